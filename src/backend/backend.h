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
//   N rows (often B*T), V vocabulary (Vp padded), OC/IC output/input features, NKV
//   key/value heads, H an MLP's hidden width.
// - Backward ops ACCUMULATE (+=) into parameter gradients (dweight, dbias, dwte, ...),
//   so micro-batches accumulate without extra copies, and OVERWRITE input gradients
//   (dinp), except layernorm_backward, which adds into dinp because its input is the
//   residual stream whose gradient already holds the skip connection's part (likewise
//   rmsnorm_backward).
// - An optional operand (a bias, a norm's weight, positions, ...) is an empty Tensor.
// - Reductions and softmax run in fp32; GEMMs accumulate in fp32.
// - An op given a dtype it does not support, or not implemented on a backend, throws
//   kiln::Error; `supports()` answers per op and dtype beforehand, so that a caller can
//   pick another path or refuse a configuration with a one-line error.
#pragma once

#include "backend/op_list.h"
#include "core/allocator.h"
#include "core/tensor.h"

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// An opaque queue of work. On CUDA it holds a cudaStream_t; on the CPU it is empty.
struct Stream {
  void* handle = nullptr;
};

/// A group of ops that a feature needs together, each op's `family` in backend/op_list.h:
/// a layer's forward and backward (Linear: linear_forward, linear_backward), ring
/// attention's tile ops (RingAttention), the vocab-parallel loss (VocabParallel), the
/// step's statistics (StepStats: accumulate_loss, sum_squares, clip_coefficient), a
/// mixture-of-experts layer's router, token permutation and grouped linear (MoE),
/// ...
enum class OpFamily : uint8_t {
  Embedding,
  LayerNorm,
  RMSNorm,
  Linear,
  Attention,
  VarlenAttention,
  RingAttention,
  Decode,
  Rope,
  SwiGLU,
  Gelu,
  Silu,
  Modulate,
  Add,
  Dropout,
  SoftmaxCrossEntropy,
  VocabParallel,
  Patchify,
  Unpatchify,
  FlowMatching,
  StepStats,
  AdamW,
  Ema,
  MoE,
  Fp8,
};
/// "linear", "ring_attention", ...
const char* family_name(OpFamily family);

/// Every compute op of the interface (backend/op_list.h: the memory ops copy*, fill are
/// not among them), for `Backend::supports`.
enum class Op : uint8_t {
#define KILN_OP_VALUE(Call, method, family, category, params, args) Call,
  KILN_BACKEND_OPS(KILN_OP_VALUE)
#undef KILN_OP_VALUE
};
/// Every Op, in the list's order.
inline constexpr std::array kAllOps = {
#define KILN_OP_ITEM(Call, method, family, category, params, args) Op::Call,
    KILN_BACKEND_OPS(KILN_OP_ITEM)
#undef KILN_OP_ITEM
};
/// The Backend method's name: "linear_forward", "attention_tile_backward", ...
const char* op_name(Op op);
/// The family `op` belongs to.
constexpr OpFamily op_family(Op op) {
  switch (op) {
#define KILN_OP_FAMILY(Call, method, family, category, params, args) \
  case Op::Call:                                                     \
    return OpFamily::family;
    KILN_BACKEND_OPS(KILN_OP_FAMILY)
#undef KILN_OP_FAMILY
  }
  return OpFamily::Add;  // not reached: every Op has a case
}

/// Dropout with probability p (0 disables), its keep-mask drawn from Philox stream
/// `stream` under `seed`: element i is kept when uniform_at(seed, stream, offset + i) >= p,
/// and kept values are scaled by 1/(1-p). The same spec replays the same mask.
/// A tensor split over ranks (tensor / sequence parallel) passes its global coordinates,
/// so that every layout draws the single process's mask: `offset`, the global index of its
/// first element (rows of the flattened activations; a model also counts the samples
/// before the micro-batch in it, docs/distributed.md); for attention probabilities, whose
/// element ((b NH + h) T + i) T + j is numbered by head and drawn at offset + that index,
/// `head_offset` and `total_heads` (0: the op's own NH) place the op's NH heads among the
/// global ones.
struct DropoutSpec {
  float p = 0.f;
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t offset = 0;
  int head_offset = 0, total_heads = 0;
  bool enabled() const { return p > 0.f; }
  /// The global head-row index b * H + head_offset + h of local head h of sequence b,
  /// from the local bh = b * NH + h.
  uint64_t global_bh(uint64_t bh, int NH) const {
    if (total_heads == 0) return bh;
    return (bh / NH) * total_heads + head_offset + bh % NH;
  }
};

/// Where the elements of an op sit among those of a larger, global tensor, for random
/// draws keyed by the global index (Backend::copy_stochastic_round): element i of the op
/// is element begin + (i / row_len) * stride + i % row_len of the global tensor (row-major),
/// or begin + i when row_len is 0 (one contiguous run). A tensor-parallel shard of a
/// row-parallel weight [out, in], for instance, is out rows of in/tp elements `in` apart.
struct GlobalIndices {
  int64_t begin = 0;
  int64_t row_len = 0;  // elements per row; 0: one contiguous run
  int64_t stride = 0;   // global distance between the starts of consecutive rows
  int64_t at(int64_t i) const {
    return row_len == 0 ? begin + i : begin + (i / row_len) * stride + i % row_len;
  }
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
/// The shape of one self-attention over a packed buffer qkv [B, T, (NH + 2 NKV) * HD]:
/// q heads in columns [0, NH*HD), k heads in [NH*HD, (NH+NKV)*HD), v heads after them,
/// each head's HD columns contiguous (GPT-2's c_attn output is the case NKV = NH). Query
/// head h reads key/value head h / (NH / NKV): grouped-query attention (Ainslie et al.
/// 2023, "GQA"), multi-head when NKV = NH. Causal: query t sees keys 0..t; otherwise
/// every key (a bidirectional encoder). Scores are scaled by 1/sqrt(HD).
struct AttentionShape {
  int n_head = 0;     // NH
  int n_kv_head = 0;  // NKV; 0 means NH
  int64_t head_dim = 0;
  bool causal = true;

