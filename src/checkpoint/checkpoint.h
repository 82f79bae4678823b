#pragma once
// Sharded, layout-independent checkpoints (../shared/DESIGN.md principle 6).
//
// Layout (Megatron's directory and tracker names, not its pickle format):
//   <save>/latest_checkpointed_iteration.txt   the iteration as decimal ("release" = dir "release")
//   <save>/iter_0000020/
//       common.json                  written by rank 0: the trainer's JSON object (see below)
//                                    plus "format", "format_version", "iteration", "world_size"
//       model_rank00000.safetensors  one per writing rank (%05d)
//       integrity.json               with --verify-integrity: {"algorithm": "crc32",
//                                    "files": {name: {"bytes": n, "crc32": c}}}
//
// Each rank file is a standard safetensors file. Every tensor is stored under
// its GLOBAL Megatron name (a second slice of the same name in one file gets
// the key "<name>#<k>"); "__metadata__" holds "format" = "megatron-cpp-checkpoint",
// "format_version" = "1", "rank", "world_size", and for each tensor key a JSON
// string {"name": global name, "global_shape": [...], "offsets": [...]} saying
// which slice of the global tensor the stored array is. A later run with
// another TP/PP/DP layout asks for any global slice and read_slice assembles
// it from whichever stored slices overlap it.
//
// Naming convention used by the training helpers below: the parameter under
// its name, the optimizer's state as "optimizer.<state>.<name>" with torch's
// state names: AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer (fp32
// or the parameters' dtype).
//
// common.json keys the trainer is expected to provide (see save_checkpoint):
//   iteration, consumed_train_samples, consumed_valid_samples,
//   num_floating_point_operations_so_far, opt_param_scheduler (state_json()),
//   optimizer {"step": ...}, rng_state, args {flag: value}.
// Only "iteration" is interpreted here; the rest is carried verbatim.
//
// Crash safety: everything is written into "<save>/iter_%07d.tmp.<tag>"
// (files fsync'ed), the directory is renamed to "iter_%07d" when complete, and
// only then is the tracker replaced atomically (tmp + rename). A process killed
// at any point leaves the previous checkpoint loadable with the tracker still
// pointing to it. Stale "*.tmp.*" directories are removed by the next save.
//
// Loading is pure data: JSON and safetensors headers are parsed and checked,
// array bytes are copied through a read-only mmap; nothing from a file is
// executed. CPU tensors only.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace mt::model {
class GPTModel;
}
namespace mt::optim {
class Optimizer;
}

namespace mt::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";

// One slice of a global tensor that this rank owns and writes.
struct NamedSlice {
  std::string name;              // global Megatron name
  Shape global_shape;            // the whole tensor's shape
  std::vector<int64_t> offsets;  // where data starts in each dim; empty = all zeros
  Tensor data;                   // cpu, contiguous; data.ndim() == global_shape.ndim
  // Store in another floating dtype (e.g. kBF16 for an fp32 parameter);
  // nullopt = data.dtype(). Conversion is round-to-nearest-even.
  std::optional<DType> store_dtype;
};

// "iter_0000020" (Megatron's %07d).
std::string iteration_dir_name(int64_t iteration);

struct SaveOptions {
  // Tag of the temporary directory "iter_%07d.tmp.<tmp_tag>"; empty = this
  // process's pid. With world > 1 every rank must pass the same tag.
  std::string tmp_tag;
  // Whether this call also commits (rename + tracker); default: world == 1.
  // With world > 1: every rank calls save_checkpoint(commit = false), the
  // trainer barriers, then rank 0 calls commit_checkpoint().
  std::optional<bool> commit;
  // --verify-integrity: the commit writes integrity.json, the CRC-32 and
  // size of every file of the checkpoint (common.json and each rank file),
  // which LoadedCheckpoint::verify_integrity() checks.
  bool verify_integrity = false;
};

// Writes this rank's file into the temporary directory (and, for rank 0,
// common.json), then commits when asked (see SaveOptions). `common` must be a
// JSON object; its "iteration" (if present) must equal `iteration`.
// Errors: kInvalidArgument (bad slice: shape/offset outside global shape,
// non-cpu data, duplicate overlap in the list), kIoError naming the path.
// Environment hook for crash tests: MT_TEST_CHECKPOINT_PAUSE=<stage> with stage
// one of "mid_file" (after the first tensor's bytes of the rank file),
// "before_rename", "before_tracker" creates "<save>/.paused_<stage>" and then
// sleeps until the process is killed.
Status save_checkpoint(const std::string& save_dir, int64_t iteration, const std::vector<NamedSlice>& tensors,
                       const nlohmann::json& common, int rank, int world, const SaveOptions& options = {});

// Rank 0, after every rank's save_checkpoint(commit=false) returned (barrier):
// checks that all `world` rank files and common.json exist, renames the
// temporary directory to iter_%07d (replacing an older directory of the same
// iteration), updates the tracker, removes stale temporaries.
Status commit_checkpoint(const std::string& save_dir, int64_t iteration, int world, const SaveOptions& options = {});

// What is stored for one global tensor name (all its slices together).
struct TensorInfo {
  std::string name;
  Shape global_shape;
  DType dtype;
};

class LoadedCheckpoint {
 public:
  LoadedCheckpoint();
  ~LoadedCheckpoint();
  LoadedCheckpoint(LoadedCheckpoint&&) noexcept;
  LoadedCheckpoint& operator=(LoadedCheckpoint&&) noexcept;

