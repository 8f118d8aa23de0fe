#include "sim/json_reader.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "sim/check.hpp"

namespace trainplan {

using nlohmann::json;

std::string read_input_file(const std::filesystem::path& path, std::uintmax_t max_bytes) {
  // stat() first: opening a FIFO would block until a writer appears, and a device such as
  // /dev/zero never ends. Only regular files (or links to them) are read.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(fmt::format("{}: cannot open file ({})", path.string(), std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) throw InputError(fmt::format("{}: cannot open file (is a directory)", path.string()));
  if (!S_ISREG(st.st_mode)) {
    throw InputError(fmt::format("{}: cannot open file (not a regular file: a FIFO, device or socket)", path.string()));
  }
  if (static_cast<std::uintmax_t>(st.st_size) > max_bytes) {
    throw InputError(fmt::format("{}: file is {} bytes, larger than the {} MiB an input file may have", path.string(),
                                 static_cast<std::uintmax_t>(st.st_size), max_bytes >> 20));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open file ({})", path.string(), std::strerror(errno)));
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw InputError(fmt::format("{}: cannot read file ({})", path.string(), why));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_bytes) {  // grew while we read it
      ::close(fd);
      throw InputError(fmt::format("{}: larger than the {} MiB an input file may have", path.string(), max_bytes >> 20));
    }
  }
  ::close(fd);
  return text;
}

json read_json_file(const std::filesystem::path& path) {
  JsonBudget one_file;
  return read_json_file(path, one_file);
}

json read_json_file(const std::filesystem::path& path, JsonBudget& budget) {
  return parse_json_text(read_input_file(path, kMaxInputFileBytes), path.string(), budget);
}

namespace {

// nlohmann's own DOM builder with three checks on the way:
//  - a key twice in one object (nlohmann keeps the last without a word; a strict reader must not
//    silently drop a value);
//  - nesting deeper than kMaxJsonDepth (printing a value, in error messages and reports, recurses
//    once per level: a value nested 100,000 deep in a field overflowed the stack);
//  - more than the budget's objects, arrays and strings, or values of any kind (memory: see
//    json_reader.hpp).
// parse() with a callback did the key check before, but after every object or array it closes the
// callback parser scans the parent for a discarded value: quadratic, so a 64 MB array of {} ran
// for hours. This builder is the plain parser's (linear).
class StrictDomParser : public nlohmann::detail::json_sax_dom_parser<json> {
  using Base = nlohmann::detail::json_sax_dom_parser<json>;

 public:
  StrictDomParser(json& result, const std::string& file, JsonBudget& budget)
      : Base(result, true), file_(file), budget_(budget) {}

  bool start_object(std::size_t n) {
    open();
    allocate();
    keys_.emplace_back();
    return Base::start_object(n);
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    open();
    allocate();
    return Base::start_array(n);
  }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  bool string(std::string& s) {
    allocate();
    return Base::string(s);
  }
  bool null() { return count(), Base::null(); }
  bool boolean(bool b) { return count(), Base::boolean(b); }
  bool number_integer(json::number_integer_t x) { return count(), Base::number_integer(x); }
  bool number_unsigned(json::number_unsigned_t x) { return count(), Base::number_unsigned(x); }
  bool number_float(json::number_float_t x, const json::string_t& text) { return count(), Base::number_float(x, text); }
  bool key(std::string& k) {
    if (!keys_.back().insert(k).second) {
      throw InputError(fmt::format("{}: key {} appears twice in the same object", file_, json(k).dump()));
    }
    return Base::key(k);
  }

