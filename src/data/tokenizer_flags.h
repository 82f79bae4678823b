#pragma once
// Megatron's tokenizer flags (--tokenizer-type, --vocab-file, --merge-file,
// --tokenizer-model, --vocab-size), shared by preprocess, train and generate.
#include "core/flags.h"
#include "data/tokenizer.h"

namespace mt::data {

// `with_vocab_size`: false where another flag group already owns
// --vocab-size (the model flags of train and plan).
void register_tokenizer_flags(FlagSet& flags, TokenizerConfig& cfg, bool with_vocab_size = true);

}  // namespace mt::data
