#include "backend/registry.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace kiln {

std::vector<std::unique_ptr<Backend>> available_backends() {
  std::vector<std::unique_ptr<Backend>> v;
  v.push_back(make_cpu_backend());
  return v;
}

std::vector<std::string> skipped_backends() {
  return {"cuda: not compiled into this build"};
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  KILN_FAIL("unknown or unavailable backend '{}' (available: cpu)", name);
}

}  // namespace kiln
