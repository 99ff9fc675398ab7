// The CPU kernels behind CpuBackend, fp32. Arguments were validated by op_checks; sizes
// are passed explicitly. Each kernel parallelises with OpenMP over independent rows,
// heads or channels, so results do not depend on the thread count except where noted
// (parameter-gradient reductions sum per-thread partials in thread order).
#pragma once

#include "backend/backend.h"

#include <cstdint>

namespace kiln::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t Vp);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t Vp);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C);

/// db[OC] += sum over N rows of dout[N,OC].
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t OC);

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, const DropoutSpec& dropout);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        const DropoutSpec& dropout);

void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void add(float* out, const float* a, const float* b, int64_t n);
/// out = inp * keep(i) / (1-p); used for both directions (the mask is replayed).
void dropout(float* out, const float* inp, int64_t n, const DropoutSpec& spec);
void fill(float* out, float value, int64_t n);
double sum_squares(const float* x, int64_t n);

void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t N, int64_t Vp, int vocab_size,
                           int ignore_index, float grad_scale);

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& hp);

}  // namespace kiln::cpu

namespace kiln::cpu {
class Gemm;
void linear_forward(Gemm& gemm, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t N, int64_t IC, int64_t OC);
/// dinp, dweight or dbias may be nullptr to skip that gradient.
void linear_backward(Gemm& gemm, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t IC, int64_t OC);
}  // namespace kiln::cpu

namespace kiln::cpu {
void attention_decode(float* out, float* k_cache, float* v_cache, const float* qkv, int64_t B,
                      int64_t Tq, int64_t Tmax, int64_t C, int64_t NH, int64_t past);
}  // namespace kiln::cpu
