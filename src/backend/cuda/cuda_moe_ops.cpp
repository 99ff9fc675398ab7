// CudaBackend's mixture-of-experts ops (docs/cuda.md, "Mixture of experts"). Each
// validates with op_checks (the messages of every backend) and launches the kernels of
// moe_router.cu (the router, the balancing statistics and their gradients) or
// moe_permute.cu (the plan as a device-side counting sort, the row scatters and
// gathers) on the caller's stream; the activations are fp32 or bf16, the router's
// tensors fp32 and the ids int32 whatever the model's dtype.
//
// The grouped linear runs the dense linear's cuBLASLt GEMMs (gemm.h) per power-of-two
// piece of each expert's rows (backend/grouped_pieces.h: a bounded set of shapes, so
// that GEMM plans and tuning stay bounded while the counts change every step). cuBLASLt
// 13.0 has no grouped GEMM with ragged row counts on the device, so each call copies the
// E + 1 offsets to the host once: a synchronisation of the caller's stream per grouped
// linear call (4 per MoE block and micro-batch: gate/up and down, forward and backward;
// more with recomputation), which also lets the offsets be checked as on the CPU. Ids
// and rows are not checked on the host (that would need a synchronisation per op): an
// expert id outside [0, E) makes its slot dropped (row -1) and counted nowhere; the
// permutation ops trust rows (moe_permute_plan's).
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/moe_permute.h"
#include "backend/cuda/moe_router.h"
#include "backend/cuda/nvtx.h"
#include "backend/grouped_pieces.h"
#include "backend/op_checks.h"
#include "core/error.h"

#include <climits>

