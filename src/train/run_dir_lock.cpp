#include "train/run_dir_lock.h"

#include "core/error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace kiln {

namespace {
// Who holds the lock, as the holder wrote it ("pid P on host H"), or "" when unreadable.
std::string read_holder(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}
}  // namespace

RunDirLock::RunDirLock(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "kiln.lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  KILN_CHECK(fd_ >= 0, "cannot open the run directory's lock {}: {}", file.string(),
             std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    KILN_CHECK(err != EWOULDBLOCK,
               "run directory {} is in use by another kiln train ({}): wait for it to end, or "
               "set run.dir to another directory", dir.string(),
               holder.empty() ? "its pid unknown" : holder);
    KILN_FAIL("cannot lock {}: {}", file.string(), std::strerror(err));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("pid {} on host {}\n", static_cast<long>(::getpid()), host);
  const bool named = ::ftruncate(fd_, 0) == 0 &&
                     ::pwrite(fd_, me.data(), me.size(), 0) == static_cast<ssize_t>(me.size());
  static_cast<void>(named);  // best effort: the lock excludes, the text only names the holder
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace kiln
