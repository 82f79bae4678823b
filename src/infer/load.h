#pragma once
// A model and its tokenizer rebuilt from a checkpoint that `megatron train`
// wrote (checkpoint/checkpoint.h): common.json's "args" carries the training
// command line, from which the ModelConfig and the tokenizer configuration
// are parsed with the trainer's own flag set (train/train_config.h), exactly
// as training resolved them (the vocabulary size comes from the tokenizer,
// NullTokenizer's from --vocab-size). The parameters are then read by global
// name (checkpoint::load_training_state), so any saved layout loads.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

namespace mt::infer {

struct LoadOptions {
  std::optional<int64_t> iteration;  // default: the tracker's
  // Non-empty fields replace the checkpoint's (tokenizer files moved since training).
  std::string vocab_file, merge_file, tokenizer_model;
};

struct LoadedModel {
  std::unique_ptr<model::GPTModel> model;  // parameters only (GPTOptions::slots = 0), fp32
  std::unique_ptr<data::Tokenizer> tokenizer;
  data::TokenizerConfig tokenizer_config;  // as resolved (files after LoadOptions' replacements)
  bool bf16 = false;                       // trained with --bf16
  bool fp16 = false;                       // trained with --fp16
  int64_t iteration = 0;
  std::string directory;  // .../iter_0000020
};

// The ModelConfig and tokenizer a training command line describes, resolved
// as training resolves them (the vocabulary from the tokenizer; the padded
// vocabulary of the run's TP size kept, so every stored row has a place).
// `where` names the source in errors.
struct RebuiltConfig {
  model::ModelConfig model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  data::TokenizerConfig tokenizer_config;
  bool bf16 = false, fp16 = false;
};
Result<RebuiltConfig> config_from_training_argv(const std::vector<std::string>& argv, const std::string& where,
                                                const LoadOptions& opt = {});

// Errors: the checkpoint's (kNotFound/kCorrupt naming the directory and
// file), a training command line that no longer parses (naming the flag), a
// tokenizer file that cannot be opened (naming the flag to override it with),
// or parameters whose names or shapes do not match the rebuilt model.
Result<LoadedModel> load_for_generation(const std::string& load_dir, const LoadOptions& opt = {});

}  // namespace mt::infer
