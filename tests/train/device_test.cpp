// train.device: the one mapping from the key to a backend and a world communicator,
// their errors, the [backend] keys as the backend's options, parallel.communicator
// through the communicator registry, the launcher's local rank (which GPU a rank takes),
// AdamW's options from [optim], and the batch staged
// through the backend's staging (pinned on CUDA) memory, checked on the CPU through a
// backend that records where each host-to-device copy reads from.
#include "backend/op_list.h"
#include "backend/registry.h"
#include "comm/communicator.h"
#include "comm/local_communicator.h"
#include "config/components.h"
#include "config/config.h"
#include "train/device.h"
#include "model_io/model_io.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace kiln {
namespace {

TEST(Device, CpuIsTheDefaultAndMapsToTheCpuBackend) {
  const TrainConfig c = load_config_string("[model]\nn_layer = 1\n", {}, "t.toml");
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(make_device_backend(c.train.device)->name(), "cpu");
}

TEST(Device, TheKeyTakesCpuOrCudaOnly) {
  EXPECT_EQ(load_config_string("[train]\ndevice = \"cuda\"\n", {}, "t.toml").train.device, "cuda");
  try {
    load_config_string("[train]\ndevice = \"tpu\"\n", {}, "t.toml");
    FAIL() << "tpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_device_backend("gpu"), Error);
}

// `make` with train.device = cuda on a machine without a GPU: one line naming the key.
template <class F>
void expect_cuda_refused(F make) {
  try {
    make();
    FAIL() << "cuda without a GPU accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("train.device = cuda"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(Device, CudaWithoutAGpuIsOneLineNamingTheKey) {
  if (gpu_device_count("cuda") > 0) GTEST_SKIP() << "a GPU is visible: nothing to refuse";
  expect_cuda_refused([] { make_device_backend("cuda"); });
}

TEST(Device, TheWorldCommunicatorFollowsTheDevice) {
  EXPECT_EQ(make_device_world_communicator("cpu")->size(), 1);
  EXPECT_THROW(make_device_world_communicator("gpu"), Error);
  if (gpu_device_count("cuda") > 0) GTEST_SKIP() << "a GPU is visible: nothing to refuse";
  expect_cuda_refused([] { make_device_world_communicator("cuda"); });
}

TEST(Device, TheBackendKeysBecomeTheBackendsOptions) {
  const BackendOptions plain = backend_options(load_config_string("", {}, "t.toml"));
  EXPECT_FALSE(plain.tf32);
  EXPECT_FALSE(plain.gemm_tuning);
  EXPECT_EQ(plain.attention, AttentionKernel::Auto);
  const TrainConfig c = load_config_string(
      "", {"backend.tf32=true", "backend.gemm_tuning=true", "backend.attention=simt"}, "t.toml");
  const BackendOptions o = backend_options(c);
  EXPECT_TRUE(o.tf32);
  EXPECT_TRUE(o.gemm_tuning);
  EXPECT_EQ(o.attention, AttentionKernel::Simt);
  EXPECT_EQ(make_device_backend("cpu", o)->name(), "cpu");  // the CPU has none to take
}

// `make` must throw one line containing `want`.
template <class F>
void expect_one_line_error(F make, const std::string& want) {
  try {
    make();
    FAIL() << "accepted; wanted an error with " << want;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(want), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(Device, TheCommunicatorKeyChoosesFromTheRegistry) {
  EXPECT_EQ(make_device_world_communicator("cpu", "auto")->backend_name(), "local");
  EXPECT_EQ(make_device_world_communicator("cpu", "local")->backend_name(), "local");
  expect_one_line_error([] { make_device_world_communicator("cpu", "nccl"); },
                        "parallel.communicator = nccl with train.device = cpu");
  expect_one_line_error([] { make_device_world_communicator("cuda", "mpi"); },
                        "parallel.communicator = mpi with train.device = cuda");
  expect_one_line_error([] { make_device_world_communicator("cpu", "bogus"); },
                        "communicator 'bogus'");
}

TEST(OptimFromConfig, AdamWTakesMultiTensorFromTheKey) {
  EXPECT_TRUE(adamw_config_from(load_config_string("", {}, "t.toml")).multi_tensor);
  EXPECT_FALSE(
      adamw_config_from(load_config_string("", {"optim.multi_tensor=false"}, "t.toml")).multi_tensor);
}

// A CPU backend whose staging allocator is its own and which records, for each
// copy_from_host, whether it read from that allocator's memory, and each synchronize.
class StagingProbe final : public Backend {
 public:
  struct Allocations final : public Allocator {
    Device device() const override { return Device::cpu(); }
    std::vector<std::pair<const char*, size_t>> blocks;
    bool holds(const void* p, size_t n) const {
      const auto* c = static_cast<const char*>(p);
      for (const auto& [b, size] : blocks)
        if (c >= b && c + n <= b + size) return true;
      return false;
    }

   protected:
    void* raw_allocate(size_t bytes) override {
      void* p = host_allocator().allocate(bytes, MemCategory::Temporaries);
      blocks.emplace_back(static_cast<const char*>(p), bytes);
      return p;
    }
    void raw_deallocate(void*) override {}  // kept: the test reads the record afterwards
  };
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  Allocations staging;
  std::vector<std::string> events;  // "sync", "staged", "pageable"

  std::string name() const override { return "probe"; }
  Device device() const override { return cpu->device(); }
  Allocator& allocator() override { return cpu->allocator(); }
  Allocator& staging_allocator() override { return staging; }
  Stream default_stream() override { return cpu->default_stream(); }
  void synchronize(Stream s) override {
    events.push_back("sync");
    cpu->synchronize(s);
  }
  void copy_from_host(Stream s, const Tensor& dst, const void* src) override {
    events.push_back(staging.holds(src, dst.nbytes()) ? "staged" : "pageable");
    cpu->copy_from_host(s, dst, src);
  }
  void copy_to_host(Stream s, void* dst, const Tensor& src) override { cpu->copy_to_host(s, dst, src); }
  void copy(Stream s, const Tensor& dst, const Tensor& src) override { cpu->copy(s, dst, src); }
  void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src, uint64_t seed,
                             uint64_t stream, const GlobalIndices& at) override {
    cpu->copy_stochastic_round(s, dst, src, seed, stream, at);
  }
  void fill(Stream s, const Tensor& t, float value) override { cpu->fill(s, t, value); }
#define KILN_PROBE_FORWARD(Call, method, family, category, params, args) \
  void method(Stream s, KILN_PARAMS params) override { cpu->method(s, KILN_PARAMS args); }
  KILN_BACKEND_OPS(KILN_PROBE_FORWARD)
#undef KILN_PROBE_FORWARD

 protected:
  bool runs(Op op, DType dtype) const override { return cpu->supports(op, dtype); }
};

TEST(Device, TheBatchIsStagedThroughTheBackendsStagingMemory) {
  ModelOptions mo;
  mo.n_layer = 1, mo.n_head = 2, mo.n_embd = 16, mo.block_size = 8, mo.vocab_size = 37;
  const int B = 2, T = 7;
  TrainConfig config = step_config(mo, B, T);
  config.train.global_batch = 2 * B;  // two micro-steps per update
  std::vector<int32_t> tokens(2 * B * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % 37);
    targets[i] = static_cast<int32_t>((i * 5 + 1) % 37);
  }
  double losses[2];
  StagingProbe probe;
  for (int pass = 0; pass < 2; ++pass) {
    std::unique_ptr<Backend> plain = make_backend("cpu");
    Backend& be = pass == 0 ? static_cast<Backend&>(probe) : *plain;
    LocalCommunicator single;
    TrainStep step(config, be, {.dp_cp = single});
    ASSERT_EQ(step.grad_accum_steps(), 2);
    step.init_weights(5);
    if (pass == 0) {
      EXPECT_EQ(step.staging().device(), Device::cpu());
      // A slot of tokens and targets per micro-step.
      EXPECT_TRUE(probe.staging.holds(step.staging().raw(), 2u * 2u * B * T * sizeof(int32_t)));
      probe.events.clear();
    }
    losses[pass] = step.run(tokens.data(), targets.data(), 0).loss;
  }
  // Per micro-step tokens and targets from the staging buffer (its own slot: no wait for
  // the copies before; the step waits only in its one read of the loss at the end).
  EXPECT_EQ(probe.events, (std::vector<std::string>{"staged", "staged", "staged", "staged"}));
  EXPECT_EQ(losses[0], losses[1]) << "staging changed the step";
}

TEST(Device, MfuPeakDtypeIsTheComputeDtypeOnTheGpuAndFp32OnTheCpu) {
  TrainConfig c = load_config_string("[train]\ndtype = \"bf16\"\n", {}, "t.toml");
  EXPECT_EQ(mfu_peak_dtype(c), DType::F32);
  c.train.device = "cuda";
  EXPECT_EQ(mfu_peak_dtype(c), DType::BF16);
  c.train.dtype = "fp32";
  EXPECT_EQ(mfu_peak_dtype(c), DType::F32);
}

TEST(Device, LocalRankFromTheLauncher) {
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
  unsetenv("MPI_LOCALRANKID");
  EXPECT_EQ(launcher_local_rank(), 0);
  setenv("SLURM_LOCALID", "3", 1);
  EXPECT_EQ(launcher_local_rank(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);  // Open MPI's first, and 0 is a rank
  EXPECT_EQ(launcher_local_rank(), 0);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x", 1);
  EXPECT_THROW(launcher_local_rank(), Error);
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("SLURM_LOCALID");
}

}  // namespace
}  // namespace kiln
