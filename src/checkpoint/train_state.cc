// Training-state helpers: a GPTModel's parameters and an Optimizer's
// state as named global slices, for any TP / DP / distributed-optimizer
// layout (see checkpoint.h).

#include <fmt/format.h>

#include <algorithm>

#include "checkpoint/checkpoint.h"
#include "model/gpt.h"
#include "optim/optimizer.h"

namespace mt::checkpoint {

namespace {

// Rows [r0, r1) of a 1-D or 2-D local tensor as a tensor of `shape`.
Tensor local_piece(const Tensor& t, int64_t first_flat, const Shape& shape) {
  return Tensor(static_cast<char*>(t.data()) + first_flat * static_cast<int64_t>(dtype_size(t.dtype())), shape,
                t.dtype(), t.device());
}

int64_t row_elems(const Tensor& t) { return t.ndim() >= 2 ? t.numel() / t.dim(0) : 1; }

}  // namespace

std::vector<NamedSlice> training_state_slices(const model::GPTModel& model, const optim::Optimizer* optimizer,
                                              std::optional<DType> params_dtype, bool dp_writer,
                                              std::optional<bool> expert_dp_writer) {
  const auto& specs = model.specs();
  const auto& params = model.params();
  const int64_t tp_rank = model.options().tp_rank;
  // Replicated over TP: TP rank 0 writes; a tied word embedding held by the
  // last pipeline stage as its output layer: the first stage writes it.
  auto writes = [&](const model::ParamSpec& s) {
    return (s.shard != model::ShardKind::kReplicated || tp_rank == 0) && !model.is_shared_copy(model.find(s.name));
  };
  // The parameters (and undistributed moments) this rank writes, once over DP.
  auto dp_writes = [&](const model::ParamSpec& s) {
    return s.expert >= 0 ? expert_dp_writer.value_or(dp_writer) : dp_writer;
  };
  std::vector<NamedSlice> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!writes(specs[i]) || !dp_writes(specs[i])) continue;
    const auto sg = model.split_group(specs[i]);
    for (const model::ShardPiece& p : model::shard_pieces(specs[i], sg.size, sg.rank))
      out.push_back(NamedSlice{specs[i].name, specs[i].global_shape, p.offsets,
                               local_piece(params[i], p.local_row * row_elems(params[i]), p.shape), params_dtype});
  }
  // --moe-router-enable-expert-bias: each layer's bias, the same on every
  // TP and DP rank of its stage.
  if (dp_writer && tp_rank == 0)
    for (const auto& [name, t] : model.expert_bias_tensors())
      out.push_back(NamedSlice{name, t.shape(), {}, t, std::nullopt});
  if (optimizer) {
    for (int which = 0; which < optimizer->state_count(); ++which)
      for (const optim::StateRange& r : optimizer->state_ranges()) {
        const model::ParamSpec& s = specs[static_cast<size_t>(r.param)];
        if (!writes(s) || (!optimizer->distributed() && !dp_writes(s))) continue;
        const Tensor& state = r.state(which);
        const std::string name = "optimizer." + optimizer->state_names()[static_cast<size_t>(which)] + "." + s.name;
        const auto sg = model.split_group(s);
        for (const model::FlatPiece& p : model::flat_range_pieces(s, sg.size, sg.rank, r.begin, r.end))
          out.push_back(NamedSlice{name, s.global_shape, p.offsets, local_piece(state, p.local_flat - r.begin, p.shape),
                                   std::nullopt});
      }
  }
  return out;
}

namespace {

// Reads global slice [offsets, offsets + shape) of `name` into `out`. When the
// stored tensor is vocabulary-split with another row count, reads the rows
// both have and leaves the rest of `out` as it is.
Status read_piece(const LoadedCheckpoint& ckpt, const model::ParamSpec& spec, const std::string& name,
                  const std::vector<int64_t>& offsets, const Tensor& out, bool convert, bool* clipped) {
  if (spec.shard == model::ShardKind::kVocab && ckpt.has_tensor(name)) {
    auto info = ckpt.info(name);
    if (!info) return info.status();
    const Shape& g = info->global_shape;
    if (g.ndim == spec.global_shape.ndim && g[0] != spec.global_shape[0] && g.ndim == 2 && g[1] == spec.global_shape[1]) {
      *clipped = true;
      const int64_t r0 = offsets[0], rows = out.dim(0), have = std::max<int64_t>(0, std::min(rows, g[0] - r0));
      if (have == 0) return Status::ok();
      return ckpt.read_slice(name, g, offsets, out.slice(0, have), convert, /*require_finite=*/true);
    }
  }
  return ckpt.read_slice(name, spec.global_shape, offsets, out, convert, /*require_finite=*/true);
}

}  // namespace

