// The CPU kernels behind CpuBackend. Arguments were validated by op_checks; sizes are
// passed explicitly. Each kernel is a template over the storage type T of activations
// and parameters (float, bf16, f16; see element.h) and, where it accumulates parameter
// gradients, over their type G (float, or T when train.grad_dtype is the low precision).
// Arithmetic is fp32 throughout. Each kernel parallelises with OpenMP over independent
// rows, heads or channels; reductions sum fixed chunks in a fixed order, so results do
// not depend on the thread count except where noted (parameter-gradient reductions sum
// per-thread partials in thread order).
#pragma once

#include "backend/backend.h"
#include "backend/cpu/attention_windows.h"
#include "backend/cpu/element.h"

#include <cstdint>
#include <vector>

namespace kiln::cpu {

/// positions and wpe may be nullptr (positions 0..T-1; no position table).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                       const T* wpe, int64_t B, int64_t T_, int64_t C, int64_t Vp, int64_t maxT);
template <class T, class G>
void embedding_backward(G* dwte, G* dwpe, const T* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t B, int64_t T_, int64_t C, int64_t Vp,
                        int64_t maxT);

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int64_t N, int64_t C, float eps);
template <class T, class G>
void layernorm_backward(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C);

/// weight may be nullptr (then dweight is too).
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C,
                     float eps);
template <class T, class G>
void rmsnorm_backward(T* dinp, G* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int64_t N, int64_t C);

/// Zeroed per-thread fp32 partial sums of n floats, reused across calls (no allocation
/// per step once the largest size was seen). Owned by the calling thread; the OpenMP
/// team writes disjoint rows.
std::vector<float>& partial_sums(size_t n);

/// db[OC] += sum over N rows of dout[N,OC].
template <class T, class G>
void bias_backward(G* dbias, const T* dout, int64_t N, int64_t OC);

/// The sizes of one attention (see AttentionShape).
struct AttnDims {
  int64_t B, T, NH, NKV, HD;
  bool causal;
  int64_t W() const { return (NH + 2 * NKV) * HD; }
};
/// Attention of each query over the keys of its window (w: B*T rows; a.causal is read
/// only through the windows).
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, const AttnDims& a, const KeyWindows& w,
                       const DropoutSpec& dropout);
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        const AttnDims& a, const KeyWindows& w, const DropoutSpec& dropout);
/// A tile of a blockwise attention (Backend::attention_tile_forward): a.T = qkv's rows,
/// Tk = kv's rows [B,Tk,2*NKV*HD]; out and lse fp32, merged into; w the tile's windows
/// (B * tile.q_len rows over its k_len keys).
template <class T>
void attention_tile_forward(float* out, float* lse, const T* qkv, const T* kv, const AttnDims& a,
                            int64_t Tk, const AttentionTile& tile, const KeyWindows& w);
/// Its gradients, accumulated into fp32 dq [B,T,NH*HD] and dkv [B,Tk,2*NKV*HD].
template <class T>
void attention_tile_backward(float* dq, float* dkv, const T* dout, const T* qkv, const T* kv,
                             const T* out, const float* lse, const AttnDims& a, int64_t Tk,
                             const AttentionTile& tile, const KeyWindows& w);
/// a.T = Tq new positions.
template <class T>
void attention_decode(T* out, T* k_cache, T* v_cache, const T* qkv, const AttnDims& a,
                      int64_t Tmax, int64_t past);
/// Rotates q and k heads of qkv [B,T,(NH+2NKV)*HD] in place by sign * pos * inv_freq.
template <class T>
void rope(T* qkv, const int32_t* positions, const float* inv_freq, int64_t B, int64_t T_,
          int64_t NH, int64_t NKV, int64_t HD, float sign);

template <class T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <class T>
void gelu_backward(T* dinp, const T* dout, const T* inp, int64_t n);
/// out = x sigmoid(x); backward dinp = dout silu'(inp) (dinp may alias dout).
template <class T>
void silu_forward(T* out, const T* inp, int64_t n);
template <class T>
void silu_backward(T* dinp, const T* dout, const T* inp, int64_t n);
/// Backend::modulate: x, out [B,T,C], mod [B,M,C]; shift < 0: no shift.
template <class T>
void modulate(T* out, const T* x, const T* mod, int64_t B, int64_t T_, int64_t C, int64_t M,
              int64_t scale, int64_t shift, float scale_offset);
/// Backend::modulate_backward: dx may be nullptr or alias dout.
template <class T>
void modulate_backward(T* dx, T* dmod, const T* dout, const T* x, const T* mod, int64_t B,
                       int64_t T_, int64_t C, int64_t M, int64_t scale, int64_t shift,
                       float scale_offset);
