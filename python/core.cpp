// trainplan._core: the planner commands, run in-process through cli/embed (the CLI's own flag
// parsing and command functions), for the Python package in python/trainplan/. Links no LibTorch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "cli/embed.hpp"

namespace nb = nanobind;

// Where the built-in data was when this module was built (the source tree: used by an in-tree
// build; an installed package ships its own copy, see trainplan/__init__.py).
#ifndef TRAINPLAN_DATA_DIR
#error "TRAINPLAN_DATA_DIR must be defined by python/CMakeLists.txt"
#endif

NB_MODULE(_core, m) {
  m.doc() = "trainplan's planner commands run in-process (use the trainplan package, not this module)";
  m.def(
      "run",
      [](const std::string& command, const std::vector<std::string>& args, const std::string& data_dir) {
        trainplan::cli::EmbeddedResult r;
        {
          // The planner holds no Python objects and keeps no global state: other threads may run.
          nb::gil_scoped_release unlocked;
          r = trainplan::cli::run_embedded(command, args, data_dir);
        }
        // Bytes: a report may quote a flag value or file name that is not valid UTF-8.
        return nb::make_tuple(r.code, nb::bytes(r.out.data(), r.out.size()), nb::bytes(r.err.data(), r.err.size()),
                              nb::bytes(r.json.data(), r.json.size()));
      },
      nb::arg("command"), nb::arg("args"), nb::arg("data_dir"),
      "Runs `trainplan COMMAND ARGS...` (predict, simulate, search, capacity) with its --json captured; "
      "returns (exit status, stdout, stderr, JSON document) with the last three as bytes.");
  m.attr("BUILD_DATA_DIR") = TRAINPLAN_DATA_DIR;
  m.attr("VERSION") = TRAINPLAN_VERSION;
}
