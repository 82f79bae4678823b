#pragma once
// Megatron's GPT dataset over an indexed dataset (spec §2): the split string
// to sequence ranges, epochs with the separate last epoch, the document,
// sample and shuffle indices (numpy RandomState shuffles reproduced exactly,
// so a seed gives Megatron's sample order), index caching, blending of
// several datasets, and reading sample k as seq_length + 1 tokens.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"

namespace mt::data {

// numpy.random.RandomState(seed): MT19937 with init_genrand seeding, and
// RandomState.shuffle's bounded draws (mask, then reject).
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : gen_(seed) {}
  uint64_t random_interval(uint64_t max);
  template <typename T>
  void shuffle(T* a, size_t n) {
    for (size_t i = n; i-- > 1;) {
      const size_t j = static_cast<size_t>(random_interval(i));
      std::swap(a[i], a[j]);
    }
  }

 private:
  std::mt19937 gen_;
};

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
const char* split_name(Split s);

// "969,30,1" -> normalised weights (train, valid, test); every run of
// [.0-9] is a number, missing entries are 0.
Result<std::array<double, 3>> parse_split(const std::string& split);
struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
// Sequence-id ranges with Python's round-half-to-even; nullopt for an empty split.
std::array<std::optional<IndexRange>, 3> split_ranges(const std::array<double, 3>& weights, int64_t num_sequences);

struct GptIndices {
  int64_t num_epochs = 1;
  bool separate_final_epoch = false;
  int64_t tokens_per_epoch = 0;
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;  // (num_samples + 1) x 2, row-major: (position in document_index, offset)
  std::vector<int64_t> shuffle_index;
  int64_t num_samples() const { return static_cast<int64_t>(shuffle_index.size()); }
};

// helpers.cpp build_sample_idx: (num_samples + 1) x 2 rows of (position in
// document_index, token offset) where each sample of s + 1 tokens starts.
std::vector<int64_t> build_sample_index(std::span<const int32_t> lengths, std::span<const int32_t> document_index,
                                        int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch, bool drop_last_partial);

// Builds the three indices for the sequences [range) of `lengths`, asking for
// `num_samples` samples of `seq_length` (+1 overlapping token); nullopt = one epoch.
Result<GptIndices> build_gpt_indices(std::span<const int32_t> lengths, IndexRange range, std::optional<int64_t> num_samples,
                                     int64_t seq_length, uint32_t seed, bool drop_last_partial = true);

// Anything that yields samples of seq_length + 1 tokens.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  // Writes seq_length + 1 tokens of sample k; positions past the data (only
  // for a padded last validation sample) get -1. Fails (kCorrupt, naming the
  // file, byte, sequence and token) on a stored value that is not an id of
  // the vocabulary (GptDatasetConfig::vocab_size).
  virtual Status sample_tokens(int64_t k, int64_t* out) const = 0;
  virtual std::string describe() const = 0;
};

struct GptDatasetConfig {
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  std::string cache_dir;       // --data-cache-path; empty: Megatron's <prefix>/cache/GPTDataset_indices
  bool no_cache = false;       // build in memory only (tests, mock data)
  bool drop_last_partial_validation = true;
  // Every token read must be an id in [0, vocab_size): the model's (padded)
  // vocabulary, which the embedding can look up. 0: not checked.
  int64_t vocab_size = 0;
};

class GptDataset final : public SampleSource {
 public:
  // `log` (optional) receives one line saying whether the indices were built or loaded.
  static Result<std::shared_ptr<GptDataset>> build(std::shared_ptr<const Documents> ds, Split split, IndexRange range,
                                                   std::optional<int64_t> num_samples, const GptDatasetConfig& cfg,
                                                   std::string* log = nullptr);
  int64_t size() const override { return idx_.num_samples(); }
  int64_t seq_length() const override { return seq_length_; }
  Status sample_tokens(int64_t k, int64_t* out) const override;
  std::string describe() const override;
  const GptIndices& indices() const { return idx_; }

 private:
  std::shared_ptr<const Documents> ds_;
  GptIndices idx_;
  int64_t seq_length_ = 0;
  int64_t vocab_size_ = 0;
  Split split_ = Split::kTrain;
};

// --data-path "w1 p1 w2 p2 ..." or "p1 p2 ...": weights normalised to sum to 1,
// or empty when none are given.
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // empty: no weights
};
Result<Blend> parse_blend(const std::vector<std::string>& args, const std::string& flag);

// Megatron's greedy interleaving (helpers.cpp build_blending_indices).
void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index);
// Exhaustive variant: every dataset gives exactly counts[i] samples.
void build_exhaustive_blending_indices(const std::vector<int64_t>& counts, std::vector<int16_t>* dataset_index,
                                       std::vector<int64_t>* dataset_sample_index);

class BlendedDataset final : public SampleSource {
 public:
  static Result<std::shared_ptr<BlendedDataset>> create(std::vector<std::shared_ptr<SampleSource>> datasets,
                                                        std::vector<double> weights, std::optional<int64_t> size);
  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  Status sample_tokens(int64_t k, int64_t* out) const override;
  std::string describe() const override;
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }

 private:
  std::vector<std::shared_ptr<SampleSource>> datasets_;
  std::vector<double> weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

// Everything Megatron's data flags say about where samples come from.
struct DataConfig {
  std::vector<std::string> data_path;        // --data-path
  std::vector<std::string> train_data_path;  // --train-data-path (and valid/test): whole datasets per split
  std::vector<std::string> valid_data_path;
  std::vector<std::string> test_data_path;
  std::string data_args_path;            // --data-args-path: a file holding --data-path's tokens
  std::string per_split_data_args_path;  // --per-split-data-args-path: JSON {"train": ..., "valid": ..., "test": ...}
  std::string split = "969, 30, 1";          // --split (Megatron's legacy default with --data-path)
  // --mock-data: Megatron's MockGPTLowLevelDataset for the tokenizer's
  // vocabulary size and EOD token, split "1,1,1" whatever --split says.
  bool mock = false;
  int64_t mock_vocab_size = 0;
  int32_t mock_eod = 0;
  double mid_level_dataset_surplus = 0.005;  // --mid-level-dataset-surplus
  GptDatasetConfig gpt;
};

// Train, valid and test sources for the requested sample counts (nullopt:
// one epoch); a split with no data is nullptr. Each log line goes to *log.
// Splits with `wanted` false are not built.
Result<std::array<std::shared_ptr<SampleSource>, 3>> build_train_valid_test(const DataConfig& cfg,
                                                                             const std::array<std::optional<int64_t>, 3>& num_samples,
                                                                             std::vector<std::string>* log = nullptr,
                                                                             std::array<bool, 3> wanted = {true, true, true});

}  // namespace mt::data
