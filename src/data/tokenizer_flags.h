#pragma once
// Megatron's tokenizer flags (--tokenizer-type, --vocab-file, --merge-file,
// --tokenizer-model, --vocab-size), shared by preprocess, train and generate.
#include "core/flags.h"
#include "data/tokenizer.h"

namespace mt::data {

// `with_model_flags`: false where the model flags (train, plan) already own
// --vocab-size and --vocab-file; the caller copies them into cfg after parsing.
void register_tokenizer_flags(FlagSet& flags, TokenizerConfig& cfg, bool with_model_flags = true);

}  // namespace mt::data
