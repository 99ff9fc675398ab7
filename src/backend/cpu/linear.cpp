// linear_forward / linear_backward as oneDNN GEMMs (see gemm.h):
//   forward   out[N,OC]   = inp[N,IC] @ W[OC,IC]^T + b      (bias fused into the GEMM)
//   backward  dinp[N,IC]  = dout[N,OC] @ W[OC,IC]
//             dW[OC,IC]  += dout^T @ inp                     (sum post-op: accumulate)
//             db[OC]     += column sums of dout
// FLOPs: 2*N*IC*OC forward, 4*N*IC*OC backward. bf16 operands use the CPU's bf16 matrix
// instructions (AVX512-BF16 / AMX) through oneDNN, accumulating in fp32; the weight
// gradient is produced directly in its own dtype (fp32 by default). fp16 has no fast
// matrix path on most CPUs: its operands are widened to fp32 scratch first.
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

#include <type_traits>
#include <vector>

namespace kiln::cpu {

namespace {

// C[M,N] (+)= op(A) op(B) (+ bias) with A, B, bias of type T and C of type C_.
template <class T, class C_>
void gemm_t(Gemm& gemm, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, bool ta,
            const T* b, int64_t ldb, bool tb, C_* c, int64_t ldc, const T* bias, bool accumulate) {
  if constexpr (std::is_same_v<T, f16>) {
    // Widen to fp32, multiply, narrow (or accumulate) into C.
    auto widen = [](const f16* p, int64_t count) {
      std::vector<float> v(static_cast<size_t>(count));
      convert(v.data(), p, count);
      return v;
    };
    const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
    const auto fa = widen(a, a_rows * lda), fb = widen(b, b_rows * ldb);
    std::vector<float> fbias;
    if (bias) fbias = widen(bias, n);
    std::vector<float> fc(static_cast<size_t>(m * ldc));
    if (accumulate) convert(fc.data(), c, m * ldc);
    GemmArgs g{m, n, k, fa.data(), lda, ta, fb.data(), ldb, tb, fc.data(), ldc,
               bias ? fbias.data() : nullptr, accumulate};
    gemm.run(g);
    convert(c, fc.data(), m * ldc);
  } else {
    GemmArgs g{m, n, k, a, lda, ta, b, ldb, tb, c, ldc, bias, accumulate};
    g.a_type = g.b_type = g.bias_type = dtype_of<T>();
    g.c_type = dtype_of<C_>();
    gemm.run(g);
  }
}

}  // namespace

template <class T>
void linear_forward(Gemm& gemm, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                    int64_t IC, int64_t OC) {
  gemm_t(gemm, N, OC, IC, inp, IC, false, weight, IC, true, out, OC, bias, false);
}

template <class T, class G>
void linear_backward(Gemm& gemm, T* dinp, G* dweight, G* dbias, const T* dout, const T* inp,
                     const T* weight, int64_t N, int64_t IC, int64_t OC) {
  if (dinp) gemm_t(gemm, N, IC, OC, dout, OC, false, weight, IC, false, dinp, IC, (const T*)nullptr, false);
  if (dweight) gemm_t(gemm, OC, IC, N, dout, OC, true, inp, IC, false, dweight, IC, (const T*)nullptr, true);
  if (dbias) bias_backward(dbias, dout, N, OC);
}

#define INST_T(T) \
  template void linear_forward<T>(Gemm&, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);
#define INST_TG(T, G)                                                                     \
  template void linear_backward<T, G>(Gemm&, T*, G*, G*, const T*, const T*, const T*,     \
                                      int64_t, int64_t, int64_t);
KILN_CPU_FOR_EACH_T(INST_T)
KILN_CPU_FOR_EACH_TG(INST_TG)

}  // namespace kiln::cpu
