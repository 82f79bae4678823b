#include "data/gpt_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <new>

#include <fmt/format.h>

#include "core/file.h"
#include "data/mock_dataset.h"
#include "data/npy.h"

namespace mt::data {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1, mask |= mask >> 2, mask |= mask >> 4, mask |= mask >> 8, mask |= mask >> 16, mask |= mask >> 32;
  uint64_t v;
  if (max <= 0xFFFFFFFFull) {
    do v = static_cast<uint64_t>(gen_()) & mask;
    while (v > max);
  } else {
    do {
      const uint64_t hi = gen_();
      v = ((hi << 32) | gen_()) & mask;
    } while (v > max);
  }
  return v;
}

const char* split_name(Split s) {
  switch (s) {
    case Split::kTrain: return "train";
    case Split::kValid: return "valid";
    case Split::kTest: return "test";
  }
  return "?";
}

Result<std::array<double, 3>> parse_split(const std::string& split) {
  std::vector<double> v;
  size_t i = 0;
  while (i < split.size()) {
    if (!(std::isdigit(static_cast<unsigned char>(split[i])) || split[i] == '.')) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && (std::isdigit(static_cast<unsigned char>(split[j])) || split[j] == '.')) ++j;
    const std::string num = split.substr(i, j - i);
    char* end = nullptr;
    const double x = std::strtod(num.c_str(), &end);
    if (end != num.c_str() + num.size() || !std::isfinite(x))
      return Status::invalid(fmt::format("--split: '{}' in \"{}\" is not a number", num, split));
    v.push_back(x);
    i = j;
  }
  if (v.size() > 3) return Status::invalid(fmt::format("--split \"{}\": at most 3 numbers (train, valid, test)", split));
  v.resize(3, 0.0);
  const double sum = v[0] + v[1] + v[2];
  if (!(sum > 0)) return Status::invalid(fmt::format("--split \"{}\": the parts must add up to more than 0", split));
  return std::array<double, 3>{v[0] / sum, v[1] / sum, v[2] / sum};
}

std::array<std::optional<IndexRange>, 3> split_ranges(const std::array<double, 3>& w, int64_t n) {
  const double e[4] = {0.0, w[0], w[0] + w[1], w[0] + w[1] + w[2]};
  std::array<std::optional<IndexRange>, 3> out;
  for (int i = 0; i < 3; ++i) {
    if (e[i + 1] - e[i] <= 0) continue;
    // Python's int(round(x)): round half to even (the default FP rounding mode).
    const int64_t b = static_cast<int64_t>(std::nearbyint(e[i] * static_cast<double>(n)));
    const int64_t en = static_cast<int64_t>(std::nearbyint(e[i + 1] * static_cast<double>(n)));
    out[i] = IndexRange{b, en};
  }
  return out;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> lengths, std::span<const int32_t> document_index,
                                        int64_t s, int64_t E, int64_t T, bool drop_last) {
  constexpr int64_t x = 1;
  // Megatron computes the padded count in float32: ceil(float(E*T - x) / s).
  const int64_t n = drop_last ? (E * T - x) / s : static_cast<int64_t>(std::ceil(static_cast<float>(E * T - x) / static_cast<float>(s)));
  std::vector<int64_t> idx(static_cast<size_t>(2 * (n + 1)), 0);
  int64_t d = 0, off = 0;
  const int64_t last = static_cast<int64_t>(document_index.size()) - 1;
  for (int64_t j = 1; j <= n; ++j) {
    int64_t remaining = s + x;
    while (remaining != 0) {
      const int64_t len = lengths[document_index[d]] - off;
      remaining -= len;
      if (remaining <= 0) {  // the sample ends inside this sequence
        off += remaining + len - x;  // -x: the next sample starts on this sample's last token
        remaining = 0;
      } else {
        if (d == last) {
          off = lengths[document_index[d]] - x;
          break;
        }
        ++d;
        off = 0;
      }
    }
    idx[2 * j] = d;
    idx[2 * j + 1] = off;
  }
  return idx;
}

