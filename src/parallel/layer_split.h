#pragma once
// How Megatron splits transformer layers over pipeline ranks and virtual
// stages (get_num_layers_to_build / get_transformer_layer_offset): even
// split, optionally counting the embedding and the loss as one layer each,
// or explicit first/last-stage sizes with the rest split evenly. Virtual
// stages are numbered chunk-major (stage = chunk * PP + pp_rank), and a
// chunk's first layer is the sum of the layers of all earlier stages.

#include <cstdint>
#include <optional>
#include <vector>

#include "core/status.h"

namespace mt::parallel {

struct LayerSplitSpec {
  int64_t num_layers = 0, pp = 1, vpp = 1;
  std::optional<int64_t> first_stage_layers, last_stage_layers;
  bool account_for_embedding = false, account_for_loss = false;
};

struct ChunkSpan {
  int64_t pp_rank = 0, chunk = 0, first_layer = 0, num_layers = 0;
};

// Result is ordered pp-major: index = pp_rank * vpp + chunk.
// Fails (with Megatron's rule in the message) when the split is not exact.
Result<std::vector<ChunkSpan>> split_layers(const LayerSplitSpec& spec);

}  // namespace mt::parallel
