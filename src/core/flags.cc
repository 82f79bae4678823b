#include "core/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

namespace mt {
namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string shown(const std::string& text, size_t limit = 40) {
  // Keep error lines one line long whatever the user typed (flag names get a
  // longer limit: Megatron's run to 50 characters).
  std::string s = text.size() > limit ? text.substr(0, limit) + "..." : text;
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  return "'" + s + "'";
}

std::string fmt_int(int64_t v) {
  if (v == INT64_MAX) return "2^63-1";
  return std::to_string(v);
}

}  // namespace

Status parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max,
                 int64_t* out) {
  int64_t v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec == std::errc::result_out_of_range)
    return Status::invalid(fmt::format("--{}: {} is out of range; expected an integer in [{}, {}]",
                                       flag, shown(text), fmt_int(min), fmt_int(max)));
  if (ec != std::errc() || p != e || text.empty())
    return Status::invalid(
        fmt::format("--{}: expected an integer, got {}", flag, shown(text)));
  if (v < min || v > max) {
    if (min == 1 && v <= 0)
      return Status::invalid(fmt::format("--{}: must be a positive integer, got {}", flag, v));
    return Status::invalid(fmt::format("--{}: {} is out of range; expected an integer in [{}, {}]",
                                       flag, v, fmt_int(min), fmt_int(max)));
  }
  *out = v;
  return Status::ok();
}

Status parse_double(const std::string& flag, const std::string& text, double min, double max,
                    double* out) {
  double v = 0;
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && p == e && !std::isfinite(v)))
    return Status::invalid(fmt::format("--{}: {} is out of range; expected a number in [{:g}, {:g}]",
                                       flag, shown(text), min, max));
  if (ec != std::errc() || p != e || text.empty())
    return Status::invalid(fmt::format("--{}: expected a number, got {}", flag, shown(text)));
  if (!(v >= min && v <= max))
    return Status::invalid(
        fmt::format("--{}: {:g} is out of range; expected a number in [{:g}, {:g}]", flag, v, min, max));
  *out = v;
  return Status::ok();
}

FlagSet::Flag FlagSet::make_flag(const std::string& name, const std::string& help, const std::string& section,
                                 const std::string& default_text) {
  Flag f;
  f.name = name, f.help = help, f.section = section, f.default_text = default_text;
  return f;
}

