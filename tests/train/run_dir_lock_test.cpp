// One run per run directory: a second taker of RunDirLock fails naming the directory and
// the holder's pid; the lock frees when its holder goes, even when killed.
#include "train/run_dir_lock.h"

#include "support/error_of.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace kiln {
namespace {

namespace fs = std::filesystem;
using kiln::testing::error_of;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("kiln_lock_{}_{}", name, ::getpid());
  fs::remove_all(d);
  return d;
}

TEST(RunDirLock, SecondHolderFailsNamingTheDirectoryAndThePid) {
  const fs::path dir = fresh_dir("second");
  {
    RunDirLock first(dir);  // creates the directory
    EXPECT_TRUE(fs::exists(dir / "kiln.lock"));
    const std::string err = error_of([&] { RunDirLock second(dir); });
    EXPECT_NE(err.find("run directory " + dir.string() + " is in use by another kiln train"),
              std::string::npos) << err;
    EXPECT_NE(err.find(fmt::format("pid {} on host", ::getpid())), std::string::npos) << err;
  }
  RunDirLock again(dir);  // released with its holder
  fs::remove_all(dir);
}

TEST(RunDirLock, AKilledHoldersLockDoesNotBlock) {
  const fs::path dir = fresh_dir("killed");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RunDirLock held(dir);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    ::pause();  // until killed: no destructor runs
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  EXPECT_NE(error_of([&] { RunDirLock busy(dir); }).find(fmt::format("pid {}", child)),
            std::string::npos);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(fs::exists(dir / "kiln.lock"));  // the stale file stays, and does not block
  EXPECT_EQ(error_of([&] { RunDirLock mine(dir); }), "");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
