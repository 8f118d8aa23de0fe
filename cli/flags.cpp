#include "cli/flags.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "sim/check.hpp"

namespace trainplan::cli {

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
  if (v->empty()) throw InputError(fmt::format("--{}: must not be empty", name));
  return *v;
}

std::optional<long long> Flags::get_optional_int(const std::string& name, long long lo, long long hi) const {
  auto v = get(name);
  if (!v) return std::nullopt;
  long long x = 0;
  auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || ptr != v->data() + v->size()) {
    throw InputError(fmt::format("--{} {}: must be an integer", name, *v));
  }
  if (x < lo || x > hi) throw InputError(fmt::format("--{} {}: must be in [{}, {}]", name, *v, lo, hi));
  return x;
}

long long Flags::get_int(const std::string& name, long long fallback, long long lo, long long hi) const {
  return get_optional_int(name, lo, hi).value_or(fallback);
}

double Flags::get_double(const std::string& name, double fallback, double lo, double hi) const {
  auto v = get(name);
  if (!v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (v->empty() || end != v->c_str() + v->size() || !std::isfinite(x)) {
    throw InputError(fmt::format("--{} {}: must be a number", name, *v));
  }
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
