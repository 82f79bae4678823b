// megatron train: pre-training with Megatron-LM's flags.

#include <cstdio>

#include "commands.h"
#include "core/flags.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace mt::tools {

int train_main(const std::vector<std::string>& args) {
  train::TrainConfig cfg;
  FlagSet flags("megatron train",
                "Pre-trains a GPT or LLaMA-style model on a preprocessed dataset with Megatron-LM's flags.\n"
                "Exit code 0: done (or exited on purpose after saving); 2: bad configuration; 1: a runtime failure.");
  train::register_train_flags(flags, cfg);
  bool help = false;
  if (Status st = train::parse_train_args(args, &cfg, &flags, &help); !st) {
    std::fprintf(stderr, "megatron train: error: %s\n", st.message().c_str());
    return 2;
  }
  if (help) {
    std::fputs(flags.help().c_str(), stdout);
    return 0;
  }
  auto r = train::run_training(cfg, args, stdout);
  if (!r) {
    std::fflush(stdout);
    std::fprintf(stderr, "megatron train: error: %s\n", r.status().message().c_str());
    return r.status().code() == StatusCode::kInvalidArgument || r.status().code() == StatusCode::kNotFound ? 2 : 1;
  }
  return 0;
}

}  // namespace mt::tools
