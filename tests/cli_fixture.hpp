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

// A shell command line as given (its redirections decide what `output` holds).
inline Merged run_shell(const std::string& cmd) {
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

inline Merged run_merged(const std::string& args) { return run_shell(std::string(TRAINPLAN_BINARY) + " " + args + " 2>&1"); }

// A fresh, empty folder for one test (named after the test and the process), removed when the test
// ends. Every file a command writes there was written by this run: a command that stopped writing
// its --json or --trace cannot pass on a file left by an earlier run.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "trainplan_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
                       std::to_string(::getpid());
    for (char& c : name)
      if (c == '/') c = '_';  // parameterised tests are named Suite/Name/0
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  // A path inside the folder; the file does not exist yet.
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

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