FlagSet::FlagSet(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagSet::section(const std::string& title) { section_ = title; }

void FlagSet::add(Flag f) {
  MT_CHECK(!flags_.count(f.name), "flag --" + f.name + " registered twice");
  f.section = section_;
  order_.push_back(f.name);
  flags_.emplace(f.name, std::move(f));
}

void FlagSet::add_int(const std::string& name, int64_t* out, const std::string& help, int64_t min,
                      int64_t max) {
  Flag f = make_flag(name, help, "", fmt_int(*out));
  f.set = [=](const std::string& t) { return parse_int(name, t, min, max, out); };
  add(std::move(f));
}

void FlagSet::add_int(const std::string& name, std::optional<int64_t>* out, const std::string& help,
                      int64_t min, int64_t max) {
  Flag f = make_flag(name, help, "", out->has_value() ? fmt_int(**out) : "unset");
  f.set = [=](const std::string& t) {
    int64_t v = 0;
    MT_RETURN_IF_ERROR(parse_int(name, t, min, max, &v));
    *out = v;
    return Status::ok();
  };
  add(std::move(f));
}

void FlagSet::add_double(const std::string& name, double* out, const std::string& help, double min,
                         double max) {
  Flag f = make_flag(name, help, "", fmt::format("{:g}", *out));
  f.set = [=](const std::string& t) { return parse_double(name, t, min, max, out); };
  add(std::move(f));
}

void FlagSet::add_double(const std::string& name, std::optional<double>* out,
                         const std::string& help, double min, double max) {
  Flag f = make_flag(name, help, "", out->has_value() ? fmt::format("{:g}", **out) : "unset");
  f.set = [=](const std::string& t) {
    double v = 0;
    MT_RETURN_IF_ERROR(parse_double(name, t, min, max, &v));
    *out = v;
    return Status::ok();
  };
  add(std::move(f));
}

void FlagSet::add_switch(const std::string& name, bool* out, const std::string& help, bool value) {
  Flag f = make_flag(name, help, "", "");
  f.takes_value = false;
  f.set_switch = [=] { *out = value; };
  add(std::move(f));
}

static Status check_choice(const std::string& name, const std::string& t,
                           const std::vector<std::string>& choices) {
  if (choices.empty() || std::find(choices.begin(), choices.end(), t) != choices.end())
    return Status::ok();
  return Status::invalid(
      fmt::format("--{}: invalid choice {}; expected one of {}", name, shown(t), join(choices, ", ")));
}

void FlagSet::add_string(const std::string& name, std::string* out, const std::string& help,
                         std::vector<std::string> choices) {
  std::string h = help;
  if (!choices.empty()) h += " {" + join(choices, ",") + "}";
  Flag f = make_flag(name, h, "", out->empty() ? "" : *out);
  f.set = [=](const std::string& t) {
    MT_RETURN_IF_ERROR(check_choice(name, t, choices));
    *out = t;
    return Status::ok();
  };
  add(std::move(f));
}

void FlagSet::add_string(const std::string& name, std::optional<std::string>* out,
                         const std::string& help, std::vector<std::string> choices) {
  std::string h = help;
  if (!choices.empty()) h += " {" + join(choices, ",") + "}";
  Flag f = make_flag(name, h, "", out->has_value() ? **out : "unset");
  f.set = [=](const std::string& t) {
    MT_RETURN_IF_ERROR(check_choice(name, t, choices));
    *out = t;
    return Status::ok();
  };
  add(std::move(f));
}

void FlagSet::add_choice(const std::string& name, const std::string& help,
                         std::vector<std::string> choices, const std::string& default_text,
                         std::function<void(const std::string&)> set) {
  Flag f = make_flag(name, help + " {" + join(choices, ",") + "}", "", default_text);
  f.set = [=](const std::string& t) {
    MT_RETURN_IF_ERROR(check_choice(name, t, choices));
    set(t);
    return Status::ok();
  };
  add(std::move(f));
}

void FlagSet::add_seen(const std::string& name, bool takes_value, const std::string& help,
                       std::vector<std::string> choices, std::function<void(const std::string&)> seen) {
  std::string h = help;
  if (!choices.empty()) h += " {" + join(choices, ",") + "}";
  Flag f = make_flag(name, h, "", "");
  f.takes_value = takes_value;
  if (takes_value) {
    f.set = [=](const std::string& t) {
      MT_RETURN_IF_ERROR(check_choice(name, t, choices));
      seen(t);
      return Status::ok();
    };
  } else {
    f.set_switch = [=] { seen(""); };
  }
  add(std::move(f));
}

void FlagSet::add_list(const std::string& name, std::vector<std::string>* out,
                       const std::string& help) {
  Flag f = make_flag(name, help, "", "");
  f.is_list = true;
  f.set = [=](const std::string& t) {
    out->push_back(t);
    return Status::ok();
  };
  f.clear = [=] { out->clear(); };
  add(std::move(f));
}

std::string FlagSet::closest(const std::string& unknown) const {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& name : order_) {
    size_t d = edit_distance(unknown, name);
    if (d < best_d) best_d = d, best = name;
  }
  // Also catch "--tp" style abbreviations of a longer flag.
  if (best_d > std::max<size_t>(3, unknown.size() / 3)) {
    for (const auto& name : order_)
      if (unknown.size() >= 4 && name.find(unknown) != std::string::npos) return name;
    return "";
  }
  return best;
}

