// The single-process communicator, the bandwidth formulas, timeouts, the launcher's
// environment the world factory reads and the registry of communicators. No MPI needed.
#include "comm/communicator.h"
#include "comm/launch.h"
#include "comm/local_communicator.h"
#include "comm/registry.h"
#include "core/trace_sink.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace kiln {
namespace {

/// Sets (or unsets) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CommBandwidth, NcclTestsFactors) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::AllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::AllReduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::AllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::ReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::AllGather, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::Broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::Send, 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::Barrier, 8), 0.0);
  // 1 GB all-reduced over 4 ranks in 0.5 s: algbw 2 GB/s, busbw 3 GB/s.
  EXPECT_DOUBLE_EQ(algorithm_bandwidth(1'000'000'000, 0.5), 2e9);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::AllReduce, 4, 1'000'000'000, 0.5), 3e9);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::AllReduce, 4, 100, 0.0), 0.0);
  EXPECT_STREQ(collective_name(Collective::ReduceScatter), "reduce_scatter");
}

TEST(LocalComm, CollectivesOfOneRank) {
  LocalCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.name(), "world");
  std::vector<float> x = {1.f, -2.f, 3.f};
  c.all_reduce(Tensor::view(x.data(), {3}, DType::F32));
  c.all_reduce(Tensor::view(x.data(), {3}, DType::F32), ReduceOp::Max);
  c.broadcast(Tensor::view(x.data(), {3}, DType::F32), 0);
  EXPECT_EQ(x, (std::vector<float>{1.f, -2.f, 3.f}));
  std::vector<float> y(3, 0.f);
  c.reduce_scatter(Tensor::view(y.data(), {3}, DType::F32), Tensor::view(x.data(), {3}, DType::F32));
  EXPECT_EQ(y, x);
  std::vector<float> z(3, 0.f);
  auto w = c.all_gather_async(Tensor::view(z.data(), {3}, DType::F32), Tensor::view(x.data(), {3}, DType::F32));
  EXPECT_TRUE(w->is_completed());
  w->wait();
  EXPECT_EQ(z, x);
  c.barrier();
  CommStats s = c.stats();
  EXPECT_EQ(s.of(Collective::AllReduce).count, 2);
  EXPECT_EQ(s.of(Collective::AllReduce).bytes, 24);
  EXPECT_EQ(s.of(Collective::ReduceScatter).bytes, 12);
  EXPECT_EQ(s.of(Collective::AllGather).bytes, 12);
  EXPECT_EQ(s.of(Collective::Barrier).count, 1);
}

TEST(LocalComm, ChecksLikeAWorldOfMany) {
  LocalCommunicator c;
  std::vector<float> x(4);
  std::vector<int32_t> i(4);
  Tensor f = Tensor::view(x.data(), {4}, DType::F32);
  EXPECT_THROW(c.reduce_scatter(Tensor::view(x.data(), {2}, DType::F32), f), Error);
  EXPECT_THROW(c.all_gather(f, Tensor::view(i.data(), {4}, DType::I32)), Error);
  EXPECT_THROW(c.broadcast(f, 1), Error);
  EXPECT_THROW(c.send(f, 1, 0), Error);
  EXPECT_THROW(c.recv(f, 0, -1), Error);
  try {
    c.reduce_scatter(Tensor::view(x.data(), {3}, DType::F32), f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter on 'world' (rank 0 of 1): input has 4 elements"), std::string::npos) << e.what();
  }
}

TEST(LocalComm, SendToSelfInEitherOrder) {
  LocalCommunicator c;
  std::vector<int32_t> a = {1, 2, 3}, b(3, 0), d(3, 0);
  c.send(Tensor::view(a.data(), {3}, DType::I32), 0, 5);  // buffered
  c.recv(Tensor::view(b.data(), {3}, DType::I32), 0, 5);
  EXPECT_EQ(b, a);
  auto r = c.recv_async(Tensor::view(d.data(), {3}, DType::I32), 0, 9);  // posted first
  EXPECT_FALSE(r->is_completed());
  c.send(Tensor::view(a.data(), {3}, DType::I32), 0, 9);
  EXPECT_TRUE(r->is_completed());
  r->wait();
  EXPECT_EQ(d, a);
  std::vector<int32_t> big(4);
  c.send(Tensor::view(a.data(), {3}, DType::I32), 0, 1);
  EXPECT_THROW(c.recv(Tensor::view(big.data(), {4}, DType::I32), 0, 1), Error);
}

TEST(LocalComm, GroupsAndConsistencyCheck) {
  LocalCommunicator c;
  c.set_timeout(7.5);
  auto g = c.new_group({0}, "tp");
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->name(), "tp");
  EXPECT_EQ(g->timeout(), 7.5);
  EXPECT_EQ(c.new_group({0})->name(), "world/group");
  EXPECT_EQ(c.split(3, 0)->size(), 1);
  EXPECT_THROW(c.new_group({}), Error);
  EXPECT_THROW(c.new_group({1}), Error);
  EXPECT_THROW(c.new_group({0, 0}), Error);
  EXPECT_THROW(c.split(-1, 0), Error);
  EXPECT_NO_THROW(check_same_on_all_ranks(c, "config", "abc"));
  EXPECT_NO_THROW(check_same_on_all_ranks(c, "config", ""));
}