Result<GptIndices> build_gpt_indices(std::span<const int32_t> lengths, IndexRange range, std::optional<int64_t> num_samples,
                                     int64_t s, uint32_t seed, bool drop_last) {
  constexpr int64_t x = 1;  // add_extra_token_to_sequence
  if (s <= 1) return Status::invalid(fmt::format("--seq-length {} must be at least 2", s));
  if (range.begin < 0 || range.end > static_cast<int64_t>(lengths.size()) || range.begin > range.end)
    return Status::internal("sequence range outside the dataset");
  GptIndices r;
  for (int64_t i = range.begin; i < range.end; ++i) r.tokens_per_epoch += lengths[i];
  const int64_t T = r.tokens_per_epoch;
  if (T <= 1) return Status::invalid(fmt::format("the split holds {} tokens; a sample needs at least 2", T));
  const int64_t n_ids = range.size();
  if (num_samples) {
    if (*num_samples < 0) return Status::internal("negative sample count");
    if (*num_samples > (std::numeric_limits<int64_t>::max() - T) / s)
      return Status::invalid(fmt::format("{} samples of {} tokens overflow a 64-bit token count: lower --train-iters "
                                         "(or --train-samples), --global-batch-size or --eval-iters", *num_samples, s));
    // Smallest E with E*T >= N*s + 1.
    const int64_t need = *num_samples * s + x;
    r.num_epochs = std::max<int64_t>(1, (need + T - 1) / T);
    // The indices' bytes (document index: 4 per sequence and epoch; sample
    // and shuffle index: 24 per sample), checked before any is built: a
    // sample count no machine could index fails here, not as an allocation
    // failure or an hour of filling.
    const double bytes = 4.0 * static_cast<double>(r.num_epochs) * static_cast<double>(n_ids) +
                         24.0 * (static_cast<double>(*num_samples) + 2);
    const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    if (ram > 0 && bytes > ram)
      return Status::invalid(fmt::format(
          "{} samples of {} tokens ({} epochs of {} tokens) need {:.1f} GiB of dataset indices, more than this "
          "machine's {:.1f} GiB of memory: lower --train-iters (or --train-samples), --global-batch-size or --eval-iters",
          *num_samples, s, r.num_epochs, T, bytes / (1 << 30), ram / (1 << 30)));
  }
  const int64_t E = r.num_epochs;
  int64_t sans_final = 0;
  if (E > 1) {
    sans_final = ((E - 1) * T - x) / s;
    const int64_t from_final = *num_samples - sans_final;
    const int64_t per_epoch = (T - x) / s;
    if (from_final < 0 || from_final > per_epoch + 1) return Status::internal("epoch arithmetic");
    r.separate_final_epoch = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState rng(seed);
  // Document index: the split's ids tiled per epoch, shuffled (the last epoch
  // on its own when separate).
  auto tiled = [&](int64_t epochs) {
    std::vector<int32_t> v(static_cast<size_t>(epochs * n_ids));
    for (int64_t e = 0; e < epochs; ++e)
      for (int64_t i = 0; i < n_ids; ++i) v[e * n_ids + i] = static_cast<int32_t>(range.begin + i);
    rng.shuffle(v.data(), v.size());
    return v;
  };
  if (!r.separate_final_epoch) {
    r.document_index = tiled(E);
  } else {
    r.document_index = tiled(E - 1);
    std::vector<int32_t> last = tiled(1);
    r.document_index.insert(r.document_index.end(), last.begin(), last.end());
  }
  r.sample_index = build_sample_index(lengths, r.document_index, s, E, T, drop_last);
  const int64_t n = static_cast<int64_t>(r.sample_index.size() / 2) - 1;
  // Shuffle index: one range, or the epochs before the last and the last separately.
  r.shuffle_index.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r.shuffle_index[i] = i;
  const int64_t first = r.separate_final_epoch ? sans_final : n;
  rng.shuffle(r.shuffle_index.data(), static_cast<size_t>(first));
  if (first < n) rng.shuffle(r.shuffle_index.data() + first, static_cast<size_t>(n - first));
  return r;
}

// ---------------------------------------------------------------- GptDataset

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string read_text(const std::string& path) {
  auto text = read_regular_file(path, size_t{1} << 20);
  return text ? *text : std::string();
}

// A cached index set that sample_tokens can read without leaving the
// dataset: documents in range, sample rows (document position, token
// offset) nondecreasing with each offset inside its sequence (an empty
// sequence only at the first row's offset 0, or at the last row's -1, which
// the builder writes for an empty last sequence when the partial last
// sample is kept), shuffle values in range.
Status check_indices(const GptIndices& r, const Documents& ds, const std::string& where) {
  for (int32_t d : r.document_index)
    if (d < 0 || d >= ds.num_sequences())
      return Status::corrupt(fmt::format("{}: document index {} outside the dataset", where, d));
  const int64_t n = r.num_samples(), docs = static_cast<int64_t>(r.document_index.size());
  if (static_cast<int64_t>(r.sample_index.size()) != 2 * (n + 1))
    return Status::corrupt(fmt::format("{}: sample index has {} entries, expected {}", where, r.sample_index.size(), 2 * (n + 1)));
  for (int64_t j = 0; j <= n; ++j) {
    const int64_t pos = r.sample_index[2 * j], off = r.sample_index[2 * j + 1];
    bool ok = pos >= 0 && pos < docs && off >= -1 && (j == 0 || pos >= r.sample_index[2 * j - 2]);
    if (ok) {
      const int64_t len = ds.sequence_length(r.document_index[pos]);
      ok = (off >= 0 && off < len) || (j == 0 && off == 0) || (j == n && len == 0 && off == -1);
      if (ok && j > 0 && pos == r.sample_index[2 * j - 2]) ok = len > 0 && off >= r.sample_index[2 * j - 1];
    }
    if (!ok) return Status::corrupt(fmt::format("{}: sample index row {} out of range", where, j));
  }
  for (int64_t v : r.shuffle_index)
    if (v < 0 || v >= n) return Status::corrupt(fmt::format("{}: shuffle index value {} out of range", where, v));
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<GptDataset>> GptDataset::build(std::shared_ptr<const Documents> ds, Split split, IndexRange range,
                                                      std::optional<int64_t> num_samples, const GptDatasetConfig& cfg,
                                                      std::string* log) {
  auto out = std::make_shared<GptDataset>();
  out->ds_ = ds;
  out->seq_length_ = cfg.seq_length;
  out->vocab_size_ = cfg.vocab_size;
  out->split_ = split;
  const bool drop_last = split != Split::kValid || cfg.drop_last_partial_validation;

  std::string dir, base, description;
  if (!cfg.no_cache) {
    dir = cfg.cache_dir.empty() ? ds->prefix() + "/cache/GPTDataset_indices" : cfg.cache_dir;
    struct stat st;
    std::string idx_id = "unknown";
    if (::stat((ds->prefix() + ".idx").c_str(), &st) == 0)
      idx_id = fmt::format("{{\"size\": {}, \"mtime_ns\": {}}}", static_cast<long long>(st.st_size),
                           static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec);
    description = fmt::format(
        "{{\n    \"class\": \"GPTDataset\",\n    \"format\": \"megatron-cpp 1\",\n    \"dataset_path\": \"{}\",\n"
        "    \"index_file\": {},\n    \"sequences\": {},\n    \"tokens\": {},\n    \"index_split\": \"{}\",\n"
        "    \"split_range\": [{}, {}],\n    \"num_samples\": {},\n    \"random_seed\": {},\n    \"sequence_length\": {},\n"
        "    \"drop_last_partial_sequence\": {}\n}}",
        ds->prefix(), idx_id, ds->num_sequences(), ds->num_tokens(), split_name(split), range.begin, range.end,
        num_samples ? std::to_string(*num_samples) : "null", cfg.seed, cfg.seq_length, drop_last ? "true" : "false");
    base = fmt::format("{}/{:016x}-GPTDataset-{}-", dir, fnv1a(description), split_name(split));
    if (read_text(base + "description.txt") == description) {
      std::vector<int64_t> s1, s2, s3;
      auto d = read_npy<int32_t>(base + "document_index.npy", &s1);
      auto sm = read_npy<int64_t>(base + "sample_index.npy", &s2);
      auto sh = read_npy<int64_t>(base + "shuffle_index.npy", &s3);
      if (d && sm && sh) {
        out->idx_.document_index = std::move(*d);
        out->idx_.sample_index = std::move(*sm);
        out->idx_.shuffle_index = std::move(*sh);
        Status ok = check_indices(out->idx_, *ds, base);
        if (ok) {
          if (log) *log = fmt::format("loaded {} indices of {} from {}*: {} samples", split_name(split), ds->prefix(), base, out->size());
          return out;
        }
      }
      // An unreadable or inconsistent cache is rebuilt below.
    }
  }
  const std::vector<int32_t> lengths = ds->sequence_lengths();
  auto build = [&]() -> Result<GptIndices> {
    try {
      return build_gpt_indices(lengths, range, num_samples, cfg.seq_length, cfg.seed, drop_last);
    } catch (const std::bad_alloc&) {
      return Status::invalid(fmt::format("the indices of {} samples do not fit in the memory this process may use: lower "
                                         "--train-iters (or --train-samples), --global-batch-size or --eval-iters",
                                         num_samples ? std::to_string(*num_samples) : "one epoch's"));
    }
  };
  auto built = build();
  if (!built) return Status(built.status().code(), fmt::format("{} ({} split): {}", ds->prefix(), split_name(split), built.status().message()));
  out->idx_ = std::move(*built);
  std::string where = "memory";
  if (!cfg.no_cache) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    Status st = ec ? Status::io_error(fmt::format("cannot create cache directory {}: {}", dir, ec.message())) : Status::ok();
    const int64_t n = out->size();
    if (st) st = write_npy(base + "document_index.npy", out->idx_.document_index, {static_cast<int64_t>(out->idx_.document_index.size())});
    if (st) st = write_npy(base + "sample_index.npy", out->idx_.sample_index, {n + 1, 2});
    if (st) st = write_npy(base + "shuffle_index.npy", out->idx_.shuffle_index, {n});
    if (st) st = write_file_atomic(base + "description.txt", description);  // last: marks the set complete
    where = st ? base + "*" : "memory only (" + st.message() + ")";
  }
  if (log)
    *log = fmt::format("built {} indices of {}: {} samples, {} epoch{}{}, cached in {}", split_name(split), ds->prefix(),
                       out->size(), out->idx_.num_epochs, out->idx_.num_epochs == 1 ? "" : "s",
                       out->idx_.separate_final_epoch ? " (last epoch shuffled separately)" : "", where);
  return out;
}

Status GptDataset::sample_tokens(int64_t k, int64_t* out) const {
  MT_CHECK(k >= 0 && k < size(), "sample index out of range");
  const int64_t j = idx_.shuffle_index[k];
  const int64_t d0 = idx_.sample_index[2 * j], o0 = idx_.sample_index[2 * j + 1];
  const int64_t d1 = idx_.sample_index[2 * j + 2], o1 = idx_.sample_index[2 * j + 3];
  const int64_t want = seq_length_ + 1;
  int64_t got = 0;
  Status st;
  auto take = [&](int64_t pos, int64_t from, int64_t count) {
    const int64_t seq = idx_.document_index[pos];
    count = std::min(count, want - got);
    if (count <= 0 || !st) return;
    ds_->read(seq, from, count, out + got);
    for (int64_t i = 0; i < count && vocab_size_ > 0; ++i) {
      const int64_t v = out[got + i];
      if (v >= 0 && v < vocab_size_) continue;
      const std::string what = v == std::numeric_limits<int64_t>::lowest()
                                   ? std::string("a value that is no integer token id")
                                   : fmt::format("token id {}", v);
      st = Status::corrupt(fmt::format(
          "{} holds {}, outside the model's vocabulary [0, {}) (sample {} of {}): the dataset was made with "
          "another tokenizer or --vocab-size than this run's, or the file is damaged",
          ds_->token_place(seq, from + i), what, vocab_size_, k, describe()));
      return;
    }
    got += count;
  };
  if (d0 == d1) {
    take(d0, o0, o1 - o0 + 1);
  } else {
    take(d0, o0, ds_->sequence_length(idx_.document_index[d0]) - o0);
    for (int64_t d = d0 + 1; d < d1; ++d) take(d, 0, ds_->sequence_length(idx_.document_index[d]));
    take(d1, 0, o1 + 1);
  }
  if (!st) return st;
  for (; got < want; ++got) out[got] = -1;  // padded last sample
  return Status::ok();
}

std::string GptDataset::describe() const {
  return fmt::format("GPTDataset({}, {}, {} samples)", ds_->prefix(), split_name(split_), size());
}

// ---------------------------------------------------------------- blending

Result<Blend> parse_blend(const std::vector<std::string>& args, const std::string& flag) {
  Blend b;
  if (args.empty()) return Status::invalid(fmt::format("{} needs at least one path prefix", flag));
  auto number = [](const std::string& s, double* v) {
    char* end = nullptr;
    *v = std::strtod(s.c_str(), &end);
    return !s.empty() && end == s.c_str() + s.size() && std::isfinite(*v);
  };
  double w0;
  if (args.size() % 2 == 0 && number(args[0], &w0)) {
    double sum = 0;
    for (size_t i = 0; i < args.size(); i += 2) {
      double w;
      if (!number(args[i], &w) || w < 0)
        return Status::invalid(fmt::format("{}: expected weight/prefix pairs, but '{}' is not a weight", flag, args[i]));
      b.weights.push_back(w);
      b.prefixes.push_back(args[i + 1]);
      sum += w;
    }
    if (!(sum > 0)) return Status::invalid(fmt::format("{}: the weights add up to 0", flag));
    for (double& w : b.weights) w /= sum;
  } else {
    for (const auto& a : args) {
      double w;
      if (number(a, &w))
        return Status::invalid(fmt::format("{}: '{}' looks like a weight; give weight/prefix pairs or prefixes only", flag, a));
      b.prefixes.push_back(a);
    }
  }
  return b;
}

void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* di,
                            std::vector<int64_t>* dsi) {
  const size_t n = weights.size();
  di->resize(static_cast<size_t>(size));
  dsi->resize(static_cast<size_t>(size));
  std::vector<int64_t> count(n, 0);
  for (int64_t t = 0; t < size; ++t) {
    const double at = std::max(static_cast<double>(t), 1.0);
    size_t best = 0;
    double best_err = weights[0] * at - static_cast<double>(count[0]);
    for (size_t i = 1; i < n; ++i) {
      const double err = weights[i] * at - static_cast<double>(count[i]);
      if (err > best_err) best_err = err, best = i;
    }
    (*di)[t] = static_cast<int16_t>(best);
    (*dsi)[t] = count[best]++;
  }
}

