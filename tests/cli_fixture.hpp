// Runs the built trainplan binary from a test: in a scratch folder with stdout and stderr apart
// (CliTest), or with both merged as a user sees them (run_merged). Shared by the CLI tests.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace trainplan::testing {

struct Result {
  int code = -1;  // exit status; -1 when the process did not exit normally
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `trainplan <args>` with stdout and stderr together. `code` is the exit status, or 128 + the signal
// that ended the process; `seconds` its wall time.
struct Merged {
  int code = -1;
  std::string output;
  double seconds = 0;
};

inline Merged run_merged(const std::string& args) {
  const std::string cmd = std::string(TRAINPLAN_BINARY) + " " + args + " 2>&1";
  Merged r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("trainplan_" + std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `trainplan <args>` (args as a shell would split them).
  Result run(const std::string& args) const {
    const auto out = dir_ / "out.txt", err = dir_ / "err.txt";
    const std::string cmd = std::string("'") + TRAINPLAN_BINARY + "' " + args + " >'" + out.string() + "' 2>'" +
                            err.string() + "'";
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  }
  nlohmann::json read(const std::filesystem::path& p) const { return nlohmann::json::parse(slurp(p)); }

  std::filesystem::path dir_;
};

}  // namespace trainplan::testing
