#include "data/hf_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"  // json_brief
#include "data/byte_bpe.h"
#include "data/pretok_regex.h"
#include "data/unicode.h"

namespace mt::data {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// GPT-2's pattern, which ByteLevel splits with when use_regex is on.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr uint64_t kMaxJsonBytes = uint64_t{1} << 30;

Result<std::string> read_json_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    return Status::not_found(fmt::format("--tokenizer-model: {} is not a regular file", p.string()));
  const auto size = fs::file_size(p, ec);
  if (ec || size > kMaxJsonBytes)
    return Status::invalid(fmt::format("--tokenizer-model: {}: larger than 1 GiB or unreadable", p.string()));
  std::ifstream f(p, std::ios::binary);
  if (!f) return Status::not_found(fmt::format("--tokenizer-model: {}: cannot open: {}", p.string(), std::strerror(errno)));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::io_error(fmt::format("--tokenizer-model: {}: read failed", p.string()));
  return ss.str();
}

Result<json> parse_json(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    return Status::corrupt(fmt::format("{}: not valid JSON (byte {}): {}", where, e.byte, e.what()));
  }
}

bool is_null_or(const json& j, const char* key, const json& value) {
  return !j.contains(key) || j[key].is_null() || j[key] == value;
}

// A component's "type", quoted, for messages.
std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") ? json_brief(j["type"]) : json_brief(j);
}

// A special token given as "text" or {"content": "text", ...}.
std::optional<std::string> token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

struct HfTokenizer::Impl {
  struct Step {
    enum Kind { kSplit, kByteLevel } kind;
    std::unique_ptr<PretokRegex> regex;  // kSplit, or kByteLevel with use_regex
    bool add_prefix_space = false;       // kByteLevel
  };
  struct Added {
    std::string content;
    int32_t id;
  };

  std::string where;  // the tokenizer.json path, for messages
  std::unique_ptr<BytePairEncoder> bpe;
  std::vector<Step> steps;
  bool nfc_normalize = false;
  std::vector<Added> added;                       // sorted by content
  std::unordered_map<std::string, int32_t> added_ids;
  std::vector<uint8_t> added_first;               // bytes that start an added token
  size_t added_max_len = 0;
  std::vector<std::string> id_text;               // added tokens outside the model's vocabulary, by id - V
  std::vector<int32_t> prefix, suffix;            // the template's ids around the text
  std::vector<int32_t> raw_ids;                   // vocabulary entries outside the byte-level alphabet
  // Whether the steps come down to at most one regex split (split_regex, or
  // none) and no inserted text: Llama 3's Split + ByteLevel, GPT-2's ByteLevel.
  bool one_split = false;
  const PretokRegex* split_regex = nullptr;
  bool include_special = true;
  int64_t vocab = 0;
  int32_t eod = -1, pad = -1, bos = -1;

  Status parse(const json& tj);
  Status parse_pre_tokenizer(const json& p, const std::string& path);
  Status parse_post_processor(const json& p, const std::string& path);
  int32_t id_of(const std::string& text) const;
  void encode_segment(std::string_view text, std::vector<int32_t>* out) const;
  void encode(std::string_view text, std::vector<int32_t>* out) const;
};

