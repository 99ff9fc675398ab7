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

Elem elem_of(DType t) {
  if (t == DType::F32) return Elem::F32;
  if (t == DType::BF16) return Elem::BF16;
  KILN_FAIL("cuda: no kernel for {}", dtype_name(t));
}

}  // namespace kiln::cuda