  /// Multi-head attention with NH heads over C channels (HD = C / NH).
  static AttentionShape mha(int n_head, int64_t C, bool causal = true) {
    return {n_head, n_head, n_head > 0 ? C / n_head : 0, causal};
  }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t q_width() const { return n_head * head_dim; }
  int64_t kv_width() const { return kv_heads() * head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
};

/// One tile of a blockwise attention (ring attention, Liu et al. 2023): the query rows
/// [q_begin, q_begin + q_len) of a qkv buffer against the key/value rows [k_begin,
/// k_begin + k_len) of a kv buffer. causal: a diagonal tile (q_len == k_len, rows aligned:
/// the tile's query i sees its keys 0..i); otherwise every key of the tile.
/// With documents (a tile op's cu_seqlens) the tile's rows are also runs of the whole
/// sequences of seq_len tokens: its queries at positions q_pos.. and its keys at k_pos..
/// of each sequence, and a query sees only the keys of its own document.
struct AttentionTile {
  int64_t q_begin = 0, q_len = 0, k_begin = 0, k_len = 0;
  bool causal = false;
  int64_t q_pos = 0, k_pos = 0, seq_len = 0;
};

/// Rotary position embedding (Su et al. 2021, "RoFormer"), in the "rotate half" layout
/// of Hugging Face's Llama: within each head, channel i < HD/2 pairs with i + HD/2 and
/// the pair turns by the angle pos * inv_freq[i], inv_freq[i] = theta^(-2i/HD). With
/// `scale_factor` > 0 the frequencies are rescaled as Llama 3.1 does (long wavelengths
/// divided by the factor, a smooth blend between the two wavelength bounds; see
/// rope_inv_freq).
struct RopeSpec {
  double theta = 10000.0;
  double scale_factor = 0.0;  // 0: no rescaling
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
};
/// The HD/2 fp32 inverse frequencies of `rope` for head size HD, computed as Hugging Face
/// transformers does (fp32 powers of theta, then the Llama 3 rescaling in double).
/// Throws kiln::Error when HD is odd or not positive.
std::vector<float> rope_inv_freq(const RopeSpec& rope, int64_t head_dim);

/// How a mixture-of-experts router turns its fp32 logits [N,E] into expert scores, and
/// how many experts each token takes (see Backend::moe_router_forward).
enum class MoeScoring : uint8_t {
  Softmax,  // scores = softmax over the E experts (Mixtral, Qwen3-MoE, Switch)
  Sigmoid,  // scores = sigmoid of each logit (DeepSeek-V3)
};
struct MoeRouterSpec {
  MoeScoring scoring = MoeScoring::Softmax;
  int k = 1;                 // experts per token, 1 <= k <= E
  bool renormalize = false;  // the k chosen scores divided by their sum (Mixtral; Qwen3's
                             // norm_topk_prob; DeepSeek-V3's norm_topk_prob)
  bool round_robin = false;  // a test router (model.moe.routing): token n takes experts
                             // (n k + j) mod E, j < k, whatever the scores (CPU only)
};

struct AdamWParams {
  float lr = 1e-3f;
  double beta1 = 0.9;
  double beta2 = 0.95;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  float grad_scale = 1.f;
  int64_t step = 1;
};

/// One tensor of Backend::adamw_multi_step: n elements each (any shapes).
struct AdamWTensor {
  Tensor param;   // the parameters (updated, or rounded from the master)
  Tensor master;  // fp32 master weights, or empty: param itself is updated
  Tensor grad;    // fp32 or the parameters' dtype
  Tensor m, v;    // fp32 moments
  float weight_decay = 0.f;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  /// Host memory that copy_from_host reads fastest and asynchronously: page-locked
  /// (pinned) on CUDA, so the copy runs on the DMA engine while the host goes on; the
  /// process's host allocator on the CPU. Tensors from it are host tensors (device cpu).
  /// A caller that stages through it must leave the bytes untouched until the stream
  /// has passed the copy (synchronize, or a later blocking read on that stream).
  virtual Allocator& staging_allocator() { return host_allocator(); }
  virtual Stream default_stream() = 0;
  /// Waits until all work queued on `stream` is done.
  virtual void synchronize(Stream stream) = 0;
  /// Whether `op` runs here with activations (the optimizer's ops: parameters, with fp32
  /// master weights for low-precision ones where the op takes them) of `dtype`: true
  /// exactly where calling it on valid arguments of that dtype does not throw kiln::Error
  /// for the dtype or for the op being unimplemented on this backend. An op whose tensors
  /// have fixed dtypes (accumulate_loss, shard_ids, ...) answers for the runs of every
  /// float dtype. Only fp32, bf16 and fp16 can answer true.
  bool supports(Op op, DType dtype) const { return runs(op, dtype); }
  /// Whether every op of `family` runs here with `dtype`.
  bool supports(OpFamily family, DType dtype) const { return !unsupported_op(family, dtype); }
  /// The first op of `family` (in backend/op_list.h's order) that does not run here with
  /// `dtype`, for an error message naming it; nullopt when all do.
  std::optional<Op> unsupported_op(OpFamily family, DType dtype) const;
  /// How linear layers' GEMMs with operands of `dtype` run here, one line for the
  /// start-up log (e.g. "bf16 GEMMs: fp32 compute (...)" on a CPU without bf16 kernels).
  virtual std::string gemm_path(DType dtype) const {
    return fmt::format("{} GEMMs: {}", dtype_name(dtype), name());
  }

  // ---- device timing (profiling without synchronising each op) ----------------------
  /// Records a timing marker on stream s (on CUDA an event) and returns its id, or -1
  /// where ops complete before they return (the CPU): the host clock times those.
  /// Markers live until release_markers().
  virtual int64_t record_marker(Stream s) {
    (void)s;
    return -1;
  }
  /// Device milliseconds from marker `from` to marker `to` (waits for `to` to complete).
  /// kiln::Error for an id this backend did not return.
  virtual double marker_elapsed_ms(int64_t from, int64_t to);
  /// Forgets every marker (their ids become invalid); they are reused.
  virtual void release_markers() {}

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
  /// equal to the discarded fraction, using the low 16 bits of Philox word g = at.at(i)
  /// (word g % 4 of block g / 4) of stream `stream` under `seed` (added to the fp32 bits
  /// before truncation; NaN and Inf are rounded to nearest instead). Unbiased in
  /// expectation (Gupta et al. 2015, "Deep Learning with Limited Numerical Precision");
  /// replayable from (seed, stream, at). `at` places dst among the elements of a global
  /// tensor, so that an element draws the same bits in whichever shard it lives.
  virtual void copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src,
                                     uint64_t seed, uint64_t stream,
                                     const GlobalIndices& at) = 0;
  /// Every element of t set to `value` (converted to t's dtype).
  virtual void fill(Stream s, const Tensor& t, float value) = 0;
  /// acc fp64 [1] += the sum of squares of all elements of x (any float dtype), summed in
  /// double in an order fixed by x's size (bitwise reproducible); stays on the device, so
  /// a step's gradient norm needs no host read (read_sum_squares() reads one).
  virtual void sum_squares(Stream s, const Tensor& acc, const Tensor& x) = 0;

