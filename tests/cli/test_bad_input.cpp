// Table-driven bad-input test of the whole CLI: every row of
// tests/data/bad_input/cases.tsv is one `trainplan` command line that must be refused as bad input:
//   - exit status 2, exactly one line on stderr naming the flag, file or field (the row's expected
//     substring), nothing that looks like a crash (internal error, terminate, sanitizer report);
//   - in bounded time and memory: the process runs under RLIMIT_AS (2 GiB, not under ASan, which
//     reserves terabytes of address space) and RLIMIT_CPU, and is killed after 60 s of wall time;
//   - nothing is created in its scratch folder and a pre-existing output file ({OUT}) is untouched.
// Rows:  name <TAB> expected substring of the stderr line <TAB> arguments (split on spaces).
// Placeholders in the arguments: {DATA} tests/data, {TMP} this row's fresh scratch folder, {OUT} a
// pre-existing file there, {FIFO} a named pipe, {DIR} a folder, {EMPTY} an empty file, {ODD} 3
// bytes, {SHORT} 2 tokens, {OOV} tokens 65535 (out of any test vocabulary), {NOEXT} a model file
// without .json whose "layers" is 0, {PLAN} a copy of a valid prediction, {MEASUREMENT} of a valid
// measurement, {MODEL} {CLUSTER} {SOFTWARE} {RELIABILITY} copies of built-in data files, {NUMS}
// 64 MiB of JSON numbers and {HALFNUMS} 5 M of them (made only for the rows that name them), {NL}
// a newline, {ESC} an escape character, {CSI} the C1 control U+009B (two bytes of UTF-8), {XFF} a
// byte that is no UTF-8, {LONG} 100,000 letters. Every file of the scratch folder must be
// unchanged after the row, and the one line must be at most kMaxErrorLineBytes long, with no
// control character (C0, DEL, C1) and no byte that is not UTF-8 (printable()'s rule).
// A row whose name starts with "exec-" runs trainplan-exec; in a build without LibTorch the command
// is still refused with one line (exit 2), but the expected substring is not checked.
// Below the table: the shared pieces every command relies on (the strict decimal parser of real
// flags, the list splitter, the finite-result check), tested directly.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "sim/check.hpp"

namespace {

namespace fs = std::filesystem;

// printable() bounds a line at kMaxShownLine characters (an escape or a UTF-8 character counted as
// shown); "trainplan COMMAND: " and the newline come on top, and a UTF-8 character has 4 bytes at most.
constexpr std::size_t kMaxErrorLineBytes = 4 * trainplan::kMaxShownLine + 64;

struct Case {
  std::string name, expect, args;
  int line = 0;
};

std::vector<Case> load_cases() {
  std::ifstream in(std::string(TRAINPLAN_TEST_DATA_DIR) + "/bad_input/cases.tsv");
  std::vector<Case> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    const auto t1 = line.find('\t'), t2 = line.find('\t', t1 == std::string::npos ? 0 : t1 + 1);
    if (t1 == std::string::npos || t2 == std::string::npos) {
      out.push_back({"malformed_row_" + std::to_string(n), "", "", n});
      continue;
    }
    out.push_back({line.substr(0, t1), line.substr(t1 + 1, t2 - t1 - 1), line.substr(t2 + 1), n});
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream o(p, std::ios::binary);
  o << bytes;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Outcome {
  int code = -1;        // exit status, or 128 + signal
  bool timed_out = false;
  std::string err;
};

// Runs the binary with `args` in `cwd`, stdin from /dev/null, stdout discarded, stderr captured;
// memory and CPU limited in the child, wall time in the parent.
Outcome run_limited(const std::vector<std::string>& args, const fs::path& cwd, const fs::path& err_file) {
  std::vector<std::string> owned{TRAINPLAN_BINARY};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int in = ::open("/dev/null", O_RDONLY), out = ::open("/dev/null", O_WRONLY);
    const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0) ::_exit(126);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
#if !defined(__SANITIZE_ADDRESS__)
    const rlimit as{2ull << 30, 2ull << 30};  // 2 GiB of address space
    ::setrlimit(RLIMIT_AS, &as);
#endif
    const rlimit cpu{60, 60};
    ::setrlimit(RLIMIT_CPU, &cpu);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Outcome o;
  if (pid < 0) return o;
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
      o.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.err = slurp(err_file);
  return o;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  for (char c : s) {
    if (c == ' ') {
      if (!w.empty()) out.push_back(w);
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) out.push_back(w);
  return out;
}

// Every entry of the folder, with the content of its regular files.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out[e.path().lexically_relative(dir).string()] = e.is_regular_file() ? slurp(e.path()) : std::string("<not a file>");
  }
  return out;
}

