#include "mpi_test_main.h"

#include "timeout_flag.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace kiln::testing {
namespace {

std::unique_ptr<Communicator> g_world;

/// Prints failed assertions with the rank in front (ranks other than 0).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

Communicator& world() { return *g_world; }

}  // namespace kiln::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kiln::testing::g_world = kiln::make_world_communicator();
  kiln::Communicator& w = *kiln::testing::g_world;
  w.set_timeout(kiln::testing::timeout_flag(argc, argv, kiln::kDefaultCommTimeout));
  if (w.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new kiln::testing::RankFailurePrinter(w.rank()));
  }
  std::printf("world: %s communicator, %d rank(s)\n", w.backend_name().c_str(), w.size());
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int32_t any = failed;
  w.all_reduce(kiln::Tensor::view(&any, {1}, kiln::DType::I32), kiln::ReduceOp::Max);
  if (any != 0 && w.rank() == 0 && failed == 0) {
    std::fprintf(stderr, "some other rank failed (see its [rank R] lines)\n");
  }
  kiln::testing::g_world.reset();
  return any != 0 ? 1 : 0;
}