// The TraceSink installed in a communicator hears of each completed operation (name,
// bytes, the track "comm <group>"), its groups inherit it, and none installed or a
// disabled one hears nothing.
struct RecordingSink final : TraceSink {
  bool on = true;
  std::vector<std::string> heard;  // "all_reduce 12 comm world"
  bool enabled() const override { return on; }
  void record_span(std::string_view, std::string_view, Clock::time_point,
                   Clock::time_point) override {}
  void record_collective(std::string_view name, int64_t bytes, Clock::time_point start,
                         Clock::time_point end, std::string_view track) override {
    EXPECT_LE(start, end);
    heard.push_back(fmt::format("{} {} {}", name, bytes, track));
  }
};

TEST(LocalComm, ReportsToTheInstalledTracer) {
  LocalCommunicator c;
  std::vector<float> x = {1.f, 2.f, 3.f};
  c.all_reduce(Tensor::view(x.data(), {3}, DType::F32));  // nothing installed
  RecordingSink sink;
  c.set_tracer(&sink);
  c.all_reduce(Tensor::view(x.data(), {3}, DType::F32));
  auto tp = c.new_group({0}, "tp");
  EXPECT_EQ(tp->tracer(), &sink);
  tp->broadcast(Tensor::view(x.data(), {3}, DType::F32), 0);
  c.split(0, 0, "dp")->barrier();
  sink.on = false;
  c.all_reduce(Tensor::view(x.data(), {3}, DType::F32));
  EXPECT_EQ(sink.heard, (std::vector<std::string>{"all_reduce 12 comm world",
                                                  "broadcast 12 comm tp", "barrier 0 comm dp"}));
}

TEST(CommEnv, Timeout) {
  // 60 s until set: the trainer sets parallel.timeout_s, programs without a config call
  // set_timeout (the MPI test mains take --timeout-s). No environment variable changes it.
  EXPECT_EQ(kDefaultCommTimeout, 60.0);
  EXPECT_EQ(LocalCommunicator().timeout(), 60.0);
  {
    ScopedEnv e("KILN_COMM_TIMEOUT_S", "2.5");
    EXPECT_EQ(LocalCommunicator().timeout(), 60.0);
  }
  LocalCommunicator c;
  for (const double bad : {0.0, -3.0, std::nan(""), HUGE_VAL})
    EXPECT_THROW(c.set_timeout(bad), Error) << bad;
  c.set_timeout(2.5);
  EXPECT_EQ(c.timeout(), 2.5);
  EXPECT_EQ(c.new_group({0})->timeout(), 2.5);  // sub-groups inherit it
  c.set_timeout(0.25);
  EXPECT_EQ(c.timeout(), 0.25);
}

TEST(CommEnv, LauncherDetectionAndFactory) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), d("PMIX_RANK", nullptr);
  EXPECT_EQ(launcher_world_size(), 0);
  auto w = make_world_communicator();
  EXPECT_EQ(w->backend_name(), "local");
  EXPECT_EQ(w->size(), 1);
  {
    ScopedEnv e("PMI_SIZE", "3");
    EXPECT_EQ(launcher_world_size(), 3);
    if (!comm_built_with_mpi()) {
      EXPECT_THROW(make_world_communicator(), Error);
    }
  }
  {
    ScopedEnv e("OMPI_COMM_WORLD_SIZE", "1");
    EXPECT_EQ(launcher_world_size(), 1);
    EXPECT_EQ(make_world_communicator()->backend_name(), "local");  // one process: no MPI
  }
  {
    ScopedEnv e("PMIX_RANK", "0");
    EXPECT_EQ(launcher_world_size(), -1);
  }
  {
    ScopedEnv e("OMPI_COMM_WORLD_SIZE", "x");
    EXPECT_THROW(launcher_world_size(), Error);
  }
}