// Rows print as their name and arguments in gtest messages.
void PrintTo(const Case& c, std::ostream* os) { *os << "cases.tsv line " << c.line << " (" << c.name << "): " << c.args; }

class BadInput : public ::testing::TestWithParam<Case> {};

TEST_P(BadInput, ExitTwoWithOneLineAndNothingWritten) {
  const Case& c = GetParam();
  ASSERT_FALSE(c.args.empty()) << "cases.tsv line " << c.line << ": needs name, expected text and arguments";
  // A fresh scratch folder per row: nothing left over from another row or an earlier run.
  const fs::path tmp = fs::temp_directory_path() /
                       ("trainplan_bad_input_" + std::to_string(::getpid()) + "_" + std::to_string(c.line));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "dir");
  const std::string precious = "precious: must survive a refused command\n";
  write_file(tmp / "out.json", precious);
  write_file(tmp / "empty.bin", "");
  write_file(tmp / "odd.bin", std::string("\x01\x00\x02", 3));
  write_file(tmp / "short.bin", std::string("\x01\x00\x02\x00", 4));
  write_file(tmp / "oov.bin", std::string(4096, '\xff'));
  write_file(tmp / "model_noext",
             R"({"name": "noext", "layers": 0, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 256,
                 "vocab": 1000, "seq_len": 128, "activation": "gelu", "norm": "layernorm",
                 "tied_embeddings": true, "position": "learned"})");
  fs::copy_file(fs::path(TRAINPLAN_TEST_DATA_DIR) / "compare" / "prediction_pp2.json", tmp / "plan.json");
  fs::copy_file(fs::path(TRAINPLAN_TEST_DATA_DIR) / "compare" / "measurement_pp2.json", tmp / "measurement.json");
  const fs::path source(TRAINPLAN_SOURCE_DIR);
  fs::copy_file(source / "models" / "llama3-8b.json", tmp / "model.json");
  fs::copy_file(source / "topologies" / "dgx-h100.json", tmp / "cluster.json");
  fs::copy_file(source / "software" / "megatron-core.json", tmp / "software.json");
  fs::copy_file(source / "reliability" / "default.json", tmp / "reliability.json");
  // Large files only for the rows that use them (64 MiB each).
  auto numbers = [&](const char* name, std::size_t count) {
    std::string text = "[0";
    text.reserve(2 * count + 2);
    for (std::size_t i = 1; i < count; ++i) text += ",0";
    write_file(tmp / name, text + "]");
  };
  if (c.args.find("{NUMS}") != std::string::npos) numbers("nums.json", (64u << 20) / 2 - 1);
  if (c.args.find("{HALFNUMS}") != std::string::npos) numbers("halfnums.json", 5u << 20);
  ASSERT_EQ(::mkfifo((tmp / "fifo").c_str(), 0644), 0);
  const fs::path err_file = fs::temp_directory_path() / ("trainplan_bad_input_err_" + std::to_string(::getpid()));

  std::string args = c.args;
  replace_all(args, "{DATA}", TRAINPLAN_TEST_DATA_DIR);
  replace_all(args, "{OUT}", (tmp / "out.json").string());
  replace_all(args, "{FIFO}", (tmp / "fifo").string());
  replace_all(args, "{DIR}", (tmp / "dir").string());
  replace_all(args, "{EMPTY}", (tmp / "empty.bin").string());
  replace_all(args, "{ODD}", (tmp / "odd.bin").string());
  replace_all(args, "{SHORT}", (tmp / "short.bin").string());
  replace_all(args, "{OOV}", (tmp / "oov.bin").string());
  replace_all(args, "{NOEXT}", (tmp / "model_noext").string());
  replace_all(args, "{PLAN}", (tmp / "plan.json").string());
  replace_all(args, "{MEASUREMENT}", (tmp / "measurement.json").string());
  replace_all(args, "{MODEL}", (tmp / "model.json").string());
  replace_all(args, "{CLUSTER}", (tmp / "cluster.json").string());
  replace_all(args, "{SOFTWARE}", (tmp / "software.json").string());
  replace_all(args, "{RELIABILITY}", (tmp / "reliability.json").string());
  replace_all(args, "{HALFNUMS}", (tmp / "halfnums.json").string());
  replace_all(args, "{NUMS}", (tmp / "nums.json").string());
  replace_all(args, "{TMP}", tmp.string());
  std::vector<std::string> words = split_words(args);
  for (auto& w : words) {
    replace_all(w, "{NL}", "\n");
    replace_all(w, "{ESC}", "\x1b");
    replace_all(w, "{CSI}", "\xc2\x9b");
    replace_all(w, "{XFF}", "\xff");
    replace_all(w, "{LONG}", std::string(100000, 'a'));
  }
  const auto before = snapshot(tmp);

  const Outcome o = run_limited(words, tmp, err_file);
  SCOPED_TRACE("cases.tsv line " + std::to_string(c.line) + ": trainplan " + args + "\nstderr: " + o.err);
  EXPECT_FALSE(o.timed_out) << "still running after 60 s";
  EXPECT_EQ(o.code, 2);
  // Exactly one line, ending in a newline, no crash report.
  ASSERT_FALSE(o.err.empty());
  EXPECT_EQ(o.err.back(), '\n');
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1);
  for (const char* crash : {"internal error", "terminate called", "Sanitizer", "runtime error:", "Aborted", "what():",
                            "Exception raised from", "frame #"}) {
    EXPECT_EQ(o.err.find(crash), std::string::npos) << crash;
  }
  // printable()'s rule: no control character of any kind, nothing that is not UTF-8, bounded.
  EXPECT_FALSE(trainplan::has_control_characters(o.err.substr(0, o.err.size() - 1))) << "control character";
  EXPECT_LE(o.err.size(), kMaxErrorLineBytes);
  const bool have_exec = fs::exists(fs::path(TRAINPLAN_BINARY).parent_path() / "trainplan-exec");
  if (c.name.rfind("exec-", 0) != 0 || have_exec) {
    EXPECT_NE(o.err.find(c.expect), std::string::npos) << c.expect;
  }
  // Nothing created, nothing changed.
  EXPECT_EQ(slurp(tmp / "out.json"), precious);
  EXPECT_EQ(snapshot(tmp), before);
  fs::remove_all(tmp);
  fs::remove(err_file);
}

