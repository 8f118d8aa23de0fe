// Reading the fields of trainplan's result documents (the *_from_json readers of reports/): the
// accessors sim/json_reader.hpp's JsonObject lacks for what results hold -- texts that may be
// empty, arrays of numbers, integers and texts, figures that may be null, nested documents -- with
// the same rules and the same messages ("<file>: <field> = <value>, <rule>").
#pragma once
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/json_reader.hpp"

namespace trainplan::schema {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A text that may be empty (a name a document leaves out is ""); like JsonObject::string it
// refuses control characters, which would reach a terminal or a page.
std::string text(const JsonObject& o, const std::string& key);
// An array of texts (each may be empty).
std::vector<std::string> texts(const JsonObject& o, const std::string& key);

// An array of numbers, each in [lo, hi] ((lo, hi] with lo_open); bounds clamped to
// +-kMaxJsonMagnitude as JsonObject::number clamps them. Names the entry, e.g. "step_s[3]".
std::vector<double> numbers(const JsonObject& o, const std::string& key, double lo, double hi,
                            bool lo_open = false);
// An array of integers in [lo, hi].
std::vector<long long> integers(const JsonObject& o, const std::string& key, long long lo, long long hi);
// An array of true/false.
std::vector<bool> booleans(const JsonObject& o, const std::string& key);

// A figure the schema allows as null ("not known", "never finishes"): nullopt for null, else a
// number in [lo, hi]. The key is required.
std::optional<double> nullable_number(const JsonObject& o, const std::string& key, double lo, double hi);
std::optional<long long> nullable_integer(const JsonObject& o, const std::string& key, long long lo, long long hi);

// Whether an optional key is there (and marks it read). Its value must not be null: null appears
// only where a schema says so (read those with nullable_number).
bool has(const JsonObject& o, const std::string& key);

// A time the writer computed as a difference: zero up to rounding (-1e-9 s or less in magnitude)
// reads as 0; anything more negative is an error.
double seconds(const JsonObject& o, const std::string& key);

// The array under `key` (each entry read by the caller, e.g. a nested document).
const nlohmann::json& array(const JsonObject& o, const std::string& key);

// The name a nested document (an entry of `key`) is read under: "<file>: <path.key>[i]", so that
// its errors read "search.json: top[0]: memory.peak_bytes = -1, ...".
std::string nested(const JsonObject& o, const std::string& key, std::size_t i);
std::string nested(const JsonObject& o, const std::string& key);

// Two figures the writer derives from one another must agree, to rounding in the file.
void check_consistent(const JsonObject& o, const std::string& key, double stored, double expected,
                      const std::string& rule);

// A per-stage list (a memory section's "per_stage", a simulation's "stages") holds one entry per
// pipeline stage of the strategy, in order: `entries` of them under `key` for `pp` stages
// (check_stage_count, on the section holding the list), and entry i is stage i
// (check_stage_index, on the entry).
void check_stage_count(const JsonObject& section, const std::string& key, std::size_t entries, int pp);
void check_stage_index(const JsonObject& entry, int stage, std::size_t i);

// The document's "schema" must be `expected`; `hint` ends the message (e.g. "is this a
// measurement file?").
void check_schema(const JsonObject& root, const char* expected, const std::string& hint);

}  // namespace trainplan::schema
