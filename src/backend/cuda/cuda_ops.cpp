// CudaBackend's ops outside attention: embedding, LayerNorm, RMSNorm, linear, GELU, SiLU,
// SwiGLU, add, dropout. Each validates with op_checks, picks the element type (fp32 or
// bf16; parameter gradients fp32 or the activations' type) and launches its .cu file's
// kernels on the caller's stream.
#include "backend/cuda/add.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/dropout.h"
#include "backend/cuda/embedding.h"
#include "backend/cuda/gelu.h"
#include "backend/cuda/layernorm.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/nvtx.h"
#include "backend/cuda/rmsnorm.h"
#include "backend/cuda/silu.h"
#include "backend/cuda/swiglu.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace kiln::cuda {

namespace {
const int32_t* ids_or_null(const Tensor& t) { return t ? t.data<int32_t>() : nullptr; }
}  // namespace

void CudaBackend::embedding_forward(Stream s, const Tensor& out, const Tensor& tokens,
                                    const Tensor& positions, const Tensor& wte,
                                    const Tensor& wpe) {
  cuda::NvtxRange r("embedding_forward");
  const auto d = checks::embedding(out, tokens, positions, wte, wpe);
  const Elem e = elem(out, "embedding", {&wte, &wpe});
  if (positions) on_device(positions, "embedding positions");
  cuda::embedding_forward(st(s), e, out.raw(), tokens.data<int32_t>(), ids_or_null(positions),
                          wte.raw(), wpe.raw(), d.B, d.T, d.C, d.Vp, d.maxT);
}
void CudaBackend::embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe,
                                     const Tensor& dout, const Tensor& tokens,
                                     const Tensor& positions) {
  cuda::NvtxRange r("embedding_backward");
  const auto d = checks::embedding(dout, tokens, positions, dwte, dwpe);
  const Elem e = elem(dout, "embedding_backward");
  const Elem g = grad_elem(dwte, e, "embedding_backward dwte", {&dwpe});
  if (positions) on_device(positions, "embedding_backward positions");
  const size_t bytes = cuda::embedding_backward_scratch_bytes(d.B * d.T);
  Scratch scratch(*this, st(s), bytes);
  cuda::embedding_backward(st(s), e, g, dwte.raw(), dwpe.raw(), dout.raw(),
                           tokens.data<int32_t>(), ids_or_null(positions), d.B, d.T, d.C, d.Vp,
                           d.maxT, scratch.ptr(), bytes);
}

void CudaBackend::layernorm_forward(Stream s, const Tensor& out, const Tensor& mean,
                                    const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                    const Tensor& bias, float eps) {
  cuda::NvtxRange r("layernorm_forward");
  const auto d = checks::layernorm(out, mean, rstd, inp, weight, bias);
  const Elem e = elem(inp, "layernorm", {&out, &weight, &bias});
  cuda::layernorm_forward(st(s), e, out.raw(), mean.data<float>(), rstd.data<float>(), inp.raw(),
                          weight.raw(), bias.raw(), d.N, d.C, eps);
}
void CudaBackend::layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                     const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight, const Tensor& mean,
                                     const Tensor& rstd) {
  cuda::NvtxRange r("layernorm_backward");
  const auto d = checks::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  const Elem e = elem(inp, "layernorm_backward", {&dinp, &dout, &weight});
  // Without a weight or a bias, the other gradient (if any) sets the gradients' type.
  const Elem g = dweight ? grad_elem(dweight, e, "layernorm_backward dweight", {&dbias})
               : dbias   ? grad_elem(dbias, e, "layernorm_backward dbias")
                         : e;
  Scratch scratch(*this, st(s), cuda::layernorm_backward_scratch_bytes(d.N, d.C));
  cuda::layernorm_backward(st(s), e, g, dinp.raw(), dweight.raw(), dbias.raw(), dout.raw(),
                           inp.raw(), weight.raw(), mean.data<float>(), rstd.data<float>(), d.N,
                           d.C, scratch.ptr());
}

void CudaBackend::rmsnorm_forward(Stream s, const Tensor& out, const Tensor& rstd,
                                  const Tensor& inp, const Tensor& weight, float eps) {
  cuda::NvtxRange r("rmsnorm_forward");
  const auto d = checks::rmsnorm(out, rstd, inp, weight);
  const Elem e = elem(inp, "rmsnorm", {&out, &weight});
  cuda::rmsnorm_forward(st(s), e, out.raw(), rstd.data<float>(), inp.raw(), weight.raw(), d.N,
                        d.C, eps);
}
void CudaBackend::rmsnorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                   const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                   const Tensor& rstd) {
  cuda::NvtxRange r("rmsnorm_backward");
  const auto d = checks::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
  const Elem e = elem(inp, "rmsnorm_backward", {&dinp, &dout, &weight});
  const Elem g = dweight ? grad_elem(dweight, e, "rmsnorm_backward dweight") : e;
  Scratch scratch(*this, st(s), cuda::rmsnorm_backward_scratch_bytes(d.N, d.C));
  cuda::rmsnorm_backward(st(s), e, g, dinp.raw(), dweight.raw(), dout.raw(), inp.raw(),
                         weight.raw(), rstd.data<float>(), d.N, d.C, scratch.ptr());
}

