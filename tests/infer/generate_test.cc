// Generation end to end: greedy decoding with the KV cache equals greedy
// decoding that re-runs GPTModel::forward on every prefix; EOD and length
// stops; seeded sampling repeats; a checkpoint written with the checkpoint
// API (and the trainer's argv in common.json) loads into the same model and
// `megatron generate` prints the same continuation.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "infer/generate.h"
#include "infer/load.h"

namespace mt::infer {
namespace {

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 24;
  c.max_position_embeddings = 24, c.vocab_size = 91, c.make_vocab_size_divisible_by = 16;  // V = 96
  c.init_method_std = 0.3;
  return c;
}

// The reference: next token = arg-max over the real vocabulary of the full
// forward's logits at the last position (causal: later padding is invisible).
std::vector<int32_t> greedy_by_full_forward(model::GPTModel& m, std::vector<int32_t> seq, int64_t n, int64_t vocab) {
  const int64_t T = m.options().seq_length, V = m.vocab();
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> tok(static_cast<size_t>(T), 0), lab(static_cast<size_t>(T), 0);
    std::copy(seq.begin(), seq.end(), tok.begin());
    Tensor tt(tok.data(), {1, T}, DType::kI32), lt(lab.data(), {1, T}, DType::kI32);
    m.forward(0, tt, lt, 0, false);
    const float* row = m.logits(0).ptr<float>() + (static_cast<int64_t>(seq.size()) - 1) * V;
    int32_t best = 0;
    for (int32_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

std::unique_ptr<model::GPTModel> make_model(uint64_t seed) {
  model::GPTOptions o;
  o.micro_batch = 1;
  auto m = model::GPTModel::create(tiny(), o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  (*m)->init_parameters(seed);
  return std::move(*m);
}

TEST(Generate, GreedyWithCacheEqualsGreedyByFullForward) {
  auto m = make_model(5);
  auto dec = Decoder::create(*m);
  ASSERT_TRUE(dec.is_ok());
  const std::vector<int32_t> prompt = {3, 14, 15, 92 % 91, 65};
  GenerateOptions go;
  go.max_new_tokens = 20;  // 5 + 19 fed back = all 24 positions (the last token is not fed back)
  go.sampling.temperature = 0;
  go.vocab_limit = 91;
  std::vector<int32_t> streamed;
  auto r = generate(**dec, prompt, go, [&](int32_t t) { streamed.push_back(t); });
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->stop, StopReason::kMaxNewTokens);
  EXPECT_EQ(r->tokens, greedy_by_full_forward(*m, prompt, 20, 91));
  EXPECT_EQ(streamed, r->tokens);
  go.max_new_tokens = 21;
  auto too_many = generate(**dec, prompt, go);
  ASSERT_FALSE(too_many.is_ok());
  EXPECT_NE(too_many.status().message().find("--max-new-tokens 21"), std::string::npos) << too_many.status().message();
  EXPECT_NE(too_many.status().message().find("at most 20"), std::string::npos) << too_many.status().message();
}

TEST(Generate, StopsAtEodAndSampledRunsRepeat) {
  auto m = make_model(6);
  auto dec = Decoder::create(*m);
  ASSERT_TRUE(dec.is_ok());
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerateOptions go;
  go.max_new_tokens = 10;
  go.sampling.temperature = 0;
  auto greedy = generate(**dec, prompt, go);
  ASSERT_TRUE(greedy.is_ok());
  ASSERT_EQ(greedy->tokens.size(), 10u);
  go.eod = greedy->tokens[3];
  auto stopped = generate(**dec, prompt, go);
  ASSERT_TRUE(stopped.is_ok());
  EXPECT_EQ(stopped->stop, StopReason::kEod);
  // Stops at the first occurrence of that id.
  size_t first = std::find(greedy->tokens.begin(), greedy->tokens.end(), go.eod) - greedy->tokens.begin();
  EXPECT_EQ(stopped->tokens, std::vector<int32_t>(greedy->tokens.begin(), greedy->tokens.begin() + first));

  go.eod = -1;
  go.sampling = SamplingOptions{};
  go.sampling.temperature = 1.3, go.sampling.top_k = 20, go.sampling.seed = 99;
  auto a = generate(**dec, prompt, go), b = generate(**dec, prompt, go);
  go.sampling.seed = 100;
  auto c = generate(**dec, prompt, go);
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
  // An empty prompt starts from EOD; without an EOD id it is an error.
  go.eod = -1;
  EXPECT_FALSE(generate(**dec, std::vector<int32_t>{}, go).is_ok());
  go.eod = 90;
  go.max_new_tokens = 3;
  EXPECT_TRUE(generate(**dec, std::vector<int32_t>{}, go).is_ok());
}

std::string temp_dir(const std::string& name) {
  const std::string d = std::string(MT_BINARY_DIR) + "/test-artifacts/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// What `megatron train` stores: the command line in common.json's args.argv.
std::vector<std::string> train_argv() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "24",
          "--max-position-embeddings", "24", "--vocab-size", "91", "--make-vocab-size-divisible-by", "16",
          "--init-method-std", "0.3", "--tokenizer-type", "NullTokenizer", "--micro-batch-size", "1",
          "--train-iters", "10", "--lr", "1e-3", "--data-path", "/nonexistent/prefix"};
}

TEST(LoadForGeneration, CheckpointRebuildsTheModelAndTheCliPrintsTheSameText) {
  auto m = make_model(8);
  const std::string dir = temp_dir("generate_ckpt");
  nlohmann::json common = {{"iteration", 7}, {"args", {{"argv", train_argv()}, {"seed", 1234}}}};
  ASSERT_TRUE(checkpoint::save_checkpoint(dir, 7, checkpoint::training_state_slices(*m, nullptr), common, 0, 1).is_ok());
  auto loaded = load_for_generation(dir);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  EXPECT_EQ(loaded->iteration, 7);
  EXPECT_EQ(loaded->tokenizer->name(), "NullTokenizer");
  EXPECT_EQ(loaded->tokenizer->eod(), 90);
  ASSERT_EQ(loaded->model->params().size(), m->params().size());
  for (size_t i = 0; i < m->params().size(); ++i)
    EXPECT_EQ(std::memcmp(loaded->model->params()[i].data(), m->params()[i].data(), m->params()[i].nbytes()), 0)
        << m->specs()[i].name;
  EXPECT_EQ(loaded->model->memory_plan().activations, 0u);  // parameters only

  // The library's greedy continuation ...
  auto dec = Decoder::create(*loaded->model);
  ASSERT_TRUE(dec.is_ok());
  GenerateOptions go;
  go.max_new_tokens = 8, go.sampling.temperature = 0, go.eod = 90, go.vocab_limit = 91;
  const std::vector<int32_t> prompt = {7, 8, 9, 10};
  auto r = generate(**dec, prompt, go);
  ASSERT_TRUE(r.is_ok());
  auto text = loaded->tokenizer->decode(r->tokens);
  ASSERT_TRUE(text.is_ok());

  // ... and the binary's, on the same checkpoint.
  const std::string exe = std::string(MT_BINARY_DIR) + "/megatron";
  if (!std::filesystem::exists(exe)) GTEST_SKIP() << "megatron binary not built";
  const std::string out = dir + "/out.txt";
  const std::string cmd = exe + " generate --load " + dir + " --prompt '7 8 9 10' --max-new-tokens 8 --temperature 0 > " +
                          out + " 2> " + dir + "/err.txt";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), *text + "\n");

