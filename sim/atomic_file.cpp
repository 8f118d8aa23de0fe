#include "sim/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <streambuf>
#include <string>
#include <utility>

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

namespace {

// A stream buffer writing to a file descriptor; the first failed write(2) is kept (errno) and
// makes every later one fail too.
class FdBuffer : public std::streambuf {
 public:
  explicit FdBuffer(int fd) : fd_(fd) { setp(buffer_, buffer_ + sizeof buffer_); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const char* p = pbase();
    while (error_ == 0 && p < pptr()) {
      const ssize_t n = ::write(fd_, p, static_cast<std::size_t>(pptr() - p));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) error_ = errno;
      if (n > 0) p += n;
    }
    setp(buffer_, buffer_ + sizeof buffer_);
    return error_ == 0;
  }
  int fd_;
  int error_ = 0;
  char buffer_[1 << 16];
};

}  // namespace

void OutputSet::stage(const fs::path& path, std::string_view content, std::string what) {
  stage(path, std::move(what), [&](std::ostream& os) { os.write(content.data(), static_cast<std::streamsize>(content.size())); });
}

// A new hidden temporary beside `path` (.NAME.tmp-XXXXXX), staged (so removed unless committed);
// returns its open descriptor.
int OutputSet::create_temporary(const fs::path& path, const std::string& what) {
  check_output_path(path, what);
  std::string leaf = ".";
  leaf += path.filename().string();
  leaf += ".tmp-XXXXXX";
  std::string tmp = (folder_of(path) / leaf).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw InputError(fmt::format("{}: cannot create a temporary file: {}", what, std::strerror(errno)));
  staged_.push_back({path, tmp, what});  // removed by the destructor unless committed
  return fd;
}

// Gives the temporary on `fd` an ordinary new file's permissions (mkstemp creates 0600), flushes
// it to disk and closes it; `step` names a write that already failed (with errno `err`).
void OutputSet::finish_temporary(int fd, const std::string& what, const char* step, int err) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (!step && ::fchmod(fd, 0666 & ~mask) != 0) step = "setting permissions", err = errno;
  if (!step && ::fsync(fd) != 0) step = "flushing", err = errno;
  if (::close(fd) != 0 && !step) step = "closing", err = errno;
  if (step) throw InputError(fmt::format("{}: {} failed: {}", what, step, std::strerror(err)));
}

void OutputSet::stage(const fs::path& path, std::string what, const std::function<void(std::ostream&)>& write) {
  const int fd = create_temporary(path, what);
  const char* step = nullptr;  // what failed, with errno in `err`
  int err = 0;
  try {
    FdBuffer buffer(fd);
    std::ostream os(&buffer);
    write(os);
    os.flush();
    if (buffer.error() != 0 || !os) step = "writing", err = buffer.error() != 0 ? buffer.error() : EIO;
  } catch (...) {
    ::close(fd);
    throw;
  }
  finish_temporary(fd, what, step, err);
}

void OutputSet::stage_by_path(const fs::path& path, std::string what, const std::function<void(const fs::path&)>& write) {
  ::close(create_temporary(path, what));
  write(staged_.back().temporary);
  const int fd = ::open(staged_.back().temporary.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(fmt::format("{}: reopening the written file failed: {}", what, std::strerror(errno)));
  finish_temporary(fd, what, nullptr, 0);
}

void OutputSet::commit() {
  std::string replaced;  // the outputs already renamed, for a failure part-way
  for (std::size_t i = 0; i < staged_.size(); ++i) {
    const Staged& s = staged_[i];
    if (std::rename(s.temporary.c_str(), s.target.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      throw InputError(fmt::format("{}: renaming into place failed: {}{}", s.what, why,
                                   replaced.empty() ? "; no output was replaced"
                                                    : "; already replaced: " + replaced));
    }
    replaced += (replaced.empty() ? "" : ", ") + s.what;
    staged_[i].temporary.clear();  // renamed: nothing to remove
  }
  staged_.clear();
}

OutputSet::~OutputSet() {
  for (const Staged& s : staged_)
    if (!s.temporary.empty()) ::unlink(s.temporary.c_str());
}

void write_file_atomically(const fs::path& path, std::string_view content, std::string_view what) {
  OutputSet one;
  one.stage(path, content, std::string(what));
  one.commit();
}

}  // namespace trainplan