void CudaBackend::linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                                 const Tensor& weight, const Tensor& bias) {
  cuda::NvtxRange r("linear_forward");
  const auto d = checks::linear(out, inp, weight, bias);
  const Elem e = bias ? elem(inp, "linear", {&out, &weight, &bias})
                      : elem(inp, "linear", {&out, &weight});
  if (d.N == 0 || d.OC == 0) return;
  if (d.IC == 0) {
    fill(s, out, 0.f);
    if (bias) cuda::add_bias(st(s), e, out.raw(), bias.raw(), d.N, d.OC);
    return;
  }
  cuda::GemmArgs g =
      cuda::linear_forward_gemm(e, out.raw(), inp.raw(), weight.raw(), d.N, d.IC, d.OC);
  if (bias) {
    g.epilogue = cuda::Epilogue::Bias;
    g.bias = bias.raw();
  }
  if (!gemm_->run(st(s), g)) {  // no fused-bias algorithm: GEMM, then a bias kernel
    g.epilogue = cuda::Epilogue::None;
    g.bias = nullptr;
    gemm_->run(st(s), g);
    cuda::add_bias(st(s), e, out.raw(), bias.raw(), d.N, d.OC);
  }
}
void CudaBackend::linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                  const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                  const Tensor& weight) {
  cuda::NvtxRange r("linear_backward");
  const auto d = checks::linear_backward(dinp, dweight, dbias, dout, inp, weight);
  const Elem e = elem(inp, "linear_backward", {&dout, &weight, &dinp});
  // Parameter gradients in fp32 (mixed precision) or the activations' dtype, as the CPU.
  const Elem g = dweight ? grad_elem(dweight, e, "linear_backward dweight", {&dbias})
               : dbias   ? grad_elem(dbias, e, "linear_backward dbias")
                         : e;
  if (d.N == 0) {
    if (dinp) fill(s, dinp, 0.f);
    return;
  }
  if (dinp) {
    if (d.OC == 0) {
      fill(s, dinp, 0.f);
    } else {
      gemm_->run(st(s), cuda::linear_dinp_gemm(e, dinp.raw(), dout.raw(), weight.raw(), d.N,
                                               d.IC, d.OC));
    }
  }
  if (dweight && d.IC > 0 && d.OC > 0)
    gemm_->run(st(s), cuda::linear_dweight_gemm(e, g, dweight.raw(), dout.raw(), inp.raw(), d.N,
                                                d.IC, d.OC));
  if (dbias) {
    Scratch scratch(*this, st(s), cuda::bias_backward_scratch_bytes(d.N, d.OC));
    cuda::bias_backward(st(s), e, g, dbias.raw(), dout.raw(), d.N, d.OC, scratch.ptr());
  }
}

void CudaBackend::gelu_forward(Stream s, const Tensor& out, const Tensor& inp) {
  cuda::NvtxRange r("gelu_forward");
  checks::same_size(out, inp, "gelu");
  cuda::gelu_forward(st(s), elem(inp, "gelu"), out.raw(), inp.raw(), inp.numel());
}
void CudaBackend::gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                const Tensor& inp) {
  cuda::NvtxRange r("gelu_backward");
  checks::same_size(dinp, inp, "gelu_backward");
  checks::same_size(dout, inp, "gelu_backward");
  cuda::gelu_backward(st(s), elem(inp, "gelu_backward"), dinp.raw(), dout.raw(), inp.raw(),
                      inp.numel());
}
void CudaBackend::swiglu_forward(Stream s, const Tensor& out, const Tensor& inp) {
  cuda::NvtxRange r("swiglu_forward");
  const auto d = checks::swiglu(out, inp);
  cuda::swiglu_forward(st(s), elem(inp, "swiglu", {&out}), out.raw(), inp.raw(), d.N, d.H);
}
void CudaBackend::swiglu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                  const Tensor& inp) {
  cuda::NvtxRange r("swiglu_backward");
  const auto d = checks::swiglu(dout, inp);
  checks::same_size(dinp, inp, "swiglu_backward dinp");
  cuda::swiglu_backward(st(s), elem(inp, "swiglu_backward", {&dout, &dinp}), dinp.raw(),
                        dout.raw(), inp.raw(), d.N, d.H);
}
void CudaBackend::silu_forward(Stream s, const Tensor& out, const Tensor& inp) {
  cuda::NvtxRange r("silu_forward");
  checks::same_size(out, inp, "silu");
  cuda::silu_forward(st(s), elem(inp, "silu"), out.raw(), inp.raw(), inp.numel());
}
void CudaBackend::silu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                const Tensor& inp) {
  cuda::NvtxRange r("silu_backward");
  checks::same_size(dinp, inp, "silu_backward");
  checks::same_size(dout, inp, "silu_backward");
  cuda::silu_backward(st(s), elem(inp, "silu_backward"), dinp.raw(), dout.raw(), inp.raw(),
                      inp.numel());
}
void CudaBackend::add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) {
  cuda::NvtxRange r("add");
  checks::same_size(out, a, "add");
  checks::same_size(out, b, "add");
  cuda::add(st(s), elem(out, "add"), out.raw(), a.raw(), b.raw(), out.numel());
}
void CudaBackend::add_columns(Stream s, const Tensor& out, const Tensor& src, int64_t out_col,
                              float alpha) {
  cuda::NvtxRange r("add_columns");
  const auto d = checks::add_columns(out, src, out_col);
  on_device(src, "add_columns");
  cuda::add_columns(st(s), elem(out, "add_columns", {&src}), out.raw(), d.Wd, out_col,
                    src.raw(), d.Ws, d.N, alpha);
}
void CudaBackend::dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                                  const DropoutSpec& spec) {
  cuda::NvtxRange r("dropout_forward");
  checks::same_size(out, inp, "dropout");
  run_dropout(s, out, inp, spec, "dropout");
}
void CudaBackend::dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                   const DropoutSpec& spec) {
  cuda::NvtxRange r("dropout_backward");
  checks::same_size(dinp, dout, "dropout_backward");
  run_dropout(s, dinp, dout, spec, "dropout_backward");
}

}  // namespace kiln::cuda
