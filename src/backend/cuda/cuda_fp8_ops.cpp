// CudaBackend's fp8 ops (train.fp8, docs/fp8.md; docs/cuda.md "fp8"): fp8_amax, and
// fp8_linear_forward / fp8_linear_backward with the CPU backend's semantics, on two paths.
//
// fp8 tensor cores (cuBLASLt's fp8 GEMMs), when the device is sm_89 or newer, the
// dimensions allow them (N, IC, OC > 0 and IC, OC multiples of 16: every leading
// dimension of the 1-byte operands and of the outputs; N is padded, below) and cuBLASLt
// offers an algorithm for every GEMM the call needs (Gemm::available; otherwise the
// whole call is emulated). Each operand is quantized into 1-byte codes fp8(x S)
// (fp8.cu fp8_quantize_codes: S from the amax on the device, bit for bit fp8_quantize's,
// so code / S is the emulation's value), transposing where cuBLASLt's only fp8 layout
// ("TN" in column-major terms: A transposed, B not) needs it, as Transformer Engine's
// fp8 transpose casts do; the GEMMs descale by 1/S through CUBLASLT_MATMUL_DESC_A/B_SCALE_
// POINTER (fp32 factors written on the device by fp8_descale), compute type 32F, fast
// accumulation off, D in the output's dtype. The operands, named row-major (cuBLASLt's
// column-major view of a row-major [r,c] is [c,r]: forward is D[OC,N] = A' B with A = W
// stored [IC,OC], lda IC, A transposed, and so on):
//   forward  y = x W^T      A = q(W) [OC,IC] (lda IC), E4M3;  B = q(x) [N,IC] (ldb IC), E4M3;
//            the bias: cuBLASLt's BIAS epilogue for a bf16 y (one rounding, as the
//            emulation's), a separate add for an fp32 y (the same fp32 sum);
//   dinp     dx = dy W      A = q(W)^T [IC,OC] (lda OC), E4M3;  B = q(dy) [N,OC] (ldb OC), E5M2;
//   dweight  dW += dy^T x   A = q(x)^T [IC,Np] (lda Np), E4M3;  B = q(dy)^T [OC,Np] (ldb Np),
//            E5M2; beta = 1 into the fp32 (or bf16) gradient, C = D; Np = N rounded up
//            to 16, the padding columns zero codes (they add exact zeros).
// The products of two fp8 values are exact in fp32 and the descale factors are powers of
// two, so the result equals the emulation's up to the order of the fp32 sums (and a bf16
// output's one rounding, the same on both) -- as far as the tensor cores accumulate in
// fp32: with FAST_ACCUM off cuBLASLt promotes their partial sums to fp32 periodically,
// but Hopper's fp8 MMA itself is reported to keep fewer accumulator bits between
// promotions (DeepSeek-V3's report, section 3.3.2), which a GPU run has to bound against
// the op test's fp32 tolerance. Outputs below fp32's normal range (both operands' scales
// near 2^127, i.e. amaxes near 2^-118) may also differ in their subnormal bits, as
// 1/(S_a S_b) is applied to the sum here and to each product there.
//
// Emulation (the reference and the fallback: older devices, other dimensions, no
// algorithm), as on the CPU: each operand is quantized into a scratch copy of its own
// dtype (fp8.cu fp8_quantize: value fp8(x S) / S, exact in fp32 and bf16 since S is a
// power of two), and this backend's linear_forward / linear_backward run their bf16 or
// fp32 cuBLASLt GEMMs on the copies, at bf16/fp32 speed and with the copies' traffic.
//
// Scratch: one per call (the backend stream's arena; 256-byte aligned pieces). fp8 path:
// a 256-byte piece for the descale factors, then forward q(x), q(W); backward q(dy)
// (for dinp), q(dy)^T (for dweight), q(W)^T (for dinp), q(x)^T (for dweight), 1 byte an
// element. Emulation: inp and weight in forward; dout, inp (only for dweight) and weight
// (only for dinp) in backward, in the operands' dtype. src/plan/scratch_models.cpp's
// CudaScratch counts the larger of the two. The bias gradient comes from the unquantized
// dout (a linear_backward with only dbias, whose own scratch is released before the
// copies' is taken).
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/nvtx.h"
#include "backend/op_checks.h"
#include "core/error.h"

#include <array>
#include <atomic>

