// linear_forward / linear_backward as oneDNN GEMMs (see gemm.h):
//   forward   out[N,OC]   = inp[N,IC] @ W[OC,IC]^T + b      (bias fused into the GEMM)
//   backward  dinp[N,IC]  = dout[N,OC] @ W[OC,IC]
//             dW[OC,IC]  += dout^T @ inp                     (sum post-op: accumulate)
//             db[OC]     += column sums of dout
// FLOPs: 2*N*IC*OC forward, 4*N*IC*OC backward.
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"

namespace kiln::cpu {

void linear_forward(Gemm& gemm, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t N, int64_t IC, int64_t OC) {
  GemmArgs g;
  g.m = N, g.n = OC, g.k = IC;
  g.a = inp, g.lda = IC;
  g.b = weight, g.ldb = IC, g.trans_b = true;
  g.c = out, g.ldc = OC;
  g.bias = bias;
  gemm.run(g);
}

void linear_backward(Gemm& gemm, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t IC, int64_t OC) {
  if (dinp) {
    GemmArgs g;
    g.m = N, g.n = IC, g.k = OC;
    g.a = dout, g.lda = OC;
    g.b = weight, g.ldb = IC;
    g.c = dinp, g.ldc = IC;
    gemm.run(g);
  }
  if (dweight) {
    GemmArgs g;
    g.m = OC, g.n = IC, g.k = N;
    g.a = dout, g.lda = OC, g.trans_a = true;
    g.b = inp, g.ldb = IC;
    g.c = dweight, g.ldc = IC;
    g.accumulate = true;
    gemm.run(g);
  }
  if (dbias) bias_backward(dbias, dout, N, OC);
}

}  // namespace kiln::cpu
