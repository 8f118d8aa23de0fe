#include "cli/embed.hpp"

#include <fmt/format.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "cli/dispatch.hpp"
#include "sim/check.hpp"

namespace trainplan::cli {

namespace {

// A folder of its own under the system's temporary folder (mkdtemp: mode 0700, a fresh name),
// removed with everything in it when this goes out of scope.
class PrivateFolder {
 public:
  PrivateFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "trainplan-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
    path_ = pattern;
  }
  ~PrivateFolder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  PrivateFolder(const PrivateFolder&) = delete;
  PrivateFolder& operator=(const PrivateFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

using CommandFn = int (*)(const Args&, const Context&);

const std::map<std::string, CommandFn>& embedded_commands() {
  static const std::map<std::string, CommandFn> commands = {
      {"predict", cmd_predict}, {"simulate", cmd_simulate}, {"search", cmd_search}, {"capacity", cmd_capacity}};
  return commands;
}

bool gives_json(const Args& args) {
  for (const std::string& a : args)
    if (a == "--json" || a.rfind("--json=", 0) == 0) return true;
  return false;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

EmbeddedResult run_embedded(const std::string& command, const Args& args, const std::filesystem::path& data_dir) {
  EmbeddedResult r;
  const auto it = embedded_commands().find(command);
  if (it == embedded_commands().end()) {
    r.code = 2;
    r.err = fmt::format("trainplan: '{}' is not a command that runs in-process (predict, simulate, search, capacity)\n",
                        printable(command));
    return r;
  }
  if (gives_json(args)) {
    r.code = 2;
    r.err = fmt::format("trainplan {}: --json: not taken here; the document is returned (write it with json.dump)\n",
                        command);
    return r;
  }
  const PrivateFolder folder;
  const std::filesystem::path json_path = folder.path() / "result.json";
  Args full = args;
  full.insert(full.end(), {"--json", json_path.string()});
  std::ostringstream out, err;
  const Context ctx{data_dir, out, err, false};
  // As dispatch() turns what a command throws into its exit status and one line.
  try {
    r.code = it->second(full, ctx);
  } catch (const InputError& e) {
    err << "trainplan " << command << ": " << printable(e.what()) << "\n";
    r.code = 2;
  } catch (const std::exception& e) {
    err << "trainplan " << command << ": internal error: " << printable(e.what()) << "\n";
    r.code = 1;
  }
  r.out = out.str();
  r.err = err.str();
  std::error_code ec;
  if (std::filesystem::is_regular_file(json_path, ec)) r.json = read_file(json_path);
  return r;
}

}  // namespace trainplan::cli
