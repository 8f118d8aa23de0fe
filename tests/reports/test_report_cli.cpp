// `trainplan report` and the --html / --csv outputs end to end on the real binary: each report
// type from real command output, the page well-formed XML (python3's expat parser; python3 is a
// project dependency, see cmake/install-deps.sh), self-contained, and bad input refused in one line.
#include "cli_fixture.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <string>

namespace {

namespace fs = std::filesystem;
using trainplan::testing::Result;
using trainplan::testing::slurp;

const std::string kCompare = std::string(TRAINPLAN_TEST_DATA_DIR) + "/compare/";

class ReportCli : public trainplan::testing::CliTest {
 protected:
  // Parses `html` with python3's XML parser; "" when well-formed, else the parser's message.
  std::string xml_error(const fs::path& html) const {
    const fs::path msg = dir_ / "xml.txt";
    const std::string cmd = "python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' '" +
                            html.string() + "' >'" + msg.string() + "' 2>&1";
    return std::system(cmd.c_str()) == 0 ? "" : slurp(msg) + "(python3 missing?)";
  }
  // Checks what every page must be: well-formed, no script, no URL but the SVG namespace.
  void expect_self_contained(const fs::path& html) const {
    ASSERT_TRUE(fs::exists(html)) << html;
    EXPECT_EQ(xml_error(html), "") << html;
    const std::string s = slurp(html);
    EXPECT_EQ(s.find("<script"), std::string::npos);
    std::string rest = std::regex_replace(s, std::regex("http://www\\.w3\\.org/2000/svg"), "");
    EXPECT_EQ(rest.find("http"), std::string::npos) << "a network reference in " << html;
    EXPECT_EQ(rest.find("url("), std::string::npos);
  }
  static std::size_t count(const std::string& s, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  }
};

TEST_F(ReportCli, PredictWritesMemoryAndTimeCharts) {
  const fs::path html = dir_ / "p.html";
  const Result r = run("predict --model llama2-7b --cluster dgx-h100 --gpus 16 --tp 2 --pp 2 --global-batch 64 --html " +
                       html.string());
  ASSERT_EQ(r.code, 0) << r.err;
  expect_self_contained(html);
  const std::string s = slurp(html);
  EXPECT_NE(s.find("<section id=\"prediction-1\""), std::string::npos);
  EXPECT_NE(s.find("memory per GPU (GB)"), std::string::npos);
  EXPECT_NE(s.find("time per step ("), std::string::npos);
  EXPECT_NE(s.find(">stage 1</text>"), std::string::npos);  // a bar per pipeline stage
  EXPECT_NE(s.find("class=\"reference\""), std::string::npos);  // the GPU's capacity line
  // The plan section's cost per step, with the price's source.
  EXPECT_NE(s.find("<dt>cost per step</dt><dd>$"), std::string::npos);
  EXPECT_NE(s.find("per GPU-hour; price_per_gpu_hour_usd of cluster file dgx-h100"), std::string::npos);
  // A phone scrolls a chart sideways instead of shrinking its text.
  EXPECT_NE(s.find("figure > svg { min-width: 600px; }"), std::string::npos);
}

TEST_F(ReportCli, EveryKindFromRealOutput) {
  const std::string d = dir_.string() + "/";
  ASSERT_EQ(run("simulate --model gpt2 --cluster dgx-a100-80g --gpus 8 --pp 4 --global-batch 32 --json " + d + "sim.json").code, 0);
  ASSERT_EQ(run("search --model gpt2-xl --cluster dgx-a100-40g --gpus 8 --global-batch 64 --top 5 --threads 1 --json " + d +
                "search.json").code, 0);
  ASSERT_EQ(run("capacity --model llama3-8b --tokens 1T --clusters dgx-a100-80g,dgx-h100 --gpus-range 64..128 "
                "--deadline-days 40 --threads 1 --json " + d + "cap.json").code, 0);
  ASSERT_EQ(run("compare " + kCompare + "prediction_pp2.json " + kCompare + "measurement_pp2.json --json " + d + "cmp.json").code, 0);
  const Result r = run("report " + d + "sim.json " + d + "search.json " + d + "cap.json " + d + "cmp.json " + kCompare +
                       "measurement_pp2.json --title 'All & sundry' --html " + d + "all.html");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("5 sections"), std::string::npos) << r.out;
  expect_self_contained(dir_ / "all.html");
  const std::string s = slurp(dir_ / "all.html");
  EXPECT_NE(s.find("<title>All &amp; sundry</title>"), std::string::npos);
  for (const char* id : {"prediction-1", "search-2", "capacity-3", "comparison-4", "measurement-5"}) {
    EXPECT_NE(s.find(std::string("<section id=\"") + id + "\""), std::string::npos) << id;
  }
  // The simulated timeline as a Gantt chart: rows per stage and stream.
  EXPECT_NE(s.find("stage 3 compute"), std::string::npos);
  EXPECT_NE(s.find("time since the step started"), std::string::npos);
  // Search: the candidates drawn are those the JSON carries, the front as a line, top 5 labelled.
  const nlohmann::json search = read(dir_ / "search.json");
  const std::size_t drawn = search["candidates"]["step_s"].size();
  EXPECT_GT(drawn, 10u);
  const std::size_t from = s.find("<section id=\"search-2\"");
  const std::string section = s.substr(from, s.find("</section>", from) - from);
  EXPECT_EQ(count(section, "class=\"point s0\""), drawn);
  EXPECT_EQ(count(section, "class=\"point s1\""), search["pareto"].size());
  EXPECT_EQ(count(section, "class=\"point s2\""), 5u);
  EXPECT_NE(section.find("class=\"line s1\""), std::string::npos);
  // Capacity: log axes, one series per cluster kind, the deadline pick ringed.
  EXPECT_NE(s.find("days to train"), std::string::npos);
  EXPECT_EQ(count(s, "class=\"marker\""), 1u);
  // Comparison: paired bars, the error of the step and n/a where both sides are 0.
  EXPECT_NE(s.find("error -21.6%"), std::string::npos);
  EXPECT_NE(s.find("n/a (both 0)"), std::string::npos);
}

