// Runs the built trainplan binary from a test, in a scratch folder of its own, with stdout and
// stderr captured apart. Shared by the CLI tests.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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
