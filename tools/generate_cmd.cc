// megatron generate: text from a checkpoint that `megatron train` wrote, with
// a KV cache (infer/decoder.h) and Megatron-style sampling (infer/sampling.h).

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "core/flags.h"
#include "infer/generate.h"
#include "infer/load.h"

namespace mt::tools {

namespace {

// Bytes of `s` that may be printed now: all but a trailing U+FFFD, which may
// be a multi-byte character whose remaining bytes come with the next token.
size_t stable_prefix(const std::string& s) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (s.size() >= 3 && std::string_view(s).substr(s.size() - 3) == kReplacement) return s.size() - 3;
  return s.size();
}

}  // namespace

int generate_main(const std::vector<std::string>& args) {
  std::string load, prompt;
  int64_t max_new_tokens = 64;
  std::optional<int64_t> ckpt_step;
  infer::SamplingOptions so;
  int64_t seed = 1234;
  infer::LoadOptions lo;
  bool help = false;
  FlagSet flags("megatron generate",
                "Continues a prompt with a model trained by `megatron train`, using a KV cache.\n"
                "Greedy with --temperature 0 or --top-k 1; otherwise samples (top-k or top-p, not both, as in Megatron) with --seed.\n"
                "Exit code 0: done; 2: bad flags or checkpoint; 1: a runtime failure.");
  flags.section("generation");
  flags.add_string("load", &load, "checkpoint directory written by megatron train --save (required)");
  flags.add_int("ckpt-step", &ckpt_step, "iteration to load (default: the latest)", 0, INT64_MAX);
  flags.add_string("prompt", &prompt, "text to continue (required; \"\" starts from the end-of-document token)");
  flags.add_int("max-new-tokens", &max_new_tokens,
                "tokens to generate at most (stops earlier at end-of-document); the default also stops at the model's "
                "last position", 0,
                int64_t{1} << 30);
  flags.add_double("temperature", &so.temperature, "softmax temperature; 0 is greedy", 0, 1e6);
  flags.add_int("top-k", &so.top_k, "sample among the k most probable tokens (0: off, 1: greedy)", 0, int64_t{1} << 31);
  flags.add_double("top-p", &so.top_p, "sample among the smallest set of tokens with probability mass >= p (0: off)", 0, 1);
  flags.add_int("seed", &seed, "random seed of the sampler (Philox)", 0, INT64_MAX);
  flags.section("tokenizer files (when they moved since training)");
  flags.add_string("vocab-file", &lo.vocab_file, "GPT-2 vocab.json instead of the training run's");
  flags.add_string("merge-file", &lo.merge_file, "GPT-2 merges.txt instead of the training run's");
  flags.add_string("tokenizer-model", &lo.tokenizer_model, "SentencePiece .model instead of the training run's");
  flags.add_switch("help", &help, "show this help");
  if (Status st = flags.parse(args); !st) {
    std::fprintf(stderr, "megatron generate: error: %s\n", st.message().c_str());
    return 2;
  }
  if (help) {
    std::fputs(flags.help().c_str(), stdout);
    return 0;
  }
  std::vector<std::string> missing;
  if (load.empty()) missing.push_back("--load DIR");
  if (!flags.given("prompt")) missing.push_back("--prompt TEXT");
  if (!missing.empty()) {
    std::fprintf(stderr, "megatron generate: error: missing %s%s%s\n", missing[0].c_str(),
                 missing.size() > 1 ? " and " : "", missing.size() > 1 ? missing[1].c_str() : "");
    return 2;
  }
  so.seed = static_cast<uint64_t>(seed);
  if (Status st = so.validate(); !st) {
    std::fprintf(stderr, "megatron generate: error: %s\n", st.message().c_str());
    return 2;
  }
  lo.iteration = ckpt_step;
  auto loaded = infer::load_for_generation(load, lo);
  if (!loaded) {
    std::fprintf(stderr, "megatron generate: error: %s\n", loaded.status().message().c_str());
    return loaded.status().code() == StatusCode::kIoError || loaded.status().code() == StatusCode::kInternal ? 1 : 2;
  }
  auto dec = infer::Decoder::create(*loaded->model);
  if (!dec) {
    std::fprintf(stderr, "megatron generate: error: %s\n", dec.status().message().c_str());
    return 2;
  }
  const data::Tokenizer& tok = *loaded->tokenizer;
  std::vector<int32_t> ids;
  // As `megatron tokenize` does: a prompt Megatron's tokenizer refuses
  // (invalid UTF-8; NullTokenizer: a word that is not an id of the
  // vocabulary) is an error, not silently dropped ids.
  if (Status st = tok.encode_checked(prompt, &ids); !st) {
    std::fprintf(stderr, "megatron generate: error: --prompt: %s\n", st.message().c_str());
    return 2;
  }
  infer::GenerateOptions go;
  go.max_new_tokens = max_new_tokens;
  // Without --max-new-tokens, the default stops where the model's positions end.
  const int64_t room = (*dec)->capacity() - std::max<int64_t>(1, static_cast<int64_t>(ids.size())) + 1;
  if (!flags.given("max-new-tokens") && room > 0) go.max_new_tokens = std::min(max_new_tokens, room);
  go.sampling = so;
  go.eod = tok.eod();
  go.vocab_limit = tok.vocab_size();
  std::fprintf(stderr, "megatron generate: %s (iteration %lld), prompt of %zu tokens, %s\n", loaded->directory.c_str(),
               static_cast<long long>(loaded->iteration), ids.size(),
               so.greedy() ? "greedy" : "sampling");
  // Stream the continuation: re-decode what was generated and print the new,
  // complete characters.
  std::vector<int32_t> out;
  size_t printed = 0;
  Status stream_error;
  auto on_token = [&](int32_t t) {
    out.push_back(t);
    auto text = tok.decode(out);
    if (!text) {
      stream_error = text.status();
      return;
    }
    const size_t n = stable_prefix(*text);
    if (n > printed) {
      std::fwrite(text->data() + printed, 1, n - printed, stdout);
      std::fflush(stdout);
      printed = n;
    }
  };
  auto res = infer::generate(**dec, ids, go, on_token);
  if (!res) {
    std::fprintf(stderr, "megatron generate: error: %s\n", res.status().message().c_str());
    return 2;
  }
  if (!stream_error) {
    std::fprintf(stderr, "megatron generate: error: %s\n", stream_error.message().c_str());
    return 1;
  }
  auto text = tok.decode(out);
  if (text && text->size() > printed) std::fwrite(text->data() + printed, 1, text->size() - printed, stdout);
  std::fputc('\n', stdout);
  std::fprintf(stderr, "megatron generate: %zu new tokens, stopped at %s\n", res->tokens.size(),
               infer::stop_reason_name(res->stop));
  return 0;
}

}  // namespace mt::tools
