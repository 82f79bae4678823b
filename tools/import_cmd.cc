// megatron import: a Hugging Face transformers model directory (GPT-2,
// LLaMA, Qwen2; checkpoint/hf.h) as a checkpoint that `megatron train`
// (--finetune), `generate` and `export` load, under any parallel layout.

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "commands.h"
#include "core/flags.h"
#include "data/hf_tokenizer.h"
#include "infer/load.h"
#include "model/gpt.h"

namespace mt::tools {

namespace fs = std::filesystem;

int import_main(const std::vector<std::string>& args) {
  std::string hf, save, tokenizer_type, vocab_file, merge_file, tokenizer_model;
  std::optional<int64_t> seq_length, divisible_by;
  bool help = false;
  FlagSet flags("megatron import",
                "Reads a Hugging Face transformers model directory (config.json, model.safetensors or its shards) of\n"
                "GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM and writes it as a\n"
                "megatron-cpp checkpoint "
                "(iteration 0) with the equivalent Megatron model flags. Then: megatron generate --load SAVE, or\n"
                "megatron train --load SAVE --finetune with the model flags it prints, under any parallel layout.\n"
                "The tokenizer is found in the directory (GPT-2: vocab.json + merges.txt; tokenizer.model: SentencePiece)\n"
                "unless --tokenizer-type says; otherwise NullTokenizer over the vocabulary (EOD: eos_token_id).\n"
                "Exit code 0: written; 2: bad flags, files or a model no Megatron flag describes; 1: I/O.");
  flags.section("import");
  flags.add_string("hf", &hf, "the transformers model directory (required)");
  flags.add_string("save", &save, "new checkpoint directory (required; must not hold a checkpoint)");
  flags.add_int("seq-length", &seq_length, "--seq-length stored with the model (default: its max_position_embeddings, at most 4096)",
                1, int64_t{1} << 24);
  flags.add_int("make-vocab-size-divisible-by", &divisible_by, "Megatron's vocabulary padding multiple (default 128)", 1,
                int64_t{1} << 20);
  flags.section("tokenizer (default: found in --hf)");
  flags.add_string("tokenizer-type", &tokenizer_type, "GPT2BPETokenizer, SentencePieceTokenizer or NullTokenizer");
  flags.add_string("vocab-file", &vocab_file, "GPT-2 vocab.json");
  flags.add_string("merge-file", &merge_file, "GPT-2 merges.txt");
  flags.add_string("tokenizer-model", &tokenizer_model, "SentencePiece .model file");
  flags.add_switch("help", &help, "show this help");
  auto error = [](const std::string& m, int code = 2) {
    std::fprintf(stderr, "megatron import: error: %s\n", m.c_str());
    return code;
  };
  if (Status st = flags.parse(args); !st) return error(st.message());
  if (help) {
    std::fputs(flags.help().c_str(), stdout);
    return 0;
  }
  if (hf.empty() || save.empty())
    return error(hf.empty() && save.empty() ? "missing --hf DIR and --save DIR" : hf.empty() ? "missing --hf DIR" : "missing --save DIR");
  std::error_code ec;
  const fs::path dir = fs::absolute(hf, ec);
  auto tracker = checkpoint::read_tracker(save);
  if (!tracker) return error(tracker.status().message());
  if (*tracker)
    return error(fmt::format("--save {} already holds a checkpoint (iteration {}): choose a new directory (nothing "
                             "there is overwritten)",
                             save, **tracker));

  // config.json -> Megatron's model flags.
  const fs::path cfg_path = dir / "config.json";
  auto cfg_read = checkpoint::hf_read_json(cfg_path.string());
  if (!cfg_read)
    return error(cfg_read.status().code() == StatusCode::kNotFound ? fmt::format("--hf {}: no config.json there", hf)
                                                                    : cfg_read.status().message());
  const nlohmann::json& cfg = *cfg_read;
  auto model_flags = checkpoint::hf_import_flags(cfg, cfg_path.string());
  if (!model_flags) return error(model_flags.status().message());
  std::vector<std::string> argv = model_flags->flags;
  // DeepSeek-V3's num_nextn_predict_layers without the MTP layers' tensors
  // (files published without them): the model without them, noted.
  std::vector<std::string> notes;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] != "--mtp-num-layers") continue;
    int64_t layers = 0;
    for (size_t k = 0; k + 1 < argv.size(); ++k)
      if (argv[k] == "--num-layers") layers = std::stoll(argv[k + 1]);
    auto names = checkpoint::hf_tensor_names(dir.string());
    if (!names) return error(names.status().message(), names.status().code() == StatusCode::kIoError ? 1 : 2);
    const std::string first = fmt::format("model.layers.{}.eh_proj.weight", layers);
    if (!names->count(first)) {
      notes.push_back(fmt::format("config.json has num_nextn_predict_layers {} but the files have no {}: imported "
                                  "without the multi-token prediction layers",
                                  argv[i + 1], first));
      argv.erase(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    }
    break;
  }

  // The tokenizer.
  auto here = [&](const char* f) { return fs::exists(dir / f, ec); };
  auto abs = [&](const std::string& p) { return fs::absolute(p, ec).string(); };
  if (tokenizer_type.empty() && (!vocab_file.empty() || !merge_file.empty() || !tokenizer_model.empty()))
    return error("--vocab-file/--merge-file/--tokenizer-model need --tokenizer-type (which tokenizer reads them)");
  if (tokenizer_type.empty()) {
    // GPT-2's byte-level BPE only for GPT-2 itself: other models' vocab.json
    // pairs with pre-tokenisers (and added tokens) GPT2BPETokenizer lacks.
    if (model_flags->arch == checkpoint::HfArch::kGpt2 && here("vocab.json") && here("merges.txt")) {
      tokenizer_type = "GPT2BPETokenizer";
      vocab_file = (dir / "vocab.json").string(), merge_file = (dir / "merges.txt").string();
    } else if (here("tokenizer.model")) {
      tokenizer_type = "SentencePieceTokenizer";
      tokenizer_model = (dir / "tokenizer.model").string();
    } else if (auto hft = here("tokenizer.json") ? data::HfTokenizer::load(dir.string())
                                                  : Result<std::unique_ptr<data::HfTokenizer>>(Status::not_found(""));
               hft) {
      tokenizer_type = "HuggingFaceTokenizer";
      tokenizer_model = dir.string();
    } else {
      if (here("tokenizer.json"))
        notes.push_back(fmt::format("tokenizer.json is not read: {}", hft.status().message()));
      tokenizer_type = "NullTokenizer";
      notes.push_back(fmt::format("no tokenizer this build reads in {} (GPT-2's vocab.json + merges.txt, a "
                                  "SentencePiece tokenizer.model or a byte-level BPE tokenizer.json): NullTokenizer "
                                  "over {} ids; give --tokenizer-type "
                                  "and its files for text",
                                  hf, model_flags->vocab_size));
    }
  }
  argv.insert(argv.end(), {"--tokenizer-type", tokenizer_type});
  if (tokenizer_type == "NullTokenizer") {
    argv.insert(argv.end(), {"--vocab-size", std::to_string(model_flags->vocab_size)});
    // The model's end-of-sequence id as EOD (NullTokenizer's default is the last id).
    if (cfg.contains("eos_token_id") && cfg["eos_token_id"].is_number_integer()) {
      const int64_t eos = cfg["eos_token_id"].get<int64_t>();
      if (eos >= 0 && eos < model_flags->vocab_size && eos != model_flags->vocab_size - 1)
        argv.insert(argv.end(), {"--null-tokenizer-eod-id", std::to_string(eos)});
    }
  }
  if (!vocab_file.empty()) argv.insert(argv.end(), {"--vocab-file", abs(vocab_file)});
  if (!merge_file.empty()) argv.insert(argv.end(), {"--merge-file", abs(merge_file)});
  if (!tokenizer_model.empty()) argv.insert(argv.end(), {"--tokenizer-model", abs(tokenizer_model)});
  // --seq-length: the given one, else the model's positions up to 4096.
  int64_t max_pos = 0;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "--max-position-embeddings") max_pos = std::stoll(argv[i + 1]);  // written by hf_import_flags
  int64_t seq = seq_length.value_or(std::min<int64_t>(max_pos, 4096));
  if (model_flags->max_seq_length) {
    if (seq_length && *seq_length > *model_flags->max_seq_length)
      return error(fmt::format("--seq-length {}: the model's sliding window is {} tokens and attention here is full "
                               "causal, the same only up to the window; use --seq-length {} or less",
                               *seq_length, *model_flags->max_seq_length, *model_flags->max_seq_length));
    seq = std::min(seq, *model_flags->max_seq_length);
    notes.push_back(fmt::format("sliding_window {}: the imported model equals the original on sequences of up to {} "
                                "tokens; keep --seq-length at most that when training it",
                                *model_flags->max_seq_length, *model_flags->max_seq_length));
  }
  argv.insert(argv.end(), {"--seq-length", std::to_string(seq)});
  if (cfg.contains("torch_dtype") && cfg["torch_dtype"] == "bfloat16") argv.push_back("--bf16");
  // float16 weights say how the model was stored, not how to train it (many
  // Hub models are float16): fine-tuning stays fp32 unless asked.
  if (cfg.contains("torch_dtype") && cfg["torch_dtype"] == "float16")
    notes.push_back("the weights are float16: the fine-tune command trains in fp32; add --bf16, or --fp16 (with "
                    "Megatron's loss scaling), for 16-bit training");
  if (divisible_by) argv.insert(argv.end(), {"--make-vocab-size-divisible-by", std::to_string(*divisible_by)});

  auto rebuilt = infer::config_from_training_argv(argv, "megatron import");
  if (!rebuilt) return error(rebuilt.status().message());
  model::GPTOptions mo;
  mo.slots = 0;  // parameters only
  mo.seq_length = rebuilt->model.seq_length;
  auto m = model::GPTModel::create(rebuilt->model, mo);
  if (!m) return error(m.status().message());
  if (Status st = checkpoint::hf_import_weights(dir.string(), model_flags->arch, **m, &notes); !st)
    return error(st.message(), st.code() == StatusCode::kIoError ? 1 : 2);

  nlohmann::json common{{"iteration", 0},
                        {"consumed_train_samples", 0},
                        {"consumed_valid_samples", 0},
                        {"num_floating_point_operations_so_far", 0.0},
                        {"imported_from", dir.string()},
                        {"args", {{"argv", argv}, {"seed", 1234}, {"gelu", rebuilt->model.gelu_tanh() ? "tanh" : "erf"}}}};
  const auto slices = checkpoint::training_state_slices(**m, nullptr);
  if (Status st = checkpoint::save_checkpoint(save, 0, slices, common, 0, 1); !st)
    return error(st.message(), st.code() == StatusCode::kIoError ? 1 : 2);
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  int64_t params = 0;
  for (const auto& p : (*m)->params()) params += p.numel();
  std::printf("imported %s (%s, %lld parameters, vocabulary %lld padded to %lld) into %s, iteration 0\n", hf.c_str(),
              checkpoint::hf_arch_name(model_flags->arch), static_cast<long long>(params),
              static_cast<long long>(rebuilt->tokenizer->vocab_size()), static_cast<long long>((*m)->vocab()),
              save.c_str());
  // Megatron's --use-checkpoint-args does not take every model flag (the
  // norm epsilon, RoPE scaling, the GELU form, the tokenizer files): the
  // fine-tuning command spells them all out.
  std::string all;
  for (const auto& t : argv) all += " " + (t.find(' ') == std::string::npos ? t : "'" + t + "'");
  std::printf("generate: megatron generate --load %s --prompt TEXT\n", save.c_str());
  std::printf("fine-tune: megatron train --load %s --finetune%s [data and training flags]\n", save.c_str(), all.c_str());
  return 0;
}

}  // namespace mt::tools