Status HfTokenizer::Impl::parse_pre_tokenizer(const json& p, const std::string& path) {
  if (p.is_null()) return Status::ok();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      return Status::corrupt(fmt::format("{}: {}.pretokenizers: expected a list", where, path));
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
      if (Status st = parse_pre_tokenizer(p["pretokenizers"][i], fmt::format("{}.pretokenizers[{}]", path, i)); !st)
        return st;
    return Status::ok();
  }
  if (!steps.empty() && steps.back().kind == Step::kByteLevel)
    return Status::invalid(fmt::format("{}: {}: a pre-tokenizer after ByteLevel is not supported (it would see the "
                                       "byte-level characters)",
                                       where, path));
  if (type == "ByteLevel") {
    Step s{Step::kByteLevel, nullptr, p.value("add_prefix_space", false)};
    if (p.value("use_regex", true)) {
      auto re = PretokRegex::compile(kByteLevelPattern);
      if (!re) return re.status();
      s.regex = std::make_unique<PretokRegex>(std::move(*re));
    }
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Split") {
    if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
        !p["pattern"]["Regex"].is_string())
      return Status::invalid(fmt::format("{}: {}: a Split pre-tokenizer is supported with a {{\"Regex\": ...}} "
                                         "pattern only",
                                         where, path));
    if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
      return Status::invalid(fmt::format("{}: {}: a Split pre-tokenizer is supported with behavior \"Isolated\" and "
                                         "invert false only (got behavior {}, invert {})",
                                         where, path, p.contains("behavior") ? p["behavior"].dump() : "none",
                                         p.contains("invert") ? p["invert"].dump() : "false"));
    auto re = PretokRegex::compile(p["pattern"]["Regex"].get<std::string>());
    if (!re) return Status::invalid(fmt::format("{}: {}: {}", where, path, re.status().message()));
    if (re->can_match_empty())
      return Status::invalid(fmt::format("{}: {}: a Split pattern that can match the empty string is not supported",
                                         where, path));
    steps.push_back(Step{Step::kSplit, std::make_unique<PretokRegex>(std::move(*re)), false});
    return Status::ok();
  }
  return Status::invalid(fmt::format("{}: {}: pre-tokenizer type \"{}\" is not supported (byte-level BPE "
                                     "tokenizers: ByteLevel, Split, Sequence)",
                                     where, path, type));
}

