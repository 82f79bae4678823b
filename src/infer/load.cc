#include "infer/load.h"

#include <fmt/format.h>

#include <tuple>

#include "checkpoint/checkpoint.h"
#include "train/train_config.h"

namespace mt::infer {

Result<RebuiltConfig> config_from_training_argv(const std::vector<std::string>& argv, const std::string& where,
                                                const LoadOptions& opt) {
  // The trainer's flags, parsed as training parsed them.
  train::TrainConfig tc;
  FlagSet flags("megatron train");
  train::register_train_flags(flags, tc);
  bool help = false;
  Status st = train::parse_train_args(argv, &tc, &flags, &help);
  if (!st) return Status::invalid(fmt::format("{}: the stored training arguments do not parse: {}", where, st.message()));
  model::ModelConfig mc = tc.job.model;
  // Megatron pads the vocabulary to a multiple of divisible_by x TP: keep the
  // training run's padded size on this single rank, so every stored row loads.
  mc.make_vocab_size_divisible_by *= std::max<int64_t>(1, tc.job.parallel.tp);

  // Tokenizer, as run_training builds it (train/trainer.cc).
  data::TokenizerConfig tk = tc.tokenizer;
  tk.vocab_file = mc.vocab_file;
  if (tk.type == "NullTokenizer" || tk.type == "TikTokenizer") tk.vocab_size = mc.vocab_size;
  if (tk.type.empty()) return Status::invalid(fmt::format("{}: the training arguments have no --tokenizer-type", where));
  // A replacement file the checkpoint's tokenizer does not read is an error,
  // not silently ignored.
  const bool bpe = tk.type == "GPT2BPETokenizer";
  for (const auto& [flag, given, used] : {std::tuple{"--vocab-file", !opt.vocab_file.empty(), bpe},
                                          std::tuple{"--merge-file", !opt.merge_file.empty(), bpe},
                                          std::tuple{"--tokenizer-model", !opt.tokenizer_model.empty(),
                                                     !bpe && tk.type != "NullTokenizer"}})
    if (given && !used)
      return Status::invalid(fmt::format("{}: the checkpoint's tokenizer is {}, which reads no such file; drop the flag",
                                         flag, tk.type));
  if (!opt.vocab_file.empty()) tk.vocab_file = opt.vocab_file;
  if (!opt.merge_file.empty()) tk.merge_file = opt.merge_file;
  if (!opt.tokenizer_model.empty()) tk.tokenizer_model = opt.tokenizer_model;
  auto tok = data::make_tokenizer(tk);
  if (!tok)
    return Status::invalid(fmt::format("{}\n(the tokenizer files are the training run's; if they moved, pass "
                                       "--vocab-file/--merge-file/--tokenizer-model to this command)",
                                       tok.status().message()));
  if (!mc.vocab_size || tk.type != "NullTokenizer") {
    mc.vocab_size = (*tok)->vocab_size();
    mc.vocab_file.clear();
  }
  RebuiltConfig r;
  r.model = mc;
  r.tokenizer = std::move(*tok);
  r.tokenizer_config = tk;
  r.bf16 = tc.job.precision.bf16;
  r.fp16 = tc.job.precision.fp16;
  return r;
}

Result<LoadedModel> load_for_generation(const std::string& load_dir, const LoadOptions& opt) {
  auto ck = checkpoint::load_checkpoint(load_dir, opt.iteration);
  if (!ck) return ck.status();
  const std::string where = ck->directory() + "/common.json";
  auto argv = checkpoint::training_argv(ck->common(), where);
  if (!argv) return argv.status();
  auto rc = config_from_training_argv(*argv, where, opt);
  if (!rc) return rc.status();

  model::GPTOptions mo;
  mo.micro_batch = 1;
  mo.seq_length = rc->model.seq_length;
  mo.slots = 0;  // parameters only
  auto m = model::GPTModel::create(rc->model, mo);
  if (!m) return Status::invalid(fmt::format("{}: {}", where, m.status().message()));
  Status ls = checkpoint::load_training_state(*ck, **m, nullptr);
  if (!ls) return ls;
  LoadedModel out;
  out.model = std::move(*m);
  out.tokenizer = std::move(rc->tokenizer);
  out.tokenizer_config = rc->tokenizer_config;
  out.bf16 = rc->bf16;
  out.fp16 = rc->fp16;
  out.iteration = ck->iteration();
  out.directory = ck->directory();
  return out;
}

}  // namespace mt::infer