  // ---- ops --------------------------------------------------------------------------
  /// out[B,T,C] = wte[tokens[b,t], :] + wpe[pos[b,t], :].  tokens int32 [B,T] in
  /// [0, Vp) or -1 (a zero wte row: the token lives on another vocab-parallel rank, see
  /// shard_ids); positions int32 [B,T] in [0, maxT), or empty for pos[b,t] = t; wte [Vp,C];
  /// wpe [maxT,C] (learned positions, GPT-2: Radford et al. 2019), or empty for none
  /// (out = wte[tokens]: rotary models). Throws on a token or position out of range.
  virtual void embedding_forward(Stream s, const Tensor& out, const Tensor& tokens,
                                 const Tensor& positions, const Tensor& wte,
                                 const Tensor& wpe) = 0;
  /// dwte[tokens[b,t]] += dout[b,t] (tokens of -1 skipped);  dwpe[pos[b,t]] += dout[b,t]
  /// (when dwpe is given).
  virtual void embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe,
                                  const Tensor& dout, const Tensor& tokens,
                                  const Tensor& positions) = 0;

  /// LayerNorm over the last dim (Ba, Kiros, Hinton 2016): inp [N,C] -> out [N,C] =
  /// (inp - mean) * rstd * weight + bias; mean, rstd fp32 [N] saved for backward; rstd
  /// = 1/sqrt(var + eps), biased variance. weight and bias [C] may each be empty (no
  /// scale / no shift); backward's dweight, dbias are then empty too.
  virtual void layernorm_forward(Stream s, const Tensor& out, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias, float eps) = 0;
  /// dinp [N,C] += d/dinp; dweight [C] += ..; dbias [C] += ..
  virtual void layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                  const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                  const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) = 0;

  /// RMSNorm over the last dim (Zhang & Sennrich 2019): out [N,C] = inp * rstd * weight,
  /// rstd fp32 [N] = 1/sqrt(mean(inp^2) + eps), saved for backward; weight [C] or empty.
  virtual void rmsnorm_forward(Stream s, const Tensor& out, const Tensor& rstd,
                               const Tensor& inp, const Tensor& weight, float eps) = 0;
  /// dinp [N,C] += d/dinp (adds, as layernorm_backward); dweight [C] += sum_n dout *
  /// inp * rstd (empty with weight).
  virtual void rmsnorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                const Tensor& rstd) = 0;

  /// out [N,OC] = inp [N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be empty), as
  /// torch.nn.functional.linear.
  virtual void linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                              const Tensor& weight, const Tensor& bias) = 0;
  /// dinp [N,IC] = dout @ weight; dweight [OC,IC] += dout^T @ inp; dbias [OC] += sum over
  /// rows of dout. Each output is skipped when empty; inp is read only for dweight.
  virtual void linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight) = 0;

  // ---- fp8 (train.fp8, docs/fp8.md) ----------------------------------------------------
  /// amax fp32 [1] = max(amax, max |x|) over every element of x (fp32, bf16 or fp16, any
  /// shape): the largest magnitude a tensorwise fp8 scale is taken from, on the device
  /// (no host read). A NaN in x makes amax NaN.
  virtual void fp8_amax(Stream s, const Tensor& amax, const Tensor& x) = 0;
  /// linear_forward on fp8 operands: inp and weight (fp32 or bf16) are quantized to E4M3
  /// at the tensorwise scales S_x = fp8_scale(amax[0], E4M3), S_w = fp8_scale(amax[1],
  /// E4M3) (core/dtype.h: powers of two), q(x) = e4m3(x S) / S with saturation, and out =
  /// q(inp) @ q(weight)^T + bias (bias unquantized). The products of the quantized values
  /// are exact in fp32 and accumulate in fp32, as an fp8 tensor-core GEMM with fp32
  /// accumulation and these scales computes them; backends differ only in summation
  /// order. amax fp32 [3] on the device (inp, weight, dout: Linear's, reduced over the
  /// ranks that hold parts of the tensors); a non-finite amax makes the output NaN.
  virtual void fp8_linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                                  const Tensor& weight, const Tensor& bias,
                                  const Tensor& amax) = 0;
  /// linear_backward on fp8 operands: dout quantized to E5M2 at S_g = fp8_scale(amax[2],
  /// E5M2), inp and weight as in fp8_linear_forward; dinp = q(dout) @ q(weight), dweight
  /// += q(dout)^T @ q(inp); dbias += the row sums of the unquantized dout (as Transformer
  /// Engine's bias gradient). Outputs skipped when empty, as linear_backward's.
  virtual void fp8_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                   const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                   const Tensor& weight, const Tensor& amax) = 0;

  /// Delayed scaling's step (train.fp8 = "delayed", docs/fp8.md; Transformer Engine's
  /// DelayedScaling): for n tensors with an amax history of H steps, all fp32 on the device,
  ///   history [n,H,k][:, slot, :] = step_amax [n,k];
  ///   amax [n,k] = max over h of history (most_recent: = step_amax);  step_amax = 0.
  /// A NaN in step_amax stays NaN in amax for as long as the history holds it.
  virtual void fp8_amax_history(Stream s, const Tensor& amax, const Tensor& history,
                                const Tensor& step_amax, int64_t slot, bool most_recent) = 0;

  /// Self-attention (Vaswani et al. 2017) on packed qkv [B,T,qkv_width] (see
  /// AttentionShape): out [B,T,NH*HD], out[b,t,h] = sum_j softmax_j(q_t.k_j / sqrt(HD))
  /// v_j over the keys j that query t sees, with dropout on the probabilities. lse fp32
  /// [B,NH,T] stores each row's log-sum-exp so that backward recomputes the
  /// probabilities (FlashAttention, Dao et al. 2022) and no [T,T] matrix is kept
  /// between forward and backward.
  virtual void attention_forward(Stream s, const Tensor& out, const Tensor& lse,
                                 const Tensor& qkv, const AttentionShape& shape,
                                 const DropoutSpec& dropout) = 0;
  /// dqkv [B,T,qkv_width] = gradient of out with respect to qkv (a key/value head's
  /// gradient sums over the query heads of its group).
  virtual void attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                  const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                  const AttentionShape& shape, const DropoutSpec& dropout) = 0;

  /// attention_forward over documents packed into the sequences (the varlen attention of
  /// FlashAttention-2, Dao 2023): cu_seqlens int32 [D+1] on the device, the cumulative
  /// document lengths over the B*T rows of qkv laid end to end, 0 = cu[0] <= cu[1] <= ...
  /// <= cu[D] = B*T (repeated entries are empty documents: a fixed-size cu_seqlens may be
  /// padded with B*T). Query t of document d sees only the keys of d (causal: those not
  /// after t); a document is also cut where a sequence ends. Dropout's element index is
  /// attention_forward's, so a document mask equals masking the whole-sequence op.
  /// Entries outside [0, B*T] or decreasing: undefined (the CPU backend throws).
  virtual void attention_varlen_forward(Stream s, const Tensor& out, const Tensor& lse,
                                        const Tensor& qkv, const Tensor& cu_seqlens,
                                        const AttentionShape& shape,
                                        const DropoutSpec& dropout) = 0;
  /// attention_backward over the same documents.
  virtual void attention_varlen_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                         const Tensor& qkv, const Tensor& out,
                                         const Tensor& lse, const Tensor& cu_seqlens,
                                         const AttentionShape& shape,
                                         const DropoutSpec& dropout) = 0;

  /// One tile of a blockwise attention merged into a running result (ring attention: Liu
  /// et al. 2023; the merge is FlashAttention's online softmax, Dao et al. 2022): queries
  /// from qkv [B,T,qkv_width] (its q columns), keys and values from kv [B,Tk,2*NKV*HD]
  /// (k heads then v heads: qkv's columns from NH*HD on, see copy_columns). out_acc fp32
  /// [B,T,NH*HD] and lse fp32 [B,NH,T] hold the attention over the keys merged so far
  /// (start at 0 and -inf); the tile's query rows become
  ///   out <- (e^lse out + e^l' o') / (e^lse + e^l'),  lse <- log(e^lse + e^l'),
  /// o' and l' the tile's own softmax output and log-sum-exp. No dropout; the tile, not
  /// shape.causal, says which keys a query sees, and cu_seqlens int32 [D+1] (empty: none)
  /// the documents of the whole sequences (attention_varlen_forward's, over B * tile.seq_len
  /// tokens; the tile's q_pos and k_pos place its rows among them). A query row that sees
  /// no key of the tile is left as it was. Throws on a tile outside the buffers.
  virtual void attention_tile_forward(Stream s, const Tensor& out_acc, const Tensor& lse,
                                      const Tensor& qkv, const Tensor& kv,
                                      const Tensor& cu_seqlens, const AttentionShape& shape,
                                      const AttentionTile& tile) = 0;
  /// The tile's gradients, accumulated: rows of dq fp32 [B,T,NH*HD] += dL/dq, rows of dkv
  /// fp32 [B,Tk,2*NKV*HD] += dL/dk, dL/dv, from dout and out [B,T,NH*HD] (qkv's dtype) and
  /// lse fp32 [B,NH,T]: the FINAL output and log-sum-exp over every key (FlashAttention-2's
  /// backward, Dao 2023: P = exp(S - lse), dS = P o (dO V^T - rowsum(dO o O))).
  virtual void attention_tile_backward(Stream s, const Tensor& dq, const Tensor& dkv,
                                       const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                       const Tensor& out, const Tensor& lse,
                                       const Tensor& cu_seqlens, const AttentionShape& shape,
                                       const AttentionTile& tile) = 0;
  /// dst[n, dst_col + j] <- src[n, src_col + j] for j < ncols and every row n, dst [N, Wd]
  /// and src [N, Ws] seen as rows of their last dimension (the same N), converted as
  /// copy() does when the dtypes differ. Throws when a column range leaves its tensor.
  virtual void copy_columns(Stream s, const Tensor& dst, const Tensor& src, int64_t dst_col,
                            int64_t src_col, int64_t ncols) = 0;

  /// Inference attention over a KV cache (causal shapes only). qkv [B,Tq,qkv_width]
  /// holds the projections of Tq new tokens at positions past .. past+Tq-1; their k and
  /// v are written into rows past.. of k_cache and v_cache [B,Tmax,NKV*HD] (heads
  /// interleaved as in qkv), then out [B,Tq,NH*HD] = attention of each new query over
  /// cache rows [0, its position]. No dropout, nothing saved for backward. Throws when
  /// past + Tq > Tmax.
  virtual void attention_decode(Stream s, const Tensor& out, const Tensor& k_cache,
                                const Tensor& v_cache, const Tensor& qkv, int64_t past,
                                const AttentionShape& shape) = 0;

  /// Rotary position embedding (RopeSpec) applied IN PLACE to the q and k heads of qkv
  /// [B,T,qkv_width] (v untouched): for each pair (x1, x2) = (x[i], x[i + HD/2]) of a
  /// head, angle a = pos[b,t] * inv_freq[i] (an fp32 product, as Hugging Face), x[i] =
  /// x1 cos a - x2 sin a, x[i + HD/2] = x2 cos a + x1 sin a. positions int32 [B,T] or
  /// empty for pos = t.
  virtual void rope_forward(Stream s, const Tensor& qkv, const Tensor& positions,
                            const AttentionShape& shape, const RopeSpec& rope) = 0;
  /// The transpose: dqkv [B,T,qkv_width] turned by -a in place (the gradient with
  /// respect to the un-rotated q and k).
  virtual void rope_backward(Stream s, const Tensor& dqkv, const Tensor& positions,
                             const AttentionShape& shape, const RopeSpec& rope) = 0;

  /// GELU, tanh approximation (Hendrycks & Gimpel 2016): out = 0.5 x (1 + tanh(
  /// sqrt(2/pi) (x + 0.044715 x^3))). Any shape.
  virtual void gelu_forward(Stream s, const Tensor& out, const Tensor& inp) = 0;
  /// dinp = dout * gelu'(inp).
  virtual void gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp) = 0;

  /// SiLU, the sigmoid-weighted linear unit (Elfwing et al. 2018; Hendrycks & Gimpel's
  /// 2016 "SiLU"; also called swish): out = x * sigmoid(x) = x / (1 + exp(-x)), as
  /// torch.nn.functional.silu (DiT's conditioning MLP and adaLN input). Any shape, any
  /// float dtype; out may alias inp.
  virtual void silu_forward(Stream s, const Tensor& out, const Tensor& inp) = 0;
  /// dinp = dout * silu'(inp), silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))); dinp
  /// overwritten, may alias dout.
  virtual void silu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp) = 0;

  /// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"): inp [N,2H] holds the
  /// gate in columns [0,H) and the up projection in [H,2H) (one fused Linear);
  /// out [N,H] = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
  virtual void swiglu_forward(Stream s, const Tensor& out, const Tensor& inp) = 0;
  /// dinp [N,2H] (overwritten) from dout [N,H] and forward's inp.
  virtual void swiglu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                               const Tensor& inp) = 0;

  /// out = a + b (the residual connection). Any shape; out may alias a or b.
  virtual void add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  /// out[n, out_col + j] += alpha * src[n, j] for every row n and j < Ws: out [N, Wo] and src
  /// [N, Ws] seen as rows of their last dimension (the same N; any leading dims flatten),
  /// of one float dtype (fp32, bf16, fp16); each sum computed in fp32 (one fused
  /// multiply-add, fma(alpha, src, out)) and rounded once to the dtype. The other columns
  /// of out are left as they were; src must not overlap out.
  /// Adds a LoRA adapter's scaled output into its columns of a fused projection (nn/lora.h).
  /// Throws kiln::Error when the dtypes differ, the row counts differ or [out_col, out_col +
  /// Ws) leaves out.
  virtual void add_columns(Stream s, const Tensor& out, const Tensor& src, int64_t out_col,
                           float alpha) = 0;

  /// DiT's adaptive LayerNorm modulation and gate (Peebles & Xie 2023, "Scalable Diffusion
  /// Models with Transformers", adaLN-Zero), one chunk of a per-sample conditioning
  /// vector broadcast over the T positions: x, out [B,T,C], mod [B,M,C] (the M chunks of
  /// width C of the adaLN linear's output), all of one float dtype;
  ///   out[b,t,c] = x[b,t,c] * (scale_offset + mod[b,scale_index,c])
  ///                + (shift_index >= 0 ? mod[b,shift_index,c] : 0).
  /// modulate(h, shift, scale) = h (1 + scale) + shift is scale_offset 1; the gate g * y
  /// is scale_offset 0 with no shift (shift_index -1). 0 <= scale_index < M; shift_index
  /// is -1 or in [0, M) and differs from scale_index. out may alias x.
  virtual void modulate(Stream s, const Tensor& out, const Tensor& x, const Tensor& mod,
                        int scale_index, int shift_index, float scale_offset) = 0;
  /// The gradients of modulate:
  ///   dx[b,t,c] = dout[b,t,c] * (scale_offset + mod[b,scale_index,c])  (overwritten;
  ///     dx may alias dout; an empty dx is skipped),
  ///   dmod[b,scale_index,c] = sum_t dout[b,t,c] x[b,t,c],
  ///   dmod[b,shift_index,c] = sum_t dout[b,t,c]  (when shift_index >= 0).
  /// Those chunks of dmod [B,M,C] (mod's dtype) are OVERWRITTEN and the other chunks left
  /// untouched, so that the M chunks of one adaLN output fill one dmod, each by its own
  /// call. The sums accumulate in fp32 or better and are rounded once.
  virtual void modulate_backward(Stream s, const Tensor& dx, const Tensor& dmod,
                                 const Tensor& dout, const Tensor& x, const Tensor& mod,
                                 int scale_index, int shift_index, float scale_offset) = 0;

  /// out = inp * keep / (1 - p), keep from `spec` (see DropoutSpec). out may alias inp.
  virtual void dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                               const DropoutSpec& spec) = 0;
  /// dinp = dout * keep / (1 - p), the mask replayed from `spec`. dinp may alias dout.
  virtual void dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                const DropoutSpec& spec) = 0;

  // ---- a mixture-of-experts layer (MoE) -----------------------------------------------
  // The feed-forward of a mixture of experts (Shazeer et al. 2017; Switch, Fedus et al.
  // 2021; Mixtral, Jiang et al. 2024; DeepSeek-V3, 2024) run dropless, as Megatron-core
  // and torchtitan do, or with a capacity per expert (token dropping, Switch; GShard):
  // each of N tokens is routed to k of E experts; the N*k (token, choice) slots are
  // permuted into expert order (rows of expert 0, then expert 1, ...; within an expert,
  // in token order), each expert's rows go through its own weights as one grouped GEMM
  // with ragged row counts (an expert may have no rows), and the expert outputs are
  // combined back per token, weighted by the router. Shapes: N tokens, C channels, E
  // experts, k choices per token, M = N*k slots. Slot (n, j) is token n's j-th choice;
  // rows int32 [N,k] holds its row in expert order (moe_permute_plan), or -1 for a slot
  // dropped past its expert's capacity: the kept slots' rows are a permutation of [0,
  // M_kept), M_kept = offsets[E] <= M (M_kept = M dropless), which the ops taking rows
  // check where they can read them on the host (the CPU), throwing kiln::Error
  // otherwise. The expert-row tensors stay [M, ...]; rows [M_kept, M) are neither
  // written nor read by these ops (a caller's elementwise op over the whole buffer sees
  // whatever they held).

  /// The router: scores fp32 [N,E] = softmax over the experts of logits fp32 [N,E], or
  /// the sigmoid of each logit (spec.scoring). Token n takes the spec.k experts with the
  /// largest fp32 sums scores[n,e] + bias[e] (bias fp32 [E], DeepSeek-V3's aux-loss-free
  /// balancing bias, Wang et al. 2024; empty for none: it changes the choice only), in
  /// decreasing order, equal sums broken by the lower expert index: expert_idx int32
  /// [N,k] (distinct experts, in [0, E)). expert_weight fp32 [N,k] = the chosen scores,
  /// divided by their sum (+ 1e-20) when spec.renormalize. All of scores, expert_idx and
  /// expert_weight are overwritten. With spec.round_robin (a test router; the CPU only,
  /// other backends throw) token n takes experts (n k + j) mod E instead, the weights
  /// still the chosen scores. Throws unless 1 <= spec.k <= E.
  virtual void moe_router_forward(Stream s, const Tensor& scores, const Tensor& expert_idx,
                                  const Tensor& expert_weight, const Tensor& logits,
                                  const Tensor& bias, const MoeRouterSpec& spec) = 0;
  /// dlogits fp32 [N,E] (overwritten) = the gradient through the renormalisation and the
  /// softmax or sigmoid of dexpert_weight fp32 [N,k] plus dscores fp32 [N,E] (a gradient
  /// on every score, e.g. an auxiliary load-balancing loss's; empty for none), from
  /// forward's scores and expert_idx. With w_j = s_j / S, S = sum_j s_{i_j} + 1e-20:
  /// ds_{i_j} += (g_j - sum_l g_l w_l) / S (g = dexpert_weight; ds_{i_j} += g_j without
  /// renormalisation); then dlogits = s (ds - sum_e ds_e s_e) (softmax) or ds s (1 - s)
  /// (sigmoid). The bias gets no gradient.
  virtual void moe_router_backward(Stream s, const Tensor& dlogits, const Tensor& dexpert_weight,
                                   const Tensor& dscores, const Tensor& scores,
                                   const Tensor& expert_idx, const MoeRouterSpec& spec) = 0;
  /// The router's load-balancing statistics, ACCUMULATED (+=) over calls, from logits
  /// fp32 [N,E] and expert_idx int32 [N,k] (Switch, Fedus et al. 2021, eq. 4; GShard; the
  /// router z-loss of ST-MoE, Zoph et al. 2022, eq. 5):
  ///   load fp32 [E] += the number of slots (n, j) with expert_idx[n,j] = e;
  ///   prob fp32 [E] += prob_scale * sum_n p[n,e], p[n] = softmax(logits[n]) (Softmax) or
  ///                    sigmoid(logits[n]) / sum_e sigmoid(logits[n,e]) (Sigmoid: the
  ///                    scores normalised per token, as Megatron-core);
  ///   z fp32 [1]    += z_scale * sum_n logsumexp_e(logits[n,e])^2.
  /// Each of load, prob and z may be empty to skip it. Sums in double, added once.
  virtual void moe_balance_stats(Stream s, const Tensor& load, const Tensor& prob,
                                 const Tensor& z, const Tensor& logits, const Tensor& expert_idx,
                                 MoeScoring scoring, float prob_scale, float z_scale) = 0;
  /// The gradients of the balancing losses, ADDED (+=) to dlogits fp32 [N,E]: of aux =
  /// sum_n sum_e g_e p[n,e] with g_e = aux_scale * load[e] (load fp32 [E]; empty: no aux
  /// term), p as moe_balance_stats's, and of z = z_scale * sum_n lse_n^2 (lse_n =
  /// logsumexp_e logits[n,e]). With a = g - sum_f g_f p[n,f]:
  ///   Softmax:  dlogits[n,e] += p[n,e] a_e;
  ///   Sigmoid:  dlogits[n,e] += s_e (1 - s_e) a_e / S  (s = sigmoid(logits[n]), S = sum s);
  ///   z:        dlogits[n,e] += 2 z_scale lse_n softmax(logits[n])_e.
  virtual void moe_balance_backward(Stream s, const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& load, MoeScoring scoring, float aux_scale,
                                    float z_scale) = 0;
  /// The token permutation's plan from expert_idx int32 [N,k] (ids in [0, E)), keeping at
  /// most `capacity` slots per expert (capacity 0: all, dropless). In (token, choice)
  /// order (token n ascending, then choice j), each expert keeps its first `capacity`
  /// slots and drops the rest (Megatron-core's "position" drop policy; every choice of a
  /// token is a different expert, so this is token order within each expert). offsets
  /// int32 [E+1], offsets[e] = the kept slots of experts below e (offsets[0] = 0,
  /// offsets[E] = M_kept; expert e keeps offsets[e+1] - offsets[e] = min(its slots,
  /// capacity)), and rows int32 [N,k]: a kept slot (n, j)'s row in expert order,
  /// offsets[e] + the number of kept slots (n', j') of expert e before it in (token,
  /// choice) order (stable: an expert's rows keep their tokens' order); -1 for a dropped
  /// slot. Computed on the device; the grouped GEMM reads offsets. Throws on an expert id
  /// out of range where the backend can check it (the CPU), and on capacity < 0.
  virtual void moe_permute_plan(Stream s, const Tensor& offsets, const Tensor& rows,
                                const Tensor& expert_idx, int64_t capacity) = 0;
  /// Tokens into expert order: out [M,C] with out[rows[n,j]] = inp[n] for every kept slot
  /// (inp [N,C]; one float dtype). Rows [0, M_kept) of out are written, the rest left.
  virtual void moe_permute(Stream s, const Tensor& out, const Tensor& inp,
                           const Tensor& rows) = 0;
  /// Its gradient: dinp [N,C] (overwritten) = sum over the kept slots j of dout[rows[n,
  /// j]], dout [M,C] (0 for a token whose slots were all dropped).
  virtual void moe_permute_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                    const Tensor& rows) = 0;
  /// The experts' outputs combined back per token: out [N,C] (overwritten) = sum over the
  /// kept slots j of expert_weight[n,j] * expert_out[rows[n,j]], expert_out [M,C] (out's
  /// dtype), expert_weight fp32 [N,k]; summed in fp32. A dropped slot adds nothing (the
  /// other weights are not renormalised).
  virtual void moe_unpermute(Stream s, const Tensor& out, const Tensor& expert_out,
                             const Tensor& expert_weight, const Tensor& rows) = 0;
  /// Its gradients, both overwritten: dexpert_out [M,C], dexpert_out[rows[n,j]] =
  /// expert_weight[n,j] * dout[n] for the kept slots (rows [M_kept, M) left);
  /// dexpert_weight fp32 [N,k] = dout[n] . expert_out[rows[n,j]] (an fp32 dot product),
  /// 0 for a dropped slot. Either may be empty to skip it.
  virtual void moe_unpermute_backward(Stream s, const Tensor& dexpert_out,
                                      const Tensor& dexpert_weight, const Tensor& dout,
                                      const Tensor& expert_out, const Tensor& expert_weight,
                                      const Tensor& rows) = 0;
  /// A grouped linear (a grouped GEMM with ragged row counts, the experts' projections):
  /// rows [offsets[e], offsets[e+1]) of out [M,O] = the same rows of inp [M,I] @
  /// weight[e]^T, weight [E,O,I] (each expert's a torch Linear's [out, in]); offsets int32
  /// [E+1] on the device as moe_permute_plan leaves them (0 = offsets[0] <= ... <=
  /// offsets[E] = M_kept <= M; an expert may have no rows). Rows [M_kept, M) of out are
  /// neither read nor written. No bias. One float dtype; fp32 accumulation. A backend
  /// that needs the counts on the host reads offsets there (the CPU: they are there; a
  /// GPU: one E+1 copy per call, or a device-side grouped GEMM); offsets that do not rise
  /// from 0 to at most M throw where they are read on the host.
  virtual void grouped_linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                                      const Tensor& weight, const Tensor& offsets) = 0;
  /// dinp [M,I] (rows [0, M_kept) overwritten) = per expert dout rows @ weight[e];
  /// dweight [E,O,I] += per expert dout rows^T @ inp rows (an expert without rows:
  /// unchanged), fp32 or weight's dtype (as linear_backward). Each of dinp and dweight
  /// may be empty.
  virtual void grouped_linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                       const Tensor& dout, const Tensor& inp,
                                       const Tensor& weight, const Tensor& offsets) = 0;

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

  /// Vocab-parallel softmax cross-entropy (Megatron-LM's vocab_parallel_cross_entropy),
  /// part 1: per-row statistics of the logits [N,Vl] of one rank's vocabulary columns
  /// [vocab_begin, vocab_begin + Vl), of which the first `valid` (0 <= valid <= Vl) are
  /// real vocabulary and the rest padding. stats fp32 [N,3]:
  ///   m = max_{j < valid} l[n,j]  (-inf when valid = 0),
  ///   s = sum_{j < valid} exp(l[n,j] - m)  (0 when valid = 0),
  ///   x = l[n, targets[n] - vocab_begin] when that column is one of the `valid`, else 0.
  /// targets int32 [N] are global ids (ignore_index -1 among them). Combined over the tp
  /// ranks: lse = M + log(sum_r s_r exp(m_r - M)), M = max_r m_r; loss = lse - sum_r x_r.
  virtual void cross_entropy_shard_stats(Stream s, const Tensor& stats, const Tensor& logits,
                                         const Tensor& targets, int64_t vocab_begin,
                                         int valid) = 0;
  /// Part 2: dlogits [N,Vl] (may alias logits) = grad_scale * (exp(l[n,j] - lse[n]) -
  /// [j == targets[n] - vocab_begin]) for j < valid; 0 in padding columns and in rows
  /// whose target is ignore_index. lse fp32 [N] is the combined log-sum-exp of part 1.
  virtual void cross_entropy_shard_backward(Stream s, const Tensor& dlogits,
                                            const Tensor& logits, const Tensor& targets,
                                            const Tensor& lse, int64_t vocab_begin, int valid,
                                            int ignore_index, float grad_scale) = 0;
  /// Token ids as one vocab-parallel rank sees them (Megatron's VocabParallelEmbedding):
  /// out[i] = ids[i] - begin when begin <= ids[i] < begin + count, else -1 (a row held by
  /// another rank, which embedding_forward reads as zero). int32, one shape; out may
  /// alias ids.
  virtual void shard_ids(Stream s, const Tensor& out, const Tensor& ids, int64_t begin,
                         int64_t count) = 0;

  /// Images to rows of flattened patches (a vision transformer's patch embedding input,
  /// Dosovitskiy et al. 2021): images fp32 [B,H,W,Ci] (channels last), P = `patch`
  /// dividing H and W; out [B, T, Ci*P*P] in any float dtype with T >= N = (H/P)(W/P).
  /// Row n = py*(W/P) + px of image b is the patch at (py, px), element c*P*P + dy*P + dx
  /// = images[b, py*P + dy, px*P + dx, c] (the order of a [C_out, Ci, P, P] convolution
  /// weight flattened, so such a weight is the patch projection). Rows N..T-1 are not
  /// written (room for a class token).
  virtual void patchify(Stream s, const Tensor& out, const Tensor& images, int patch) = 0;
  /// The exact inverse of patchify (a diffusion transformer's output back to images,
  /// DiT's "unpatchify", Peebles & Xie 2023): images fp32 [B,H,W,Ci] from patches
  /// [B, T, Ci*P*P] in any float dtype with T >= N = (H/P)(W/P), images[b, py*P + dy,
  /// px*P + dx, c] = patches[b, py*(W/P) + px, c*P*P + dy*P + dx] (patchify's element
  /// order). Rows N..T-1 are not read. Every element of images is written.
  virtual void unpatchify(Stream s, const Tensor& images, const Tensor& patches, int patch) = 0;

  /// Rectified flow / flow matching inputs (Liu et al. 2023, "Flow Straight and Fast";
  /// Lipman et al. 2023; the form of Esser et al. 2024, "Scaling Rectified Flow
  /// Transformers"): images, noise, xt and target fp32 of one shape [B, ...] (rank >= 1,
  /// B = size(0)), t fp32 [B] (the time of each sample, in [0, 1]):
  ///   xt = (1 - t_b) * images + t_b * noise,   target = noise - images  (the velocity).
  /// xt and target are distinct tensors; each may alias images or noise (every element is
  /// read before it is written).
  virtual void rectified_flow_inputs(Stream s, const Tensor& xt, const Tensor& target,
                                     const Tensor& images, const Tensor& noise,
                                     const Tensor& t) = 0;
  /// Per-sample mean squared error (the flow-matching loss): pred [B, ...] in any float
  /// dtype, target fp32 of pred's shape, losses fp32 [B]:
  ///   losses[b] = (1/n) sum over the n = numel/B elements i of sample b of
  ///               (pred[b,i] - target[b,i])^2,
  /// summed in fp32 or better (double on the CPU). When dpred is given (pred's dtype and
  /// shape; may alias pred) it is overwritten with grad_scale * 2 (pred - target) / n, the
  /// gradient of grad_scale * sum_b losses[b].
  virtual void mse_loss(Stream s, const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                        const Tensor& target, float grad_scale) = 0;

  /// A language model's loss sums on the device (no host read per micro-batch): losses
  /// fp32 [N], targets int32 [N], acc fp64 [2]:
  ///   acc[0] += sum of losses[i] over the i with targets[i] != -1 (nats; in double, in
  ///             an order fixed by N: bitwise reproducible),
  ///   acc[1] += the number of those i.
  virtual void accumulate_loss(Stream s, const Tensor& acc, const Tensor& losses,
                               const Tensor& targets) = 0;
  /// Vocab-parallel cross-entropy, between parts 1 and 2: the tp ranks' statistics of N
  /// rows, stats fp32 [tp*N, 3] (rank q's rows q*N .. q*N + N-1, as all_gather_rows leaves
  /// them), combined in double in rank order:
  ///   M = max_q m_q,  S = max(1, sum_{q: s_q > 0} s_q exp(m_q - M)),  lse[n] = M + log S
  /// (fp32 [N], rounded once), and, over the rows whose target is not -1,
  ///   acc[0] += M + log S - sum_q x_q,  acc[1] += 1    (acc fp64 [2], targets int32 [N]).
  virtual void cross_entropy_shard_combine(Stream s, const Tensor& lse, const Tensor& acc,
                                           const Tensor& stats, const Tensor& targets) = 0;
  /// The optimizer's gradient multiplier for global-norm clipping with loss scaling,
  /// computed on the device (the update reads it there): sumsq fp64 [1] the gradients'
  /// global sum of squares (loss-scaled), check fp64 [1] any value that must be finite
  /// (the loss sum) or empty, coef fp32 [1]:
  ///   norm = sqrt(sumsq) / loss_scale,
  ///   coef = min(1, max_norm / (norm + 1e-6)) / loss_scale   (1 / loss_scale when
  ///          max_norm <= 0; torch.nn.utils.clip_grad_norm_, clip_scale() on the host),
  /// in double, rounded to fp32 before the division by loss_scale, as clip_scale() then
  /// the division in float; NaN when sumsq or check is not finite (adamw_step then skips).
  virtual void clip_coefficient(Stream s, const Tensor& coef, const Tensor& sumsq,
                                const Tensor& check, double max_norm, float loss_scale) = 0;
  /// One AdamW step on a parameter tensor (any shape); m and v fp32 of the same shape.
  /// The gradient is multiplied by hp.grad_scale and, when `scale` (fp32 [1], on the
  /// device) is given, by scale[0]; a scale[0] that is not finite skips the update
  /// (param, m and v unchanged).
  virtual void adamw_step(Stream s, const Tensor& param, const Tensor& grad, const Tensor& m,
                          const Tensor& v, const Tensor& scale, const AdamWParams& hp) = 0;
  /// AdamW over many tensors in a few launches (a multi-tensor update, as apex's and
  /// torch's fused AdamW): for each t, the update of adamw_step(master or param, t.grad,
  /// t.m, t.v, scale, hp with weight_decay = t.weight_decay) and, with a master, param =
  /// the master rounded to param's dtype (to nearest even, as copy) in the same pass.
  /// Bitwise equal to those adamw_step and copy calls; a scale[0] that is not finite
  /// skips every update. hp.weight_decay is not used.
  virtual void adamw_multi_step(Stream s, std::span<const AdamWTensor> tensors,
                                const Tensor& scale, const AdamWParams& hp) = 0;

  /// An exponential moving average of the weights (Polyak & Juditsky 1992; as DiT's
  /// update_ema, Peebles & Xie 2023): ema fp32 [n], param [n] in any float dtype (the
  /// optimizer's fp32 master weights, or the parameters themselves), any shapes of n
  /// elements; 0 <= decay <= 1:
  ///   ema = decay * ema + (1 - decay) * param,
  /// in fp32, 1 - decay computed in double and rounded once. param is only read.
  virtual void ema_update(Stream s, const Tensor& ema, const Tensor& param, float decay) = 0;

 protected:
  /// supports(op, dtype), as this backend answers it.
  virtual bool runs(Op op, DType dtype) const = 0;
};