  int64_t iteration() const;
  const std::string& directory() const;  // .../iter_0000020
  const nlohmann::json& common() const;  // common.json as written (trainer keys + format keys)
  // --verify-integrity: every file integrity.json lists (all of common.json
  // and the rank files) has its recorded size and CR-32... CRC-32 again.
  // kNotFound when the checkpoint was saved without integrity.json;
  // kCorrupt naming the file whose bytes changed since the save.
  Status verify_integrity() const;

  bool has_tensor(const std::string& name) const;
  std::vector<std::string> tensor_names() const;  // sorted
  // kNotFound naming the checkpoint directory when absent.
  Result<TensorInfo> info(const std::string& name) const;

  // Copies the global slice [offsets, offsets + out.shape()) of `name` into
  // `out` (cpu, contiguous), assembling it from every stored slice that
  // overlaps it (any stored split, any requested split; row-major, any ndim).
  // Errors: kNotFound (no tensor `name`), kInvalidArgument (global shape in the
  // file differs from `global_shape`; dtype differs from out.dtype() unless
  // allow_dtype_conversion, which converts between fp32/fp64/bf16; request
  // outside the global shape), kCorrupt (the stored slices do not cover the
  // request), each message naming the tensor, the file(s) and both values.
  // The bytes are returned as stored (NaN payloads, infinities); with
  // require_finite a NaN or inf in the slice is kCorrupt, naming the tensor,
  // file and element (model weights and optimizer state: a run that
  // trained never stores one).
  Status read_slice(const std::string& name, const Shape& global_shape, const std::vector<int64_t>& offsets,
                    const Tensor& out, bool allow_dtype_conversion = false, bool require_finite = false) const;
  // The whole tensor: read_slice(name, out.shape(), {}, out, ...).
  Status read(const std::string& name, const Tensor& out, bool allow_dtype_conversion = false,
              bool require_finite = false) const;

  struct Impl;

 private:
  explicit LoadedCheckpoint(std::unique_ptr<Impl> impl);
  friend Result<LoadedCheckpoint> load_checkpoint(const std::string&, std::optional<int64_t>);
  std::unique_ptr<Impl> impl_;
};

// Opens <load_dir>/iter_%07d (iteration given) or the one the tracker names
// (nullopt), parses common.json and every rank file's header, and checks them
// (known dtypes, byte ranges inside the file, slices inside their global shape,
// no two stored slices of a name overlapping, consistent global shapes/dtypes).
// Errors: kNotFound "no checkpoint in <dir>: <dir>/latest_checkpointed_iteration.txt
// does not exist", kNotFound for a tracker naming a missing directory,
// kCorrupt for a bad tracker, common.json or safetensors file (naming the file,
// the offset or key, and what was expected).
Result<LoadedCheckpoint> load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration = std::nullopt);

// The training command line stored in common.json: args.argv (a list of
// tokens), or args as a {flag: value} object (true: a switch, false/null:
// absent). kCorrupt naming the file when neither is there. An argv without
// args.gelu (written before the GELU default became Megatron's tanh form)
// gets --no-bias-gelu-fusion appended, so the model it trained is rebuilt.
Result<std::vector<std::string>> training_argv(const nlohmann::json& common, const std::string& where);

// The iteration the tracker in `dir` names ("release" reads as 0), or nullopt
// when there is no tracker (also when `dir` itself does not exist, so that a
// first run with --load == --save starts from scratch, as in Megatron).
// kCorrupt when the tracker holds anything but a number or "release".
Result<std::optional<int64_t>> read_tracker(const std::string& dir);

// ---- Training-state helpers (any TP / DP / distributed-optimizer layout) ----
//
// Each parameter is stored as the global slices this rank's TP shard covers
// (model::shard_pieces: one per chunk, two for SwiGLU's fc1). Adam moments
// are stored as the global slices of the optimizer's state ranges
// (model::flat_range_pieces: a flat range of a distributed-optimizer shard
// becomes at most three rectangles per piece). Who writes what, so that
// every element is stored exactly once:
//   parameters: the rank with dp_writer (DP rank 0); parameters replicated
//     over TP only from TP rank 0; the routed experts' (--num-experts) from
//     the rank with expert_dp_writer (expert data-parallel rank 0: each EP
//     rank writes its own experts, under their global names);
//   moments: without the distributed optimizer as the parameters; with it,
//     every DP rank its own ranges (replicated parameters: TP rank 0 only).
// Loading reads exactly the local pieces, from whatever slices were stored.

// Every slice this rank writes (see above). params_dtype: store the
// parameters as that dtype (e.g. kBF16); nullopt = the parameters' dtype
// (fp32 masters, for an exact resume). dp_writer: this rank is DP rank 0;
// expert_dp_writer: expert data-parallel rank 0 (nullopt: as dp_writer).
std::vector<NamedSlice> training_state_slices(const model::GPTModel& model, const optim::Optimizer* optimizer,
                                              std::optional<DType> params_dtype = std::nullopt, bool dp_writer = true,
                                              std::optional<bool> expert_dp_writer = std::nullopt);

// Reads this rank's pieces of every parameter of `model` (converting from a
// bf16-stored checkpoint) and, when `optimizer` is non-null, of its moments
// (missing moments are an error naming --no-load-optim). A vocabulary-split
// tensor stored with a different padded vocabulary (Megatron pads to a
// multiple of 128 x TP, so another TP size can change it) is read for the
// rows both have; extra rows keep their initial values (zero moments), and
// `notes` (if given) gets a line saying so. Refreshes the bf16 copies. Does
// not touch the optimizer step count (that lives in common.json).
Status load_training_state(const LoadedCheckpoint& ckpt, model::GPTModel& model, optim::Optimizer* optimizer,
                           std::vector<std::string>* notes = nullptr);

}  // namespace mt::checkpoint
