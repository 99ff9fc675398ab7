// CudaBackend's fp8 ops (train.fp8, docs/fp8.md; docs/cuda.md "fp8"): fp8_amax, and
// fp8_linear_forward / fp8_linear_backward with the CPU backend's semantics.
//
// This is the emulation, as on the CPU: each operand is quantized into a scratch copy of
// its own dtype (fp8.cu: value fp8(x S) / S, exact in fp32 and bf16 since S is a power
// of two, S from the amax in device memory), and this backend's linear_forward /
// linear_backward run their bf16 or fp32 cuBLASLt GEMMs on the copies: the products of
// fp8 values are exact and accumulate in fp32, which is what an fp8 tensor-core GEMM
// with fp32 accumulation computes (up to summation order), at bf16/fp32 speed and with
// the copies' memory traffic. The next step is cuBLASLt's fp8 GEMMs (sm_89/sm_90: E4M3
// x E4M3 forward, E5M2 x E4M3 backward, the scales as CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER
// device pointers, 1/S as the descale), which would quantize into 1-byte operands instead.
//
// The copies live in one Scratch (the backend stream's arena; 256-byte aligned pieces)
// for the call; src/plan/scratch_models.cpp's fp8_quantized_bytes models them: inp and
// weight in forward; dout, inp (only for dweight) and weight (only for dinp) in backward.
// The bias gradient comes from the unquantized dout (a linear_backward with only dbias,
// whose own scratch is released before the copies' is taken).
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/nvtx.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace kiln::cuda {

namespace {
// Bytes of a copy of t, rounded up to 256 so that the next piece stays aligned (the
// allocator's and cuBLASLt's preferred alignment).
size_t piece_bytes(const Tensor& t) { return (t.nbytes() + 255) / 256 * 256; }
}  // namespace

void CudaBackend::fp8_amax(Stream s, const Tensor& amax, const Tensor& x) {
  cuda::NvtxRange r("fp8_amax");
  checks::fp8_amax(amax, x);
  on_device(amax, "fp8_amax");
  on_device(x, "fp8_amax");
  // Launched also for an empty x: amax = max(amax, 0), as the CPU.
  cuda::fp8_amax(st(s), float_kind(x, "fp8_amax"), x.raw(), x.numel(), amax.data<float>());
}

void CudaBackend::fp8_amax_history(Stream s, const Tensor& amax, const Tensor& history,
                                   const Tensor& step_amax, int64_t slot, bool most_recent) {
  cuda::NvtxRange r("fp8_amax_history");
  checks::fp8_amax_history(amax, history, step_amax, slot);
  on_device_all({&amax, &history, &step_amax}, "fp8_amax_history");
  cuda::fp8_amax_history(st(s), amax.data<float>(), history.data<float>(),
                         step_amax.data<float>(), history.size(0), history.size(1),
                         history.size(2), slot, most_recent);
}

void CudaBackend::fp8_linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                                     const Tensor& weight, const Tensor& bias,
                                     const Tensor& amax) {
  cuda::NvtxRange r("fp8_linear_forward");
  checks::fp8_linear(out, inp, weight, bias, amax);
  const Elem e = elem(inp, "fp8_linear_forward", {&weight});
  on_device_all({&out, &weight, &bias, &amax}, "fp8_linear_forward");
  const float* a = amax.data<float>();
  Scratch scratch(*this, st(s), piece_bytes(inp) + piece_bytes(weight));
  char* p = static_cast<char*>(scratch.ptr());
  const Tensor qinp = Tensor::view(p, inp.shape(), inp.dtype(), device());
  const Tensor qweight = Tensor::view(p + piece_bytes(inp), weight.shape(), weight.dtype(), device());
  cuda::fp8_quantize(st(s), e, qinp.raw(), inp.raw(), inp.numel(), a + 0, DType::E4M3);
  cuda::fp8_quantize(st(s), e, qweight.raw(), weight.raw(), weight.numel(), a + 1, DType::E4M3);
  linear_forward(s, out, qinp, qweight, bias);
}

void CudaBackend::fp8_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                      const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                      const Tensor& weight, const Tensor& amax) {
  cuda::NvtxRange r("fp8_linear_backward");
  checks::fp8_linear_backward(dinp, dweight, dbias, dout, inp, weight, amax);
  const Elem e = elem(inp, "fp8_linear_backward", {&dout, &weight});
  on_device_all({&dinp, &dweight, &dbias, &dout, &weight, &amax}, "fp8_linear_backward");
  const float* a = amax.data<float>();
  // Bias gradient from the unquantized dout (Transformer Engine's), before the copies.
  if (dbias) linear_backward(s, Tensor(), Tensor(), dbias, dout, inp, weight);
  if (!dinp && !dweight) return;
  const size_t dout_bytes = piece_bytes(dout), inp_bytes = dweight ? piece_bytes(inp) : 0;
  const size_t weight_bytes = dinp ? piece_bytes(weight) : 0;
  Scratch scratch(*this, st(s), dout_bytes + inp_bytes + weight_bytes);
  char* p = static_cast<char*>(scratch.ptr());
  const Tensor qdout = Tensor::view(p, dout.shape(), dout.dtype(), device());
  cuda::fp8_quantize(st(s), e, qdout.raw(), dout.raw(), dout.numel(), a + 2, DType::E5M2);
  Tensor qinp = inp, qweight = weight;  // the unquantized ones where no output reads them
  if (dweight) {
    qinp = Tensor::view(p + dout_bytes, inp.shape(), inp.dtype(), device());
    cuda::fp8_quantize(st(s), e, qinp.raw(), inp.raw(), inp.numel(), a + 0, DType::E4M3);
  }
  if (dinp) {
    qweight = Tensor::view(p + dout_bytes + inp_bytes, weight.shape(), weight.dtype(), device());
    cuda::fp8_quantize(st(s), e, qweight.raw(), weight.raw(), weight.numel(), a + 1,
                       DType::E4M3);
  }
  linear_backward(s, dinp, dweight, Tensor(), qdout, qinp, qweight);
}

}  // namespace kiln::cuda