namespace kiln::cuda {

namespace {
size_t up256(size_t b) { return (b + 255) / 256 * 256; }
// Bytes of a copy of t, rounded up to 256 so that the next piece stays aligned (the
// allocator's and cuBLASLt's preferred alignment).
size_t piece_bytes(const Tensor& t) { return up256(t.nbytes()); }
constexpr size_t kDescaleBytes = 256;  // the fp32 descale factors' piece

// Whether `device` has fp8 tensor cores (sm_89 or newer), asked once per device.
bool fp8_tensor_cores(int device) {
  static std::array<std::atomic<int>, 64> known{};  // 0: not asked, 1: no, 2: yes
  if (device < 0 || device >= static_cast<int>(known.size())) return false;
  int v = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      major = minor = 0;
    }
    v = major * 10 + minor >= 89 ? 2 : 1;
    known[static_cast<size_t>(device)].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

// The dimensions the fp8 path takes (see the file comment).
bool fp8_dims(const checks::LinearDims& d) {
  return d.N > 0 && d.IC > 0 && d.OC > 0 && d.IC % 16 == 0 && d.OC % 16 == 0;
}
int64_t padded16(int64_t n) { return (n + 15) / 16 * 16; }
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
  const auto d = checks::fp8_linear(out, inp, weight, bias, amax);
  // (out's and bias's dtypes as linear_forward checks them, before the fp8 path writes.)
  const Elem e = elem(inp, "fp8_linear_forward", {&weight, &out, &bias});
  on_device_all({&out, &weight, &bias, &amax}, "fp8_linear_forward");
  const float* a = amax.data<float>();
  if (fp8_dims(d) && fp8_tensor_cores(device_)) {
    const size_t x_bytes = up256(static_cast<size_t>(d.N * d.IC));
    const size_t w_bytes = up256(static_cast<size_t>(d.OC * d.IC));
    Scratch scratch(*this, st(s), kDescaleBytes + x_bytes + w_bytes);
    char* p = static_cast<char*>(scratch.ptr());
    float* descale = reinterpret_cast<float*>(p);  // [x, w]
    auto* qx = reinterpret_cast<uint8_t*>(p + kDescaleBytes);
    uint8_t* qw = qx + x_bytes;
    cuda::GemmArgs g = cuda::linear_forward_gemm(e, out.raw(), qx, qw, d.N, d.IC, d.OC);
    g.fp8_a = g.fp8_b = cuda::Fp8Operand::E4M3;
    g.a_scale = descale + 1;  // A = W
    g.b_scale = descale + 0;  // B = x
    // A bf16 output takes the bias in the GEMM's epilogue (one rounding, as the
    // emulation's linear_forward); an fp32 one gets the same fp32 sum from add_bias.
    bool fused = false;
    if (bias && e == Elem::BF16) {
      g.epilogue = cuda::Epilogue::Bias;
      g.bias = bias.raw();
      fused = gemm_->available(st(s), g);
      if (!fused) g.epilogue = cuda::Epilogue::None, g.bias = nullptr;
    }
    if (fused || gemm_->available(st(s), g)) {
      cuda::fp8_descale(st(s), descale, a, 2, 0u);
      cuda::fp8_quantize_codes(st(s), e, qx, nullptr, inp.raw(), d.N, d.IC, 0, a + 0,
                               DType::E4M3);
      cuda::fp8_quantize_codes(st(s), e, qw, nullptr, weight.raw(), d.OC, d.IC, 0, a + 1,
                               DType::E4M3);
      KILN_CHECK(gemm_->run(st(s), g), "cuda: fp8_linear_forward: the fp8 GEMM's plan vanished");
      if (bias && !fused) cuda::add_bias(st(s), e, out.raw(), bias.raw(), d.N, d.OC);
      return;
    }
  }
  // The emulation: copies of the operands' dtype, then the ordinary linear.
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
  const auto d = checks::fp8_linear_backward(dinp, dweight, dbias, dout, inp, weight, amax);
  // The dtypes as linear_backward checks them, before the fp8 path writes.
  const Elem e = elem(inp, "fp8_linear_backward", {&dout, &weight, &dinp});
  const Elem ge = dweight ? grad_elem(dweight, e, "fp8_linear_backward dweight", {&dbias}) : e;
  on_device_all({&dinp, &dweight, &dbias, &dout, &weight, &amax}, "fp8_linear_backward");
  const float* a = amax.data<float>();
  // Bias gradient from the unquantized dout (Transformer Engine's), before the copies.
  if (dbias) linear_backward(s, Tensor(), Tensor(), dbias, dout, inp, weight);
  if (!dinp && !dweight) return;
  if (fp8_dims(d) && fp8_tensor_cores(device_)) {
    const int64_t Np = padded16(d.N);  // dweight's k: the transposes' padded rows
    const size_t g_bytes = dinp ? up256(static_cast<size_t>(d.N * d.OC)) : 0;
    const size_t gt_bytes = dweight ? up256(static_cast<size_t>(d.OC * Np)) : 0;
    const size_t wt_bytes = dinp ? up256(static_cast<size_t>(d.IC * d.OC)) : 0;
    const size_t xt_bytes = dweight ? up256(static_cast<size_t>(d.IC * Np)) : 0;
    Scratch scratch(*this, st(s), kDescaleBytes + g_bytes + gt_bytes + wt_bytes + xt_bytes);
    char* p = static_cast<char*>(scratch.ptr());
    float* descale = reinterpret_cast<float*>(p);  // [x, w, dy]
    auto* qg = reinterpret_cast<uint8_t*>(p + kDescaleBytes);  // q(dy) [N,OC]
    uint8_t* qgt = qg + g_bytes;                               // q(dy)^T [OC,Np]
    uint8_t* qwt = qgt + gt_bytes;                             // q(W)^T [IC,OC]
    uint8_t* qxt = qwt + wt_bytes;                             // q(x)^T [IC,Np]
    // dinp: column-major dx^T[IC,N] = A' B, A = q(W)^T stored [OC,IC] col-major (lda OC),
    // B = q(dy) stored [OC,N] (ldb OC).
    cuda::GemmArgs gi;
    gi.trans_a = true;
    gi.m = d.IC, gi.n = d.N, gi.k = d.OC;
    gi.a = qwt, gi.lda = d.OC;
    gi.b = qg, gi.ldb = d.OC;
    gi.c = dinp.raw(), gi.ldc = d.IC;
    gi.elem = e;
    gi.fp8_a = cuda::Fp8Operand::E4M3, gi.fp8_b = cuda::Fp8Operand::E5M2;
    gi.a_scale = descale + 1, gi.b_scale = descale + 2;
    // dweight: column-major dW^T[IC,OC] += A' B, A = q(x)^T stored [Np,IC] (lda Np),
    // B = q(dy)^T stored [Np,OC] (ldb Np).
    cuda::GemmArgs gw;
    gw.trans_a = true;
    gw.m = d.IC, gw.n = d.OC, gw.k = Np;
    gw.a = qxt, gw.lda = Np;
    gw.b = qgt, gw.ldb = Np;
    gw.c = dweight.raw(), gw.ldc = d.IC;
    gw.beta = 1.f;
    gw.elem = ge;
    gw.fp8_a = cuda::Fp8Operand::E4M3, gw.fp8_b = cuda::Fp8Operand::E5M2;
    gw.a_scale = descale + 0, gw.b_scale = descale + 2;
    if ((!dinp || gemm_->available(st(s), gi)) && (!dweight || gemm_->available(st(s), gw))) {
      cuda::fp8_descale(st(s), descale, a, 3, 1u << 2);
      // dy once for both layouts it is needed in.
      cuda::fp8_quantize_codes(st(s), e, dinp ? qg : nullptr, dweight ? qgt : nullptr, dout.raw(),
                               d.N, d.OC, Np, a + 2, DType::E5M2);
      if (dinp) {
        cuda::fp8_quantize_codes(st(s), e, nullptr, qwt, weight.raw(), d.OC, d.IC, d.OC, a + 1,
                                 DType::E4M3);
        KILN_CHECK(gemm_->run(st(s), gi),
                   "cuda: fp8_linear_backward: the dinp GEMM's plan vanished");
      }
      if (dweight) {
        cuda::fp8_quantize_codes(st(s), e, nullptr, qxt, inp.raw(), d.N, d.IC, Np, a + 0,
                                 DType::E4M3);
        KILN_CHECK(gemm_->run(st(s), gw),
                   "cuda: fp8_linear_backward: the dweight GEMM's plan vanished");
      }
      return;
    }
  }
  // The emulation: copies of the operands' dtype, then the ordinary GEMMs.
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