/// out [N,H] = silu(inp[:, :H]) * inp[:, H:]; backward writes dinp [N,2H].
template <class T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t H);
template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int64_t N, int64_t H);
template <class T>
void add(T* out, const T* a, const T* b, int64_t n);
/// out[n * Wo + j] = fma(alpha, src[n * Ws + j], out[n * Wo + j]) in fp32, rounded once,
/// for n < N and j < Ws (Backend::add_columns: out already offset to its first column).
template <class T>
void add_columns(T* out, int64_t Wo, const T* src, int64_t Ws, int64_t N, float alpha);
/// out = inp * keep(i) / (1-p); used for both directions (the mask is replayed).
template <class T>
void dropout(T* out, const T* inp, int64_t n, const DropoutSpec& spec);
template <class T>
void fill(T* out, float value, int64_t n);
template <class T>
double sum_squares(const T* x, int64_t n);
/// dst = src rounded stochastically (see Backend::copy_stochastic_round).
void stochastic_round_bf16(bf16* dst, const float* src, int64_t n, uint64_t seed, uint64_t stream,
                           const GlobalIndices& at);
/// dst = src converted (round to nearest even).
template <class D, class S>
void convert(D* dst, const S* src, int64_t n);
/// dst[n * Wd + j] = src[n * Ws + j] converted, for n < N and j < ncols (Backend::
/// copy_columns: dst and src already offset to their first column); rows in parallel.
template <class D, class S>
void copy_columns(D* dst, int64_t Wd, const S* src, int64_t Ws, int64_t N, int64_t ncols);

/// Vocab-parallel cross-entropy (Backend::cross_entropy_shard_stats / _backward).
template <class T>
void cross_entropy_shard_stats(float* stats, const T* logits, const int32_t* targets, int64_t N,
                               int64_t Vl, int64_t vocab_begin, int valid);
template <class T>
void cross_entropy_shard_backward(T* dlogits, const T* logits, const int32_t* targets,
                                  const float* lse, int64_t N, int64_t Vl, int64_t vocab_begin,
                                  int valid, int ignore_index, float grad_scale);
/// Backend::accumulate_loss: acc[0] += sum of losses[i] with targets[i] != -1, acc[1] += count.
void accumulate_loss(double* acc, const float* losses, const int32_t* targets, int64_t n);
/// Backend::cross_entropy_shard_combine over N rows of tp ranks' stats.
void cross_entropy_shard_combine(float* lse, double* acc, const float* stats,
                                 const int32_t* targets, int64_t N, int64_t tp);
/// Backend::clip_coefficient.
float clip_coefficient(double sumsq, double check, double max_norm, float loss_scale);
/// Backend::shard_ids.
void shard_ids(int32_t* out, const int32_t* ids, int64_t n, int64_t begin, int64_t count);
/// Backend::patchify: images [B,H,W,C], out rows of T >= (H/P)(W/P).
template <class T>
void patchify(T* out, const float* images, int64_t B, int64_t H, int64_t W, int64_t C, int64_t P,
              int64_t T_rows);
/// Backend::unpatchify: the inverse, rows [0, (H/P)(W/P)) of each image's T_rows read.
template <class T>
void unpatchify(float* images, const T* patches, int64_t B, int64_t H, int64_t W, int64_t C,
                int64_t P, int64_t T_rows);
/// Backend::rectified_flow_inputs over B samples of n elements.
void rectified_flow_inputs(float* xt, float* target, const float* images, const float* noise,
                           const float* t, int64_t B, int64_t n);
/// Backend::mse_loss over B samples of n elements; dpred may be nullptr.
template <class T>
void mse_loss(float* losses, T* dpred, const T* pred, const float* target, int64_t B, int64_t n,
              float grad_scale);

template <class T>
void softmax_cross_entropy(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                           int64_t N, int64_t Vp, int vocab_size, int ignore_index,
                           float grad_scale);

/// param and moments fp32; the gradient in G.
template <class G>
void adamw(float* param, const G* grad, float* m, float* v, int64_t n, const AdamWParams& hp);
/// ema = decay * ema + (1 - decay) * param (Backend::ema_update); ema fp32, param in P.
template <class P>
void ema_update(float* ema, const P* param, int64_t n, float decay);

/// max |x_i| over n elements (NaN if any is NaN): Backend::fp8_amax's reduction.
template <class T>
float amax(const T* x, int64_t n);
/// out = fp8(in S) / S with S = fp8_scale(amax, format) (format E4M3 or E5M2; rounding to
/// nearest even, saturating): exact in fp32 and bf16 (cpu/fp8.cpp). A non-finite amax
/// makes every output NaN. out may alias in.
template <class T>
void fp8_quantize(T* out, const T* in, int64_t n, float amax, DType format);