Status HfTokenizer::Impl::parse_post_processor(const json& p, const std::string& path) {
  if (p.is_null()) return Status::ok();
  const std::string type = p.value("type", "");
  if (type == "ByteLevel") return Status::ok();  // offsets only
  if (type == "Sequence") {
    if (!p.contains("processors") || !p["processors"].is_array())
      return Status::corrupt(fmt::format("{}: {}.processors: expected a list", where, path));
    for (size_t i = 0; i < p["processors"].size(); ++i)
      if (Status st = parse_post_processor(p["processors"][i], fmt::format("{}.processors[{}]", path, i)); !st)
        return st;
    return Status::ok();
  }
  if (type == "TemplateProcessing") {
    if (!prefix.empty() || !suffix.empty())
      return Status::invalid(fmt::format("{}: {}: a second TemplateProcessing is not supported", where, path));
    if (!p.contains("single") || !p["single"].is_array())
      return Status::corrupt(fmt::format("{}: {}.single: expected a list", where, path));
    bool seen_a = false;
    for (size_t i = 0; i < p["single"].size(); ++i) {
      const json& item = p["single"][i];
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", "") != "A" || seen_a)
          return Status::corrupt(fmt::format("{}: {}.single[{}]: the single template holds sequence A once", where,
                                             path, i));
        seen_a = true;
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        const json& name = item["SpecialToken"]["id"];
        if (!name.is_string() || !p.contains("special_tokens") || !p["special_tokens"].contains(name.get<std::string>()))
          return Status::corrupt(fmt::format("{}: {}.single[{}]: special token {} is not in {}.special_tokens", where,
                                             path, i, name.dump(), path));
        const json& st = p["special_tokens"][name.get<std::string>()];
        if (!st.contains("ids") || !st["ids"].is_array())
          return Status::corrupt(fmt::format("{}: {}.special_tokens[{}].ids: expected a list", where, path, name.dump()));
        for (const json& id : st["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31))
            return Status::corrupt(fmt::format("{}: {}.special_tokens[{}].ids: {} is not a token id", where, path,
                                               name.dump(), id.dump()));
          (seen_a ? suffix : prefix).push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
      } else {
        return Status::corrupt(fmt::format("{}: {}.single[{}]: expected {{\"Sequence\"}} or {{\"SpecialToken\"}}",
                                           where, path, i));
      }
    }
    if (!seen_a) return Status::corrupt(fmt::format("{}: {}.single: no sequence A", where, path));
    return Status::ok();
  }
  return Status::invalid(fmt::format("{}: {}: post-processor type \"{}\" is not supported (TemplateProcessing, "
                                     "ByteLevel, Sequence)",
                                     where, path, type));
}

Status HfTokenizer::Impl::parse(const json& tj) {
  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object())
    return Status::corrupt(fmt::format("{}: expected a tokenizer.json object with a \"model\"", where));
  const json& m = tj["model"];
  const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    return Status::invalid(fmt::format("{}: model type \"{}\" is not supported: HuggingFaceTokenizer reads byte-level "
                                       "BPE tokenizers (a SentencePiece model loads with --tokenizer-type "
                                       "SentencePieceTokenizer and its tokenizer.model)",
                                       where, type));
  std::vector<std::string> unsupported;
  if (!is_null_or(m, "dropout", json(0.0)) && !is_null_or(m, "dropout", json(0)))
    unsupported.push_back("model.dropout " + m["dropout"].dump());
  if (m.value("byte_fallback", false)) unsupported.push_back("model.byte_fallback true");
  if (!is_null_or(m, "continuing_subword_prefix", json("")))
    unsupported.push_back("model.continuing_subword_prefix " + m["continuing_subword_prefix"].dump());
  if (!is_null_or(m, "end_of_word_suffix", json("")))
    unsupported.push_back("model.end_of_word_suffix " + m["end_of_word_suffix"].dump());
  const json norm = tj.contains("normalizer") ? tj["normalizer"] : json();
  if (!norm.is_null()) {
    const bool one_nfc = norm.value("type", "") == "NFC";
    const bool seq_nfc = norm.value("type", "") == "Sequence" && norm.contains("normalizers") &&
                         norm["normalizers"].is_array() && norm["normalizers"].size() == 1 &&
                         norm["normalizers"][0].value("type", "") == "NFC";
    if (one_nfc || seq_nfc) nfc_normalize = true;
    else unsupported.push_back("normalizer " + type_of(norm));
  }
  if (tj.contains("decoder") && !tj["decoder"].is_null() && tj["decoder"].value("type", "") != "ByteLevel")
    unsupported.push_back("decoder " + type_of(tj["decoder"]));
  if (!unsupported.empty()) {
    std::string list;
    for (const auto& u : unsupported) list += (list.empty() ? "" : "; ") + u;
    return Status::invalid(fmt::format("{}: not a plain byte-level BPE tokenizer, which is what HuggingFaceTokenizer "
                                       "reads here: {}",
                                       where, list));
  }

  // Vocabulary: byte-level strings -> ids 0..V-1.
  if (!m.contains("vocab") || !m["vocab"].is_object() || m["vocab"].empty())
    return Status::corrupt(fmt::format("{}: model.vocab: expected an object of token -> id", where));
  const json& v = m["vocab"];
  const size_t V = v.size();
  std::vector<std::string> tokens(V);
  std::vector<uint8_t> seen(V, 0);
  std::string bytes;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= static_cast<int64_t>(V))
      return Status::corrupt(fmt::format("{}: model.vocab[{}]: id {} is outside [0, {}) (ids must be 0..size-1)",
                                         where, json(it.key()).dump(), it.value().dump(), V));
    const size_t id = it.value().get<size_t>();
    if (seen[id]) return Status::corrupt(fmt::format("{}: model.vocab: id {} is used twice", where, id));
    seen[id] = 1;
    char32_t bad;
    if (!byte_level_to_bytes(it.key(), &bytes, &bad) || bytes.empty()) {
      // Not in the byte-level alphabet (DeepSeek's special tokens, say): BPE
      // can never produce it; it stands for its own UTF-8 text, as an added
      // token does.
      raw_ids.push_back(static_cast<int32_t>(id));
      tokens[id] = it.key();
      continue;
    }
    tokens[id] = bytes;
  }
  auto engine = BytePairEncoder::create(std::move(tokens), where + ": model.vocab");
  if (!engine) return engine.status();
  bpe = std::move(*engine);

  // Merges: "a b" or ["a", "b"], by rank.
  if (!m.contains("merges") || !m["merges"].is_array())
    return Status::corrupt(fmt::format("{}: model.merges: expected a list", where));
  std::vector<std::array<int32_t, 3>> merges;
  merges.reserve(m["merges"].size());
  std::string left, right;
  for (size_t r = 0; r < m["merges"].size(); ++r) {
    const json& e = m["merges"][r];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return Status::corrupt(fmt::format("{}: model.merges[{}]: expected \"a b\", got {}", where, r, e.dump()));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      return Status::corrupt(fmt::format("{}: model.merges[{}]: expected \"a b\" or [\"a\", \"b\"]", where, r));
    }
    char32_t bad;
    if (!byte_level_to_bytes(a, &left, &bad) || !byte_level_to_bytes(b, &right, &bad))
      return Status::corrupt(fmt::format("{}: model.merges[{}]: character U+{:04X} is not in the byte-level alphabet",
                                         where, r, static_cast<uint32_t>(bad)));
    const int32_t ia = bpe->find(left), ib = bpe->find(right), im = bpe->find(left + right);
    if (ia < 0 || ib < 0 || im < 0)
      return Status::corrupt(fmt::format("{}: model.merges[{}]: {} is not in model.vocab", where, r,
                                         json(ia < 0 ? a : ib < 0 ? b : a + b).dump()));
    merges.push_back({ia, ib, im});
  }
  bpe->set_merges(merges);
  const bool ignore_merges = m.value("ignore_merges", false);
  if (Status st = bpe->finish(ignore_merges ? BytePairEncoder::WholePiece::kAlways
                                            : BytePairEncoder::WholePiece::kIfBpeAgrees,
                              where + ": model.vocab");
      !st)
    return st;
  for (int32_t id : raw_ids) bpe->never_whole(id);
  if (raw_ids.size() > 16)
    return Status::invalid(fmt::format("{}: model.vocab: {} tokens are not in the byte-level alphabet: not a "
                                       "byte-level BPE vocabulary",
                                       where, raw_ids.size()));

  // Added tokens: ids inside the vocabulary must be the same token; the rest
  // extend it.
  vocab = static_cast<int64_t>(V);
  if (tj.contains("added_tokens") && !tj["added_tokens"].is_null()) {
    if (!tj["added_tokens"].is_array())
      return Status::corrupt(fmt::format("{}: added_tokens: expected a list", where));
    std::unordered_map<int64_t, std::string> outside;
    for (size_t i = 0; i < tj["added_tokens"].size(); ++i) {
      const json& a = tj["added_tokens"][i];
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string() || a["content"].get<std::string>().empty())
        return Status::corrupt(fmt::format("{}: added_tokens[{}]: expected {{\"id\": int, \"content\": non-empty "
                                           "string, ...}}",
                                           where, i));
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      for (const char* flag : {"single_word", "lstrip", "rstrip"})
        if (a.value(flag, false))
          return Status::invalid(fmt::format("{}: added_tokens[{}] ({}): \"{}\": true is not supported", where, i,
                                             json(content).dump(), flag));
      if (id < 0 || id >= (int64_t{1} << 30))
        return Status::corrupt(fmt::format("{}: added_tokens[{}]: id {} is out of range", where, i, id));
      if (id < vocab) {
        // Inside the model's vocabulary: it must be that token (as its bytes).
        std::string b;
        char32_t bad;
        const bool same = (byte_level_to_bytes(content, &b, &bad) && bpe->find(b) == id) || bpe->bytes(static_cast<int32_t>(id)) == content;
        if (!same)
          return Status::corrupt(fmt::format("{}: added_tokens[{}]: id {} is {} in model.vocab, not {}", where, i, id,
                                             json(std::string(bpe->bytes(static_cast<int32_t>(id)))).dump(),
                                             json(content).dump()));
      } else {
        outside[id] = content;
      }
      added.push_back(Added{content, static_cast<int32_t>(id)});
    }
    int64_t next = vocab;
    while (outside.count(next)) ++next;
    if (next - vocab != static_cast<int64_t>(outside.size()))
      return Status::corrupt(fmt::format("{}: added_tokens: the ids above model.vocab ({} of them) must be {}..{} "
                                         "without gaps",
                                         where, outside.size(), vocab, vocab + static_cast<int64_t>(outside.size()) - 1));
    id_text.resize(outside.size());
    for (const auto& [id, content] : outside) id_text[static_cast<size_t>(id - vocab)] = content;
    vocab = next;
  }
  added_first.assign(256, 0);
  for (const Added& a : added) {
    if (!added_ids.emplace(a.content, a.id).second)
      return Status::corrupt(fmt::format("{}: added_tokens: {} is listed twice", where, json(a.content).dump()));
    added_first[static_cast<unsigned char>(a.content[0])] = 1;
    added_max_len = std::max(added_max_len, a.content.size());
  }

  if (Status st = parse_pre_tokenizer(tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : json(), "pre_tokenizer"); !st)
    return st;
  if (Status st = parse_post_processor(tj.contains("post_processor") ? tj["post_processor"] : json(), "post_processor");
      !st)
    return st;
  {
    int regexes = 0;
    bool inserts = false;
    for (const Step& st : steps) {
      inserts |= st.kind == Step::kByteLevel && st.add_prefix_space;
      if (st.regex) ++regexes, split_regex = st.regex.get();
    }
    one_split = !inserts && regexes <= 1;
  }
  for (int32_t id : prefix)
    if (id >= vocab) return Status::corrupt(fmt::format("{}: post_processor: id {} is outside the vocabulary", where, id));
  for (int32_t id : suffix)
    if (id >= vocab) return Status::corrupt(fmt::format("{}: post_processor: id {} is outside the vocabulary", where, id));
  return Status::ok();
}