Status FlagSet::parse(const std::vector<std::string>& args) {
  error_flag_.clear();
  // Every bad token is reported, not just the first: a Megatron launch
  // script with several flags this program does not take lists them all.
  std::vector<std::pair<std::string, std::string>> errors;  // (flag, message)
  parse_tokens(args, &errors);
  if (errors.empty()) return Status::ok();
  error_flag_ = errors.front().first;
  if (errors.size() == 1) return Status::invalid(errors.front().second);
  std::string m = fmt::format("{} problems on the command line:", errors.size());
  for (const auto& e : errors) m += "\n  - " + e.second;
  return Status::invalid(m);
}

std::vector<std::pair<std::string, std::vector<std::string>>> FlagSet::groups(const std::vector<std::string>& args) const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& tok = args[i];
    if (tok.size() < 3 || tok[0] != '-' || tok[1] != '-') {
      out.push_back({"", {tok}});
      continue;
    }
    std::string name = tok.substr(2);
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) name = name.substr(0, eq);
    std::vector<std::string> toks{tok};
    auto it = flags_.find(name);
    const bool list = it == flags_.end() || it->second.is_list;
    if (list) {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) toks.push_back(args[++i]);
    } else if (it->second.takes_value && !inline_value && i + 1 < args.size() &&
               !(args[i + 1].rfind("--", 0) == 0 && args[i + 1].size() > 2)) {
      toks.push_back(args[++i]);
    }
    out.push_back({name, std::move(toks)});
  }
  return out;
}

void FlagSet::parse_tokens(const std::vector<std::string>& args,
                           std::vector<std::pair<std::string, std::string>>* errors) {
  auto error = [&](const std::string& flag, std::string message) { errors->emplace_back(flag, std::move(message)); };
  // Values of a flag that could not be taken: the tokens up to the next --flag.
  auto skip_values = [&](size_t& i) {
    while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) ++i;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& tok = args[i];
    if (tok.size() < 3 || tok[0] != '-' || tok[1] != '-') {
      error("", fmt::format("unexpected argument {}: {} takes only --flags (see `{} --help`)", shown(tok), program_,
                            program_));
      continue;
    }
    std::string name = tok.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const std::string current = "--" + name;
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      std::string hint = closest(name);
      const std::string quoted = shown(name, 80);
      error(current, fmt::format("unknown flag --{}{}", quoted.substr(1, quoted.size() - 2),
                                 hint.empty() ? fmt::format(" (see `{} --help`)", program_)
                                              : fmt::format("; did you mean --{}?", hint)));
      skip_values(i);
      continue;
    }
    Flag& f = it->second;
    given_.insert(name);
    if (!f.takes_value) {
      if (inline_value) error(current, fmt::format("--{} is a switch and takes no value (got {})", name, shown(value)));
      else f.set_switch();
      continue;
    }
    if (f.is_list) {
      // As argparse's nargs lists: a flag given again replaces its values
      // (the last --data-path wins, as the last --lr does), never appends.
      f.clear();
      size_t n = 0;
      if (inline_value) {
        if (Status st = f.set(value); !st) error(current, st.message());
        ++n;
      }
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        if (Status st = f.set(args[++i]); !st) error(current, st.message());
        ++n;
      }
      if (n == 0) error(current, fmt::format("--{} needs at least one value", name));
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size() || (args[i + 1].rfind("--", 0) == 0 && args[i + 1].size() > 2)) {
        error(current, fmt::format("--{} needs a value", name));
        continue;
      }
      value = args[++i];
    }
    if (Status st = f.set(value); !st) error(current, st.message());
  }
}

std::string FlagSet::help() const {
  std::ostringstream out;
  out << "usage: " << program_ << " [--flag value ...]\n";
  if (!summary_.empty()) out << "\n" << summary_ << "\n";
  std::string current = "\x01";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    if (f.section != current) {
      current = f.section;
      out << "\n" << (current.empty() ? "options" : current) << ":\n";
    }
    std::string left = "  --" + name + (f.takes_value ? (f.is_list ? " V [V ...]" : " V") : "");
    if (left.size() < 44) left.resize(44, ' ');
    else left += "\n" + std::string(44, ' ');
    out << left << f.help;
    if (!f.default_text.empty() && f.takes_value) out << " (default: " << f.default_text << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace mt
