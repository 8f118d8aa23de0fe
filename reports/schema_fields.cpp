#include "reports/schema_fields.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/check.hpp"

namespace trainplan::schema {

using nlohmann::json;

namespace {

// The entry's value as a message shows it (cut past 80 characters, as JsonObject does).
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() <= 80) return s;
  std::size_t cut = 77;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return s.substr(0, cut) + "...";
}

InputError entry_error(const JsonObject& o, const std::string& key, std::size_t i, const json& v,
                       const std::string& rule) {
  return InputError(fmt::format("{}: {}[{}] = {}, {}", o.file(), o.field(key), i, shown(v), rule));
}

bool has_control(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c < 0x20 || c == 0x7f;
  });
}

constexpr const char* kNoControl = "must not contain control characters (newlines, escapes)";

std::string range_text(double lo, double hi, bool lo_open) {
  auto num = [](double v) { return std::isinf(v) ? std::string(v < 0 ? "-inf" : "inf") : fmt::format("{:g}", v); };
  return fmt::format("must be in {}{}, {}]", lo_open ? "(" : "[", num(lo), num(hi));
}

}  // namespace

std::string text(const JsonObject& o, const std::string& key) {
  const json& v = o.raw(key);
  if (!v.is_string()) throw o.error(key, "must be a string");
  std::string s = v.get<std::string>();
  if (has_control(s)) throw o.error(key, kNoControl);
  return s;
}

std::vector<std::string> texts(const JsonObject& o, const std::string& key) {
  const json& a = array(o, key);
  std::vector<std::string> out;
  out.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_string()) throw entry_error(o, key, i, a[i], "must be a string");
    out.push_back(a[i].get<std::string>());
    if (has_control(out.back())) throw entry_error(o, key, i, a[i], kNoControl);
  }
  return out;
}

std::vector<double> numbers(const JsonObject& o, const std::string& key, double lo, double hi, bool lo_open) {
  const json& a = array(o, key);
  lo = std::max(lo, -kMaxJsonMagnitude);
  hi = std::min(hi, kMaxJsonMagnitude);
  std::vector<double> out;
  out.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number()) throw entry_error(o, key, i, a[i], "must be a number");
    const double x = a[i].get<double>();
    if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
      throw entry_error(o, key, i, a[i], range_text(lo, hi, lo_open));
    }
    out.push_back(x);
  }
  return out;
}

std::vector<long long> integers(const JsonObject& o, const std::string& key, long long lo, long long hi) {
  const json& a = array(o, key);
  std::vector<long long> out;
  out.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number_integer()) throw entry_error(o, key, i, a[i], "must be an integer");
    const long long x = a[i].get<long long>();
    if (x < lo || x > hi) throw entry_error(o, key, i, a[i], fmt::format("must be in [{}, {}]", lo, hi));
    out.push_back(x);
  }
  return out;
}

std::vector<bool> booleans(const JsonObject& o, const std::string& key) {
  const json& a = array(o, key);
  std::vector<bool> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_boolean()) throw entry_error(o, key, i, a[i], "must be true or false");
    out.push_back(a[i].get<bool>());
  }
  return out;
}

std::optional<double> nullable_number(const JsonObject& o, const std::string& key, double lo, double hi) {
  if (o.raw(key).is_null()) return std::nullopt;
  return o.number(key, lo, hi);
}

std::optional<long long> nullable_integer(const JsonObject& o, const std::string& key, long long lo, long long hi) {
  if (o.raw(key).is_null()) return std::nullopt;
  return o.integer(key, lo, hi);
}

bool has(const JsonObject& o, const std::string& key) {
  if (!o.has(key)) return false;
  if (o.raw(key).is_null()) throw o.error(key, "must not be null");
  return true;
}

double seconds(const JsonObject& o, const std::string& key) { return std::max(0.0, o.number(key, -1e-9, kInf)); }

const json& array(const JsonObject& o, const std::string& key) {
  const json& a = o.raw(key);
  if (!a.is_array()) throw o.error(key, "must be an array");
  return a;
}

std::string nested(const JsonObject& o, const std::string& key, std::size_t i) {
  return fmt::format("{}: {}[{}]", o.file(), o.field(key), i);
}

std::string nested(const JsonObject& o, const std::string& key) { return fmt::format("{}: {}", o.file(), o.field(key)); }

void check_consistent(const JsonObject& o, const std::string& key, double stored, double expected,
                      const std::string& rule) {
  const double tol = 1e-9 * std::max({1.0, std::fabs(stored), std::fabs(expected)});
  if (!(std::fabs(stored - expected) <= tol)) throw o.error(key, rule);
}

void check_stage_count(const JsonObject& section, const std::string& key, std::size_t entries, int pp) {
  if (static_cast<long long>(entries) != pp) {
    throw section.error(key, fmt::format("has {} entries, must have one per pipeline stage (strategy.pp = {})", entries, pp));
  }
}

void check_stage_index(const JsonObject& entry, int stage, std::size_t i) {
  if (stage != static_cast<int>(i)) throw entry.error("stage", fmt::format("must be {} (one entry per pipeline stage, in order)", i));
}

void check_schema(const JsonObject& root, const char* expected, const std::string& hint) {
  if (root.string("schema") != expected) throw root.error("schema", fmt::format("must be \"{}\" ({})", expected, hint));
}

}  // namespace trainplan::schema
