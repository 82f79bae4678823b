#include "parallel/layer_split.h"

#include <fmt/format.h>

namespace mt::parallel {

Result<std::vector<ChunkSpan>> split_layers(const LayerSplitSpec& s) {
  const int64_t P = s.pp, V = s.vpp, L = s.num_layers;
  if (P < 1 || V < 1 || L < 1) return Status::invalid("split_layers: sizes must be at least 1");
  std::vector<int64_t> per_stage(P * V, 0);  // indexed by virtual stage c*P + p
  const bool uneven = s.first_stage_layers || s.last_stage_layers;
  if (uneven) {
    int64_t rest = L, middle_stages = P;
    if (s.first_stage_layers) rest -= *s.first_stage_layers, --middle_stages;
    if (s.last_stage_layers) rest -= *s.last_stage_layers, --middle_stages;
    if (rest < 0) return Status::invalid("first/last stage layers exceed --num-layers");
    if (middle_stages == 0 && rest != 0)
      return Status::invalid(fmt::format("{} layers are left for the middle stages but there are none", rest));
    const int64_t per_middle = middle_stages > 0 ? rest / middle_stages : 0;
    if (middle_stages > 0 && rest % middle_stages != 0)
      return Status::invalid(fmt::format("{} middle layers do not split evenly over {} middle stages", rest, middle_stages));
    for (int64_t p = 0; p < P; ++p) {
      int64_t n = per_middle;
      if (p == 0 && s.first_stage_layers) n = *s.first_stage_layers;
      if (p == P - 1 && s.last_stage_layers) n = *s.last_stage_layers;
      if (n % V != 0)
        return Status::invalid(fmt::format("{} layers on pipeline rank {} do not split over {} virtual stages", n, p, V));
      for (int64_t c = 0; c < V; ++c) per_stage[c * P + p] = n / V;
    }
  } else {
    const int64_t Lp = L + s.account_for_embedding + s.account_for_loss;
    if (Lp % P != 0)
      return Status::invalid(fmt::format("{} layers do not split evenly over {} pipeline stages", Lp, P));
    if ((Lp / P) % V != 0)
      return Status::invalid(fmt::format("{} layers per pipeline stage do not split over {} virtual stages", Lp / P, V));
    const int64_t per_chunk = Lp / P / V;
    for (auto& n : per_stage) n = per_chunk;
    if (s.account_for_embedding) per_stage.front() -= 1;
    if (s.account_for_loss) per_stage.back() -= 1;
  }
  std::vector<ChunkSpan> out(P * V);
  int64_t offset = 0;
  for (int64_t c = 0; c < V; ++c)
    for (int64_t p = 0; p < P; ++p) {
      ChunkSpan& cs = out[p * V + c];
      cs.pp_rank = p, cs.chunk = c, cs.first_layer = offset, cs.num_layers = per_stage[c * P + p];
      offset += cs.num_layers;
    }
  if (offset != L) return Status::internal("split_layers: layers do not add up");
  return out;
}

}  // namespace mt::parallel
