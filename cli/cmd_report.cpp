// trainplan report: one self-contained HTML page of charts from trainplan's JSON files
// (reports/html_report.hpp).
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "cli/output.hpp"
#include "reports/html_report.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan report FILE.json... --html OUT.html [--title T]

Writes one self-contained HTML page (inline CSS and SVG charts; no script, no network request;
readable when printed) from the JSON files trainplan writes, one section per file:
  predict --json      the plan, memory per pipeline stage against the GPU's capacity, the
                      step-time breakdown
  simulate --json     the same with the simulated pipeline timeline (Gantt chart)
  search --json       the top layouts, step time vs peak memory of the feasible candidates
                      with the Pareto front, infeasible counts by reason
  capacity --json     days to train vs cost per cluster kind and size, deadline/budget picks
  exec --json         the measured run: step time spread, phases, memory per stage (a failed
                      run: which rank failed, in which step and phase, and why)
  compare --json      predicted vs measured: paired bars per phase and for memory, % error
The commands above also take --html FILE to write their own page directly.

  --html FILE     the page to write (required)
  --title T       the page's title (default: "trainplan report")

Each file is read by the strict reader of its schema, as compare and --plan read them.
Exit status: 0, or 2 on bad input (an unreadable file, an unknown schema, a missing figure, a
key the schema does not have).
)";

}  // namespace

int cmd_report(const Args& args, const Context& ctx) {
  Flags f(args, "report");
  if (f.help()) {
    ctx.out << kHelp;
    return 0;
  }
  const std::string out_path = f.require("html");
  CommandFiles outputs(f, ctx, {"html"});  // before any input is read: the path, inputs apart, their sizes
  // Written into the page: no control characters (as calibrate's --name).
  const std::string title = f.get_text("title", "trainplan report");
  const std::vector<std::string>& files = f.take_positionals();
  f.finish();
  if (files.empty()) throw InputError("expects at least one JSON file (see trainplan report --help)");
  // The documents are all held at once, so together they may hold what one file may (memory).
  JsonBudget budget{kMaxJsonAllocations, kMaxJsonValues, "the report's input files"};
  std::vector<ReportDocument> docs;
  for (const std::string& file : files) docs.push_back({file, read_json_file(file, budget)});
  outputs.stage("html", html_report(docs, title));
  ctx.out << fmt::format("report: {} ({} section{})\n", printable(out_path), docs.size(), docs.size() == 1 ? "" : "s");
  outputs.commit();
  return 0;
}

}  // namespace trainplan::cli
