#pragma once
// FlagSet: Megatron-style command-line flags (`--name value`, `--name=value`,
// switches `--name`), each bound to a field of a config struct. parse() fills
// the fields, remembers which flags were given, and turns every bad token into
// a one-line error that names the flag, what was expected and a fix.
//
// Like Megatron's argparse parser (allow_abbrev=False): no prefix matching,
// the last occurrence of a repeated flag wins, unknown flags are errors.
// Unlike argparse, parse() reports every bad token at once (an unknown flag
// takes the tokens up to the next --flag with it), so that a launch script
// written for Megatron gets one list of what to change.
// Several subcommands register the same groups of flags (see
// plan/plan_flags.h), so `megatron plan` accepts what `megatron train` does.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace mt {

class FlagSet {
 public:
  explicit FlagSet(std::string program, std::string summary = "");

  // Starts a titled group in --help; later flags belong to it.
  void section(const std::string& title);

  // Integer in [min, max]. `out` keeps its current value as the default.
  void add_int(const std::string& name, int64_t* out, const std::string& help,
               int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  void add_int(const std::string& name, std::optional<int64_t>* out, const std::string& help,
               int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  // Finite real number in [min, max]; accepts 13e9, 0.8, 1.5E-4.
  void add_double(const std::string& name, double* out, const std::string& help,
                  double min = -1e308, double max = 1e308);
  void add_double(const std::string& name, std::optional<double>* out, const std::string& help,
                  double min = -1e308, double max = 1e308);
  // A switch: `--name` stores `value` into *out (true unless stated).
  void add_switch(const std::string& name, bool* out, const std::string& help, bool value = true);
  // A string, optionally restricted to `choices`.
  void add_string(const std::string& name, std::string* out, const std::string& help,
                  std::vector<std::string> choices = {});
  void add_string(const std::string& name, std::optional<std::string>* out, const std::string& help,
                  std::vector<std::string> choices = {});
  // One of `choices`, handed to `set` (for enums kept outside strings).
  void add_choice(const std::string& name, const std::string& help, std::vector<std::string> choices,
                  const std::string& default_text, std::function<void(const std::string&)> set);
  // A flag whose given value ("" for a switch, takes_value false) is handed
  // to `seen` after the `choices` check (none when empty): the flags kept
  // for Megatron command lines (train/train_config.cc).
  void add_seen(const std::string& name, bool takes_value, const std::string& help,
                std::vector<std::string> choices, std::function<void(const std::string&)> seen);
  // One or more values up to the next `--flag` (argparse nargs='+').
  void add_list(const std::string& name, std::vector<std::string>* out, const std::string& help);

  // Parses argv-style tokens (without the program and subcommand names).
  Status parse(const std::vector<std::string>& args);

  // After a failed parse(): the flag the error is about ("" if none), with --.
  const std::string& error_flag() const { return error_flag_; }
  bool given(const std::string& name) const { return given_.count(name) != 0; }
  // args cut into one (flag name, its tokens) group per flag, as parse()
  // would read them (a switch alone; a value flag with its value; a list
  // with every value up to the next --flag; an unknown flag likewise).
  // Tokens that are not flags form groups with an empty name.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups(const std::vector<std::string>& args) const;
  bool has(const std::string& name) const { return flags_.count(name) != 0; }
  std::string help() const;
  const std::string& program() const { return program_; }
  const std::vector<std::string>& names() const { return order_; }  // every flag, in registration order

 private:
  struct Flag {
    std::string name, help, section, default_text;
    bool takes_value = true;
    bool is_list = false;
    std::function<Status(const std::string&)> set;  // for values
    std::function<void()> set_switch;               // for switches
    std::function<void()> clear;                    // for lists: drop the values given so far
  };
  static Flag make_flag(const std::string& name, const std::string& help, const std::string& section,
                        const std::string& default_text);
  void add(Flag f);
  std::string closest(const std::string& unknown) const;
  void parse_tokens(const std::vector<std::string>& args, std::vector<std::pair<std::string, std::string>>* errors);

  std::string program_, summary_, section_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
  std::set<std::string> given_;
  std::string error_flag_;
};

// Parsing helpers, exposed for tests and for other readers of numbers.
Status parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max,
                 int64_t* out);
Status parse_double(const std::string& flag, const std::string& text, double min, double max,
                    double* out);

}  // namespace mt
