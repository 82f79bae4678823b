#include "data/preprocess.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "data/indexed_dataset.h"
#include "data/jsonl.h"

namespace mt::data {

std::string output_name(const std::string& prefix, const std::string& key) {
  return fmt::format("{}_{}_document", prefix, key);
}

namespace {

// The tokenized documents of one batch, for every key.
struct BatchResult {
  int64_t index = 0;
  Status error;                       // the first fatal line error, in line order
  int64_t lines = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> line_numbers;  // global 0-based line index of each kept document
  struct Key {
    std::vector<int32_t> tokens;      // all documents' tokens
    std::vector<int32_t> lengths;     // all documents' sequence lengths
    std::vector<uint32_t> doc_seqs;   // sequences per document
    std::vector<uint32_t> doc_extra;  // tokens after the last sequence (legacy uncounted EOD)
  };
  std::vector<Key> keys;
  std::vector<std::string> skipped;   // "file:line: why"
};

class Pipeline {
 public:
  Pipeline(const Tokenizer& tok, const PreprocessOptions& o) : tok_(tok), o_(o) {}

  Result<PreprocessStats> run(std::FILE* progress);

 private:
  void reader_loop();
  void worker_loop();
  void process(LineBatch& b, BatchResult& r, JsonTextExtractor& json);
  void stop_all();

  const Tokenizer& tok_;
  const PreprocessOptions& o_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LineBatch> work_;
  std::map<int64_t, BatchResult> done_;
  bool reader_done_ = false, stop_ = false;
  int64_t batches_total_ = -1;     // known when the reader finishes
  int64_t next_to_write_ = 0;
  Status reader_error_;
  std::atomic<uint64_t> disk_read_{0}, disk_total_{0};
};

void Pipeline::stop_all() {
  std::lock_guard<std::mutex> l(mu_);
  stop_ = true;
  cv_.notify_all();
}

void Pipeline::reader_loop() {
  int64_t index = 0;
  uint64_t finished_bytes = 0;
  const int64_t max_ahead = 2 * std::max(1, o_.workers) + 2;
  for (const auto& path : o_.inputs) {
    auto reader = LineReader::open(path);
    if (!reader) {
      std::lock_guard<std::mutex> l(mu_);
      reader_error_ = reader.status();
      break;
    }
    for (;;) {
      LineBatch b;
      // A line is held whole: one too long for memory is an error naming
      // the file and where it was, not an escaped std::bad_alloc that
      // would end the process without removing the output's temporaries.
      auto next = [&]() -> Result<bool> {
        try {
          return (*reader)->next(o_.batch_bytes, &b);
        } catch (const std::bad_alloc&) {
          return Status::invalid(fmt::format("{}: a line around byte {} does not fit in memory: split such documents "
                                             "into several lines",
                                             path, (*reader)->bytes_read()));
        }
      };
      auto more = next();
      if (!more) {
        std::lock_guard<std::mutex> l(mu_);
        reader_error_ = more.status();
        goto finish;
      }
      disk_read_ = finished_bytes + (*reader)->bytes_read();
      if (!*more) break;
      b.index = index++;
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || b.index - next_to_write_ < max_ahead; });
      if (stop_) return;
      work_.push_back(std::move(b));
      cv_.notify_all();
    }
    finished_bytes += (*reader)->file_size();
  }
finish:
  std::lock_guard<std::mutex> l(mu_);
  reader_done_ = true;
  batches_total_ = index;
  cv_.notify_all();
}

