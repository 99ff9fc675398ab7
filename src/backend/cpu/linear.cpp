// linear_forward / linear_backward as oneDNN GEMMs (see gemm.h):
//   forward   out[N,OC]   = inp[N,IC] @ W[OC,IC]^T + b      (bias fused into the GEMM)
//   backward  dinp[N,IC]  = dout[N,OC] @ W[OC,IC]
//             dW[OC,IC]  += dout^T @ inp                     (sum post-op: accumulate)
//             db[OC]     += column sums of dout
// FLOPs: 2*N*IC*OC forward, 4*N*IC*OC backward. bf16 and fp16 operands run natively
// where oneDNN has matrix kernels for them on this CPU and through fp32 compute where it
// has none (gemm.h), accumulating in fp32 either way; the weight gradient is produced
// directly in its own dtype (fp32 by default).
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"


namespace kiln::cpu {

namespace {

// C[M,N] (+)= op(A) op(B) (+ bias) with A, B, bias of type T and C of type C_.
template <class T, class C_>
void gemm_t(Gemm& gemm, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, bool ta,
            const T* b, int64_t ldb, bool tb, C_* c, int64_t ldc, const T* bias, bool accumulate) {
  GemmArgs g{m, n, k, a, lda, ta, b, ldb, tb, c, ldc, bias, accumulate};
  g.a_type = g.b_type = g.bias_type = dtype_of<T>();
  g.c_type = dtype_of<C_>();
  gemm.run(g);
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
