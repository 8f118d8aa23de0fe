// A small command-line flag reader: "--name value" or "--name=value", plus positionals.
// Every flag a command reads is marked; finish() rejects the rest, so nothing is silently ignored.
// All errors are InputError naming the flag and the rule.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sim/check.hpp"

namespace trainplan::cli {

// A number as a person writes it in decimal: an optional sign, digits with an optional fraction
// (or a fraction alone), an optional exponent, and finite. Nothing else: no hexadecimal (0x1p3),
// inf or nan, spaces or trailing text. Every real-valued flag reads through it.
std::optional<double> parse_decimal(std::string_view text);

// A whole number in decimal digits with an optional '-' (from_chars' grammar: no '+', spaces or
// trailing text), and within long long; nothing otherwise. Every integer flag and list item reads
// through it.
std::optional<long long> parse_integer(std::string_view text);

// The items of a comma-separated flag value ("0,1,3"). InputError naming --flag for an empty
// list or an empty item ("1,,2", "1,", ",1"), and for an item given twice ("0,0"; repeated_item):
// every list flag names a set of choices, so a repeat is a slip, never a second meaning.
std::vector<std::string> split_list(const std::string& flag, const std::string& value);

// The one refusal of a list flag whose `value` names `item` twice: split_list's for the same text,
// and a command's own for two spellings of one value ("--sizes 1e3,1000", "--trace-ranks 0-3,2").
InputError repeated_item(const std::string& flag, const std::string& value, const std::string& item);

class Flags {
 public:
  // `command` names the subcommand in messages ("predict"). `boolean_flags` take no value.
  Flags(const std::vector<std::string>& args, std::string command, std::set<std::string> boolean_flags = {});

  bool has(const std::string& name) const;  // given on the command line (marks it read)
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& fallback) const;
  std::string require(const std::string& name) const;
  // Free text (a name or title written into output): no control characters. `fallback` when absent.
  std::string get_text(const std::string& name, const std::string& fallback) const;
  // The value given for --name, without marking it read (for cross-checks such as outputs vs
  // inputs); nothing when absent or given without a value.
  std::optional<std::string> peek(const std::string& name) const;
  // Integer / real (parse_decimal) in [lo, hi]; `fallback` when absent.
  long long get_int(const std::string& name, long long fallback, long long lo, long long hi) const;
  std::optional<long long> get_optional_int(const std::string& name, long long lo, long long hi) const;
  double get_double(const std::string& name, double fallback, double lo, double hi) const;
  // Value must be one of `allowed`.
  std::string get_choice(const std::string& name, const std::string& fallback,
                         const std::vector<std::string>& allowed) const;
  // Arguments that are not flags. Reading them through take_positionals() accepts them; a command
  // that never does rejects any in finish().
  const std::vector<std::string>& positionals() const { return positionals_; }
  const std::vector<std::string>& take_positionals() const;
  // Every flag given with a value, by name (without marking any read): the command's files are
  // among these and the positionals (see CommandFiles).
  const std::map<std::string, std::string>& given() const { return values_; }
  bool help() const { return help_; }
  const std::string& command() const { return command_; }

  // Throws InputError for any flag given but never read.
  void finish() const;

 private:
  static bool is_flag(const std::string& a);
  static bool looks_like_short_flag(const std::string& a);
  void check_value(const std::string& name) const;  // throws "needs a value" for a bare flag

  std::string command_;
  std::set<std::string> missing_value_;  // flags given last or followed by another flag
  std::map<std::string, std::string> values_;
  std::vector<std::string> positionals_;
  mutable std::set<std::string> read_;
  bool help_ = false;
  mutable bool positionals_taken_ = false;
};

}  // namespace trainplan::cli
