#include "train/device.h"

#include "backend/registry.h"
#include "comm/registry.h"
#include "core/error.h"

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

/// NCCL's collectives take GPU tensors, MPI's and the local one's host tensors.
void check_communicator_fits(const std::string& device, const std::string& communicator) {
  if (communicator == "auto") return;
  const bool device_comm = communicator == "nccl";
  KILN_CHECK(device_comm == (device == "cuda"),
             "parallel.communicator = {} with train.device = {}: {}", communicator, device,
             device == "cuda" ? "the trainer's groups on the GPU need nccl (or auto)"
                              : "nccl needs train.device = cuda (or set auto, mpi or local)");
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

std::unique_ptr<Communicator> make_device_world_communicator(const std::string& device,
                                                             const std::string& communicator) {
  check_device_name(device);
  check_communicator_fits(device, communicator);
  if (device == "cpu") return make_communicator(communicator);
  const int gpu = cuda_device_index();
  KILN_CHECK(communicator_registered("nccl"),
             "train.device = cuda: this kiln was built without NCCL (KILN_NCCL=OFF; see "
             "docs/cuda.md), which the trainer's groups need on the GPU");
  return make_communicator("nccl", gpu);
}

DType mfu_peak_dtype(const TrainConfig& config) {
  return config.train.device == "cuda" ? parse_dtype(config.train.dtype) : DType::F32;
}

}  // namespace kiln