int32_t HfTokenizer::Impl::id_of(const std::string& text) const {
  if (const auto it = added_ids.find(text); it != added_ids.end()) return it->second;
  std::string b;
  char32_t bad;
  if (byte_level_to_bytes(text, &b, &bad)) return bpe->find(b);
  return -1;
}

void HfTokenizer::Impl::encode_segment(std::string_view raw, std::vector<int32_t>* out) const {
  if (raw.empty()) return;
  std::string normalized;
  std::string_view text = raw;
  if (nfc_normalize && find_nfc_quick_check_failure(raw) != std::string_view::npos) {
    normalized = data::nfc(raw);
    text = normalized;
  }
  if (one_split) {  // the usual layouts: at most one regex, no text inserted
    if (!split_regex) bpe->encode_piece(text, out);
    else split_regex->split(text, [&](size_t b, size_t e, bool) { bpe->encode_piece(text.substr(b, e - b), out); });
    return;
  }
  // Pieces after each pre-tokenizer step, in order.
  std::vector<std::string> pieces{std::string(text)}, next;
  for (const Step& s : steps) {
    next.clear();
    for (std::string& p : pieces) {
      if (s.kind == Step::kByteLevel && s.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      if (!s.regex) {
        next.push_back(std::move(p));
        continue;
      }
      s.regex->split(p, [&](size_t b, size_t e, bool) { next.push_back(p.substr(b, e - b)); });  // Isolated
    }
    pieces.swap(next);
  }
  for (const std::string& p : pieces) bpe->encode_piece(p, out);
}

void HfTokenizer::Impl::encode(std::string_view text, std::vector<int32_t>* out) const {
  if (include_special) out->insert(out->end(), prefix.begin(), prefix.end());
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!added_first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t id = -1;
    size_t len = 0;
    for (size_t n = std::min(added_max_len, text.size() - i); n > 0; --n) {
      const auto it = added_ids.find(std::string(text.substr(i, n)));
      if (it != added_ids.end()) {
        id = it->second;
        len = n;
        break;
      }
    }
    if (id < 0) {
      ++i;
      continue;
    }
    encode_segment(text.substr(start, i - start), out);
    out->push_back(id);
    i += len;
    start = i;
  }
  encode_segment(text.substr(start), out);
  if (include_special) out->insert(out->end(), suffix.begin(), suffix.end());
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::load(const std::string& path, bool include_special_tokens) {
  std::error_code ec;
  fs::path file = path, dir;
  if (fs::is_directory(file, ec)) {
    dir = file;
    file /= "tokenizer.json";
    if (!fs::exists(file, ec))
      return Status::not_found(fmt::format("--tokenizer-model {}: no tokenizer.json in this directory (Hugging Face "
                                           "byte-level BPE tokenizers ship one; a SentencePiece tokenizer.model loads "
                                           "with --tokenizer-type SentencePieceTokenizer)",
                                           path));
  } else {
    dir = file.parent_path();
  }
  auto text = read_json_file(file);
  if (!text) return text.status();
  auto impl = std::make_unique<Impl>();
  impl->where = "--tokenizer-model " + file.string();
  auto tj = parse_json(*text, impl->where);
  if (!tj) return tj.status();
  try {
    if (Status st = impl->parse(*tj); !st) return st;
  } catch (const json::exception& e) {
    return Status::corrupt(fmt::format("{}: a field has the wrong JSON type: {}", impl->where, e.what()));
  }
  impl->include_special = include_special_tokens;

  // eos/pad/bos from tokenizer_config.json, else special_tokens_map.json.
  json cfg = json::object();
  // transformers reads tokenizer_config.json, then lets special_tokens_map.json override it.
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path p = dir / name;
    if (!fs::exists(p, ec)) continue;
    auto t = read_json_file(p);
    if (!t) return t.status();
    auto j = parse_json(*t, "--tokenizer-model " + p.string());
    if (!j) return j.status();
    if (!j->is_object()) return Status::corrupt(fmt::format("--tokenizer-model {}: expected a JSON object", p.string()));
    for (auto it = j->begin(); it != j->end(); ++it) cfg[it.key()] = it.value();
  }
  auto special = [&](const char* key, int32_t* out) -> Status {
    if (!cfg.is_object()) return Status::ok();
    if (!cfg.contains(key) || cfg[key].is_null()) return Status::ok();
    const auto t = token_text(cfg[key]);
    if (!t) return Status::corrupt(fmt::format("{}: tokenizer_config.json {}: expected a string", impl->where, key));
    *out = impl->id_of(*t);
    if (*out < 0)
      return Status::corrupt(fmt::format("{}: tokenizer_config.json {} {} is not a token of this tokenizer",
                                         impl->where, key, json(*t).dump()));
    return Status::ok();
  };
  if (Status st = special("eos_token", &impl->eod); !st) return st;
  // Megatron's wrapper makes sep_token the eos_token when there is none.
  if (impl->eod < 0)
    if (Status st = special("sep_token", &impl->eod); !st) return st;
  if (Status st = special("pad_token", &impl->pad); !st) return st;
  if (Status st = special("bos_token", &impl->bos); !st) return st;
  if (impl->eod < 0)
    return Status::invalid(fmt::format("{}: no eos_token (or sep_token) in tokenizer_config.json or "
                                       "special_tokens_map.json beside it: Megatron's EOD for HuggingFaceTokenizer is "
                                       "the tokenizer's eos_token",
                                       impl->where));
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

void HfTokenizer::encode(std::string_view text, std::vector<int32_t>* out) const { impl_->encode(text, out); }

Status HfTokenizer::encode_checked(std::string_view text, std::vector<int32_t>* out) const {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    return Status::invalid(fmt::format("text is not valid UTF-8 at byte offset {} (byte 0x{:02x})", bad,
                                       static_cast<unsigned char>(text[bad])));
  impl_->encode(text, out);
  return Status::ok();
}

Result<std::string> HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  const int64_t V = impl_->bpe->size();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= impl_->vocab)
      return Status::invalid(fmt::format("HuggingFaceTokenizer: token id {} at position {} is outside the vocabulary "
                                         "[0, {})",
                                         id, i, impl_->vocab));
    if (id < V) out += impl_->bpe->bytes(id);
    else out += impl_->id_text[static_cast<size_t>(id - V)];
  }
  return out;
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab; }
int32_t HfTokenizer::eod() const { return impl_->eod; }
int32_t HfTokenizer::pad() const { return impl_->pad; }
int32_t HfTokenizer::bos() const { return impl_->bos; }

}  // namespace mt::data
