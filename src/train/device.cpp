#include "train/device.h"

#include "backend/registry.h"
#include "comm/communicator.h"
#include "core/error.h"

#if defined(KILN_HAVE_NCCL)
#include "comm/nccl/nccl_communicator.h"
#endif

#include <fmt/format.h>

namespace kiln {

namespace {
void check_device_name(const std::string& device) {
  KILN_CHECK(device == "cpu" || device == "cuda", "train.device = '{}': expected cpu or cuda",
             device);
}

/// The GPU this process takes: launcher local rank % visible GPUs.
int cuda_device_index() {
  const std::string why = gpu_unavailable_reason("cuda");
  KILN_CHECK(why.empty(), "train.device = cuda: {} (use train.device = cpu)", why);
  return launcher_local_rank() % gpu_device_count("cuda");
}
}  // namespace

BackendOptions backend_options(const TrainConfig& config) {
  BackendOptions o;
  o.tf32 = config.backend.tf32;
  o.gemm_tuning = config.backend.gemm_tuning;
  o.attention = config.backend.attention == "simt" ? AttentionKernel::Simt : AttentionKernel::Auto;
  return o;
}

std::unique_ptr<Backend> make_device_backend(const std::string& device,
                                             const BackendOptions& options) {
  check_device_name(device);
  if (device == "cpu") return make_backend("cpu", options);
  return make_backend(fmt::format("cuda:{}", cuda_device_index()), options);
}

bool device_comm_built_with_nccl() {
#if defined(KILN_HAVE_NCCL)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_device_world_communicator(const std::string& device) {
  check_device_name(device);
  if (device == "cpu") return make_world_communicator();
  const int gpu = cuda_device_index();
#if defined(KILN_HAVE_NCCL)
  return make_nccl_communicator(make_world_communicator(), gpu);
#else
  (void)gpu;
  KILN_FAIL("train.device = cuda: this kiln was built without NCCL (KILN_NCCL=OFF; see "
            "docs/cuda.md), which the trainer's groups need on the GPU");
#endif
}

DType mfu_peak_dtype(const TrainConfig& config) {
  return config.train.device == "cuda" ? parse_dtype(config.train.dtype) : DType::F32;
}

}  // namespace kiln