// The one number parser of every real-valued flag: decimal only, finite. strtod, used before,
// also took hex floats, inf/nan and leading whitespace.
TEST(ParseDecimal, AcceptsPlainDecimalsOnly) {
  using trainplan::cli::parse_decimal;
  for (const char* ok : {"5", "-1", "+2", "0.5", ".5", "5.", "1e3", "1E-3", "2.5e+2", "007"}) {
    EXPECT_TRUE(parse_decimal(ok).has_value()) << ok;
  }
  EXPECT_DOUBLE_EQ(*parse_decimal("2.5e+2"), 250);
  for (const char* bad : {"", " 5", "5 ", "\n5", "0x10", "0x1p3", "inf", "-inf", "nan", "infinity", "1e400", "-1e400",
                          "5x", "1e", "1e+", ".", "-", "+", "e5", "1..2", "1,5", "--5", "+-5", "5%"}) {
    EXPECT_FALSE(parse_decimal(bad).has_value()) << "'" << bad << "'";
  }
}

// List flags: an empty item anywhere is refused (getline silently dropped a trailing one).
TEST(SplitList, RefusesEmptyItems) {
  using trainplan::cli::split_list;
  EXPECT_EQ(split_list("zero", "0,1,3"), (std::vector<std::string>{"0", "1", "3"}));
  EXPECT_EQ(split_list("zero", "2"), (std::vector<std::string>{"2"}));
  for (const char* bad : {"", ",", "1,", ",1", "1,,2", ",,"}) {
    try {
      split_list("zero", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const trainplan::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--zero"), std::string::npos) << e.what();
    }
  }
}

// List flags: an item given twice is refused, naming the flag, the list and the item (as capacity
// --clusters always did); each list flag names a set of choices, so a repeat is a slip.
TEST(SplitList, RefusesRepeatedItems) {
  using trainplan::cli::split_list;
  EXPECT_EQ(split_list("zero", "0,1"), (std::vector<std::string>{"0", "1"}));
  for (const auto& [list, item] : std::vector<std::pair<std::string, std::string>>{
           {"0,0", "0"}, {"0,1,2,1", "1"}, {"none,full,none", "none"}}) {
    try {
      split_list("zero", list);
      ADD_FAILURE() << "accepted '" << list << "'";
    } catch (const trainplan::InputError& e) {
      EXPECT_EQ(std::string(e.what()), "--zero " + list + ": names " + item + " twice");
    }
  }
}

// A result figure that overflowed is refused, naming it, before anything is printed or written
// (nlohmann would write it as null and the HTML page then refused it after --json was written).
TEST(CheckFinite, NamesTheFirstNonFiniteFigure) {
  nlohmann::json doc = {{"time", {{"step_s", 1.5}}}, {"options", nlohmann::json::array({{{"days", 2.0}}})}};
  EXPECT_NO_THROW(trainplan::cli::check_finite(doc));
  doc["options"][0]["energy_kwh"] = std::numeric_limits<double>::infinity();
  try {
    trainplan::cli::check_finite(doc);
    ADD_FAILURE() << "accepted inf";
  } catch (const trainplan::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("options[0].energy_kwh = inf"), std::string::npos) << e.what();
  }
  doc["options"][0]["energy_kwh"] = 1.0;
  doc["time"]["step_s"] = std::nan("");
  EXPECT_THROW(trainplan::cli::check_finite(doc), trainplan::InputError);
}

