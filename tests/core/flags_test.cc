#include "core/flags.h"

#include <gtest/gtest.h>

namespace mt {
namespace {

struct Cfg {
  int64_t layers = 0;
  std::optional<int64_t> gbs;
  double lr = 1e-4;
  bool sp = false, overlap = true;
  std::string style = "linear";
  std::vector<std::string> paths;
};

FlagSet make(Cfg& c) {
  FlagSet f("megatron test");
  f.add_int("num-layers", &c.layers, "layers", 1, 1 << 16);
  f.add_int("global-batch-size", &c.gbs, "batch", 1, int64_t{1} << 32);
  f.add_double("lr", &c.lr, "learning rate", 0, 10);
  f.add_switch("sequence-parallel", &c.sp, "sp");
  f.add_switch("no-overlap-p2p-communication", &c.overlap, "no overlap", false);
  f.add_string("lr-decay-style", &c.style, "style", {"constant", "linear", "cosine"});
  f.add_list("data-path", &c.paths, "paths");
  return f;
}

Status parse(Cfg& c, std::vector<std::string> args) {
  FlagSet f = make(c);
  return f.parse(args);
}

TEST(Flags, ParsesMegatronStyle) {
  Cfg c;
  FlagSet f = make(c);
  ASSERT_TRUE(f.parse({"--num-layers", "24", "--global-batch-size=512", "--lr", "6e-4", "--sequence-parallel",
                       "--no-overlap-p2p-communication", "--lr-decay-style", "cosine", "--data-path", "0.3", "a", "0.7", "b"}));
  EXPECT_EQ(c.layers, 24);
  EXPECT_EQ(c.gbs, 512);
  EXPECT_DOUBLE_EQ(c.lr, 6e-4);
  EXPECT_TRUE(c.sp);
  EXPECT_FALSE(c.overlap);
  EXPECT_EQ(c.style, "cosine");
  EXPECT_EQ(c.paths, (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  EXPECT_TRUE(f.given("num-layers"));
  EXPECT_FALSE(f.given("lr-decay-style") && false);
}

TEST(Flags, LastOccurrenceWins) {
  Cfg c;
  ASSERT_TRUE(parse(c, {"--num-layers", "2", "--data-path", "a", "b", "--num-layers", "4", "--data-path", "c"}));
  EXPECT_EQ(c.layers, 4);
  EXPECT_EQ(c.paths, std::vector<std::string>{"c"}) << "a list given again is replaced, as argparse does";
}

TEST(Flags, ErrorsNameTheFlagAndStayOneLine) {
  struct Case {
    std::vector<std::string> args;
    std::string expect, flag;
  };
  std::vector<Case> cases = {
      {{"--num-layers", "abc"}, "--num-layers: expected an integer, got 'abc'", "--num-layers"},
      {{"--num-layers", "1.5"}, "--num-layers: expected an integer", "--num-layers"},
      {{"--num-layers", "0"}, "--num-layers: must be a positive integer, got 0", "--num-layers"},
      {{"--num-layers", "-3"}, "--num-layers: must be a positive integer, got -3", "--num-layers"},
      {{"--num-layers", "99999999999999999999999"}, "--num-layers: '99999999999999999999999' is out of range", "--num-layers"},
      {{"--num-layers", "70000"}, "--num-layers: 70000 is out of range; expected an integer in [1, 65536]", "--num-layers"},
      {{"--lr", "nan"}, "--lr: ", "--lr"},
      {{"--lr", "1e999"}, "--lr: '1e999' is out of range", "--lr"},
      {{"--num-layers"}, "--num-layers needs a value", "--num-layers"},
      {{"--num-layers", "--lr", "1"}, "--num-layers needs a value", "--num-layers"},
      {{"--num-layer", "2"}, "unknown flag --num-layer; did you mean --num-layers?", "--num-layer"},
      {{"--frobnicate"}, "unknown flag --frobnicate (see `megatron test --help`)", "--frobnicate"},
      // Megatron's longest flag names are shown whole.
      {{"--check-weight-hash-across-dp-replicas-intervals", "1"},
       "unknown flag --check-weight-hash-across-dp-replicas-intervals (see", "--check-weight-hash-across-dp-replicas-intervals"},
      {{"--sequence-parallel=1"}, "--sequence-parallel is a switch and takes no value", "--sequence-parallel"},
      {{"--lr-decay-style", "exp"}, "--lr-decay-style: invalid choice 'exp'; expected one of constant, linear, cosine", "--lr-decay-style"},
      {{"24"}, "unexpected argument '24'", ""},
      {{"--data-path"}, "--data-path needs at least one value", "--data-path"},
      {{"--num-layers", std::string("1\n2")}, "--num-layers: expected an integer, got '1?2'", "--num-layers"},
  };
  for (const auto& k : cases) {
    Cfg c;
    FlagSet f = make(c);
    Status st = f.parse(k.args);
    ASSERT_FALSE(st) << k.expect;
    EXPECT_NE(st.message().find(k.expect), std::string::npos) << "got: " << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
    EXPECT_EQ(f.error_flag(), k.flag) << st.message();
  }
}

// A launch script with several problems gets them all in one message, in
// command-line order; an unknown flag takes its values with it, and the
// flags around the bad ones are still parsed.
TEST(Flags, EveryProblemIsListedAtOnce) {
  Cfg c;
  FlagSet f = make(c);
  Status st = f.parse({"--tensorboard-dir", "/tmp/tb", "--num-layers", "4", "--num-layer", "2", "--lr", "abc",
                       "--frobnicate", "x", "y", "--sequence-parallel"});
  ASSERT_FALSE(st);
  const std::string& m = st.message();
  EXPECT_EQ(m.find("4 problems on the command line:\n  - unknown flag --tensorboard-dir"), 0u) << m;
  const size_t a = m.find("unknown flag --num-layer; did you mean --num-layers?"), b = m.find("--lr: expected a number"),
               d = m.find("unknown flag --frobnicate");
  EXPECT_NE(a, std::string::npos) << m;
  EXPECT_NE(b, std::string::npos) << m;
  EXPECT_NE(d, std::string::npos) << m;
  EXPECT_TRUE(a < b && b < d) << m;
  EXPECT_EQ(m.find("'/tmp/tb'"), std::string::npos) << "a value of an unknown flag is not a problem of its own: " << m;
  EXPECT_EQ(m.find("unexpected argument"), std::string::npos) << m;
  EXPECT_EQ(f.error_flag(), "--tensorboard-dir");
  EXPECT_EQ(c.layers, 4);
  EXPECT_TRUE(c.sp);
}

// add_seen: a switch or a value handed to a callback, values checked against
// the choices.
TEST(Flags, SeenFlagsCallBack) {
  FlagSet f("megatron test");
  std::vector<std::string> seen;
  f.add_seen("use-flash-attn", false, "no effect", {}, [&](const std::string& v) { seen.push_back("flash:" + v); });
  f.add_seen("transformer-impl", true, "no effect", {"local", "transformer_engine"},
             [&](const std::string& v) { seen.push_back("impl:" + v); });
  ASSERT_TRUE(f.parse({"--use-flash-attn", "--transformer-impl", "local"}));
  EXPECT_EQ(seen, (std::vector<std::string>{"flash:", "impl:local"}));
  Status st = f.parse({"--transformer-impl", "te"});
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("--transformer-impl: invalid choice 'te'"), std::string::npos) << st.message();
}

TEST(Flags, HelpListsSectionsAndDefaults) {
  Cfg c;
  FlagSet f = make(c);
  std::string h = f.help();
  EXPECT_NE(h.find("--num-layers V"), std::string::npos);
  EXPECT_NE(h.find("(default: 0.0001)"), std::string::npos);
  EXPECT_NE(h.find("{constant,linear,cosine}"), std::string::npos);
}

TEST(Flags, ParseNumbers) {
  int64_t i = 0;
  double d = 0;
  EXPECT_TRUE(parse_int("x", "+12", 0, 100, &i));
  EXPECT_EQ(i, 12);
  EXPECT_TRUE(parse_int("x", "9223372036854775807", 0, INT64_MAX, &i));
  EXPECT_FALSE(parse_int("x", "9223372036854775808", 0, INT64_MAX, &i));
  EXPECT_FALSE(parse_int("x", "", 0, 100, &i));
  EXPECT_FALSE(parse_int("x", " 1", 0, 100, &i));
  EXPECT_TRUE(parse_double("x", "13e9", 0, 1e15, &d));
  EXPECT_DOUBLE_EQ(d, 13e9);
  EXPECT_FALSE(parse_double("x", "inf", 0, 1e300, &d));
  EXPECT_FALSE(parse_double("x", "0x10", 0, 100, &d));
}

}  // namespace
}  // namespace mt
