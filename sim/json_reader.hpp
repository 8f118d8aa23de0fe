// Strict reading of JSON input files: every key must be known, every required key present, each
// value of the right type and in range. Errors name file, field path, value and rule, e.g.
//   topologies/dgx-h100.json: network[1].efficiency = 1.3, must be in (0, 1]
#pragma once
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sim/check.hpp"

namespace trainplan {

// Input files (models, clusters, plans, measurements, configs) are small; a larger one is a mistake
// (or /dev/zero), so reading stops at this size.
inline constexpr std::uintmax_t kMaxInputFileBytes = 64ull << 20;  // 64 MiB

// The whole content of a regular file of at most `max_bytes`. Directories, FIFOs, devices and
// sockets are refused without opening them (a FIFO would block); InputError names the file.
std::string read_input_file(const std::filesystem::path& path, std::uintmax_t max_bytes);

// The largest magnitude of any number JsonObject::number accepts, whatever the bounds it is given
// (an upper bound of inf reads as this): no valid input or trainplan result comes near it (the
// largest results, costs of 1e19-token runs on the slowest allowed cluster, stay below 1e40),
// and sums, percentages and chart scales of larger figures overflow to inf.
inline constexpr double kMaxJsonMagnitude = 1e100;

// The deepest nesting of arrays and objects a JSON input may have (trainplan's own files nest
// fewer than 10 levels), and how many objects, arrays and strings it may hold in all: each costs
// 50-80 bytes of memory for its 3 bytes of text, so 64 MB of "{}," needed 2.2 GB (and 64 MB of
// "\"\"," ended in std::terminate under a 2 GiB limit); the largest trainplan file, a 60 MB search
// with every option, holds 304,146.
inline constexpr int kMaxJsonDepth = 64;
inline constexpr long long kMaxJsonAllocations = 1 << 22;
// And how many values of any kind (numbers, booleans and nulls too): each costs 16 bytes and more
// while its array grows, for as little as 2 bytes of text ("0,"), so 64 MiB of numbers needed
// 1 GB; 2^23 (~0.3 GB) is six times the 1.35 M values of the largest trainplan file above.
inline constexpr long long kMaxJsonValues = 1 << 23;

// What JSON text may still hold, counted down as it is parsed. A default one is one file's limits;
// a command that keeps several documents at once (report) reads them all through one budget, so
// that together they hold no more than one file may ("scope" names them in the message).
struct JsonBudget {
  long long allocations = kMaxJsonAllocations;  // objects, arrays and strings
  long long values = kMaxJsonValues;            // values of any kind
  std::string scope;                            // "" for one file, else e.g. "the report's inputs"
};

// Reads (as read_input_file, capped at kMaxInputFileBytes) and parses a JSON file; throws
// InputError naming the file for a missing or unreadable file or bad JSON.
nlohmann::json read_json_file(const std::filesystem::path& path);
// The same, counted against `budget` (kept across calls).
nlohmann::json read_json_file(const std::filesystem::path& path, JsonBudget& budget);

// Parses JSON text strictly (a key twice in one object is an error, so is nesting deeper than
// kMaxJsonDepth, more than kMaxJsonAllocations objects, arrays and strings or kMaxJsonValues
// values); `file` names it in messages.
nlohmann::json parse_json_text(const std::string& text, const std::string& file);
nlohmann::json parse_json_text(const std::string& text, const std::string& file, JsonBudget& budget);

// One JSON object being read. Call the accessors for every key, then finish() to reject extras.
// null is a value, not an absent key: a key given as null is "there" for has(), and each typed
// accessor refuses it ("must be a number, not null"), so that "micro_batches": null is never
// read as if the key were left out. A format whose null means "absent" (Hugging Face configs:
// "head_dim": null) asks has_value() instead, key by key.
class JsonObject {
 public:
  // `file` names the source in messages; `path` is the field path of this object ("" for root).
  JsonObject(const nlohmann::json& value, std::string file, std::string path = "");

  // A number in [lo, hi] ((lo, hi] with lo_open), both clamped to +-kMaxJsonMagnitude.
  double number(const std::string& key, double lo, double hi, bool lo_open = false) const;
  // The optional_ accessors: nullopt when the key is absent; null is refused as any wrong type is.
  std::optional<double> optional_number(const std::string& key, double lo, double hi,
                                        bool lo_open = false) const;
  long long integer(const std::string& key, long long lo, long long hi) const;
  std::string string(const std::string& key) const;
  std::optional<std::string> optional_string(const std::string& key) const;
  std::string choice(const std::string& key, std::initializer_list<const char*> allowed) const;
  bool boolean(const std::string& key) const;
  JsonObject object(const std::string& key) const;
  std::vector<JsonObject> objects(const std::string& key, std::size_t min_count = 0) const;
  const nlohmann::json& raw(const std::string& key) const;  // required key, any type
  // Whether the key is given (with any value, null included); marks it read.
  bool has(const std::string& key) const;
  // Whether the key is given with a value other than null; marks it read. Only for formats in
  // which null means "not set" (Hugging Face configs); trainplan's own files use has().
  bool has_value(const std::string& key) const;
  // The object's keys, sorted (for objects keyed by name; read each with an accessor).
  std::vector<std::string> keys() const;
  // Whether an accessor, has() or has_value() has asked for the key (given or not); marks nothing.
  // For formats whose unknown keys are left alone (Hugging Face configs): a key of some other
  // layout that the reader of this one never asked for can be refused rather than ignored.
  bool asked(const std::string& key) const { return seen_.count(key) > 0; }

  // Throws if the object holds a key that no accessor asked for.
  void finish() const;

  // Builds an InputError for this object's field: "<file>: <path.key> = <value>, <rule>".
  [[nodiscard]] InputError error(const std::string& key, const std::string& rule) const;
  const std::string& file() const { return file_; }
  std::string field(const std::string& key) const;

 private:
  const nlohmann::json& need(const std::string& key) const;
  const nlohmann::json* value_;
  std::string file_;
  std::string path_;
  mutable std::set<std::string> seen_;
};

}  // namespace trainplan