// The one error-line writer (printable): every control character escaped, C1 and invalid UTF-8
// included (one_line, before it, showed only C0 and DEL), values and the line cut.
TEST(ErrorLineWriter, EscapesEveryControlCharacterAndInvalidUtf8) {
  using trainplan::printable;
  EXPECT_EQ(printable("a\x1b[2Jb\nc\x7f"), "a\\x1b[2Jb\\x0ac\\x7f");
  EXPECT_EQ(printable("a\xc2\x9b" "31m \xc2\x85"), "a\\u{9b}31m \\u{85}");    // C1: CSI, NEL
  EXPECT_EQ(printable("\xff \xc3 \xed\xa0\x80"), "\\xff \\xc3 \\xed\\xa0\\x80");  // stray, cut short, surrogate
  const std::string german = "Gr\xc3\xb6\xc3\x9f" "e \xe2\x82\xac \xf0\x9f\x99\x82";  // valid UTF-8: kept
  EXPECT_EQ(printable(german), german);
  for (const char* bad : {"\x01", "\x7f", "\xc2\x80", "\xc2\x9f", "\x80", "\xc0\xaf", "\xf5\x80\x80\x80"}) {
    EXPECT_TRUE(trainplan::has_control_characters(bad)) << bad;
  }
  EXPECT_FALSE(trainplan::has_control_characters("caf\xc3\xa9 \xc2\xa0 ok"));
}

TEST(ErrorLineWriter, CutsLongValuesAndBoundsTheLine) {
  using trainplan::kMaxShownValue;
  using trainplan::printable;
  // A 100,000-character flag value: 80 characters shown, its start and end, the rule kept.
  const std::string line = printable("--title " + std::string(100000, 'x') + "y: must be short");
  EXPECT_EQ(line.rfind("--title xxxx", 0), 0u) << line;
  EXPECT_NE(line.find("x...xxxx"), std::string::npos) << line;
  EXPECT_NE(line.find("xxxxy: must be short"), std::string::npos) << line;
  EXPECT_EQ(line.size(), 8 + kMaxShownValue + 14);  // "--title ", the value, " must be short"
  // An escape is never split by a cut.
  const std::string escapes = printable(std::string(60, '\x1b'));
  EXPECT_EQ(escapes.find("\\x1..."), std::string::npos) << escapes;
  EXPECT_LE(escapes.size(), kMaxShownValue);
  // Many short words: the line keeps its start and end.
  std::string words;
  for (int i = 0; i < 10000; ++i) words += "word ";
  const std::string bounded = printable("--title " + words + "end");
  EXPECT_EQ(bounded.size(), trainplan::kMaxShownLine);
  EXPECT_EQ(bounded.rfind("--title word", 0), 0u);
  EXPECT_NE(bounded.find(" ... "), std::string::npos);
  EXPECT_EQ(bounded.substr(bounded.size() - 3), "end");
  EXPECT_EQ(printable("short line: kept as it is"), "short line: kept as it is");
}

INSTANTIATE_TEST_SUITE_P(Cases, BadInput, ::testing::ValuesIn(load_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.name + "_L" + std::to_string(info.param.line);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
