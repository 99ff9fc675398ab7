// Straightforward double-precision references of every op in backend/backend.h, written
// from the interface's documented math (no blocking, no tricks), for the op tests.
//
// All arrays are row-major std::vector<double> with the shapes of the interface. Backward
// functions return the plain gradient (no accumulation): the tests add the pre-filled
// values themselves where the interface accumulates.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::ref {

using Vec = std::vector<double>;

// ---- embedding ------------------------------------------------------------------------
// out [B,T,C] = wte[tokens] + wpe[pos] (pos = positions, or t when empty; no wpe term
// when wpe is empty).
Vec embedding_forward(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int B,
                      int T, int C, const std::vector<int32_t>& positions = {});
// dwte [Vp,C], dwpe [maxT,C] (rows never used zero).
void embedding_backward(Vec& dwte, Vec& dwpe, const Vec& dout, const std::vector<int32_t>& tokens,
                        int B, int T, int C, int Vp, int maxT,
                        const std::vector<int32_t>& positions = {});

// ---- layernorm ------------------------------------------------------------------------
void layernorm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& inp, const Vec& weight,
                       const Vec& bias, int N, int C, double eps);
// Uses the given mean/rstd (as the interface does).
void layernorm_backward(Vec& dinp, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& inp,
                        const Vec& weight, const Vec& mean, const Vec& rstd, int N, int C);

// ---- linear ---------------------------------------------------------------------------
// out [N,OC] = inp [N,IC] @ weight [OC,IC]^T + bias (bias may be empty).
Vec linear_forward(const Vec& inp, const Vec& weight, const Vec& bias, int N, int IC, int OC);
void linear_backward(Vec& dinp, Vec& dweight, Vec& dbias, const Vec& dout, const Vec& inp,
                     const Vec& weight, int N, int IC, int OC);

// ---- attention ------------------------------------------------------------------------
// qkv [B,T,(NH+2NKV)*HD], out [B,T,NH*HD], lse [B,NH,T]; query head h reads kv head
// h / (NH/NKV); causal rows see keys j <= t, else all.
struct Attn {
  int B, T, NH, NKV, HD;
  bool causal = true;
  static Attn mha(int B, int T, int C, int NH) { return {B, T, NH, NH, C / NH, true}; }
};
// keep: [B,NH,T,T] dropout multipliers keep[b,h,t,j] in {0, 1} (only seen keys read), or
// empty for no dropout; p the dropout probability (kept probabilities scaled by 1/(1-p)).
void attention_forward(Vec& out, Vec& lse, const Vec& qkv, const Attn& a,
                       const std::vector<uint8_t>& keep, double p);
Vec attention_backward(const Vec& dout, const Vec& qkv, const Attn& a,
                       const std::vector<uint8_t>& keep, double p);

// Documents packed into the sequences (Backend::attention_varlen_forward): cu [D+1] over
// the B*T rows, each document (cut at the sequences' ends) run as a sequence of its own
// through the functions above. No dropout.
void attention_documents_forward(Vec& out, Vec& lse, const Vec& qkv, const Attn& a,
                                 const std::vector<int32_t>& cu);
Vec attention_documents_backward(const Vec& dout, const Vec& qkv, const Attn& a,
                                 const std::vector<int32_t>& cu);

// ---- rotary (in place on q and k heads; sign -1 is the transpose) ----------------------
void rope(Vec& qkv, const std::vector<int32_t>& positions, const std::vector<float>& inv_freq,
          const Attn& a, double sign);

// ---- rmsnorm (weight may be empty) ---------------------------------------------------------
void rmsnorm_forward(Vec& out, Vec& rstd, const Vec& inp, const Vec& weight, int N, int C,
                     double eps);
void rmsnorm_backward(Vec& dinp, Vec& dweight, const Vec& dout, const Vec& inp,
                      const Vec& weight, const Vec& rstd, int N, int C);

// ---- silu (SwiGLU's gate) ---------------------------------------------------------------
double silu(double x);
double silu_grad(double x);

// ---- gelu (tanh approximation) ----------------------------------------------------------
double gelu(double x);
double gelu_grad(double x);

// ---- softmax cross-entropy --------------------------------------------------------------
// losses [N]; dlogits [N,Vp] (when non-null) = grad_scale * (softmax - onehot), 0 in padding
// and ignored rows.
Vec cross_entropy(const Vec& logits, const std::vector<int32_t>& targets, int N, int V, int Vp,
                  int ignore_index, double grad_scale, Vec* dlogits);

// ---- mixture of experts -------------------------------------------------------------------
// scores [N,E]: softmax of each row of logits, or the sigmoid of each logit.
Vec moe_scores(const Vec& logits, int N, int E, bool sigmoid);
// expert_idx [N,k]: per row the k largest of key [N,E], decreasing, ties to the lower index.
std::vector<int32_t> moe_top_k(const Vec& key, int N, int E, int k);
// expert_weight [N,k] = scores at expert_idx, divided by (their sum + 1e-20) when renormalize.
Vec moe_weights(const Vec& scores, const std::vector<int32_t>& idx, int N, int E, int k,
                bool renormalize);
// dlogits [N,E] of L = sum dweight * expert_weight + sum dscores * scores (dscores may be
// empty), the choice held fixed: the Jacobians written out element by element.
Vec moe_router_backward(const Vec& dweight, const Vec& dscores, const Vec& scores,
                        const std::vector<int32_t>& idx, int N, int E, int k, bool sigmoid,
                        bool renormalize);
// The permutation plan by its definition, keeping `capacity` slots per expert (0: all):
// slot i's rank = the earlier slots of the same expert; kept iff rank < capacity; offsets
// [E+1] (kept slots of experts below e), rows [N*k] (offsets[e] + rank, or -1 if dropped).
void moe_plan(std::vector<int32_t>& offsets, std::vector<int32_t>& rows,
              const std::vector<int32_t>& idx, int N, int k, int E, int capacity = 0);

// ---- adamw ------------------------------------------------------------------------------
struct AdamW {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
  int64_t step;
};
void adamw_step(Vec& param, const Vec& grad, Vec& m, Vec& v, const AdamW& hp);

}  // namespace kiln::ref