// The capacity page for a buyer: dollars, days and tokens as people write them (no "50000000" or
// "1.5e+13"), the price per GPU-hour of each cluster and whether it is assumed, goodput and energy.
TEST_F(ReportCli, CapacityPageStatesPricesGoodputAndEnergyInPeoplesUnits) {
  const fs::path html = dir_ / "c.html";
  ASSERT_EQ(run("capacity --model llama3-70b --tokens 15T --clusters dgx-h100,mi300x --gpus-range 512..2048 "
                "--deadline-days 120 --price mi300x=2.1 --threads 1 --html " + html.string()).code, 0);
  expect_self_contained(html);
  const std::string s = slurp(html);
  EXPECT_EQ(s.find("e+"), std::string::npos);                 // no exponent anywhere
  EXPECT_EQ(s.find(">1.5e"), std::string::npos);
  EXPECT_NE(s.find("<dd>15T</dd>"), std::string::npos);        // tokens
  EXPECT_NE(s.find("dgx-h100 $3.00 (assumed)"), std::string::npos);
  EXPECT_NE(s.find("mi300x $2.10 (--price)"), std::string::npos);
  EXPECT_NE(s.find("s comparison</h3>"), std::string::npos);  // Buyer's, escaped
  for (const char* column : {"goodput", "energy MWh", "per GPU-hour", "cost with failures"}) {
    EXPECT_NE(s.find(column), std::string::npos) << column;
  }
  // Cost ticks in dollars with a suffix; no tick of eight digits.
  EXPECT_NE(s.find(R"(class="tick" x="70")"), std::string::npos);
  EXPECT_TRUE(s.find(">$10M<") != std::string::npos || s.find(">$20M<") != std::string::npos) << s.substr(0, 200);
  EXPECT_EQ(s.find("0000000<"), std::string::npos);
}