void build_exhaustive_blending_indices(const std::vector<int64_t>& counts, std::vector<int16_t>* di,
                                       std::vector<int64_t>* dsi) {
  const size_t n = counts.size();
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = total ? static_cast<double>(counts[i]) / total : 0;
  di->clear(), dsi->clear();
  di->reserve(total), dsi->reserve(total);
  std::vector<int64_t> got(n, 0);
  for (int64_t t = 0; t < total; ++t) {
    const double at = std::max(static_cast<double>(t), 1.0);
    size_t best = n;
    double best_err = 0;
    for (size_t i = 0; i < n; ++i) {
      if (got[i] >= counts[i]) continue;  // exhausted
      const double err = w[i] * at - static_cast<double>(got[i]);
      if (best == n || err > best_err) best_err = err, best = i;
    }
    di->push_back(static_cast<int16_t>(best));
    dsi->push_back(got[best]++);
  }
}

Result<std::shared_ptr<BlendedDataset>> BlendedDataset::create(std::vector<std::shared_ptr<SampleSource>> datasets,
                                                               std::vector<double> weights, std::optional<int64_t> size) {
  if (datasets.empty()) return Status::invalid("a blend needs at least one dataset");
  if (datasets.size() > 32766) return Status::invalid("at most 32766 datasets can be blended");
  for (const auto& d : datasets)
    if (d->seq_length() != datasets.front()->seq_length()) return Status::internal("blended datasets differ in sequence length");
  auto b = std::make_shared<BlendedDataset>();
  b->datasets_ = std::move(datasets);
  b->weights_ = std::move(weights);
  if (size) {
    build_blending_indices(b->weights_, *size, &b->dataset_index_, &b->dataset_sample_index_);
  } else {
    std::vector<int64_t> counts;
    for (const auto& d : b->datasets_) counts.push_back(d->size());
    build_exhaustive_blending_indices(counts, &b->dataset_index_, &b->dataset_sample_index_);
  }
  std::vector<int64_t> need(b->datasets_.size(), 0);
  for (size_t t = 0; t < b->dataset_index_.size(); ++t)
    need[b->dataset_index_[t]] = std::max(need[b->dataset_index_[t]], b->dataset_sample_index_[t] + 1);
  for (size_t i = 0; i < need.size(); ++i)
    if (need[i] > b->datasets_[i]->size())
      return Status::invalid(fmt::format("the blend needs {} samples from {} but it has {}; raise --mid-level-dataset-surplus",
                                         need[i], b->datasets_[i]->describe(), b->datasets_[i]->size()));
  return b;
}

