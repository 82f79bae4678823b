#pragma once
// Text generation: prefill the prompt into a Decoder's KV cache, then sample
// one token at a time (infer/sampling.h) until the end-of-document token or
// max_new_tokens.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "infer/decoder.h"
#include "infer/sampling.h"

namespace mt::infer {

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // --max-new-tokens
  SamplingOptions sampling;
  int32_t eod = -1;             // stop when this id is drawn (it is not returned); -1: never
  int64_t vocab_limit = 0;      // the tokenizer's vocabulary (ids above are padding); 0: the model's
};

enum class StopReason { kEod, kMaxNewTokens };
const char* stop_reason_name(StopReason r);  // "eod", "max-new-tokens"

struct GenerateResult {
  std::vector<int32_t> tokens;  // the continuation, without the prompt and without EOD
  StopReason stop = StopReason::kMaxNewTokens;
};

// Resets `dec`, prefills `prompt` (an empty prompt starts from `eod`, as
// GPT-2's unconditional samples do), then samples. on_token, when given, is
// called with each new token as soon as it is drawn (EOD excluded), so a CLI
// can stream text.
// Errors (kInvalidArgument, nothing generated): bad sampling options, an empty
// prompt without an eod id, or prompt + max_new_tokens above the decoder's
// capacity (naming --max-new-tokens and the largest value that fits).
Result<GenerateResult> generate(Decoder& dec, std::span<const int32_t> prompt, const GenerateOptions& opt,
                                const std::function<void(int32_t)>& on_token = {});

}  // namespace mt::infer
