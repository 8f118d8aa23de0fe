// Golden outputs: the JSON that predict, search, simulate and capacity write for a fixed set of
// plans (tests/data/golden/cases.txt), compared with the files committed beside it. A refactor must
// leave these identical; a change to the cost or memory model changes them on purpose, and then
// the files are rewritten with `TRAINPLAN_GOLDEN_UPDATE=1 ctest -R test_golden` and the diff is
// reviewed in the commit.
//
// "Identical" allows a relative difference of 1e-9 in a number (the same formulas summed in
// another order) and ignores figures that measure the run rather than the plan (wall time,
// threads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kGolden = fs::path(TRAINPLAN_TEST_DATA_DIR) / "golden";

struct Case {
  std::string name;  // golden file stem
  std::string args;  // trainplan arguments, without --json
};

// cases.txt: one case per line, "name: arguments"; # starts a comment.
std::vector<Case> load_cases() {
  std::vector<Case> cases;
  std::ifstream in(kGolden / "cases.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    cases.push_back({line.substr(0, colon), line.substr(colon + 1)});
  }
  return cases;
}

bool volatile_key(const std::string& k) { return k == "elapsed_s" || k == "threads"; }

// Appends one line per difference between `want` and `got` under `path`.
void diff(const json& want, const json& got, const std::string& path, std::vector<std::string>& out) {
  if (out.size() > 20) return;
  if (want.is_number() && got.is_number()) {
    const double a = want.get<double>(), b = got.get<double>();
    if (a == b || std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b))) return;
    out.push_back(path + ": " + want.dump() + " -> " + got.dump());
    return;
  }
  if (want.type() != got.type()) {
    out.push_back(path + ": " + want.dump() + " -> " + got.dump());
    return;
  }
  if (want.is_object()) {
    for (const auto& [k, v] : want.items()) {
      if (volatile_key(k)) continue;
      if (!got.contains(k)) {
        out.push_back(path + "/" + k + ": missing");
        continue;
      }
      diff(v, got.at(k), path + "/" + k, out);
    }
    for (const auto& [k, v] : got.items()) {
      if (!want.contains(k) && !volatile_key(k)) out.push_back(path + "/" + k + ": new key");
    }
    return;
  }
  if (want.is_array()) {
    if (want.size() != got.size()) {
      out.push_back(path + ": " + std::to_string(want.size()) + " items -> " + std::to_string(got.size()));
      return;
    }
    for (std::size_t i = 0; i < want.size(); ++i) diff(want[i], got[i], path + "/" + std::to_string(i), out);
    return;
  }
  if (want != got) out.push_back(path + ": " + want.dump() + " -> " + got.dump());
}

class Golden : public trainplan::testing::CliTest {};

TEST_F(Golden, OutputsMatchCommittedFiles) {
  const std::vector<Case> cases = load_cases();
  ASSERT_GE(cases.size(), 6u) << "cases.txt missing or short: " << (kGolden / "cases.txt");
  const bool update = std::getenv("TRAINPLAN_GOLDEN_UPDATE") != nullptr;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + ":" + c.args);
    const fs::path out = dir_ / (c.name + ".json");
    const auto r = run(c.args + " --json " + out.string());
    ASSERT_TRUE(r.code == 0 || r.code == 3) << r.err;  // 3: an infeasible plan, still reported
    ASSERT_TRUE(fs::exists(out)) << "no JSON written";
    const json got = read(out);
    const fs::path want_file = kGolden / (c.name + ".json");
    if (update) {
      std::ofstream(want_file) << got.dump(2) << "\n";
      continue;
    }
    ASSERT_TRUE(fs::exists(want_file)) << want_file << " (run with TRAINPLAN_GOLDEN_UPDATE=1 to create it)";
    std::vector<std::string> diffs;
    diff(read(want_file), got, "", diffs);
    std::string text;
    for (const auto& d : diffs) text += "  " + d + "\n";
    EXPECT_TRUE(diffs.empty()) << c.name << " differs from " << want_file << ":\n" << text;
  }
}

}  // namespace
