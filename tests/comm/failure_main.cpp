// Jobs that must fail, and fail fast, for tests/comm/expect_failure.cmake:
//   throw    the last rank throws an uncaught exception; the others wait in a collective.
//   timeout  the last rank skips a collective (and sleeps); the others' wait times out.
//   exit     the last rank calls exit(3) mid-job without shutting MPI down.
//   exit0    the same with exit(0): mpirun still ends the job as a failure.
//   stop     the last rank stops itself (SIGSTOP, as a hung or frozen process): the others
//            time out naming it as the rank that did not arrive.
// In every case each rank must end with a non-zero status well before the ctest limit.
// `--timeout-s S` after the mode sets the world's timeout (timeout_flag.h); with
// `--all-to-all` the collective the others wait in is an all_to_all (250 fp32 elements
// to each rank) instead of an all_reduce.
#include "comm/communicator.h"
#include "timeout_flag.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  using namespace kiln;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "throw" && mode != "timeout" && mode != "exit" && mode != "exit0" && mode != "stop") {
    std::fprintf(stderr, "usage: %s throw|timeout|exit|exit0|stop [--timeout-s S] [--all-to-all]\n",
                 argv[0]);
    return 2;
  }
  std::unique_ptr<Communicator> world = make_world_communicator();
  world->set_timeout(testing::timeout_flag(argc, argv, kDefaultCommTimeout));
  const bool last = world->rank() == world->size() - 1;
  float x = 1.f;
  world->all_reduce(Tensor::view(&x, {1}, DType::F32));  // everyone is up
  if (last) {
    if (mode == "throw") throw std::runtime_error("deliberate failure in the test");
    if (mode == "exit") std::exit(3);
    if (mode == "exit0") std::exit(0);  // "success" without shutting MPI down
    if (mode == "stop") ::raise(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::seconds(120));  // timeout: never joins
  }
  bool all_to_all = false;
  for (int i = 2; i < argc; ++i) all_to_all = all_to_all || std::strcmp(argv[i], "--all-to-all") == 0;
  if (all_to_all) {
    const auto n = static_cast<size_t>(world->size());
    std::vector<float> in(250 * n, 1.f), out(250 * n);
    const std::vector<int64_t> counts(n, 250);
    world->all_to_all(Tensor::view(out.data(), {static_cast<int64_t>(out.size())}, DType::F32),
                      Tensor::view(in.data(), {static_cast<int64_t>(in.size())}, DType::F32),
                      counts, counts);
  } else {
    std::vector<float> y(1000, 1.f);
    world->all_reduce(Tensor::view(y.data(), {1000}, DType::F32));
  }
  std::fprintf(stderr, "rank %d: the collective completed, which it must not\n", world->rank());
  return 0;
}
