// Backend: the one interface through which every op of kiln runs.
//
// A Backend owns a device's allocator and launches ops on a Stream (a queue of work:
// a cudaStream_t on CUDA, unused on the CPU, where ops complete before returning). Each
// op has its forward and its backward here; model and layer code call only this
// interface, so the same model runs on any backend without an #ifdef.
//
// Conventions shared by every op:
// - Tensors are contiguous, row-major, on this backend's device. Shapes are named in
//   each op's comment: B batch, T sequence, C channels, NH heads, HD = C / NH head size,
//   N rows (often B*T), V vocabulary (Vp padded), OC/IC output/input features.
// - Backward ops ACCUMULATE (+=) into parameter gradients (dweight, dbias, dwte, ...),
//   so micro-batches accumulate without extra copies, and OVERWRITE input gradients
//   (dinp), except layernorm_backward, which adds into dinp because its input is the
//   residual stream whose gradient already holds the skip connection's part.
// - Reductions and softmax run in fp32; GEMMs accumulate in fp32.
// - An op given a dtype it does not support throws kiln::Error; `supports()` answers
//   beforehand so that a caller can pick another path.
#pragma once

#include "core/allocator.h"
#include "core/tensor.h"

#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// An opaque queue of work. On CUDA it holds a cudaStream_t; on the CPU it is empty.
struct Stream {
  void* handle = nullptr;
};

/// Every op of the interface, for `Backend::supports`.
enum class Op {
  Embedding,
  LayerNorm,
  Linear,
  Attention,
  Gelu,
  Add,
  Dropout,
  SoftmaxCrossEntropy,
  AdamW,
};
const char* op_name(Op op);

/// Dropout with probability p (0 disables), its keep-mask drawn from Philox stream
/// `stream` under `seed`: element i is kept when uniform_at(seed, stream, i) >= p, and
/// kept values are scaled by 1/(1-p). The same spec replays the same mask.
struct DropoutSpec {
  float p = 0.f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  bool enabled() const { return p > 0.f; }
};

/// One AdamW update (Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
/// ICLR 2019, Algorithm 2), as in torch.optim.AdamW:
///   g = grad * grad_scale
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///   p -= lr * ( (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay p )
/// `step` counts from 1. grad_scale folds gradient clipping (and later loss scaling) in.
/// As PyTorch: the betas are doubles; the bias corrections 1 - beta^step, lr / (1 -
/// beta1^step) and sqrt(1 - beta2^step) are computed in double and rounded to fp32 once;
/// the moments use beta and 1 - beta (computed in double) rounded to fp32.
struct AdamWParams {
  float lr = 1e-3f;
  double beta1 = 0.9;
  double beta2 = 0.95;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  float grad_scale = 1.f;
  int64_t step = 1;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual Stream default_stream() = 0;
  /// Waits until all work queued on `stream` is done.
  virtual void synchronize(Stream stream) = 0;
  /// Whether `op` runs with activations/parameters of `dtype`.
  virtual bool supports(Op op, DType dtype) const = 0;
  /// How linear layers' GEMMs with operands of `dtype` run here, one line for the
  /// start-up log (e.g. "bf16 GEMMs: fp32 compute (...)" on a CPU without bf16 kernels).
  virtual std::string gemm_path(DType dtype) const {
    return fmt::format("{} GEMMs: {}", dtype_name(dtype), name());
  }

