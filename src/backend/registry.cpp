#include "backend/registry.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#if defined(KILN_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

#include <cstdlib>

namespace kiln {

std::vector<std::unique_ptr<Backend>> available_backends() {
  std::vector<std::unique_ptr<Backend>> v;
  v.push_back(make_cpu_backend());
#if defined(KILN_HAVE_CUDA)
  if (cuda_device_count() > 0) v.push_back(make_cuda_backend(0));
#endif
  return v;
}

std::string gpu_unavailable_reason(const std::string& kind) {
  if (kind != "cuda") return "no such GPU kind (known: cuda)";
#if defined(KILN_HAVE_CUDA)
  if (cuda_device_count() > 0) return "";
  return "compiled, but " + cuda_unavailable_reason();
#else
  return "not compiled into this build";
#endif
}

std::vector<std::string> skipped_backends() {
  const std::string why = gpu_unavailable_reason("cuda");
  if (why.empty()) return {};
  return {"cuda: " + why};
}

int gpu_device_count(const std::string& kind) {
#if defined(KILN_HAVE_CUDA)
  if (kind == "cuda") return cuda_device_count();
#endif
  (void)kind;
  return 0;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return make_cpu_backend();
#if defined(KILN_HAVE_CUDA)
  if (name == "cuda") return make_cuda_backend(0, options);
  if (name.rfind("cuda:", 0) == 0) return make_cuda_backend(std::atoi(name.c_str() + 5), options);
  KILN_FAIL("unknown or unavailable backend '{}' (available: cpu, cuda)", name);
#else
  (void)options;
  KILN_FAIL("unknown or unavailable backend '{}' (available: cpu)", name);
#endif
}

}  // namespace kiln
