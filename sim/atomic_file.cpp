#include "sim/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "sim/check.hpp"

namespace trainplan {

namespace fs = std::filesystem;

namespace {

// What write_file_atomically adds to the file's name for its temporary: "." and ".tmp-XXXXXX".
constexpr std::size_t kTemporaryExtra = 12;

fs::path folder_of(const fs::path& path) {
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace

void check_output_path(const fs::path& path, std::string_view what) {
  std::error_code ec;
  if (path.empty()) throw InputError(fmt::format("{}: cannot write: the file name is empty", what));
  // "out/" or "out/." names a folder, not a file in it (and "out/" + ".rank0" would be hidden).
  const fs::path leaf = path.filename();
  if (leaf.empty() || leaf == "." || leaf == "..") {
    throw InputError(fmt::format("{}: cannot write: names a folder, not a file (give a file name after the last /)", what));
  }
  const fs::path folder = folder_of(path);
  if (!fs::is_directory(folder, ec)) throw InputError(fmt::format("{}: cannot write: folder {} does not exist", what, folder.string()));
  if (fs::is_directory(path, ec)) throw InputError(fmt::format("{}: cannot write: it is a directory, not a file", what));
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
    throw InputError(fmt::format("{}: cannot write: it exists and is not a regular file", what));
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw InputError(fmt::format("{}: cannot write: folder {} is not writable", what, folder.string()));
  }
  // The temporary beside it (.NAME.tmp-XXXXXX) must be a legal name too: a name that fits but whose
  // temporary does not was refused only when written, after the work and the other outputs.
  const long name_max = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  const std::size_t limit = name_max > 0 ? static_cast<std::size_t>(name_max) : 255;
  const std::size_t leaf_bytes = leaf.string().size();
  if (leaf_bytes + kTemporaryExtra > limit) {
    throw InputError(fmt::format("{}: cannot write: the file name is {} bytes, at most {} fit here (the folder's limit "
                                 "of {} less {} for the temporary .NAME.tmp-XXXXXX it is written through)",
                                 what, leaf_bytes, limit - kTemporaryExtra, limit, kTemporaryExtra));
  }
  if ((folder / leaf).string().size() + kTemporaryExtra >= PATH_MAX) {
    throw InputError(fmt::format("{}: cannot write: the path is longer than the {} bytes a path may have", what,
                                 PATH_MAX - kTemporaryExtra - 1));
  }
}

void write_file_atomically(const fs::path& path, std::string_view content, std::string_view what) {
  check_output_path(path, what);
  std::string leaf = ".";  // hidden temporary beside the target: .NAME.tmp-XXXXXX
  leaf += path.filename().string();
  leaf += ".tmp-XXXXXX";
  std::string tmp = (folder_of(path) / leaf).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw InputError(fmt::format("{}: cannot create a temporary file: {}", what, std::strerror(errno)));
  auto fail = [&](const char* step) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: {} failed: {}", what, step, why));
  };
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("writing");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  // Keep the permissions an ordinary new file would get (mkstemp creates 0600).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) fail("setting permissions");
  if (::fsync(fd) != 0) fail("flushing");
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: closing failed: {}", what, why));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(fmt::format("{}: renaming into place failed: {}", what, why));
  }
}

}  // namespace trainplan
