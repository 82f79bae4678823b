#include "infer/generate.h"

#include <fmt/format.h>

namespace mt::infer {

const char* stop_reason_name(StopReason r) { return r == StopReason::kEod ? "eod" : "max-new-tokens"; }

Result<GenerateResult> generate(Decoder& dec, std::span<const int32_t> prompt_in, const GenerateOptions& opt,
                                const std::function<void(int32_t)>& on_token) {
  MT_RETURN_IF_ERROR(opt.sampling.validate());
  if (opt.max_new_tokens < 0)
    return Status::invalid(fmt::format("--max-new-tokens {} must be >= 0", opt.max_new_tokens));
  std::vector<int32_t> prompt(prompt_in.begin(), prompt_in.end());
  if (prompt.empty()) {
    if (opt.eod < 0) return Status::invalid("--prompt is empty and the tokenizer has no end-of-document id to start from");
    prompt.push_back(opt.eod);
  }
  const int64_t P = static_cast<int64_t>(prompt.size());
  // The last drawn token is never fed back, so P + max_new - 1 positions suffice.
  if (P + std::max<int64_t>(opt.max_new_tokens - 1, 0) > dec.capacity()) {
    if (P > dec.capacity())
      return Status::invalid(fmt::format("--prompt has {} tokens, more than the model's {} positions", P, dec.capacity()));
    return Status::invalid(fmt::format("--max-new-tokens {}: the prompt's {} tokens leave room for at most {} new "
                                       "tokens in the model's {} positions",
                                       opt.max_new_tokens, P, dec.capacity() - P + 1, dec.capacity()));
  }
  // Logits of one position, in the model's dtype.
  std::vector<double> storage(static_cast<size_t>(dec.vocab()));
  const DType dt = dec.model().options().dtype;
  Tensor logits(storage.data(), {dec.vocab()}, dt);  // fp32 uses the first half of the buffer
  Sampler sampler(opt.sampling);
  GenerateResult res;
  dec.reset();
  if (opt.max_new_tokens == 0) return res;
  MT_RETURN_IF_ERROR(dec.append(prompt, logits));
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t t = sampler.sample(logits, opt.vocab_limit);
    if (t == opt.eod) {
      res.stop = StopReason::kEod;
      return res;
    }
    res.tokens.push_back(t);
    if (on_token) on_token(t);
    if (i + 1 < opt.max_new_tokens) MT_RETURN_IF_ERROR(dec.append(std::span<const int32_t>(&t, 1), logits));
  }
  res.stop = StopReason::kMaxNewTokens;
  return res;
}

}  // namespace mt::infer