 private:
  void open() {
    if (++depth_ > kMaxJsonDepth) {
      throw InputError(fmt::format("{}: values nested more than {} levels deep (no trainplan file nests so deep)",
                                   file_, kMaxJsonDepth));
    }
  }
  void allocate() {
    count();
    if (--budget_.allocations < 0) refuse(kMaxJsonAllocations, "objects, arrays and strings");
  }
  void count() {
    if (--budget_.values < 0) refuse(kMaxJsonValues, "values (numbers, strings, objects, ...)");
  }
  [[noreturn]] void refuse(long long limit, const char* what) const {
    if (budget_.scope.empty()) {
      throw InputError(fmt::format("{}: more than {} {} (no trainplan file holds so many)", file_, limit, what));
    }
    throw InputError(fmt::format("{}: {} hold more than {} {} together, the most one input file may hold (memory); "
                                 "give fewer or smaller files",
                                 file_, budget_.scope, limit, what));
  }
  const std::string& file_;
  JsonBudget& budget_;
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // of each open object
};

}  // namespace

json parse_json_text(const std::string& text, const std::string& file) {
  JsonBudget one_file;
  return parse_json_text(text, file, one_file);
}

json parse_json_text(const std::string& text, const std::string& file, JsonBudget& budget) {
  // nlohmann's lexer takes a NUL byte for the end of the input, so "{...}\0garbage" was read as
  // "{...}" without a word. JSON text never holds one (a string holds it escaped, \u0000).
  if (const auto nul = text.find('\0'); nul != std::string::npos) {
    throw InputError(fmt::format("{}: malformed JSON: a NUL byte at offset {} (JSON is text; is this a binary or "
                                 "zero-filled file?)",
                                 file, nul));
  }
  json result;
  StrictDomParser builder(result, file, budget);
  try {
    json::sax_parse(text, &builder);
  } catch (const json::exception& e) {
    // A syntax error, or e.g. out_of_range.406 for a number too large for a double (1e99999).
    // nlohmann's message starts with "[json.exception.parse_error.101] "; keep what follows.
    std::string what = e.what();
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(fmt::format("{}: malformed JSON: {}", file, what));
  }
  return result;
}

JsonObject::JsonObject(const json& value, std::string file, std::string path)
    : value_(&value), file_(std::move(file)), path_(std::move(path)) {
  if (!value.is_object()) {
    throw InputError(fmt::format("{}: {} must be a JSON object", file_, path_.empty() ? "top level" : path_));
  }
}

std::string JsonObject::field(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

// A value as a message shows it: its JSON text, cut short (with "...") past 80 characters; a whole
// array of thousands of events made a message of kilobytes.
static std::string shown_value(const json& v) {
  std::string text = v.dump();
  constexpr std::size_t kMaxShown = 80;
  if (text.size() <= kMaxShown) return text;
  std::size_t cut = kMaxShown - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return text.substr(0, cut) + "...";
}

InputError JsonObject::error(const std::string& key, const std::string& rule) const {
  auto it = value_->find(key);
  if (it == value_->end()) return InputError(fmt::format("{}: {} {}", file_, field(key), rule));
  return InputError(fmt::format("{}: {} = {}, {}", file_, field(key), shown_value(*it), rule));
}

bool JsonObject::has(const std::string& key) const {
  seen_.insert(key);
  return value_->contains(key);
}

bool JsonObject::has_value(const std::string& key) const {
  seen_.insert(key);
  const auto it = value_->find(key);
  return it != value_->end() && !it->is_null();
}

std::vector<std::string> JsonObject::keys() const {
  std::vector<std::string> out;
  for (auto it = value_->begin(); it != value_->end(); ++it) out.push_back(it.key());
  return out;
}

const json& JsonObject::need(const std::string& key) const {
  seen_.insert(key);
  auto it = value_->find(key);
  if (it == value_->end()) throw InputError(fmt::format("{}: {} is missing (required key)", file_, field(key)));
  return *it;
}

const json& JsonObject::raw(const std::string& key) const { return need(key); }

// A type rule as a message states it; for a null value it says so ("must be a number, not
// null"): a key given as null is refused, not read as absent.
static std::string type_rule(const json& v, const std::string& rule) {
  return v.is_null() ? rule + ", not null" : rule;
}

static std::string range_text(double lo, double hi, bool lo_open) {
  auto num = [](double v) { return std::isinf(v) ? std::string(v < 0 ? "-inf" : "inf") : fmt::format("{:g}", v); };
  return fmt::format("must be in {}{}, {}]", lo_open ? "(" : "[", num(lo), num(hi));
}

double JsonObject::number(const std::string& key, double lo, double hi, bool lo_open) const {
  const json& v = need(key);
  if (!v.is_number()) throw error(key, type_rule(v, "must be a number"));
  lo = std::max(lo, -kMaxJsonMagnitude);
  hi = std::min(hi, kMaxJsonMagnitude);
  double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) throw error(key, range_text(lo, hi, lo_open));
  return x;
}

