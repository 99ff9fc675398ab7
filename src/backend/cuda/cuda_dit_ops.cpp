// CudaBackend's ops for diffusion transformers (DiT, Peebles & Xie 2023): the adaLN
// modulation and gate with their backward, the rectified-flow inputs and the per-sample
// MSE loss. Each validates with op_checks, picks the element type and launches the
// kernels of modulate.cu or flow_matching.cu on the caller's stream.
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/flow_matching.h"
#include "backend/cuda/modulate.h"
#include "backend/cuda/nvtx.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace kiln::cuda {

void CudaBackend::modulate(Stream s, const Tensor& out, const Tensor& x, const Tensor& mod,
                           int scale_index, int shift_index, float scale_offset) {
  cuda::NvtxRange r("modulate");
  const auto d = checks::modulate(out, x, mod, scale_index, shift_index);
  const Elem e = elem(x, "modulate", {&out, &mod});
  cuda::modulate(st(s), e, out.raw(), x.raw(), mod.raw(), d.B, d.T, d.C, d.M, scale_index,
                 shift_index, scale_offset);
}

void CudaBackend::modulate_backward(Stream s, const Tensor& dx, const Tensor& dmod,
                                    const Tensor& dout, const Tensor& x, const Tensor& mod,
                                    int scale_index, int shift_index, float scale_offset) {
  cuda::NvtxRange r("modulate_backward");
  const auto d = checks::modulate_backward(dx, dmod, dout, x, mod, scale_index, shift_index);
  const Elem e = elem(x, "modulate_backward", {&dx, &dmod, &dout, &mod});
  on_device(dmod, "modulate_backward dmod");
  if (dx) on_device(dx, "modulate_backward dx");
  cuda::modulate_backward(st(s), e, dx ? dx.raw() : nullptr, dmod.raw(), dout.raw(), x.raw(),
                          mod.raw(), d.B, d.T, d.C, d.M, scale_index, shift_index, scale_offset);
}

void CudaBackend::rectified_flow_inputs(Stream s, const Tensor& xt, const Tensor& target,
                                        const Tensor& images, const Tensor& noise,
                                        const Tensor& t) {
  cuda::NvtxRange r("rectified_flow_inputs");
  const auto d = checks::rectified_flow_inputs(xt, target, images, noise, t);
  for (const Tensor* a : {&xt, &target, &images, &noise, &t})
    on_device(*a, "rectified_flow_inputs");
  cuda::rectified_flow_inputs(st(s), xt.data<float>(), target.data<float>(), images.data<float>(),
                              noise.data<float>(), t.data<float>(), d.B, d.n);
}

void CudaBackend::mse_loss(Stream s, const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                           const Tensor& target, float grad_scale) {
  cuda::NvtxRange r("mse_loss");
  const auto d = checks::mse_loss(losses, dpred, pred, target);
  const Elem e = elem(pred, "mse_loss", {&dpred});
  on_device(losses, "mse_loss losses");
  on_device(target, "mse_loss target");
  if (dpred) on_device(dpred, "mse_loss dpred");
  // The gradient's coefficient in double, rounded once (as the CPU backend).
  const float coef =
      d.n > 0 ? static_cast<float>(2.0 * static_cast<double>(grad_scale) / static_cast<double>(d.n))
              : 0.f;
  cuda::mse_loss(st(s), e, losses.data<float>(), dpred ? dpred.raw() : nullptr, pred.raw(),
                 target.data<float>(), d.B, d.n, coef);
}

}  // namespace kiln::cuda
