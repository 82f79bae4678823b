#include "data/tokenizer_flags.h"

namespace mt::data {

void register_tokenizer_flags(FlagSet& f, TokenizerConfig& c, bool with_model_flags) {
  f.section("tokenizer");
  f.add_string("tokenizer-type", &c.type,
               "GPT2BPETokenizer, SentencePieceTokenizer (also GPTSentencePieceTokenizer, Llama2Tokenizer), "
               "TikTokenizer, HuggingFaceTokenizer or NullTokenizer");
  if (with_model_flags) f.add_string("vocab-file", &c.vocab_file, "GPT-2 vocab.json (encoder.json)");
  f.add_string("merge-file", &c.merge_file, "GPT-2 merges.txt (vocab.bpe)");
  f.add_string("tokenizer-model", &c.tokenizer_model,
               "SentencePiece .model file; TikTokenizer's .json vocabulary; HuggingFaceTokenizer's directory "
               "(tokenizer.json)");
  if (with_model_flags)
    f.add_int("vocab-size", &c.vocab_size, "NullTokenizer vocabulary size; TikTokenizer's, specials included "
              "(default 131072)", 1, int64_t{1} << 31);
  f.add_int("null-tokenizer-eod-id", &c.null_eod_id, "NullTokenizer's EOD id (default: --vocab-size - 1)");
  f.add_int("null-tokenizer-pad-id", &c.null_pad_id, "NullTokenizer's pad id (default: -1, none)");
  f.add_choice("tiktoken-pattern", "TikTokenizer's pre-tokenisation pattern", {"v1", "v2"}, "v2",
               [&c](const std::string& v) { c.tiktoken_pattern = v; });
  f.add_int("tiktoken-num-special-tokens", &c.tiktoken_num_special_tokens,
            "TikTokenizer: ids 0..N-1 are special tokens", 1, int64_t{1} << 30);
  f.add_switch("tokenizer-hf-no-include-special-tokens", &c.hf_include_special_tokens,
               "HuggingFaceTokenizer: leave out the post-processor's tokens (BOS ...) when encoding", false);
  f.add_list("tokenizer-special-tokens", &c.special_tokens,
             "TikTokenizer's special tokens (must hold <unk> <s> </s> <mask> <pad> <cls> <sep>; the default)");
}

}  // namespace mt::data