  // Bad flags exit 2 and name the flag.
  const std::string bad = exe + " generate --load " + dir + " --prompt x --top-p 2 2> " + dir + "/bad.txt";
  int rc = std::system(bad.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  std::ifstream fb(dir + "/bad.txt");
  std::stringstream sb;
  sb << fb.rdbuf();
  EXPECT_NE(sb.str().find("--top-p"), std::string::npos) << sb.str();
}

TEST(LoadForGeneration, ErrorsNameTheProblem) {
  auto missing = load_for_generation(std::string(MT_BINARY_DIR) + "/test-artifacts/no_such_ckpt");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  auto m = make_model(8);
  const std::string dir = temp_dir("generate_ckpt_noargs");
  ASSERT_TRUE(checkpoint::save_checkpoint(dir, 1, checkpoint::training_state_slices(*m, nullptr),
                                          nlohmann::json{{"iteration", 1}}, 0, 1)
                  .is_ok());
  auto noargs = load_for_generation(dir);
  ASSERT_FALSE(noargs.is_ok());
  EXPECT_NE(noargs.status().message().find("\"args\""), std::string::npos) << noargs.status().message();

  // The {flag: value} form of args also works; a model that does not match the tensors fails by name.
  const std::string dir2 = temp_dir("generate_ckpt_mismatch");
  nlohmann::json args = {{"num_layers", 2}, {"hidden_size", 64}, {"num_attention_heads", 4}, {"seq_length", 24},
                         {"max_position_embeddings", 24}, {"vocab_size", 91}, {"make_vocab_size_divisible_by", 16},
                         {"tokenizer_type", "NullTokenizer"}, {"bf16", false}, {"load", nullptr}};
  ASSERT_TRUE(checkpoint::save_checkpoint(dir2, 1, checkpoint::training_state_slices(*m, nullptr),
                                          nlohmann::json{{"iteration", 1}, {"args", args}}, 0, 1)
                  .is_ok());
  auto mismatch = load_for_generation(dir2);
  ASSERT_FALSE(mismatch.is_ok());
  EXPECT_NE(mismatch.status().message().find("embedding.word_embeddings.weight"), std::string::npos)
      << mismatch.status().message();
}

}  // namespace
}  // namespace mt::infer