namespace kiln::cuda {

namespace {
bool sigmoid(MoeScoring scoring) { return scoring == MoeScoring::Sigmoid; }
float* f32_or_null(const Tensor& t) { return t ? t.data<float>() : nullptr; }
size_t elem_size(Elem e) { return e == Elem::F32 ? 4 : 2; }
// Element i of a row-major buffer of element type e.
void* at(void* p, int64_t i, Elem e) {
  return static_cast<char*>(p) + static_cast<size_t>(i) * elem_size(e);
}
}  // namespace

void CudaBackend::moe_router_forward(Stream s, const Tensor& scores, const Tensor& expert_idx,
                                     const Tensor& expert_weight, const Tensor& logits,
                                     const Tensor& bias, const MoeRouterSpec& spec) {
  cuda::NvtxRange r("moe_router_forward");
  const auto d = checks::moe_router(scores, expert_idx, expert_weight, logits, bias, spec);
  KILN_CHECK(!spec.round_robin, "moe_router_forward: the round_robin test router "
             "(model.moe.routing) runs on the cpu backend only");
  on_device_all({&scores, &expert_idx, &expert_weight, &logits, &bias}, "moe_router_forward");
  cuda::moe_router_forward(st(s), scores.data<float>(), expert_idx.data<int32_t>(),
                           expert_weight.data<float>(), logits.data<float>(), f32_or_null(bias),
                           d.N, d.E, spec.k, sigmoid(spec.scoring), spec.renormalize);
}
void CudaBackend::moe_router_backward(Stream s, const Tensor& dlogits, const Tensor& dexpert_weight,
                                      const Tensor& dscores, const Tensor& scores,
                                      const Tensor& expert_idx, const MoeRouterSpec& spec) {
  cuda::NvtxRange r("moe_router_backward");
  const auto d =
      checks::moe_router_backward(dlogits, dexpert_weight, dscores, scores, expert_idx, spec);
  on_device_all({&dlogits, &dexpert_weight, &dscores, &scores, &expert_idx},
                "moe_router_backward");
  cuda::moe_router_backward(st(s), dlogits.data<float>(), dexpert_weight.data<float>(),
                            f32_or_null(dscores), scores.data<float>(),
                            expert_idx.data<int32_t>(), d.N, d.E, spec.k, sigmoid(spec.scoring),
                            spec.renormalize);
}
void CudaBackend::moe_balance_stats(Stream s, const Tensor& load, const Tensor& prob,
                                    const Tensor& z, const Tensor& logits,
                                    const Tensor& expert_idx, MoeScoring scoring,
                                    float prob_scale, float z_scale) {
  cuda::NvtxRange r("moe_balance_stats");
  const auto d = checks::moe_balance_stats(load, prob, z, logits, expert_idx);
  on_device_all({&load, &prob, &z, &logits, &expert_idx}, "moe_balance_stats");
  const size_t bytes = cuda::moe_balance_scratch_bytes(d.N, d.E);
  Scratch scratch(*this, st(s), bytes);
  cuda::moe_balance_stats(st(s), f32_or_null(load), f32_or_null(prob), f32_or_null(z),
                          logits.data<float>(), expert_idx.data<int32_t>(), d.N, d.E, d.k,
                          sigmoid(scoring), prob_scale, z_scale, scratch.ptr());
}
void CudaBackend::moe_balance_backward(Stream s, const Tensor& dlogits, const Tensor& logits,
                                       const Tensor& load, MoeScoring scoring, float aux_scale,
                                       float z_scale) {
  cuda::NvtxRange r("moe_balance_backward");
  const auto d = checks::moe_balance_backward(dlogits, logits, load);
  on_device_all({&dlogits, &logits, &load}, "moe_balance_backward");
  cuda::moe_balance_backward(st(s), dlogits.data<float>(), logits.data<float>(),
                             f32_or_null(load), d.N, d.E, sigmoid(scoring), aux_scale, z_scale);
}

void CudaBackend::moe_permute_plan(Stream s, const Tensor& offsets, const Tensor& rows,
                                   const Tensor& expert_idx, int64_t capacity) {
  cuda::NvtxRange r("moe_permute_plan");
  const auto d = checks::moe_permute_plan(offsets, rows, expert_idx, capacity);
  const int64_t M = d.N * d.k;
  KILN_CHECK(M <= INT32_MAX, "moe_permute_plan: {} slots do not fit int32 rows", M);
  on_device_all({&offsets, &rows, &expert_idx}, "moe_permute_plan");
  Scratch scratch(*this, st(s), cuda::moe_plan_scratch_bytes(M, d.E));
  cuda::moe_permute_plan(st(s), offsets.data<int32_t>(), rows.data<int32_t>(),
                         expert_idx.data<int32_t>(), M, d.E, capacity, scratch.ptr());
}
void CudaBackend::moe_permute(Stream s, const Tensor& out, const Tensor& inp, const Tensor& rows) {
  cuda::NvtxRange r("moe_permute");
  const auto d = checks::moe_permute(inp, out, rows, "moe_permute");
  const Elem e = elem(inp, "moe_permute", {&out});
  on_device_all({&out, &rows}, "moe_permute");
  cuda::moe_scatter_rows(st(s), e, out.raw(), inp.raw(), nullptr, rows.data<int32_t>(), d.N,
                         d.k, d.C);
}
void CudaBackend::moe_permute_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                       const Tensor& rows) {
  cuda::NvtxRange r("moe_permute_backward");
  const auto d = checks::moe_permute(dinp, dout, rows, "moe_permute_backward");
  const Elem e = elem(dout, "moe_permute_backward", {&dinp});
  on_device_all({&dinp, &rows}, "moe_permute_backward");
  cuda::moe_gather_rows(st(s), e, dinp.raw(), dout.raw(), nullptr, rows.data<int32_t>(), d.N,
                        d.k, d.C);
}
void CudaBackend::moe_unpermute(Stream s, const Tensor& out, const Tensor& expert_out,
                                const Tensor& expert_weight, const Tensor& rows) {
  cuda::NvtxRange r("moe_unpermute");
  const auto d = checks::moe_unpermute(out, expert_out, expert_weight, rows);
  const Elem e = elem(out, "moe_unpermute", {&expert_out});
  on_device_all({&expert_out, &expert_weight, &rows}, "moe_unpermute");
  cuda::moe_gather_rows(st(s), e, out.raw(), expert_out.raw(), expert_weight.data<float>(),
                        rows.data<int32_t>(), d.N, d.k, d.C);
}
void CudaBackend::moe_unpermute_backward(Stream s, const Tensor& dexpert_out,
                                         const Tensor& dexpert_weight, const Tensor& dout,
                                         const Tensor& expert_out, const Tensor& expert_weight,
                                         const Tensor& rows) {
  cuda::NvtxRange r("moe_unpermute_backward");
  const char* op = "moe_unpermute_backward";
  const auto d = checks::moe_unpermute_backward(dexpert_out, dexpert_weight, dout, expert_out,
                                                expert_weight, rows);
  const Elem e = elem(dout, op, {&expert_out, &dexpert_out});
  on_device_all({&dexpert_out, &dexpert_weight, &expert_out, &expert_weight, &rows}, op);
  const int32_t* rw = rows.data<int32_t>();
  if (dexpert_out)
    cuda::moe_scatter_rows(st(s), e, dexpert_out.raw(), dout.raw(), expert_weight.data<float>(),
                           rw, d.N, d.k, d.C);
  if (dexpert_weight)
    cuda::moe_row_dots(st(s), e, dexpert_weight.data<float>(), dout.raw(), expert_out.raw(), rw,
                       d.N, d.k, d.C);
}