TEST_F(ReportCli, HtmlShortcutsOfEachCommand) {
  const std::string d = dir_.string() + "/";
  ASSERT_EQ(run("simulate --model gpt2 --cluster dgx-a100-80g --gpus 4 --pp 2 --global-batch 8 --html " + d + "s.html").code, 0);
  ASSERT_EQ(run("search --model gpt2 --cluster dgx-a100-40g --gpus 8 --global-batch 32 --top 3 --threads 1 --html " + d +
                "q.html").code, 0);
  ASSERT_EQ(run("capacity --model gpt2 --tokens 10B --clusters dgx-h100 --gpus-range 8..16 --threads 1 --html " + d +
                "c.html").code, 0);
  ASSERT_EQ(run("compare " + kCompare + "prediction_pp2.json " + kCompare + "measurement_pp2.json --html " + d + "m.html").code, 0);
  for (const char* f : {"s.html", "q.html", "c.html", "m.html"}) expect_self_contained(dir_ / f);
  EXPECT_NE(slurp(dir_ / "q.html").find("class=\"point s0\""), std::string::npos);
}

TEST_F(ReportCli, CsvHasAHeaderWithUnitsAndOneRowPerLayout) {
  const std::string d = dir_.string() + "/";
  ASSERT_EQ(run("search --model gpt2-xl --cluster dgx-a100-40g --gpus 8 --global-batch 64 --top 5 --threads 1 --csv " + d +
                "s.csv --json " + d + "s.json").code, 0);
  const std::string csv = slurp(dir_ / "s.csv");
  const std::string head = csv.substr(0, csv.find("\r\n"));
  for (const char* col : {"peak_memory_GB", "step_s", "tokens_per_s", "mfu_percent"}) {
    EXPECT_NE(head.find(col), std::string::npos) << col;
  }
  const nlohmann::json j = read(dir_ / "s.json");
  EXPECT_EQ(count(csv, "\r\ntop,"), 5u);
  EXPECT_EQ(count(csv, "\r\npareto,"), j["pareto"].size());
  EXPECT_EQ(count(csv, "\r\ninfeasible,"), j["infeasible"].size());
  // The first row's step time is the JSON's, as the shortest text that reads back the same.
  const std::string row1 = csv.substr(head.size() + 2, csv.find("\r\n", head.size() + 2) - head.size() - 2);
  EXPECT_NE(row1.find(fmt::format(",{},", j["top"][0]["time"]["step_s"].get<double>())), std::string::npos) << row1;

  ASSERT_EQ(run("capacity --model gpt2 --tokens 10B --clusters dgx-h100 --gpus-range 8..16 --threads 1 --csv " + d + "c.csv").code, 0);
  const std::string cap = slurp(dir_ / "c.csv");
  EXPECT_EQ(cap.rfind("cluster,feasible,layout", 0), 0u);
  EXPECT_NE(cap.find("cost_USD"), std::string::npos);
  EXPECT_EQ(count(cap, "\r\n"), 3u);  // header + 8 and 16 GPUs
}

TEST_F(ReportCli, BadInputIsOneLineAndExit2) {
  const std::string d = dir_.string() + "/";
  auto expect_refused = [&](const std::string& args, const std::string& words) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
  };
  // A JSON file of another kind (a model file) has no trainplan schema.
  expect_refused("report " + std::string(TRAINPLAN_SOURCE_DIR) + "/models/gpt2.json --html " + d + "x.html", "schema");
  expect_refused("report " + d + "missing.json --html " + d + "x.html", "missing.json");
  expect_refused("report " + kCompare + "truncated.json --html " + d + "x.html", "truncated.json");
  expect_refused("report " + kCompare + "measurement_pp2.json", "--html");
  expect_refused("report --html " + d + "x.html", "at least one JSON file");
  expect_refused("report " + kCompare + "measurement_pp2.json --html " + d + "no/such/dir/x.html", "--html");
  expect_refused("report " + kCompare + "measurement_pp2.json --html " + kCompare + "measurement_pp2.json", "input file");
  expect_refused("search --model gpt2 --cluster dgx-h100 --gpus 8 --global-batch 8 --csv " + d + "no/dir/x.csv", "--csv");
  EXPECT_FALSE(fs::exists(dir_ / "x.html"));  // nothing written by a refused command
}

}  // namespace

