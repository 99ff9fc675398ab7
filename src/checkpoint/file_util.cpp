#include "checkpoint/file_util.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln::checkpoint::detail {

namespace {
std::atomic<uint64_t> g_counter{0};

void write_all(int fd, const char* p, size_t n, const std::string& what) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      KILN_FAIL("{}: write failed: {}", what, errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}
}  // namespace

std::string errno_text() { return std::strerror(errno); }

void atomic_write_pieces(const std::filesystem::path& path,
                         const std::vector<std::string_view>& pieces) {
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path.string(), static_cast<long>(::getpid()),
                                      g_counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "{}: cannot create temporary file {}: {}", path.string(), tmp, errno_text());
  try {
    for (std::string_view p : pieces) write_all(fd, p.data(), p.size(), tmp);
    KILN_CHECK(::fsync(fd) == 0, "{}: fsync failed: {}", tmp, errno_text());
    const int rc = ::close(fd);
    fd = -1;
    KILN_CHECK(rc == 0, "{}: close failed: {}", tmp, errno_text());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    KILN_FAIL("{}: cannot rename {} over it: {}", path.string(), tmp, why);
  }
  fsync_dir(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

void atomic_write_file(const std::filesystem::path& path, std::string_view contents) {
  atomic_write_pieces(path, {contents});
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: cannot open for reading: {}", path.string(), errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  KILN_CHECK(!in.bad(), "{}: read failed", path.string());
  return ss.str();
}

void fsync_dir(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  KILN_CHECK(dfd >= 0, "{}: cannot open directory: {}", dir.string(), errno_text());
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  // Some file systems refuse fsync on directories (EINVAL); nothing more can be done there.
  KILN_CHECK(rc == 0 || err == EINVAL || err == EROFS, "{}: fsync of directory failed: {}",
             dir.string(), std::strerror(err));
}

}  // namespace kiln::checkpoint::detail
