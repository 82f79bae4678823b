// Training-state helpers: a GPTModel's parameters and an AdamWOptimizer's
// moments as named global slices (TP = PP = DP = 1: every tensor whole).

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "model/gpt.h"
#include "optim/optimizer.h"

namespace mt::checkpoint {

std::vector<NamedSlice> training_state_slices(const model::GPTModel& model, const optim::AdamWOptimizer* optimizer,
                                              std::optional<DType> params_dtype) {
  const auto& specs = model.specs();
  const auto& params = model.params();
  std::vector<NamedSlice> out;
  out.reserve(specs.size() * (optimizer ? 3 : 1));
  for (size_t i = 0; i < specs.size(); ++i)
    out.push_back(NamedSlice{specs[i].name, specs[i].global_shape, {}, params[i], params_dtype});
  if (optimizer) {
    for (size_t i = 0; i < specs.size(); ++i)
      out.push_back(NamedSlice{"optimizer.exp_avg." + specs[i].name, specs[i].global_shape, {},
                               optimizer->exp_avg()[i], std::nullopt});
    for (size_t i = 0; i < specs.size(); ++i)
      out.push_back(NamedSlice{"optimizer.exp_avg_sq." + specs[i].name, specs[i].global_shape, {},
                               optimizer->exp_avg_sq()[i], std::nullopt});
  }
  return out;
}

Status load_training_state(const LoadedCheckpoint& ckpt, model::GPTModel& model, optim::AdamWOptimizer* optimizer) {
  const auto& specs = model.specs();
  const auto& params = model.params();
  for (size_t i = 0; i < specs.size(); ++i)
    MT_RETURN_IF_ERROR(ckpt.read_slice(specs[i].name, specs[i].global_shape, {}, params[i],
                                       /*allow_dtype_conversion=*/true));
  if (optimizer) {
    for (size_t i = 0; i < specs.size(); ++i) {
      for (int which = 0; which < 2; ++which) {
        const std::string name = (which ? "optimizer.exp_avg_sq." : "optimizer.exp_avg.") + specs[i].name;
        if (!ckpt.has_tensor(name))
          return Status::not_found(fmt::format("checkpoint '{}' has no optimizer state ('{}'); it was saved without "
                                               "it: pass --no-load-optim (or --finetune) to start the optimizer afresh",
                                               ckpt.directory(), name));
        const Tensor& dst = which ? optimizer->exp_avg_sq()[i] : optimizer->exp_avg()[i];
        MT_RETURN_IF_ERROR(ckpt.read_slice(name, specs[i].global_shape, {}, dst));
      }
    }
  }
  if (model.options().bf16_compute) model.sync_low_precision();
  return Status::ok();
}

}  // namespace mt::checkpoint
