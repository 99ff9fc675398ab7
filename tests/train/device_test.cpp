// train.device: the one mapping from the key to a backend, its errors, and the launcher's
// local rank (which GPU a rank takes).
#include "backend/registry.h"
#include "comm/communicator.h"
#include "train/config.h"
#include "train/device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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

TEST(Device, CudaWithoutAGpuIsOneLineNamingTheKey) {
  if (gpu_device_count("cuda") > 0) GTEST_SKIP() << "a GPU is visible: nothing to refuse";
  try {
    make_device_backend("cuda");
    FAIL() << "cuda without a GPU accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("train.device = cuda"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
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
