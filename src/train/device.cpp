#include "train/device.h"

#include "backend/registry.h"
#include "comm/communicator.h"
#include "core/error.h"

#include <fmt/format.h>

namespace kiln {

std::unique_ptr<Backend> make_device_backend(const std::string& device) {
  if (device == "cpu") return make_backend("cpu");
  KILN_CHECK(device == "cuda", "train.device = '{}': expected cpu or cuda", device);
  const std::string why = gpu_unavailable_reason("cuda");
  KILN_CHECK(why.empty(), "train.device = cuda: {} (use train.device = cpu)", why);
  return make_backend(fmt::format("cuda:{}", launcher_local_rank() % gpu_device_count("cuda")));
}

DType mfu_peak_dtype(const TrainConfig& config) {
  return config.train.device == "cuda" ? parse_dtype(config.train.dtype) : DType::F32;
}

}  // namespace kiln
