#include "checkpoint/file_util.h"

#include "checkpoint/checkpoint.h"
#include "checkpoint/fault.h"
#include "core/error.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace kiln::checkpoint::detail {

namespace fs = std::filesystem;

namespace {
std::atomic<uint64_t> g_counter{0};

// One file operation: numbered, maybe failed by the fault plan with an injected errno.
struct Op {
  int injected;
  Op(FileOp op, const std::string& path) : injected(begin_file_op(op, path)) {}
  ~Op() { end_file_op(); }
  // errno of a failed call: the injected one, if any.
  bool fail() {
    if (injected) errno = injected;
    return injected != 0;
  }
};
}  // namespace

std::string errno_text() { return std::strerror(errno); }

int create_file(const fs::path& path, bool exclusive) {
  Op op(FileOp::Create, path.string());
  const int fd = op.fail() ? -1
                           : ::open(path.c_str(),
                                    O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC),
                                    0644);
  KILN_CHECK(fd >= 0, "{}: cannot create: {}", path.string(), errno_text());
  return fd;
}

FileWrite::FileWrite(int fd, std::string path, uint64_t total_bytes)
    : fd_(fd), path_(std::move(path)), total_(total_bytes) {
  injected_ = begin_file_op(FileOp::Write, path_);
  kill_mid_ = kill_mid_write();
}

FileWrite::~FileWrite() {
  if (open_) end_file_op();
}

void FileWrite::append(const void* data, size_t n) {
  if (injected_) {
    errno = injected_;
    KILN_FAIL("{}: write failed: {}", path_, errno_text());
  }
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    if (kill_mid_) {  // fault injection: half of the file reaches the disk, then death
      if (written_ >= total_ / 2) kill_now();
      chunk = std::min<size_t>(chunk, static_cast<size_t>(total_ / 2 - written_));
    }
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    KILN_CHECK(w > 0, "{}: write failed: {}", path_, w < 0 ? errno_text() : "no progress");
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
  if (kill_mid_ && written_ >= total_ / 2) kill_now();
}

void FileWrite::finish() {
  if (kill_mid_) kill_now();
  open_ = false;
  end_file_op();
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  FileWrite w(fd, path, n);
  w.append(data, n);
  w.finish();
}

void fsync_and_close(int fd, const std::string& path) {
  Op op(FileOp::Fsync, path);
  const bool injected = op.fail();
  const int rc = injected ? -1 : ::fsync(fd);
  const int err = errno;
  ::close(fd);
  KILN_CHECK(rc == 0, "{}: fsync failed: {}", path, std::strerror(err));
}

void rename_path(const fs::path& from, const fs::path& to) {
  Op op(FileOp::Rename, to.string());
  const bool ok = !op.fail() && ::rename(from.c_str(), to.c_str()) == 0;
  KILN_CHECK(ok, "{}: cannot rename {} to it: {}", to.string(), from.string(), errno_text());
}

bool exchange_paths(const fs::path& a, const fs::path& b) {
  Op op(FileOp::Exchange, b.string());
  if (op.fail()) KILN_FAIL("{}: cannot exchange it with {}: {}", b.string(), a.string(), errno_text());
  if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0)
    return true;
  KILN_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP,
             "{}: cannot exchange it with {}: {}", b.string(), a.string(), errno_text());
  return false;
}

void make_dirs(const fs::path& dir) {
  Op op(FileOp::Mkdir, dir.string());
  KILN_CHECK(!op.fail(), "{}: cannot create directory: {}", dir.string(), errno_text());
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec, "{}: cannot create directory: {}", dir.string(), ec.message());
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return;
  Op op(FileOp::Remove, path.string());
  KILN_CHECK(!op.fail(), "{}: cannot remove: {}", path.string(), errno_text());
  fs::remove_all(path, ec);
  KILN_CHECK(!ec, "{}: cannot remove: {}", path.string(), ec.message());
}

void fsync_dir(const fs::path& dir) {
  Op op(FileOp::FsyncDir, dir.string());
  KILN_CHECK(!op.fail(), "{}: fsync of directory failed: {}", dir.string(), errno_text());
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  KILN_CHECK(dfd >= 0, "{}: cannot open directory: {}", dir.string(), errno_text());
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  // Some file systems refuse fsync on directories (EINVAL); nothing more can be done there.
  KILN_CHECK(rc == 0 || err == EINVAL || err == EROFS, "{}: fsync of directory failed: {}",
             dir.string(), std::strerror(err));
}

std::string temp_name_for(const fs::path& path) {
  return fmt::format("{}.tmp.{}.{}", path.string(), static_cast<long>(::getpid()),
                     g_counter.fetch_add(1));
}

void remove_stale_temps(const fs::path& path) {
  std::error_code ec;
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string prefix = path.filename().string() + ".tmp.";
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string rest = name.substr(prefix.size());  // "<pid>.<n>"
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos ||
        !std::all_of(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(dot), ::isdigit))
      continue;
    const long pid = std::atol(rest.substr(0, dot).c_str());
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code rm;
      fs::remove_all(it->path(), rm);
    }
  }
}

void atomic_write_pieces(const fs::path& path, const std::vector<std::string_view>& pieces) {
  const std::string tmp = temp_name_for(path);
  const int fd = create_file(tmp, /*exclusive=*/true);
  try {
    uint64_t total = 0;
    for (std::string_view p : pieces) total += p.size();
    FileWrite w(fd, tmp, total);
    for (std::string_view p : pieces) w.append(p.data(), p.size());
    w.finish();
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  try {
    fsync_and_close(fd, tmp);
    rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(path.has_parent_path() ? path.parent_path() : fs::path("."));
}

void atomic_write_file(const fs::path& path, std::string_view contents) {
  atomic_write_pieces(path, {contents});
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: cannot open for reading: {}", path.string(), errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  KILN_CHECK(!in.bad(), "{}: read failed", path.string());
  return ss.str();
}

}  // namespace kiln::checkpoint::detail

namespace kiln::checkpoint {

namespace fs = std::filesystem;

uint32_t buffer_crc32(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (bytes > 0) {
    const size_t n = std::min<size_t>(bytes, size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(n));
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(c);
}

uint32_t file_crc32(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), detail::errno_text());
  std::vector<unsigned char> buf(size_t{4} << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = detail::errno_text();
      ::close(fd);
      KILN_FAIL("{}: read failed: {}", path.string(), why);
    }
    if (n == 0) break;
    crc = buffer_crc32(buf.data(), static_cast<size_t>(n), crc);
  }
  ::close(fd);
  return crc;
}

}  // namespace kiln::checkpoint
