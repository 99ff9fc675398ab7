#include "backend/cuda/common.h"

#include "core/error.h"

namespace kiln::cuda {

void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) return;
  // Clear a sticky launch error so that the next check reports its own call.
  (void)cudaGetLastError();
  KILN_FAIL("cuda: {} failed: {} ({}) at {}:{}", what, cudaGetErrorString(status),
            cudaGetErrorName(status), file, line);
}

void fail(const char* message) { throw Error(message); }

}  // namespace kiln::cuda