std::vector<int32_t> CudaBackend::host_offsets(Stream s, const Tensor& offsets, int64_t M,
                                               int64_t E, const char* op) {
  std::vector<int32_t> host(static_cast<size_t>(E) + 1);
  copy_to_host(s, host.data(), offsets);  // synchronises the stream
  checks::grouped_linear_offsets(host.data(), M, E, op);
  return host;
}

void CudaBackend::grouped_linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                                         const Tensor& weight, const Tensor& offsets) {
  cuda::NvtxRange r("grouped_linear_forward");
  const char* op = "grouped_linear_forward";
  const auto d = checks::grouped_linear(out, inp, weight, offsets);
  const Elem e = elem(inp, op, {&out, &weight});
  const std::vector<int32_t> off = host_offsets(s, offsets, d.M, d.E, op);
  if (d.O == 0) return;
  if (d.I == 0) {  // no inputs: the kept rows are 0 (the bits of 0 in fp32 and bf16)
    KILN_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, off[d.E] * d.O * elem_size(e), st(s)));
    return;
  }
  for_each_grouped_piece(off.data(), d.E, [&](int64_t x, int64_t row, int64_t m) {
    gemm_->run(st(s), cuda::linear_forward_gemm(e, at(out.raw(), row * d.O, e),
                                                at(inp.raw(), row * d.I, e),
                                                at(weight.raw(), x * d.O * d.I, e), m, d.I, d.O));
  });
}
void CudaBackend::grouped_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                          const Tensor& dout, const Tensor& inp,
                                          const Tensor& weight, const Tensor& offsets) {
  cuda::NvtxRange r("grouped_linear_backward");
  const char* op = "grouped_linear_backward";
  const auto d = checks::grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets);
  const Elem e = elem(inp, op, {&dout, &weight, &dinp});
  const Elem g = dweight ? grad_elem(dweight, e, "grouped_linear_backward dweight") : e;
  const std::vector<int32_t> off = host_offsets(s, offsets, d.M, d.E, op);
  if (dinp && d.O == 0)  // no outputs: the kept rows' gradient is 0
    KILN_CUDA_CHECK(cudaMemsetAsync(dinp.raw(), 0, off[d.E] * d.I * elem_size(e), st(s)));
  if (d.I == 0 || d.O == 0) return;
  for_each_grouped_piece(off.data(), d.E, [&](int64_t x, int64_t row, int64_t m) {
    void* w = at(weight.raw(), x * d.O * d.I, e);
    void* dy = at(dout.raw(), row * d.O, e);
    if (dinp)
      gemm_->run(st(s), cuda::linear_dinp_gemm(e, at(dinp.raw(), row * d.I, e), dy, w, m, d.I,
                                               d.O));
    if (dweight)
      gemm_->run(st(s), cuda::linear_dweight_gemm(e, g, at(dweight.raw(), x * d.O * d.I, g), dy,
                                                  at(inp.raw(), row * d.I, e), m, d.I, d.O));
  });
}

}  // namespace kiln::cuda
