#pragma once
// The fused QKV activation as Megatron lays it out. linear_qkv's output row
// for one token is g query groups, each [q heads of the group | k | v]:
//   [ q(0,0) .. q(0,a/g-1) k(0) v(0) | q(1,0) .. k(1) v(1) | ... ]   each d wide
// (Megatron reshapes [s, b, (a+2g)d] to [s, b, g, (a/g + 2) d] and splits).
// A tensor-parallel rank holds g/tp whole groups: a contiguous slice of the
// weight's rows and of this row. Rows are tokens in Megatron's [s, b] order:
// row r is position t = r / B of sequence b = r % B, so a sequence-parallel
// shard of s is a contiguous block of rows.

#include <cstdint>

#include "core/status.h"

namespace mt::kernels {

struct QkvLayout {
  int64_t seq = 0;       // s (T)
  int64_t batch = 0;     // b (B)
  int64_t heads = 0;     // a, attention heads on this rank
  int64_t groups = 0;    // g, query groups on this rank (heads % groups == 0)
  int64_t head_dim = 0;  // d

  int64_t heads_per_group() const { return heads / groups; }
  int64_t row() const { return (heads + 2 * groups) * head_dim; }  // elements per token
  int64_t tokens() const { return seq * batch; }
  // Column offsets within a row.
  int64_t q_col(int64_t head) const {
    return (head / heads_per_group()) * (heads_per_group() + 2) * head_dim + (head % heads_per_group()) * head_dim;
  }
  int64_t k_col(int64_t group) const { return (group * (heads_per_group() + 2) + heads_per_group()) * head_dim; }
  int64_t v_col(int64_t group) const { return k_col(group) + head_dim; }
  void check() const {
    MT_CHECK(seq > 0 && batch > 0 && heads > 0 && groups > 0 && head_dim > 0 && heads % groups == 0,
             "QkvLayout: heads must be a positive multiple of groups");
  }
};

}  // namespace mt::kernels
