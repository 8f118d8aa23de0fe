#include "cli/flags.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>

#include "sim/check.hpp"

namespace trainplan::cli {

std::optional<double> parse_decimal(std::string_view text) {
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t from = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i - from;
  };
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  std::size_t mantissa = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  // from_chars takes no leading '+'; the grammar above already checked the rest.
  const char* first = text.data() + (text[0] == '+' ? 1 : 0);
  double x = 0;
  const auto [ptr, ec] = std::from_chars(first, text.data() + text.size(), x);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(x)) return std::nullopt;
  return x;
}

std::optional<long long> parse_integer(std::string_view text) {
  long long x = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return x;
}

InputError repeated_item(const std::string& flag, const std::string& value, const std::string& item) {
  return InputError(fmt::format("--{} {}: names {} twice", flag, value, item));
}

std::vector<std::string> split_list(const std::string& flag, const std::string& value) {
  std::vector<std::string> items;
  std::set<std::string> seen;  // a set, not a scan of items: a 128 KiB argument stays fast
  std::size_t from = 0;
  for (;;) {
    const std::size_t comma = value.find(',', from);
    items.push_back(value.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (items.back().empty()) {
      throw InputError(fmt::format("--{} {}: empty item in the comma-separated list", flag, value));
    }
    if (!seen.insert(items.back()).second) throw repeated_item(flag, value, items.back());
    if (comma == std::string::npos) return items;
    from = comma + 1;
  }
}

Flags::Flags(const std::vector<std::string>& args, std::string command, std::set<std::string> boolean_flags)
    : command_(std::move(command)) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (looks_like_short_flag(a)) {
      throw InputError(fmt::format("{}: flags start with two dashes (--{})", a, a.substr(1)));
    }
    if (!is_flag(a)) {
      positionals_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      if (boolean_flags.count(name)) throw InputError(fmt::format("--{}: takes no value (got '{}')", name, value));
      // "--json=--html" is a flag whose value was left out, as "--json --html" is.
      if (is_flag(value)) {
        throw InputError(fmt::format("--{}={}: the value starts with '--' like a flag (for a file of that name write ./{})",
                                     name, value, value));
      }
    } else if (boolean_flags.count(name)) {
      value = "on";
    } else if (i + 1 >= args.size() || is_flag(args[i + 1])) {
      // Reported when the command reads the flag ("needs a value") or, if it never does, by
      // finish() as an unknown flag: a misspelt last flag is not a missing value.
      if (!missing_value_.insert(name).second || values_.count(name)) {
        throw InputError(fmt::format("--{}: given more than once", name));
      }
      continue;
    } else {
      value = args[++i];
    }
    if (values_.count(name) || missing_value_.count(name)) throw InputError(fmt::format("--{}: given more than once", name));
    values_[name] = value;
  }
}

bool Flags::is_flag(const std::string& a) { return a.size() > 2 && a.rfind("--", 0) == 0; }

// "-gpus": one dash and a letter (not "-h", not a negative number such as "-1").
bool Flags::looks_like_short_flag(const std::string& a) {
  return a.size() > 2 && a[0] == '-' && a[1] != '-' && std::isalpha(static_cast<unsigned char>(a[1]));
}

void Flags::check_value(const std::string& name) const {
  if (missing_value_.count(name)) throw InputError(fmt::format("--{}: needs a value", name));
}

bool Flags::has(const std::string& name) const {
  read_.insert(name);
  return values_.count(name) != 0 || missing_value_.count(name) != 0;
}

std::optional<std::string> Flags::get(const std::string& name) const {
  read_.insert(name);
  check_value(name);
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  // No flag has an empty value: "--json=" or --tokens "" is a slip, never a meaning.
  if (it->second.empty()) throw InputError(fmt::format("--{}: must not be empty", name));
  return it->second;
}

std::optional<std::string> Flags::peek(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Flags::get_or(const std::string& name, const std::string& fallback) const {
  return get(name).value_or(fallback);
}

std::string Flags::require(const std::string& name) const {
  auto v = get(name);
  if (!v) throw InputError(fmt::format("--{}: required for 'trainplan {}' (see --help)", name, command_));
  return *v;
}

std::string Flags::get_text(const std::string& name, const std::string& fallback) const {
  const auto v = get(name);
  if (!v) return fallback;
  if (has_control_characters(*v)) {
    throw InputError(fmt::format("--{} {}: must not contain control characters or bytes that are not UTF-8", name, *v));
  }
  return *v;
}

std::optional<long long> Flags::get_optional_int(const std::string& name, long long lo, long long hi) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  const auto parsed = parse_integer(*v);
  if (!parsed) throw InputError(fmt::format("--{} {}: must be an integer", name, *v));
  const long long x = *parsed;
  if (x < lo || x > hi) throw InputError(fmt::format("--{} {}: must be in [{}, {}]", name, *v, lo, hi));
  return x;
}

long long Flags::get_int(const std::string& name, long long fallback, long long lo, long long hi) const {
  return get_optional_int(name, lo, hi).value_or(fallback);
}

double Flags::get_double(const std::string& name, double fallback, double lo, double hi) const {
  auto v = get(name);
  if (!v) return fallback;
  const auto parsed = parse_decimal(*v);
  if (!parsed) throw InputError(fmt::format("--{} {}: must be a decimal number, e.g. 2.5 or 1e-3", name, *v));
  const double x = *parsed;
  if (x < lo || x > hi) throw InputError(fmt::format("--{} {}: must be in [{:g}, {:g}]", name, *v, lo, hi));
  return x;
}

std::string Flags::get_choice(const std::string& name, const std::string& fallback,
                              const std::vector<std::string>& allowed) const {
  auto v = get(name);
  if (!v) return fallback;
  for (const auto& a : allowed)
    if (*v == a) return a;
  throw InputError(fmt::format("--{} {}: must be one of {}", name, *v, fmt::join(allowed, "|")));
}

const std::vector<std::string>& Flags::take_positionals() const {
  positionals_taken_ = true;
  return positionals_;
}

void Flags::finish() const {
  for (const auto& [name, value] : values_) {
    if (!read_.count(name)) {
      throw InputError(fmt::format("--{}: unknown flag for 'trainplan {}' (see trainplan {} --help)", name,
                                   command_, command_));
    }
  }
  for (const auto& name : missing_value_) {
    if (!read_.count(name)) {
      throw InputError(fmt::format("--{}: unknown flag for 'trainplan {}' (see trainplan {} --help)", name,
                                   command_, command_));
    }
    check_value(name);
  }
  if (!positionals_.empty() && !positionals_taken_) {
    throw InputError(fmt::format("{}: unexpected argument for 'trainplan {}'", positionals_.front(), command_));
  }
}

}  // namespace trainplan::cli