/// Refuses a feature that needs the ops of `family` on a backend that does not run one of
/// them with `dtype`: kiln::Error "<feature> needs <op>, which the <backend> backend does
/// not run with <dtype>", `feature` naming the config key that asked for it.
void require_ops(const Backend& be, OpFamily family, DType dtype, std::string_view feature);

/// dst (any float dtype, on be's device) <- n = dst.numel() fp32 host values, converted
/// (round to nearest even) on the host first.
void upload_f32(Backend& be, const Tensor& dst, const float* src);
/// fp32 host values <- src (any float dtype).
void download_f32(Backend& be, float* dst, const Tensor& src);
std::vector<float> download_f32(Backend& be, const Tensor& src);
/// adamw_multi_step's update of one tensor through be's adamw_step and copy (the
/// per-tensor path: the CPU backend's whole implementation, the CUDA backend's for fp16
/// parameters).
void adamw_tensor_step(Backend& be, Stream s, const AdamWTensor& t, const Tensor& scale,
                       const AdamWParams& hp);
/// The sum of squares of x's elements in double, read back to the host (synchronises):
/// Backend::sum_squares into a fresh accumulator.
double read_sum_squares(Backend& be, const Tensor& x);
/// FNV-1a 64 of a tensor's bytes (copied to the host), continuing from h: to compare
/// replicas bitwise across ranks.
uint64_t hash_bytes(Backend& be, const Tensor& t, uint64_t h = 1469598103934665603ull);

}  // namespace kiln