std::optional<double> JsonObject::optional_number(const std::string& key, double lo, double hi,
                                                  bool lo_open) const {
  if (!has(key)) return std::nullopt;
  return number(key, lo, hi, lo_open);
}

long long JsonObject::integer(const std::string& key, long long lo, long long hi) const {
  const json& v = need(key);
  if (!v.is_number_integer()) {
    // 1e3 or 8.0: a whole number written as a real; say how to write it.
    const bool whole_real = v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>());
    throw error(key, whole_real ? "must be an integer, written without a decimal point or exponent"
                                : type_rule(v, "must be an integer"));
  }
  long long x = v.get<long long>();
  if (x < lo || x > hi) throw error(key, fmt::format("must be in [{}, {}]", lo, hi));
  return x;
}

std::string JsonObject::string(const std::string& key) const {
  const json& v = need(key);
  if (!v.is_string()) throw error(key, type_rule(v, "must be a string"));
  auto s = v.get<std::string>();
  if (s.empty()) throw error(key, "must not be empty");
  // Names and texts are printed on terminals: a newline or an escape sequence in a file must not
  // reach them (the message shows the value JSON-escaped).
  if (has_control_characters(s)) throw error(key, "must not contain control characters (newlines, escapes)");
  return s;
}

std::optional<std::string> JsonObject::optional_string(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

std::string JsonObject::choice(const std::string& key, std::initializer_list<const char*> allowed) const {
  const json& v = need(key);
  std::string list;
  for (const char* a : allowed) {
    if (!list.empty()) list += '|';
    list += a;
  }
  if (!v.is_string()) throw error(key, type_rule(v, "must be one of " + list));
  auto s = v.get<std::string>();
  for (const char* a : allowed)
    if (s == a) return s;
  throw error(key, "must be one of " + list);
}

bool JsonObject::boolean(const std::string& key) const {
  const json& v = need(key);
  if (!v.is_boolean()) throw error(key, type_rule(v, "must be true or false"));
  return v.get<bool>();
}

JsonObject JsonObject::object(const std::string& key) const {
  const json& v = need(key);
  if (!v.is_object()) throw error(key, type_rule(v, "must be a JSON object"));
  return JsonObject(v, file_, field(key));
}

std::vector<JsonObject> JsonObject::objects(const std::string& key, std::size_t min_count) const {
  const json& v = need(key);
  if (!v.is_array()) throw error(key, type_rule(v, "must be an array of objects"));
  if (v.size() < min_count) throw error(key, fmt::format("must hold at least {} entries", min_count));
  std::vector<JsonObject> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::string p = fmt::format("{}[{}]", field(key), i);
    if (!v[i].is_object()) throw InputError(fmt::format("{}: {} must be a JSON object", file_, p));
    out.emplace_back(v[i], file_, p);
  }
  return out;
}

void JsonObject::finish() const {
  for (auto it = value_->begin(); it != value_->end(); ++it) {
    if (!seen_.count(it.key())) {
      throw InputError(fmt::format("{}: {} is not a known key", file_, field(it.key())));
    }
  }
}

}  // namespace trainplan