/// Backend::fp8_amax_history on host arrays: history [n,H,k], amax and step_amax [n,k].
void fp8_amax_history(float* amax, float* history, float* step_amax, int64_t n, int64_t H,
                      int64_t k, int64_t slot, bool most_recent);

class Gemm;
/// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias, all in T (fp32 accumulation).
template <class T>
void linear_forward(Gemm& gemm, T* out, const T* inp, const T* weight, const T* bias, int64_t N,
                    int64_t IC, int64_t OC);
/// dinp (T), dweight and dbias (G) may be nullptr to skip that gradient.
template <class T, class G>
void linear_backward(Gemm& gemm, T* dinp, G* dweight, G* dbias, const T* dout, const T* inp,
                     const T* weight, int64_t N, int64_t IC, int64_t OC);

/// Backend::moe_router_forward on N rows of E fp32 logits; bias may be nullptr.
void moe_router_forward(float* scores, int32_t* expert_idx, float* expert_weight,
                        const float* logits, const float* bias, int64_t N, int64_t E,
                        const MoeRouterSpec& spec);
/// Backend::moe_router_backward; dscores may be nullptr.
void moe_router_backward(float* dlogits, const float* dexpert_weight, const float* dscores,
                         const float* scores, const int32_t* expert_idx, int64_t N, int64_t E,
                         const MoeRouterSpec& spec);
/// Backend::moe_balance_stats; load, prob and z may each be nullptr.
void moe_balance_stats(float* load, float* prob, float* z, const float* logits,
                       const int32_t* expert_idx, int64_t N, int64_t E, int64_t k,
                       MoeScoring scoring, float prob_scale, float z_scale);
/// Backend::moe_balance_backward; load may be nullptr (no aux term).
void moe_balance_backward(float* dlogits, const float* logits, const float* load, int64_t N,
                          int64_t E, MoeScoring scoring, float aux_scale, float z_scale);
/// Backend::moe_permute_plan over N*k slots, at most `capacity` kept per expert (0: all);
/// throws on an expert id outside [0, E).
void moe_permute_plan(int32_t* offsets, int32_t* rows, const int32_t* expert_idx, int64_t N,
                      int64_t k, int64_t E, int64_t capacity);
/// Throws unless the rows [N,k] other than -1 (dropped slots) are a permutation of [0,
/// M_kept), M_kept their number (`op` names the caller).
void check_moe_rows(const int32_t* rows, int64_t N, int64_t k, const char* op);
/// dst[rows[n,j]] = w[n,j] * src[n] for the kept slots (rows[n,j] >= 0) of N tokens of C
/// channels (w nullptr: 1): moe_permute, and moe_unpermute_backward's dexpert_out.
template <class T>
void moe_scatter_rows(T* dst, const T* src, const float* w, const int32_t* rows, int64_t N,
                      int64_t k, int64_t C);
/// dst[n] = sum over the kept slots j of w[n,j] * src[rows[n,j]] in fp32 (w nullptr: 1):
/// moe_unpermute, and moe_permute_backward.
template <class T>
void moe_gather_rows(T* dst, const T* src, const float* w, const int32_t* rows, int64_t N,
                     int64_t k, int64_t C);
/// dw[n,j] = dout[n] . src[rows[n,j]] (fp32), 0 for a dropped slot: moe_unpermute_backward's
/// dexpert_weight.
template <class T>
void moe_row_dots(float* dw, const T* dout, const T* src, const int32_t* rows, int64_t N,
                  int64_t k, int64_t C);
/// Backend::grouped_linear_forward: offsets [E+1] host values, checked (0, rising, M).
template <class T>
void grouped_linear_forward(Gemm& gemm, T* out, const T* inp, const T* weight,
                            const int32_t* offsets, int64_t M, int64_t I, int64_t O, int64_t E);
/// Backend::grouped_linear_backward: dinp (T) and dweight (G) may be nullptr.
template <class T, class G>
void grouped_linear_backward(Gemm& gemm, T* dinp, G* dweight, const T* dout, const T* inp,
                             const T* weight, const int32_t* offsets, int64_t M, int64_t I,
                             int64_t O, int64_t E);

}  // namespace kiln::cpu

// Explicit instantiations, used by each kernel file.
#define KILN_CPU_FOR_EACH_T(X) X(float) X(kiln::cpu::bf16) X(kiln::cpu::f16)
#define KILN_CPU_FOR_EACH_TG(X)                                                           \
  X(float, float) X(kiln::cpu::bf16, float) X(kiln::cpu::bf16, kiln::cpu::bf16)          \
      X(kiln::cpu::f16, float) X(kiln::cpu::f16, kiln::cpu::f16)
