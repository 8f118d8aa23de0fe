// Fuzz target: the command line of predict. The input is split into arguments at newlines; the
// plan flags are read against the shipped models and topologies, and the plan is predicted.
#include <sstream>
#include <vector>

#include "cli/flags.hpp"
#include "cli/plan_flags.hpp"
#include "fuzz_target.hpp"
#include "sim/layer_graph.hpp"
#include "sim/predict.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  if (size > 4096) return 0;  // a command line, not a file
  std::vector<std::string> args;
  std::stringstream lines(fuzz::text_of(data, size));
  for (std::string a; std::getline(lines, a);) args.push_back(a);
  fuzz::expect_loaded_or_input_error([&] {
    cli::Flags f(args, "predict");
    const cli::PlanInputs in = cli::read_plan_flags(f, TRAINPLAN_SOURCE_DIR);
    f.finish();
    const LayerGraph g(in.model, in.strategy.seq_len);
    (void)predict(g, in.cluster, in.software, in.strategy);
  });
  return 0;
}