Status load_training_state(const LoadedCheckpoint& ckpt, model::GPTModel& model, optim::Optimizer* optimizer,
                           std::vector<std::string>* notes) {
  const auto& specs = model.specs();
  const auto& params = model.params();
  const int64_t tp = model.options().tp;
  // A checkpoint whose shared experts are gated (--moe-shared-expert-gate)
  // into a model whose are not would silently lose the gates.
  for (const model::ParamSpec& s : specs) {
    const std::string fc1 = "mlp.shared_experts.linear_fc1.weight";
    if (s.name.size() < fc1.size() || s.name.compare(s.name.size() - fc1.size(), fc1.size(), fc1) != 0) continue;
    const std::string gate = s.name.substr(0, s.name.size() - fc1.size()) + "mlp.shared_experts.gate_weight";
    if (model.find(gate) < 0 && ckpt.has_tensor(gate))
      return Status::invalid(fmt::format("checkpoint '{}' has {} (its shared experts are gated) but this model's are "
                                         "not: add --moe-shared-expert-gate (or --use-checkpoint-args)",
                                         ckpt.directory(), gate));
  }
  bool clipped = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto sg = model.split_group(specs[i]);
    for (const model::ShardPiece& p : model::shard_pieces(specs[i], sg.size, sg.rank))
      MT_RETURN_IF_ERROR(read_piece(ckpt, specs[i], specs[i].name, p.offsets,
                                    local_piece(params[i], p.local_row * row_elems(params[i]), p.shape),
                                    /*convert=*/true, &clipped));
  }
  if (optimizer) {
    for (int which = 0; which < optimizer->state_count(); ++which)
      for (const optim::StateRange& r : optimizer->state_ranges()) {
        const model::ParamSpec& s = specs[static_cast<size_t>(r.param)];
        const std::string name = "optimizer." + optimizer->state_names()[static_cast<size_t>(which)] + "." + s.name;
        if (!ckpt.has_tensor(name))
          return Status::not_found(fmt::format("checkpoint '{}' has no optimizer state ('{}'); it was saved without "
                                               "it: pass --no-load-optim (or --finetune) to start the optimizer afresh",
                                               ckpt.directory(), name));
        const Tensor& state = r.state(which);
        const auto sg = model.split_group(s);
        for (const model::FlatPiece& p : model::flat_range_pieces(s, sg.size, sg.rank, r.begin, r.end))
          MT_RETURN_IF_ERROR(read_piece(ckpt, s, name, p.offsets, local_piece(state, p.local_flat - r.begin, p.shape),
                                        /*convert=*/false, &clipped));
      }
  }
  int missing_bias = 0;
  for (const auto& [name, t] : model.expert_bias_tensors()) {
    if (!ckpt.has_tensor(name)) {
      ++missing_bias;
      continue;
    }
    MT_RETURN_IF_ERROR(ckpt.read(name, t, /*allow_dtype_conversion=*/true, /*require_finite=*/true));
  }
  if (missing_bias && notes)
    notes->push_back(fmt::format("the checkpoint has no expert bias for {} of this stage's MoE layers (trained without "
                                 "--moe-router-enable-expert-bias): they start from zeros",
                                 missing_bias));
  if (clipped && notes)
    notes->push_back(fmt::format("the checkpoint's padded vocabulary differs from this run's ({} rows at "
                                 "--tensor-model-parallel-size {}): rows present in both were loaded, the others keep "
                                 "their initial values",
                                 model.vocab(), tp));
  if (model.options().half_compute) model.sync_low_precision();
  return Status::ok();
}

}  // namespace mt::checkpoint