void Pipeline::process(LineBatch& b, BatchResult& r, JsonTextExtractor& json) {
  r.index = b.index;
  r.lines = static_cast<int64_t>(b.lines.size());
  r.keys.resize(o_.json_keys.size());
  std::vector<std::vector<std::string>> texts;
  std::vector<std::vector<std::vector<int32_t>>> tokenized;  // [key][sentence] ids
  std::vector<int32_t> ids;
  for (size_t li = 0; li < b.lines.size(); ++li) {
    const auto [off, len] = b.lines[li];
    r.bytes += len + 1;
    Status st = json.extract(b.data.data() + off, len, b.data.size() - off, o_.json_keys, &texts);
    if (!st) {
      std::string where = fmt::format("{}:{}: {}", b.file, b.first_line + static_cast<int64_t>(li), st.message());
      if (!o_.skip_bad_lines) {
        r.error = Status::invalid(where + " (use --skip-bad-lines to skip such lines)");
        return;
      }
      r.skipped.push_back(std::move(where));
      continue;
    }
    // Tokenize every key first, so a line the tokenizer refuses (Megatron's
    // Python path stops on it too) leaves nothing half-added.
    tokenized.assign(o_.json_keys.size(), {});
    Status tok_st;
    for (size_t k = 0; k < o_.json_keys.size() && tok_st.is_ok(); ++k)
      for (const auto& sentence : texts[k]) {
        ids.clear();
        tok_st = tok_.encode_checked(sentence, &ids);
        if (!tok_st) break;
        tokenized[k].push_back(ids);
      }
    if (!tok_st) {
      std::string where = fmt::format("{}:{}: {}", b.file, b.first_line + static_cast<int64_t>(li), tok_st.message());
      if (!o_.skip_bad_lines) {
        r.error = Status::invalid(where + " (use --skip-bad-lines to skip such lines)");
        return;
      }
      r.skipped.push_back(std::move(where));
      continue;
    }
    r.line_numbers.push_back(static_cast<int64_t>(li));
    for (size_t k = 0; k < o_.json_keys.size(); ++k) {
      auto& out = r.keys[k];
      const size_t first_len = out.lengths.size();
      for (const auto& sentence_ids : tokenized[k]) {
        if (sentence_ids.empty()) continue;  // Megatron drops sentences with no tokens
        out.tokens.insert(out.tokens.end(), sentence_ids.begin(), sentence_ids.end());
        out.lengths.push_back(static_cast<int32_t>(sentence_ids.size()));
      }
      const bool any = out.lengths.size() > first_len;
      uint32_t extra = 0;
      if (any && o_.append_eod) {
        out.tokens.push_back(tok_.eod());
        if (o_.legacy_uncounted_eod) extra = 1;
        else out.lengths.back() += 1;
      }
      out.doc_seqs.push_back(static_cast<uint32_t>(out.lengths.size() - first_len));
      out.doc_extra.push_back(extra);
    }
  }
}

void Pipeline::worker_loop() {
  JsonTextExtractor json;
  for (;;) {
    LineBatch b;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !work_.empty() || reader_done_; });
      if (stop_) return;
      if (work_.empty()) return;  // reader done and nothing left
      b = std::move(work_.front());
      work_.pop_front();
    }
    BatchResult r;
    try {
      process(b, r, json);
    } catch (const std::bad_alloc&) {
      r.error = Status::invalid(fmt::format("{}: lines {} to {}: tokenizing them does not fit in memory: split such "
                                            "documents into several lines",
                                            b.file, b.first_line, b.first_line + static_cast<int64_t>(b.lines.size()) - 1));
    }
    std::lock_guard<std::mutex> l(mu_);
    done_.emplace(r.index, std::move(r));
    cv_.notify_all();
  }
}

