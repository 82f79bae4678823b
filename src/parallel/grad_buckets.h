#pragma once
// GradBuckets: data-parallel gradient reduction over one flat gradient
// buffer, in buckets, optionally overlapped with backward (Megatron's
// DistributedDataParallel with its ParamAndGradBuffer).
//
// The buffer is the model's gradient arena seen as one 1-D tensor (fp32 or
// fp64); every parameter's gradient is a contiguous range of it (gaps between
// ranges are alignment padding and stay zero). Its length must be a multiple
// of the data-parallel size (GPTOptions::flat_multiple pads it).
//
// Buckets (Megatron's rules):
// - Parameters are taken in REVERSE registry order (the order backward
//   finishes them). Without overlap there is one bucket: the whole buffer.
//   With overlap, a bucket is closed once it holds >= bucket_elems elements
//   (--ddp-bucket-size; default max(40,000,000, 1,000,000 x DP)), at a
//   parameter's start offset rounded DOWN to a multiple of DP, so every
//   bucket's length divides by DP (a parameter may straddle two buckets).
//   Bucket 0 ends at the buffer's end; the last bucket starts at 0.
// - Mode kAllReduce: each bucket is summed over DP in place (every rank ends
//   with the full reduced gradient). Mode kReduceScatter (distributed
//   optimizer): bucket [b0, b1) of length n is reduce-scattered so rank r
//   ends with the sum over DP of its block [b0 + r n/DP, b0 + (r+1) n/DP);
//   elsewhere the buffer holds stale partial sums. shard() lists this
//   rank's blocks: the elements whose optimizer state it owns.
// - No scaling: the caller scales the loss by 1 / (micro-batches x DP) so the
//   sum over DP is the mean gradient (Megatron's gradient_scaling_factor).
//
// Overlap (--overlap-grad-reduce): during the LAST micro-batch's backward the
// model reports progress (mark_ready(stage)); a bucket is launched
// asynchronously as soon as every parameter intersecting it is ready, and
// progress() is polled so MPI advances it while backward continues.
// finish() launches what is left and waits for everything. Without overlap,
// finish() reduces every bucket synchronously.
//
// param_gather (distributed optimizer): after the optimizer updated this
// rank's blocks of the PARAMETER buffer (same layout as the gradients),
// all_gather_params() all-gathers every bucket's blocks in place;
// start_param_gather() launches them asynchronously (--overlap-param-gather)
// and wait_param_gather(stage) waits for the buckets holding the parameters
// of a forward stage before it runs (wait_param_gather_all() for all).
//
// Stages (one per point of backward where gradients become final, and the
// same numbering for the forward's parameter use): L = final norm and an
// untied output layer (done first in backward), l = transformer layer l,
// -1 = embeddings (word embedding, tied or not, and positions; done last).

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "core/tensor.h"

namespace mt::parallel {

// One parameter's place in the flat buffer.
struct ParamRange {
  int64_t begin = 0, end = 0;  // element offsets in the flat buffer
  int stage = 0;               // see "Stages" above
};

struct Bucket {
  int64_t begin = 0, end = 0;  // element range in the flat buffer
  std::vector<int> params;     // indices into the ParamRange list intersecting it (ascending)
};

// A block of the flat buffer this rank owns (kReduceScatter) -- or the whole
// buffer per bucket with kAllReduce.
struct ShardBlock {
  int64_t begin = 0, end = 0;
  int bucket = 0;
};

enum class GradReduceMode { kAllReduce, kReduceScatter };

struct GradBucketOptions {
  GradReduceMode mode = GradReduceMode::kAllReduce;
  bool overlap_grad_reduce = false;
  int64_t bucket_elems = 0;  // 0: Megatron's default max(40e6, 1e6 x DP)
};

class GradBuckets {
 public:
  // grads, params: the flat buffers (same length and dtype, length % DP == 0).
  // params may be undefined when no param gather is needed (kAllReduce).
  // `dp` must outlive this object.
  GradBuckets(const Tensor& grads, const Tensor& params, std::vector<ParamRange> ranges, comm::Communicator& dp,
              const GradBucketOptions& options);
  ~GradBuckets();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // This rank's blocks (kReduceScatter: one per bucket; kAllReduce: the buckets).
  const std::vector<ShardBlock>& shard() const { return shard_; }
  GradReduceMode mode() const { return options_.mode; }
  // Bytes of the reduce-scatter receive blocks (0 in kAllReduce mode).
  size_t buffer_bytes() const { return block_arena_.capacity(); }

  // Call before the last micro-batch's backward (resets readiness).
  void begin_last_backward();
  // Gradients of every parameter of `stage` are final (overlap only; a no-op
  // otherwise, and before begin_last_backward()). Launches buckets that
  // became complete and polls the rest.
  void mark_ready(int stage);
  // Reduces every bucket not yet launched, waits for all. Afterwards the
  // reduced gradients are in place (see the modes above).
  void finish();

  // Distributed optimizer: gather the updated parameter blocks.
  void all_gather_params();
  void start_param_gather();
  void wait_param_gather(int stage);
  void wait_param_gather_all();

 private:
  // Starts bucket b's reduction: asynchronously with overlap, otherwise
  // synchronously (and copies a reduce-scatter result into place at once).
  void launch(size_t b);
  // Copies bucket b's reduce-scatter result from its temporary into its block.
  void copy_block_back(size_t b);
  // Something to move: DP > 1 and a non-empty buffer.
  bool reduces() const { return dp_.size() > 1 && grads_.numel() > 0; }

  Tensor grads_, params_;  // 1-D views of the flat buffers
  std::vector<ParamRange> ranges_;
  comm::Communicator& dp_;
  GradBucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<ShardBlock> shard_;
  // kReduceScatter with DP > 1: one block-sized receive buffer per bucket
  // (MPI's reduce-scatter cannot write into its own input), carved once from
  // `block_arena_` (N / DP elements in all), so every bucket can be in flight.
  Arena block_arena_;
  std::vector<Tensor> block_tmp_;
  bool armed_ = false;  // begin_last_backward() was called and finish() not yet
  std::vector<char> launched_, param_ready_;
  std::vector<std::unique_ptr<comm::Work>> grad_work_, param_work_;
};

}  // namespace mt::parallel