// srun without a PMI (Slurm's MpiDefault=none, no --mpi) starts tasks that each see only
// themselves: refused before MPI starts, naming --mpi=pmix (docs/distributed.md, "Slurm").
TEST(CommEnv, SrunWithoutPmiIsRefused) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), d("PMIX_RANK", nullptr);
  {
    ScopedEnv e("SLURM_STEP_NUM_TASKS", "2");
    EXPECT_EQ(srun_tasks_without_pmi(), 2);
    EXPECT_EQ(launcher_world_size(), 2);  // so that main's error path says it once
    try {
      make_world_communicator();
      ADD_FAILURE() << "srun without a PMI accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("srun --mpi=pmix"), std::string::npos) << err.what();
    }
    ScopedEnv f("PMIX_RANK", "0");  // srun --mpi=pmix: MPI knows the world
    EXPECT_EQ(srun_tasks_without_pmi(), 0);
    EXPECT_EQ(launcher_world_size(), -1);
  }
  ScopedEnv e("SLURM_STEP_NUM_TASKS", "1");  // srun -n 1: one process, nothing to refuse
  EXPECT_EQ(srun_tasks_without_pmi(), 0);
  EXPECT_EQ(make_world_communicator()->backend_name(), "local");
}

// The start-up line (comm/launch.h): who launched the ranks and where each runs.
TEST(CommLaunch, SummaryNamesTheLauncherTheJobAndTheHost) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), d("PMIX_RANK", nullptr);
  ScopedEnv e("SLURM_JOB_ID", nullptr), f("SLURM_STEP_ID", nullptr), g("SLURM_STEP_NUM_TASKS", nullptr);
  ScopedEnv h("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), i("SLURM_LOCALID", nullptr);
  LocalCommunicator world("world");
  EXPECT_EQ(launch_summary(world), "");  // by hand, outside Slurm: nothing to say
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  {
    ScopedEnv j("SLURM_JOB_ID", "12");  // one process of a batch script
    EXPECT_EQ(launch_summary(world), fmt::format("1 rank started in Slurm job 12; {}: rank 0, local rank 0", host));
    ScopedEnv k("SLURM_STEP_ID", "3"), l("PMIX_RANK", "0"), m("SLURM_LOCALID", "5");
    EXPECT_EQ(launch_summary(world),
              fmt::format("1 rank launched by srun --mpi=pmix in Slurm job 12 step 3; {}: rank 0, local rank 5", host));
  }
  ScopedEnv n("OMPI_COMM_WORLD_SIZE", "1");
  EXPECT_EQ(launch_summary(world), fmt::format("1 rank launched by mpirun (Open MPI); {}: rank 0, local rank 0", host));
}

// The registry (comm/registry.h): the communicators of this build by name, as
// parallel.communicator chooses them.
TEST(CommRegistry, NamesTheCommunicatorsOfThisBuild) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), d("PMIX_RANK", nullptr);
  const std::vector<std::string> names = communicator_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "local"), names.end());
  EXPECT_EQ(communicator_registered("mpi"), comm_built_with_mpi());
  EXPECT_FALSE(communicator_registered("auto"));
  EXPECT_EQ(make_communicator("auto")->backend_name(), "local");  // one process
  EXPECT_EQ(make_communicator("local")->backend_name(), "local");
  EXPECT_EQ(make_communicator("local")->name(), "world");
  for (const char* unknown : {"bogus", "nccl"}) {
    if (communicator_registered(unknown)) continue;  // nccl where built
    try {
      make_communicator(unknown);
      ADD_FAILURE() << unknown << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("communicator '") + unknown + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("local"), std::string::npos) << m;  // what the build has
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
  {
    ScopedEnv e("PMI_SIZE", "3");
    EXPECT_THROW(make_communicator("local"), Error);  // one process only
  }
}

TEST(CommRegistry, ExtensionsRegisterByName) {
  int made = 0;
  register_communicator("test-local", [&made](int gpu) -> std::unique_ptr<Communicator> {
    ++made;
    EXPECT_EQ(gpu, 3);
    return std::make_unique<LocalCommunicator>("world");
  });
  EXPECT_TRUE(communicator_registered("test-local"));
  EXPECT_EQ(make_communicator("test-local", 3)->size(), 1);
  EXPECT_EQ(made, 1);
  EXPECT_THROW(register_communicator("auto", [](int) { return std::unique_ptr<Communicator>(); }),
               Error);
}

TEST(LocalCommDeath, UnmatchedRecvTimesOutAndAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        LocalCommunicator c;
        c.set_timeout(0.2);
        int32_t v = 0;
        c.recv(Tensor::view(&v, {1}, DType::I32), 0, 4);
      },
      ::testing::ExitedWithCode(1),
      "kiln: rank 0: timed out after 0.2 s waiting for recv\\(tag 4, int32\\[1\\]\\) on 'world' \\(rank 0 of 1\\)");
}

TEST(LocalCommDeath, AbortAllPrintsRank) {
  EXPECT_EXIT(abort_all("something broke"), ::testing::ExitedWithCode(1), "kiln: rank 0: something broke");
}

}  // namespace
}  // namespace kiln
