// CudaBackend's mixture-of-experts ops (the router, the token permutation and the grouped
// linear) are not written yet: each throws a one-line kiln::Error, and cuda_supports
// answers false for the MoE family, so that a feature asking for them is refused before
// it runs (require_ops). Their kernels (a top-k per token, the plan as a device-side
// counting sort, a gather/scatter by rows, a grouped GEMM reading the offsets on the
// device or copying the E + 1 of them to the host once per call) come with the GPU part
// of the MoE work.
#include "backend/cuda/cuda_backend_impl.h"
#include "core/error.h"

namespace kiln::cuda {

namespace {
[[noreturn]] void no_moe_ops(const char* op) {
  throw Error(fmt::format("{}: the mixture-of-experts ops are not implemented on the CUDA "
                          "backend yet; run MoE models on the CPU backend", op));
}
}  // namespace

void CudaBackend::moe_router_forward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const MoeRouterSpec&) {
  no_moe_ops("moe_router_forward");
}
void CudaBackend::moe_router_backward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, const Tensor&, const MoeRouterSpec&) {
  no_moe_ops("moe_router_backward");
}
void CudaBackend::moe_balance_stats(Stream, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, MoeScoring, float, float) {
  no_moe_ops("moe_balance_stats");
}
void CudaBackend::moe_balance_backward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                       MoeScoring, float, float) {
  no_moe_ops("moe_balance_backward");
}
void CudaBackend::moe_permute_plan(Stream, const Tensor&, const Tensor&, const Tensor&, int64_t) {
  no_moe_ops("moe_permute_plan");
}
void CudaBackend::moe_permute(Stream, const Tensor&, const Tensor&, const Tensor&) {
  no_moe_ops("moe_permute");
}
void CudaBackend::moe_permute_backward(Stream, const Tensor&, const Tensor&, const Tensor&) {
  no_moe_ops("moe_permute_backward");
}
void CudaBackend::moe_unpermute(Stream, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&) {
  no_moe_ops("moe_unpermute");
}
void CudaBackend::moe_unpermute_backward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&, const Tensor&) {
  no_moe_ops("moe_unpermute_backward");
}
void CudaBackend::grouped_linear_forward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&) {
  no_moe_ops("grouped_linear_forward");
}
void CudaBackend::grouped_linear_backward(Stream, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, const Tensor&) {
  no_moe_ops("grouped_linear_backward");
}

}  // namespace kiln::cuda
