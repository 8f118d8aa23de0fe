// sim/atomic_file: an output file is complete or absent.
// The failure path is exercised for real: a file-size limit (RLIMIT_FSIZE) makes write(2) fail
// part-way, after the temporary file exists, which is the moment a plain ofstream would leave a
// truncated target behind.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sim/atomic_file.hpp"
#include "sim/check.hpp"

namespace {

namespace fs = std::filesystem;
using trainplan::InputError;
using trainplan::write_file_atomically;

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("trainplan_atomic_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

TEST(AtomicFile, WritesAndReplacesLeavingNoTemporary) {
  const fs::path dir = scratch("ok");
  const fs::path f = dir / "out.json";
  write_file_atomically(f, "first\n", "--json out.json");
  EXPECT_EQ(read(f), "first\n");
  write_file_atomically(f, "second, longer\n", "--json out.json");
  EXPECT_EQ(read(f), "second, longer\n");
  EXPECT_EQ(names(dir), std::vector<std::string>{"out.json"});
  fs::remove_all(dir);
}

// A write that fails part-way (here: the process may not write files over 4 KiB) leaves the
// previous file untouched and no temporary behind, and says which output failed.
TEST(AtomicFile, FailedWriteKeepsThePreviousFile) {
  const fs::path dir = scratch("fail");
  const fs::path f = dir / "out.json";
  write_file_atomically(f, "previous\n", "--json out.json");

  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // write(2) then fails with EFBIG instead
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_file_atomically(f, std::string(1 << 20, 'x'), "--json out.json");
  } catch (const InputError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find("--json out.json"), std::string::npos) << message;
  EXPECT_NE(message.find("writing failed"), std::string::npos) << message;
  EXPECT_EQ(read(f), "previous\n");
  EXPECT_EQ(names(dir), std::vector<std::string>{"out.json"});
  fs::remove_all(dir);
}

// The outputs of one command are written all or none: when the second fails part-way (here a
// file-size limit between the two sizes, as a disk that fills up), the first target is untouched
// too -- each output used to be renamed into place as soon as it was written.
TEST(OutputsOnFailure, OutputSetReplacesNothingWhenOneOutputFails) {
  const fs::path dir = scratch("set");
  const fs::path a = dir / "a.json", b = dir / "b.html";
  write_file_atomically(a, "previous a\n", "--json a.json");
  write_file_atomically(b, "previous b\n", "--html b.html");

  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    trainplan::OutputSet outputs;
    outputs.stage(a, "new a\n", "--json a.json");                      // fits
    outputs.stage(b, std::string(1 << 20, 'x'), "--html b.html");      // does not
    outputs.commit();
  } catch (const InputError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find("--html b.html: writing failed"), std::string::npos) << message;
  EXPECT_EQ(read(a), "previous a\n");
  EXPECT_EQ(read(b), "previous b\n");
  std::vector<std::string> left = names(dir);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"a.json", "b.html"}));  // no temporary left behind

  // Committed, both are replaced; a set dropped before commit() replaces nothing.
  {
    trainplan::OutputSet outputs;
    outputs.stage(a, "new a\n", "--json a.json");
    outputs.stage(b, "--html b.html", [](std::ostream& os) { os << "streamed b\n"; });
  }
  EXPECT_EQ(read(a), "previous a\n");
  trainplan::OutputSet outputs;
  outputs.stage(a, "new a\n", "--json a.json");
  outputs.stage(b, "--html b.html", [](std::ostream& os) { os << "streamed b\n"; });
  outputs.commit();
  EXPECT_EQ(read(a), "new a\n");
  EXPECT_EQ(read(b), "streamed b\n");
  fs::remove_all(dir);
}

// A writer that names its own file (a profiler's save()) writes the hidden temporary it is handed;
// nothing replaces the target until commit(), and a writer that throws leaves the previous file
// and no temporary behind.
TEST(OutputsOnFailure, StageByPathWritesTheTemporaryItHandsOut) {
  const fs::path dir = scratch("bypath");
  const fs::path t = dir / "trace.rank0.json";
  write_file_atomically(t, "previous\n", "--trace trace.rank0.json");
  auto save = [&dir](const std::string& text) {
    return [text, &dir](const fs::path& tmp) {
      EXPECT_EQ(tmp.parent_path(), dir);
      EXPECT_EQ(tmp.filename().string().rfind(".trace.rank0.json.tmp-", 0), 0u) << tmp;
      std::ofstream(tmp) << text;
    };
  };
  {
    trainplan::OutputSet outputs;
    outputs.stage_by_path(t, "--trace trace.rank0.json", save("never committed\n"));
  }
  EXPECT_EQ(read(t), "previous\n");
  EXPECT_THROW(
      {
        trainplan::OutputSet outputs;
        outputs.stage_by_path(t, "--trace trace.rank0.json", [](const fs::path&) { throw InputError("save failed"); });
      },
      InputError);
  EXPECT_EQ(names(dir), std::vector<std::string>{"trace.rank0.json"});
  trainplan::OutputSet outputs;
  outputs.stage_by_path(t, "--trace trace.rank0.json", save("{\"traceEvents\": []}\n"));
  outputs.commit();
  EXPECT_EQ(read(t), "{\"traceEvents\": []}\n");
  EXPECT_EQ(names(dir), std::vector<std::string>{"trace.rank0.json"});
  fs::remove_all(dir);
}

// An output that cannot be written is refused before anything is created.
TEST(AtomicFile, MissingFolderIsRefusedAndNothingIsCreated) {
  const fs::path dir = scratch("missing");
  EXPECT_THROW(write_file_atomically(dir / "no" / "out.json", "x", "--json no/out.json"), InputError);
  EXPECT_THROW(write_file_atomically(dir, "x", "--json dir"), InputError);  // a directory
  EXPECT_TRUE(names(dir).empty());
  fs::remove_all(dir);
}

// A path that names a folder ("dumps/", "dumps/.") is refused even where the folder exists: exec's
// --dump-grads dumps/ used to pass the check and write the hidden file dumps/.rank0.
TEST(AtomicFile, PathNamingAFolderIsRefused) {
  const fs::path dir = scratch("folder");
  for (const fs::path& p : {dir / "", dir / ".", dir / "..", fs::path("./")}) {
    SCOPED_TRACE(p.string());
    try {
      trainplan::check_output_path(p, "--dump-grads");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("names a folder"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(trainplan::check_output_path(dir / "grads", "--dump-grads grads"));
  EXPECT_TRUE(names(dir).empty());
  fs::remove_all(dir);
}

}  // namespace