Result<PreprocessStats> Pipeline::run(std::FILE* progress) {
  PreprocessStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  const int P = std::max(1, o_.partitions);
  const DType dtype = optimal_dtype(tok_.vocab_size());
  for (const auto& path : o_.inputs) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) disk_total_ += static_cast<uint64_t>(st.st_size);
  }

  // With keep_sequential_samples Megatron cuts the lines into P contiguous
  // blocks of ceil(total / P); that needs the line count first.
  int64_t block = 0;
  if (P > 1 && o_.keep_sequential_samples) {
    int64_t total = 0;
    for (const auto& path : o_.inputs) {
      auto reader = LineReader::open(path);
      if (!reader) return reader.status();
      LineBatch b;
      for (;;) {
        auto more = (*reader)->next(1 << 22, &b);
        if (!more) return more.status();
        if (!*more) break;
        total += static_cast<int64_t>(b.lines.size());
      }
    }
    block = std::max<int64_t>(1, (total + P - 1) / P);
  }

  // One writer per (partition, key); partitions are merged at the end.
  std::vector<std::vector<std::unique_ptr<IndexedDatasetWriter>>> writers(P);
  auto part_prefix = [&](int p, size_t k) {
    return P == 1 ? output_name(o_.output_prefix, o_.json_keys[k])
                  : fmt::format("{}.partition{}.tmp.{}", output_name(o_.output_prefix, o_.json_keys[k]), p, getpid());
  };
  for (int p = 0; p < P; ++p)
    for (size_t k = 0; k < o_.json_keys.size(); ++k) {
      auto w = IndexedDatasetWriter::create(part_prefix(p, k), dtype, o_.legacy_uncounted_eod);
      if (!w) return w.status();
      writers[p].push_back(std::move(*w));
    }

  std::thread reader([this] { reader_loop(); });
  std::vector<std::thread> workers;
  for (int i = 0; i < std::max(1, o_.workers); ++i) workers.emplace_back([this] { worker_loop(); });
  auto join_all = [&] {
    stop_all();
    reader.join();
    for (auto& w : workers) w.join();
  };

  Status failure;
  int64_t global_line = 0, next_log = o_.log_interval > 0 ? o_.log_interval : INT64_MAX;
  for (;;) {
    BatchResult r;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] {
        return done_.count(next_to_write_) || (reader_done_ && batches_total_ == next_to_write_) ||
               (reader_done_ && !reader_error_.is_ok() && work_.empty() && done_.empty());
      });
      auto it = done_.find(next_to_write_);
      if (it == done_.end()) {
        if (!reader_error_.is_ok()) failure = reader_error_;
        break;
      }
      r = std::move(it->second);
      done_.erase(it);
      ++next_to_write_;
      cv_.notify_all();
    }
    if (!r.error.is_ok()) {
      failure = r.error;
      break;
    }
    stats.lines += r.lines;
    stats.input_bytes += r.bytes;
    stats.skipped_lines += static_cast<int64_t>(r.skipped.size());
    for (auto& s : r.skipped)
      if (stats.skipped_examples.size() < 5) stats.skipped_examples.push_back(std::move(s));
    std::vector<size_t> tok_pos(r.keys.size(), 0), len_pos(r.keys.size(), 0);
    for (size_t d = 0; d < r.line_numbers.size(); ++d) {
      const int64_t line = global_line + r.line_numbers[d];
      const int p = P == 1 ? 0 : o_.keep_sequential_samples ? static_cast<int>(std::min<int64_t>(line / block, P - 1))
                                                            : static_cast<int>(line % P);
      for (size_t k = 0; k < r.keys.size(); ++k) {
        auto& key = r.keys[k];
        const uint32_t nseq = key.doc_seqs[d];
        std::span<const int32_t> lengths(key.lengths.data() + len_pos[k], nseq);
        size_t ntok = key.doc_extra[d];
        for (int32_t l : lengths) ntok += static_cast<size_t>(l);
        Status st = writers[p][k]->add_document(std::span<const int32_t>(key.tokens.data() + tok_pos[k], ntok), lengths);
        if (!st) {
          failure = st;
          break;
        }
        tok_pos[k] += ntok;
        len_pos[k] += nseq;
        if (k == 0) {
          stats.tokens += static_cast<int64_t>(ntok);
          if (nseq == 0) ++stats.empty_documents;
        }
      }
      if (!failure.is_ok()) break;
      ++stats.documents;
    }
    if (!failure.is_ok()) break;
    global_line += r.lines;
    if (progress && stats.documents >= next_log) {
      while (next_log <= stats.documents) next_log += o_.log_interval;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double mbs = stats.input_bytes / 1e6 / std::max(secs, 1e-9);
      std::string eta;
      const double frac = disk_total_ ? static_cast<double>(disk_read_) / disk_total_ : 0;
      if (frac > 0 && frac < 1) eta = fmt::format(", {:.0f}% of input, ETA {:.0f} s", frac * 100, secs * (1 - frac) / frac);
      std::fprintf(progress, "Processed %lld documents (%.0f docs/s, %.2f MB/s)%s\n", static_cast<long long>(stats.documents),
                   stats.documents / std::max(secs, 1e-9), mbs, eta.c_str());
      std::fflush(progress);
    }
  }
  join_all();
  if (!failure.is_ok()) return failure;  // writers' destructors remove the temporaries

  // Finalize: single partition directly; several are merged in order.
  for (size_t k = 0; k < o_.json_keys.size(); ++k) {
    const std::string final_prefix = output_name(o_.output_prefix, o_.json_keys[k]);
    if (P == 1) {
      MT_RETURN_IF_ERROR(writers[0][k]->finalize());
    } else {
      auto merged = IndexedDatasetWriter::create(final_prefix, dtype, o_.legacy_uncounted_eod);
      if (!merged) return merged.status();
      for (int p = 0; p < P; ++p) {
        MT_RETURN_IF_ERROR(writers[p][k]->finalize());
        auto part = IndexedDataset::open(part_prefix(p, k));
        if (!part) return part.status();
        Status st = (*merged)->add_index(*part);
        ::unlink((part_prefix(p, k) + ".bin").c_str());
        ::unlink((part_prefix(p, k) + ".idx").c_str());
        MT_RETURN_IF_ERROR(st);
      }
      MT_RETURN_IF_ERROR((*merged)->finalize());
    }
    stats.outputs.push_back(final_prefix);
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace

Result<PreprocessStats> preprocess(const Tokenizer& tokenizer, const PreprocessOptions& opts, std::FILE* progress) {
  if (opts.inputs.empty()) return Status::invalid("--input: no input files");
  if (opts.json_keys.empty()) return Status::invalid("--json-keys: at least one key is needed");
  Pipeline p(tokenizer, opts);
  return p.run(progress);
}

}  // namespace mt::data