  // ---- memory ---------------------------------------------------------------------
  /// Allocates a tensor on this backend's device (contents uninitialised).
  Tensor empty(const Shape& shape, DType dtype, MemCategory category) {
    return Tensor::empty(allocator(), shape, dtype, category);
  }
  /// dst (this device) <- host bytes; dst.nbytes() bytes are read.
  virtual void copy_from_host(Stream s, const Tensor& dst, const void* src) = 0;
  /// host bytes <- src (this device). Completes before returning.
  virtual void copy_to_host(Stream s, void* dst, const Tensor& src) = 0;
  /// dst <- src, same number of elements, both on this device; converted (round to
  /// nearest even, NaN/Inf kept) when the dtypes differ (e.g. fp32 master weights to
  /// bf16 parameters).
  virtual void copy(Stream s, const Tensor& dst, const Tensor& src) = 0;
  /// dst bf16 <- src fp32 with stochastic rounding: element i rounds up with probability
  /// equal to the discarded fraction, using the low 16 bits of Philox word i of stream
  /// `stream` under `seed` (added to the fp32 bits before truncation; NaN and Inf are
  /// rounded to nearest instead). Unbiased in expectation (Gupta et al. 2015, "Deep
  /// Learning with Limited Numerical Precision"); replayable from (seed, stream).
  virtual void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src,
                                     uint64_t seed, uint64_t stream) = 0;
  /// Every element of t set to `value` (converted to t's dtype).
  virtual void fill(Stream s, const Tensor& t, float value) = 0;
  /// Sum of squares of all elements of t, in double, returned to the host (synchronises).
  virtual double sum_squares(Stream s, const Tensor& t) = 0;

  // ---- ops --------------------------------------------------------------------------
  /// out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :].  tokens int32 [B,T] in [0, Vp);
  /// wte [Vp,C]; wpe [maxT,C] with maxT >= T. (GPT-2: Radford et al. 2019.)
  virtual void embedding_forward(Stream s, const Tensor& out, const Tensor& tokens,
                                 const Tensor& wte, const Tensor& wpe) = 0;
  /// dwte[tokens[b,t]] += dout[b,t];  dwpe[t] += sum_b dout[b,t].
  virtual void embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe,
                                  const Tensor& dout, const Tensor& tokens) = 0;

  /// LayerNorm over the last dim (Ba, Kiros, Hinton 2016): inp [N,C] -> out [N,C];
  /// mean, rstd fp32 [N] saved for backward; rstd = 1/sqrt(var + eps), biased variance.
  virtual void layernorm_forward(Stream s, const Tensor& out, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, float eps) = 0;
  /// dinp [N,C] += d/dinp; dweight [C] += ..; dbias [C] += ..
  virtual void layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                  const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                  const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) = 0;

  /// out [N,OC] = inp [N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be empty), as
  /// torch.nn.functional.linear.
  virtual void linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                              const Tensor& weight, const Tensor& bias) = 0;
  /// dinp [N,IC] = dout @ weight (skipped when dinp is empty); dweight [OC,IC] +=
  /// dout^T @ inp; dbias [OC] += sum over rows of dout (skipped when empty).
  virtual void linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight) = 0;

  /// Causal multi-head self-attention (Vaswani et al. 2017) on packed qkv [B,T,3C]
  /// (q, k, v each [B,T,NH,HD], the layout of GPT-2's c_attn output):
  ///   out[b,t,h] = sum_{j<=t} softmax_j(q_t.k_j / sqrt(HD)) v_j, with dropout on the
  /// probabilities. lse fp32 [B,NH,T] stores each row's log-sum-exp so that backward
  /// recomputes the probabilities (FlashAttention, Dao et al. 2022) and no [T,T] matrix
  /// is kept between forward and backward.
  virtual void attention_forward(Stream s, const Tensor& out, const Tensor& lse,
                                 const Tensor& qkv, int n_head, const DropoutSpec& dropout) = 0;
  /// dqkv [B,T,3C] = gradient of out with respect to qkv.
  virtual void attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                  const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                  int n_head, const DropoutSpec& dropout) = 0;

  /// Inference attention over a KV cache. qkv [B,Tq,3C] holds the projections of Tq
  /// new tokens at positions past .. past+Tq-1; their k and v are written into rows
  /// past.. of k_cache and v_cache [B,Tmax,C] (heads interleaved as in qkv), then
  /// out [B,Tq,C] = causal attention of each new query over cache rows [0, its
  /// position]. No dropout, nothing saved for backward. Throws when past + Tq > Tmax.
  virtual void attention_decode(Stream s, const Tensor& out, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& qkv, int64_t past,
                                int n_head) = 0;

  /// GELU, tanh approximation (Hendrycks & Gimpel 2016): out = 0.5 x (1 + tanh(
  /// sqrt(2/pi) (x + 0.044715 x^3))). Any shape.
  virtual void gelu_forward(Stream s, const Tensor& out, const Tensor& inp) = 0;
  /// dinp = dout * gelu'(inp).
  virtual void gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp) = 0;

  /// out = a + b (the residual connection). Any shape; out may alias a or b.
  virtual void add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) = 0;

  /// out = inp * keep / (1 - p), keep from `spec` (see DropoutSpec). out may alias inp.
  virtual void dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                               const DropoutSpec& spec) = 0;
  /// dinp = dout * keep / (1 - p), the mask replayed from `spec`. dinp may alias dout.
  virtual void dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                const DropoutSpec& spec) = 0;

  /// Softmax cross-entropy over the first `vocab_size` columns of logits [N,Vp]
  /// (columns >= vocab_size are padding and never enter the softmax):
  ///   losses fp32 [N] = logsumexp(logits[n, :V]) - logits[n, target[n]], 0 where
  ///   target[n] == ignore_index.
  /// When dlogits is given ([N,Vp], may alias logits), it is overwritten with
  ///   grad_scale * (softmax(logits[n, :V]) - onehot(target[n])), and 0 in padded
  ///   columns and ignored rows. targets int32 [N]. Callers pass row chunks so that the
  ///   [N,V] logits of a whole batch never exist at once (see nn/classifier.h).
  virtual void softmax_cross_entropy(Stream s, const Tensor& losses, const Tensor& dlogits,
                                     const Tensor& logits, const Tensor& targets,
                                     int vocab_size, int ignore_index, float grad_scale) = 0;

  /// One AdamW step on a parameter tensor (any shape); m and v fp32 of the same shape.
  virtual void adamw_step(Stream s, const Tensor& param, const Tensor& grad, const Tensor& m,
                          const Tensor& v, const AdamWParams& hp) = 0;
};

/// dst (any float dtype, on be's device) <- n = dst.numel() fp32 host values, converted
/// (round to nearest even) on the host first.
void upload_f32(Backend& be, const Tensor& dst, const float* src);
/// fp32 host values <- src (any float dtype).
void download_f32(Backend& be, float* dst, const Tensor& src);
std::vector<float> download_f32(Backend& be, const Tensor& src);

}  // namespace kiln
