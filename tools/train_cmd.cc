// megatron train: pre-training with Megatron-LM's flags, on one process or on
// every rank of an MPI job (mpirun -np N megatron train ...). Under MPI only
// rank 0 prints; configuration errors are the same on every rank, so each
// rank exits with 2 and rank 0 says why. Any later failure on any rank ends
// the whole job (see train/trainer.h).

#include <cstdio>
#include <exception>

#include "commands.h"
#include "comm/communicator.h"
#include "core/flags.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace mt::tools {

namespace {

int train_inner(const std::vector<std::string>& args) {
  const bool mpi = comm::launched_by_mpi();
  if (mpi) {
    if (Status st = comm::init_mpi(); !st) {
      std::fprintf(stderr, "megatron train: error: %s\n", st.message().c_str());
      return 1;
    }
  }
  const int rank = comm::world_rank();
  train::TrainConfig cfg;
  FlagSet flags("megatron train",
                "Pre-trains a GPT or LLaMA-style model on a preprocessed dataset with Megatron-LM's flags.\n"
                "Run under mpirun for tensor and data parallelism: mpirun -np N megatron train "
                "--tensor-model-parallel-size T ...\n"
                "Exit code 0: done (or exited on purpose after saving); 2: bad configuration; 1: a runtime failure.");
  train::register_train_flags(flags, cfg);
  bool help = false;
  if (Status st = train::parse_train_args(args, &cfg, &flags, &help); !st) {
    if (rank == 0) std::fprintf(stderr, "megatron train: error: %s\n", st.message().c_str());
    return 2;
  }
  if (help) {
    if (rank == 0) std::fputs(flags.help().c_str(), stdout);
    return 0;
  }
  std::FILE* out = stdout;
  std::FILE* devnull = nullptr;
  if (rank != 0) out = devnull = std::fopen("/dev/null", "w");
  auto r = train::run_training(cfg, args, out ? out : stdout);
  if (devnull) std::fclose(devnull);
  if (!r) {
    std::fflush(stdout);
    if (rank == 0) std::fprintf(stderr, "megatron train: error: %s\n", r.status().message().c_str());
    return r.status().code() == StatusCode::kInvalidArgument || r.status().code() == StatusCode::kNotFound ? 2 : 1;
  }
  return 0;
}

}  // namespace

int train_main(const std::vector<std::string>& args) {
  int code = 1;
  try {
    code = train_inner(args);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "megatron train: error on rank %d of %d: %s\n", comm::world_rank(), comm::world_size(), e.what());
    comm::abort_job(1);
  }
  comm::finalize_mpi();
  return code;
}

}  // namespace mt::tools
