#include "data/tokenizer_flags.h"

namespace mt::data {

void register_tokenizer_flags(FlagSet& f, TokenizerConfig& c, bool with_model_flags) {
  f.section("tokenizer");
  f.add_string("tokenizer-type", &c.type,
               "GPT2BPETokenizer, SentencePieceTokenizer (also GPTSentencePieceTokenizer, Llama2Tokenizer) or NullTokenizer");
  if (with_model_flags) f.add_string("vocab-file", &c.vocab_file, "GPT-2 vocab.json (encoder.json)");
  f.add_string("merge-file", &c.merge_file, "GPT-2 merges.txt (vocab.bpe)");
  f.add_string("tokenizer-model", &c.tokenizer_model, "SentencePiece .model file");
  if (with_model_flags) f.add_int("vocab-size", &c.vocab_size, "NullTokenizer vocabulary size", 1, int64_t{1} << 31);
}

}  // namespace mt::data