// Every console prints the version, counts, times and bytes by the same rules.
namespace {

class ConsoleCli : public trainplan::testing::CliTest {};

TEST_F(ConsoleCli, VersionFlag) {
  const Result r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("trainplan ", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find("unknown"), std::string::npos) << r.out;
}

TEST_F(ConsoleCli, TraceRanksLimitsTheTrace) {
  const fs::path trace = dir_ / "t.json";
  // dp2 tp2 pp4: replica 0 runs stages on ranks 0-1, 4-5, 8-9, 12-13.
  const std::string plan = "simulate --model gpt2 --cluster dgx-a100-80g --gpus 16 --pp 4 --tp 2 --global-batch 32 --trace " +
                           trace.string();
  Result r = run(plan + " --trace-ranks 0,4-5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(3 ranks x 4 streams)"), std::string::npos) << r.out;
  std::set<int> pids;
  const nlohmann::json t = read(trace);
  for (const auto& e : t["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 4, 5}));
  r = run(plan + " --trace-ranks 2-3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("names no rank of data-parallel replica 0"), std::string::npos) << r.err;
  r = run(plan + " --trace-ranks 16");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("rank 16 is not among the plan's 16 ranks"), std::string::npos) << r.err;
}

TEST_F(ConsoleCli, ZerosPluralsAndSmallModels) {
  Result r = run("predict --model gpt2 --cluster dgx-a100-80g --gpus 1 --global-batch 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("124.4M parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(1 GPU, 1 micro-batch of"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0.0 us"), std::string::npos) << r.out;
  r = run("compare " + kCompare + "prediction_pp2.json " + kCompare + "measurement_pp2.json");
  ASSERT_EQ(r.code, 0) << r.err;
  // Recomputation is 0 on both sides: its error is n/a, not +0.0%.
  const std::size_t at = r.out.find("  recompute");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find("n/a"), std::string::npos) << line;
  EXPECT_EQ(line.find("%"), std::string::npos) << line;
}

// Every console prints times and bytes by one rule (reports/console.hpp): GB/MB/kB with one decimal,
// seconds with three, ms with two, us with one; no MiB.
TEST_F(ConsoleCli, OnePrecisionForTimesAndBytesEverywhere) {
  const std::vector<std::string> commands = {
      "predict --model gpt2 --cluster dgx-a100-80g --gpus 8 --pp 2 --global-batch 32",
      "simulate --model gpt2 --cluster dgx-a100-80g --gpus 8 --pp 2 --global-batch 32",
      "search --model gpt2 --cluster dgx-a100-80g --gpus 8 --global-batch 32",
      "capacity --model gpt2 --tokens 1B --clusters dgx-a100-80g --gpus-range 8..16",
      "compare " + kCompare + "prediction_pp2.json " + kCompare + "measurement_pp2.json"};
  const std::regex bytes(R"((\d+(\.\d+)?) (GB|MB|kB)\b)"), secs(R"((\d+(\.\d+)?) (s|ms|us)\b)");
  for (const std::string& c : commands) {
    const Result r = run(c);
    ASSERT_EQ(r.code, 0) << c << "\n" << r.err;
    EXPECT_EQ(r.out.find("MiB"), std::string::npos) << c;
    int seen = 0;
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), bytes), end; it != end; ++it, ++seen) {
      EXPECT_EQ((*it)[2].str().size(), 2u) << c << ": " << (*it)[0] << " (one decimal)";
    }
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), secs), end; it != end; ++it) {
      const std::string unit = (*it)[3], num = (*it)[1];
      if (num == "0") continue;  // "0 s"
      const std::size_t decimals = (*it)[2].str().empty() ? 0 : (*it)[2].str().size() - 1;
      EXPECT_EQ(decimals, unit == "s" ? 3u : unit == "ms" ? 2u : 1u) << c << ": " << (*it)[0];
    }
    if (c.rfind("capacity", 0) != 0) {
      EXPECT_GT(seen, 0) << c << " prints no bytes:\n" << r.out;
    }
  }
}

}  // namespace
