// Crash safety of a 2-rank checkpoint save (both ranks in this process): killed (in a
// forked child) after every file operation and half-way through every write, and failed
// with ENOSPC / EIO at every operation (KILN_FAULT's plans, checkpoint/fault.h).
#include "checkpoint/checkpoint.h"
#include "checkpoint/fault.h"
#include "checkpoint_test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::checkpoint {
namespace {

namespace fs = std::filesystem;
using namespace test;

// Rank 0 and rank 1 of a save as the trainer does it (both in this process): stale
// temporary directory cleared, rank files of both ranks, commit, prune (keep 2).
void save_two_ranks(const FlatModel& m, const fs::path& root, int64_t step, int tag) {
  const fs::path dir = root / checkpoint_dir_name(step);
  CheckpointWriter w0(dir, 0, 2), w1(dir, 1, 2);
  w0.discard_stale_tmp_dir();
  m.add_shard(w1, 40, m.size);
  m.add_shard(w0, 0, 40);
  w1.write_rank_files();
  w0.write_rank_files();
  w0.commit({{"step", step}, {"tag", tag}}, {{"config.toml", "x = 1\n"}});
  prune_checkpoints(root, 2);
}

// Every step directory verifies (no partial checkpoint under a final name); returns the
// tag of the newest one.
int check_root(const FlatModel& m, const fs::path& root, const std::string& at) {
  for (const fs::path& d : list_checkpoint_dirs(root)) {
    EXPECT_NO_THROW(verify_checkpoint(d)) << at << ": " << d;
  }
  const auto latest = find_latest_checkpoint(root);
  EXPECT_TRUE(latest.has_value()) << at;
  if (!latest) return -1;
  CheckpointReader r(*latest);
  EXPECT_EQ(m.read_shard(r, 0, m.size), m.data) << at;
  return r.state()["tag"].get<int>();
}

// Runs save_two_ranks in a child process under the fault plan `spec`; true when the child
// was killed (false: it finished the save).
bool save_in_child(const FlatModel& m, const fs::path& root, int64_t step, int tag,
                   const std::string& spec) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      set_fault_plan(spec);
      save_two_ranks(m, root, step, tag);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) << spec;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

TEST(CheckpointCrash, KillAtEveryFileOperationOfATwoRankSave) {
  FlatModel m;
  // The operations of one save (a new step, and the same step again, replacing it) and
  // which of them are writes (from the trace).
  struct Plan {
    int64_t ops = 0;
    std::vector<int64_t> writes;
  } plans[2];
  {
    TempDir tmp;
    save_two_ranks(m, tmp.path(), 1, 1);
    for (int replace = 0; replace < 2; ++replace) {
      testing::internal::CaptureStderr();
      set_fault_plan("trace");
      save_two_ranks(m, tmp.path(), 2, 2 + replace);
      plans[replace].ops = file_op_count();
      set_fault_plan("");
      std::istringstream trace(testing::internal::GetCapturedStderr());
      for (std::string line; std::getline(trace, line);) {
        long long k = 0;
        char kind[16] = {};
        if (std::sscanf(line.c_str(), "kiln: file op %lld (rank %*d): %15s", &k, kind) == 2 &&
            std::string(kind) == "write")
          plans[replace].writes.push_back(k);
      }
    }
  }
  ASSERT_GT(plans[0].ops, 10);
  ASSERT_GE(plans[0].writes.size(), 5u);  // 2 data files, 2 part files, extra file, manifest
  int kills = 0, new_chosen = 0;
  for (const bool replace : {false, true}) {
    // Killed after every operation, and half-way through every write.
    std::vector<std::string> specs;
    for (int64_t k = 1; k <= plans[replace].ops; ++k) specs.push_back(fmt::format("kill:{}", k));
    for (int64_t k : plans[replace].writes) specs.push_back(fmt::format("kill_mid:{}", k));
    for (const std::string& spec : specs) {
      TempDir tmp;
      save_two_ranks(m, tmp.path(), 1, 1);
      if (replace) save_two_ranks(m, tmp.path(), 2, 2);
      const std::string at = fmt::format("{} ({} save)", spec, replace ? "replacing" : "new");
      ASSERT_TRUE(save_in_child(m, tmp.path(), 2, 9, spec)) << at << ": not killed";
      ++kills;
      // The newest complete checkpoint: the previous state or the new one, never a partial one.
      const int tag = check_root(m, tmp.path(), at);
      EXPECT_TRUE(tag == 9 || tag == (replace ? 2 : 1)) << at << ": tag " << tag;
      if (replace) {
        EXPECT_TRUE(fs::exists(tmp.path() / "step_00000002" / "manifest.json")) << at;
      }
      new_chosen += tag == 9;
      // The next save (the resumed run saving that step) succeeds and is chosen.
      save_two_ranks(m, tmp.path(), 2, 10);
      EXPECT_EQ(check_root(m, tmp.path(), at + ", saved again"), 10);
      EXPECT_EQ(list_checkpoint_dirs(tmp.path()).size(), 2u) << at;
    }
  }
  EXPECT_GT(new_chosen, 0);
  std::printf("killed %d saves: after each of the %lld file operations of a new save and the %lld "
              "of a replacing one, and half-way through each of their %zu and %zu writes\n",
              kills, static_cast<long long>(plans[0].ops), static_cast<long long>(plans[1].ops),
              plans[0].writes.size(), plans[1].writes.size());
}

// An injected ENOSPC or EIO at any file operation: a one-line error naming a file; the
// previous checkpoint stays intact and chosen unless the new one was already complete.
TEST(CheckpointCrash, WriteErrorAtEveryFileOperation) {
  FlatModel m;
  int64_t ops = 0;
  {
    TempDir tmp;
    save_two_ranks(m, tmp.path(), 1, 1);
    set_fault_plan("");
    save_two_ranks(m, tmp.path(), 2, 2);
    ops = file_op_count();
  }
  int errors = 0;
  for (const char* mode : {"enospc", "eio"}) {
    for (int64_t k = 1; k <= ops; ++k) {
      TempDir tmp;
      save_two_ranks(m, tmp.path(), 1, 1);
      const std::string spec = fmt::format("{}:{}", mode, k);
      set_fault_plan(spec);
      std::string err;
      try {
        save_two_ranks(m, tmp.path(), 2, 9);
      } catch (const Error& e) {
        err = e.what();
      }
      set_fault_plan("");
      ASSERT_FALSE(err.empty()) << spec << ": no error";
      ++errors;
      EXPECT_EQ(err.find('\n'), std::string::npos) << spec << ": " << err;
      EXPECT_NE(err.find(std::string(mode) == "eio" ? "Input/output error" : "No space left on device"),
                std::string::npos) << spec << ": " << err;
      EXPECT_NE(err.find(tmp.path().string()), std::string::npos) << spec << ": " << err;
      const int tag = check_root(m, tmp.path(), spec);
      EXPECT_TRUE(tag == 1 || tag == 9) << spec << ": tag " << tag;
      EXPECT_NO_THROW(verify_checkpoint(tmp.path() / "step_00000001")) << spec;
    }
  }
  EXPECT_EQ(errors, 2 * ops);
}

TEST(CheckpointCrash, BadFaultSpecIsAnError) {
  EXPECT_THROW(set_fault_plan("kill"), Error);
  EXPECT_THROW(set_fault_plan("kill:0"), Error);
  EXPECT_THROW(set_fault_plan("explode:3"), Error);
  EXPECT_THROW(set_fault_plan("kill:2:x"), Error);
  set_fault_plan("");
}

}  // namespace
}  // namespace kiln::checkpoint
