// An NVTX range for the duration of a scope (visible in Nsight Systems), when the
// toolkit has the header-only nvtx3; otherwise nothing. Costs a few nanoseconds when no
// profiler is attached.
#pragma once

#if defined(KILN_CUDA_NVTX)
#include <nvtx3/nvToolsExt.h>
namespace kiln::cuda {
struct NvtxRange {
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};
}  // namespace kiln::cuda
#else
namespace kiln::cuda {
struct NvtxRange {
  explicit NvtxRange(const char*) {}
};
}  // namespace kiln::cuda
#endif