Status BlendedDataset::sample_tokens(int64_t k, int64_t* out) const {
  MT_CHECK(k >= 0 && k < size(), "sample index out of range");
  return datasets_[dataset_index_[k]]->sample_tokens(dataset_sample_index_[k], out);
}

std::string BlendedDataset::describe() const {
  return fmt::format("BlendedDataset({} datasets, {} samples)", datasets_.size(), size());
}

// ---------------------------------------------------------------- builder

Result<std::array<std::shared_ptr<SampleSource>, 3>> build_train_valid_test(const DataConfig& cfg,
                                                                             const std::array<std::optional<int64_t>, 3>& num_samples,
                                                                             std::vector<std::string>* log,
                                                                             std::array<bool, 3> wanted) {
  std::array<std::shared_ptr<SampleSource>, 3> out;
  const bool per_split = !cfg.train_data_path.empty() || !cfg.valid_data_path.empty() || !cfg.test_data_path.empty();
  if ((per_split && !cfg.data_path.empty()) || (cfg.mock && (per_split || !cfg.data_path.empty())))
    return Status::invalid("give one of --mock-data, --data-path or --train/valid/test-data-path (a single data source must be provided)");
  if (!cfg.mock && !per_split && cfg.data_path.empty()) return Status::invalid("--data-path (or --mock-data) is required");
  if (cfg.gpt.seq_length < 2) return Status::invalid("--seq-length must be at least 2");
  auto note = [&](const std::string& s) {
    if (log && !s.empty()) log->push_back(s);
  };

  if (cfg.mock) {
    // Megatron: no blend means mock data, split "1,1,1", indices never cached.
    auto docs = std::make_shared<const MockDocuments>(cfg.mock_vocab_size, cfg.mock_eod);
    GptDatasetConfig g = cfg.gpt;
    g.no_cache = true;
    const auto ranges = split_ranges(*parse_split("1,1,1"), docs->num_sequences());
    for (int si = 0; si < 3; ++si) {
      if (!wanted[si] || !ranges[si] || ranges[si]->size() == 0) continue;
      std::string line;
      auto d = GptDataset::build(docs, static_cast<Split>(si), *ranges[si], num_samples[si], g, &line);
      if (!d) return d.status();
      note(line);
      out[si] = *d;
    }
    return out;
  }

  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened;
  auto open = [&](const std::string& prefix) -> Result<std::shared_ptr<const IndexedDataset>> {
    if (auto it = opened.find(prefix); it != opened.end()) return it->second;
    auto ds = IndexedDataset::open(prefix);
    if (!ds) return ds.status();
    auto p = std::make_shared<const IndexedDataset>(std::move(*ds));
    opened[prefix] = p;
    return p;
  };
  std::array<double, 3> split{1, 0, 0};
  if (!per_split) {
    auto s = parse_split(cfg.split);
    if (!s) return s.status();
    split = *s;
  }
  for (int si = 0; si < 3; ++si) {
    const Split which = static_cast<Split>(si);
    const std::vector<std::string>& args =
        per_split ? (si == 0 ? cfg.train_data_path : si == 1 ? cfg.valid_data_path : cfg.test_data_path) : cfg.data_path;
    if (args.empty() || !wanted[si]) continue;
    const std::string flag = per_split ? fmt::format("--{}-data-path", split_name(which)) : "--data-path";
    auto blend = parse_blend(args, flag);
    if (!blend) return blend.status();
    const std::optional<int64_t> N = num_samples[si];
    // One GPT dataset for prefix i asking for `n` samples; nullptr when the split is empty for it.
    auto one = [&](size_t i, std::optional<int64_t> n) -> Result<std::shared_ptr<GptDataset>> {
      auto ds = open(blend->prefixes[i]);
      if (!ds) return ds.status();
      IndexRange range{0, (*ds)->num_sequences()};
      if (!per_split) {
        auto r = split_ranges(split, (*ds)->num_sequences())[si];
        if (!r) return std::shared_ptr<GptDataset>();
        range = *r;
      }
      if (range.size() == 0) return std::shared_ptr<GptDataset>();
      std::string line;
      auto g = GptDataset::build(*ds, which, range, n, cfg.gpt, &line);
      if (!g) return g.status();
      note(line);
      return *g;
    };
    const size_t k = blend->prefixes.size();
    if (k == 1 && (blend->weights.empty() || per_split)) {
      auto g = one(0, N);
      if (!g) return g.status();
      out[si] = *g;
      continue;
    }
    std::vector<std::shared_ptr<SampleSource>> parts;
    std::vector<double> weights;
    std::optional<int64_t> size;
    int empty = 0;
    if (!blend->weights.empty()) {
      std::vector<std::optional<int64_t>> per(k);
      int64_t total = 0;
      if (N) {
        for (size_t i = 0; i < k; ++i) {
          const int64_t target = static_cast<int64_t>(std::ceil(static_cast<double>(*N) * blend->weights[i]));
          total += target;
          per[i] = static_cast<int64_t>(std::ceil(static_cast<double>(target) * (1 + cfg.mid_level_dataset_surplus)));
        }
        size = total;
      }
      for (size_t i = 0; i < k; ++i) {
        auto g = one(i, per[i]);
        if (!g) return g.status();
        if (!*g) ++empty;
        else parts.push_back(*g), weights.push_back(blend->weights[i]);
      }
      if (N == std::nullopt) weights.clear();
    } else {
      int64_t total = 0;
      for (size_t i = 0; i < k; ++i) {
        auto g = one(i, std::nullopt);
        if (!g) return g.status();
        if (!*g) {
          ++empty;
          continue;
        }
        parts.push_back(*g);
        total += (*g)->size();
      }
      for (const auto& p : parts) weights.push_back(total ? static_cast<double>(p->size()) / total : 0);
      if (N) size = std::min(*N, total);
    }
    if (parts.empty()) continue;
    if (empty > 0)
      return Status::invalid(fmt::format("{}: the {} split is empty for {} of the {} datasets; adjust --split", flag,
                                         split_name(which), empty, k));
    auto b = BlendedDataset::create(parts, size ? weights : std::vector<double>{}, size);
    if (!b) return b.status();
    note(fmt::format("blended {} datasets for {}: {} samples", parts.size(), split_name(which), (*b)->size()));
    out[si] = *b;
  }
  return out;
}

}  // namespace mt::data
