// `trainplan report`: one self-contained HTML page (inline CSS and SVG, no script, no network
// request) drawn from trainplan's JSON documents, each read by its schema's reader
// (reports/*_json.hpp) and drawn from the document that gives. Formatting only: every figure on
// the page is a figure of the documents (bytes shown in GB = 1e9 B, seconds in s/ms/us); nothing
// is modelled here.
//
// Sections, each present only when a document has its data:
//   trainplan/prediction/v1  the plan (model, cluster, software, layout, tokens/s, MFU), memory per
//                            pipeline stage as stacked bars against the GPU capacity, the step-time
//                            breakdown; with a "simulation.timeline" (trainplan simulate --json) the
//                            pipeline timeline as a Gantt chart of stages x streams
//   trainplan/search/v1      the top layouts, a scatter of step time vs peak memory of the feasible
//                            candidates (thinned, svg::thin_points) with the Pareto front and the
//                            top K labelled, and the infeasible counts by reason
//   trainplan/capacity/v1    days to train vs cost per cluster kind and size, the deadline and
//                            budget picks marked, and the table of options
//   trainplan/measurement/v1 the measured run: step time spread, phase breakdown, memory per stage;
//                            a failed run: its rank, step, phase, error and memory at the failure
//   trainplan/comparison/v1  predicted vs measured: paired bars per phase and for memory, % error
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainplan {

struct ReportDocument {
  std::string file;     // where it came from, for messages and the page ("" for an in-memory result)
  nlohmann::json json;
};

// The document's kind from its "schema" ("prediction", "search", "capacity", "measurement",
// "comparison"); a prediction with a simulation timeline is still "prediction". Throws InputError
// naming the file for a non-object, a missing schema or one the report does not know.
std::string report_kind(const nlohmann::json& j, const std::string& file);

// The page. Throws InputError naming the file and the field when its reader refuses a document
// (a missing or unknown key, a wrong type, a figure out of range).
std::string html_report(const std::vector<ReportDocument>& docs, const std::string& title);

}  // namespace trainplan
