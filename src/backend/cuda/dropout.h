// Dropout with kiln's replayable Philox mask: element i kept iff
// uniform_at(seed, stream, offset + i) >= p (offset: the tensor's first global element,
// DropoutSpec), kept values scaled by `scale` (= 1/(1-p), computed by the caller exactly as
// the CPU backend does, so fp32 results match it bit for bit).
#pragma once

#include "backend/cuda/common.h"

namespace kiln::cuda {

void dropout(cudaStream_t s, Elem e, void* out, const void* inp, int64_t n, float p, float scale,
             uint64_t seed, uint64_t stream, uint64_t offset);

}  // namespace kiln::cuda
