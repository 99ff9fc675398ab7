// A mixture-of-experts feed-forward (MoE) in place of a block's MLP: a router,
// E routed SwiGLU experts of which each token takes k, and optional always-on shared
// experts (Shazeer et al. 2017; Switch, Fedus et al. 2021; Mixtral, Jiang et al. 2024;
// DeepSeek-V3, 2024; Qwen3-MoE), run as Megatron-core and torchtitan do on the ops of
// OpFamily::MoE (backend.h; docs/architecture.md, "The mixture-of-experts ops").
//
// For x [N, C] (N = B*T tokens, C channels) in the model dtype:
//   logits fp32 [N,E] = x @ router^T, computed in fp32 whatever the model dtype (x and
//     the router weight converted to fp32 first);
//   scores = softmax(logits) or sigmoid(logits); token n takes the k experts of largest
//     score (ties to the lower index); w [N,k] = the chosen scores, / their sum when
//     norm_topk_prob (moe_router_forward);
//   routed y_n = sum_j w[n,j] down_e(silu(gate_e x_n) * up_e x_n), e = choice j's expert:
//     the N*k slots permuted into expert order (moe_permute_plan, moe_permute), the gate
//     and up projections of every expert one grouped linear with weight [E, 2F, C] (rows
//     [0,F) gate, [F,2F) up), SwiGLU, the down projections [E, C, F], the rows weighted
//     back per token (moe_unpermute);
//   out = routed + shared(x), shared a plain SwiGLU Mlp of width Fs (no gate on it).
// Token dropping (MoeSpec::capacity_factor f > 0; Switch, Fedus et al. 2021, eq. 3; GShard;
// Megatron-core's moe_expert_capacity_factor): in forward (training and evaluation, not
// decode, which stays dropless) each expert takes at most capacity = max(1, ceil((N k / E)
// f)) slots of the call's N tokens (moe_capacity). Who is dropped: within each expert the
// slots in (token, choice) order, token n of the flattened [B*T] rows ascending, keep the
// first `capacity` (Megatron-core's "position" drop policy; moe_permute_plan). The order
// is a property of the call's rows alone, so a layout that keeps the micro-batch whole on
// every rank (dp, pp; tp and sequence parallel gather it) drops the same slots. A dropped
// slot adds nothing to its token (its residual, and the shared experts, pass through);
// the token's other weights are not renormalised (they are computed before dropping, as
// Megatron-core and Switch); no gradient reaches a dropped slot's expert or its weight.
// The balancing statistics (counts c_e, p, z) stay those of the router's choice before
// dropping, as Megatron-core's aux loss (its routing map before capacity) and z-loss;
// DeepSeek-V3's bias update reads the same pre-drop counts (Megatron-core counts the kept
// ones there).
// Parameters (prefix e.g. "model.layers.3.mlp"):
//   <prefix>.router.weight                    [E, C]      N(0, init_std^2), decays
//   <prefix>.experts.gate_up_proj.weight      [E, 2F, C]  N(0, init_std^2), decays
//   <prefix>.experts.down_proj.weight         [E, C, F]   N(0, proj_init_std^2), decays
//   <prefix>.shared_experts.gate_up_proj.weight [2Fs, C], <prefix>.shared_experts
//   .down_proj.weight [C, Fs] (when Fs > 0; as Mlp's).
// LoRA (train.lora; nn/expert_lora.h): gate_up_lora and down_lora hold the adapters a LoRA
// plan puts on the experts' projections (each expert its own A and B, added into the
// gate/up output before the SwiGLU and into the experts' output before the combine), and
// the shared experts' Linears take adapters as any Linear (shared_linears()).
//
// Balancing losses (issue 38's design sheet): forward adds the layer's statistics to the
// buffers a MoeBalancePass names (moe_balance_stats: the per-expert slot counts c_e, the
// scaled sums of the balancing probabilities p, the scaled sum of logsumexp(logits)^2),
// and backward adds the gradients of the auxiliary loss sum_{n,e} g_e p[n,e] (g_e =
// aux_grad_scale * grad_load[e]) and of the z-loss to the router's logits
// (moe_balance_backward). The model chooses the scales, the loss form (per layer or
// Hugging Face's over all layers) and where the counts are summed (DecoderModel).
//
// Saved for backward (saved_specs(), in this order): logits, scores fp32 [N,E];
// expert_idx int32, expert_weight fp32, rows int32 [N,k]; offsets int32 [E+1]; the
// permuted tokens [M,C] (Cheap: one gather from the block's saved input), the experts'
// gate/up output [M,2F], their SwiGLU [M,F] (Cheap), their output [M,C] (M = N*k; with
// dropping only rows [0, M_kept) hold kept slots, the gate/up output's rest zeroed); then
// the shared Mlp's. The routing is a function of the input only, so a recompute re-routes
// identically (bitwise the same choice, counts and gradients).
// Auxiliary-loss-free balancing (DeepSeek-V3, Wang et al. 2024): with `expert_bias` bound
// (fp32 [E], the model's state, not a parameter: models/moe_balance.h moves it after each
// update), the choice takes the k largest scores + bias; the weights stay the scores.
// Tensor parallel (shard(); Megatron-LM's split of each expert as of a dense Mlp): the
// block's MLP placements, fc Column and proj Row, split every expert's hidden units over
// the tp group: rank r holds gate_up [E, 2F/tp, C] (its F/tp rows of the gate piece and
// of the up piece, split separately as the dense SwiGLU's) and down [E, C, F/tp]; the
// shared experts' Mlp takes the same placements (nn/mlp.h). The router weight [E, C] is
// replicated. The router reads the whole input [N, C] on every rank (under sequence
// parallelism the rank's rows all-gathered, as a column-parallel Linear gathers them), so
// its fp32 logits, choice, weights, permutation plan and balancing statistics are the
// same bits on every tp rank, never counted tp times. The experts' outputs are partial
// sums over tp: the routed output is all-reduced (reduce-scattered to the rank's rows
// under sequence parallelism) as a row-parallel Linear's, and the shared experts' Mlp
// reduces its own. Backward: the weights' gradient [N,k] (dout dotted with the partial
// expert outputs) is all-reduced over tp before the router's backward, so the router's
// logits' and weight's gradients are the single process's on every rank (a replicated
// parameter: no tp reduction); the router's input gradient, whole on every rank, is
// added on tp rank 0 only to the experts' partial one, which the layer then reduces (all
// reduce, or reduce-scatter to the rank's rows) as a column-parallel Linear's.
// Expert parallel (set_expert_parallel(); GShard; Megatron-core's all-to-all dispatcher;
// nn/expert_parallel.h): over an ep group of ep ranks, rank r holds experts [r El, (r+1)
// El) of gate_up and down (El = E / ep; ParamSlice's ep cut, composed with the tp cut of
// their hidden units). Each rank routes its own tokens as without ep; its kept slots, in
// chunk order (two chunks of what it sends each rank; rows [N,k] is saved in chunk
// order), travel to their experts' ranks (ep_dispatch_start/_finish), each rank runs the
// grouped SwiGLU on the rows it received, by local expert, one chunk while the other
// travels, and the outputs travel back (ep_combine_start) to be weighted per token as
// before; backward sends the outputs' gradients the same way and their input gradients
// back. An expert's rows are its slots from source rank 0, then 1, ..., each in token
// order (a fixed function of the routing); a row's output depends on its own input
// alone, so it is the single process's. The received rows vary with the routing, so the
// expert side's activations (received tokens [R,C], gate/up output [R,2F], SwiGLU
// [R,F]) are allocated per call (category Activations) and kept from forward to backward
// with the dispatch (saved_specs() lists the permuted tokens, gate/up output and SwiGLU
// with 0 rows); they live with the call's expert-output tensor, so full checkpointing's
// shared storage keeps one block's.
#pragma once

#include "backend/backend.h"
#include "nn/expert_lora.h"
#include "nn/expert_parallel.h"
#include "nn/mlp.h"
#include "nn/param.h"
#include "nn/saved.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kiln::nn {

/// The shape of a MoE layer; num_experts 0 means a dense MLP (BlockSpec::moe).
struct MoeSpec {
  int64_t num_experts = 0;    // E
  int top_k = 2;              // k, 1 <= k <= E
  int64_t expert_hidden = 0;  // F, each expert's SwiGLU width
  int64_t shared_hidden = 0;  // Fs, the shared experts' SwiGLU width; 0 = none
  MoeScoring scoring = MoeScoring::Softmax;
  bool norm_topk_prob = true;  // renormalise the k chosen scores to sum 1
  bool round_robin = false;    // a test router: token n takes experts (n k + j) mod E
  double capacity_factor = 0.0;  // > 0: token dropping past each expert's capacity; 0: dropless
  bool enabled() const { return num_experts > 0; }
  MoeRouterSpec router() const { return {scoring, top_k, norm_topk_prob, round_robin}; }
};

/// The slots each expert keeps of a call over N tokens with k of E experts each and capacity
/// factor f: max(1, ceil((N k / E) f)) in double (Switch eq. 3; Megatron-core's
/// get_capacity), at most N (an expert's slots can be no more: nothing dropped); 0
/// (dropless) when f = 0.
int64_t moe_capacity(double capacity_factor, int64_t N, int64_t k, int64_t E);

/// One call's balancing-loss buffers and scales (see the top of this file). Forward adds
/// (when not recomputing) the slot counts to `load` fp32 [E], prob_scale * sum_n p[n,e] to
/// `prob` fp32 [E] and z_scale * sum_n lse_n^2 to `z` fp32 [1] (each may be empty);
/// backward adds to the router's logits the gradient of aux_grad_scale * sum_{n,e}
/// grad_load[e] p[n,e] (grad_load fp32 [E], empty for none) and of z_grad_scale * sum_n
/// lse_n^2 (0 for none).
struct MoeBalancePass {
  Tensor load, prob, z;
  float prob_scale = 0.f, z_scale = 0.f;
  Tensor grad_load;
  float aux_grad_scale = 0.f, z_grad_scale = 0.f;
};

/// Scratch of a MoE layer for [B, T] (N = B*T, M = N*k), shared by every MoE block: the
/// router's fp32 copies x32 [N,C], w32 and dw32 [E,C] and wtmp [E,C] (model dtype) in a
/// low-precision model (else empty); dlogits fp32 [N,E]; dweight fp32 [N,k]; two expert
/// buffers a, b [M, max(C, 2F)] and tokens [N,C] in the model dtype; the shared experts'
/// dfc [N,2Fs] and dact [N,Fs] (empty without them); under sequence parallelism gathered
/// [N,C], the input's rows of every tp rank (else empty). F and Fs are the rank's (/tp).
struct MoeScratch {
  Tensor x32, w32, dw32, wtmp, dlogits, dweight, a, b, tokens, shared_dfc, shared_dact, gathered;
};

class MoeMlp {
 public:
  /// `prefix` names the parameters (e.g. "model.layers.3.mlp"). Throws kiln::Error for a
  /// spec without experts, k outside [1, E] or F <= 0.
  MoeMlp(const std::string& prefix, int64_t C, const MoeSpec& spec, float init_std,
         float proj_init_std);

  /// Installs the plan's placements (see the top of this file): fc Column and proj Row
  /// split every expert's hidden units and the shared experts' over their group; both
  /// Replicated leave the layer whole. Call before the model lays out its parameters.
  /// Throws kiln::Error naming the parameter for another pair of styles, or unless F (and
  /// Fs) divide by the group's size.
  void shard(const MlpPlacement& placement);
  /// Installs expert parallelism over `group` (see the top of this file): gate_up and down
  /// keep this rank's E / ep experts. Call before the model lays out its parameters (the
  /// tensor-parallel placement may come before or after). Throws kiln::Error naming the
  /// layer unless ep divides E. A group of one rank changes nothing.
  void set_expert_parallel(EpGroup& group);
  /// Whether the experts are split over an ep group of more than one rank.
  bool expert_parallel() const { return ep_ != nullptr && ep_->size() > 1; }
  /// Whether the layer's input and output are the rank's rows (sequence parallel, tp > 1).
  bool sequence_parallel() const { return placement_.active() && placement_.sequence_parallel; }
  /// What forward saves, in the order `saved` holds it (see the top of this file); N =
  /// B*T rows whatever the layout, widths the rank's.
  std::vector<SavedSpec> saved_specs(int64_t B, int64_t T, DType dtype) const;
  size_t num_saved() const {
    return size_t{kNumRouted} + (shared_ ? size_t{Mlp::kNumSaved} : size_t{0});
  }
  MoeScratch make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const;
  /// out [B,T,C] (overwritten) from inp [B,T,C] (each the rank's rows [BT/tp, C] under
  /// sequence parallelism), filling `saved`, each expert keeping at most
  /// moe_capacity(spec().capacity_factor, B*T, k, E) slots of the whole micro-batch's B*T
  /// tokens. `recomputing`: a re-run for backward (full checkpointing), which adds no
  /// statistics.
  void forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
               const Tensor& inp, const MoeScratch& w, const MoeBalancePass& balance,
               bool recomputing) const;
  /// Refills the Cheap saved tensors (permuted tokens, activations) from the others and
  /// forward's inp (gathered into w.gathered under sequence parallelism).
  void recompute(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& inp,
                 const MoeScratch& w) const;
  /// dinp [B,T,C] (overwritten) from dout [B,T,C] (the rank's rows as forward's);
  /// parameter gradients accumulate (+=), frozen ones skipped.
  void backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                const Tensor& dout, const Tensor& inp, const MoeScratch& w,
                const MoeBalancePass& balance) const;
  /// Inference: out [B,Tq,C] from inp [B,Tq,C], its saved tensors and scratch allocated
  /// for the call (category Temporaries), no statistics; dropless whatever the capacity
  /// factor (a decode step's few tokens would make the capacity a matter of batching).
  void decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const;
  /// router, gate_up, down, the experts' adapters (gate_up's, down's), the shared experts'.
  void collect(std::vector<Param*>& out);

  /// The experts' projections that take LoRA adapters, by their role in a block's MLP
  /// (nn::TransformerBlock::linears): "mlp.fc" gate_up (pieces gate, up), "mlp.proj" down.
  std::vector<std::pair<const char*, ExpertLora*>> expert_projections();
  /// The shared experts' Linears by the same roles ("mlp.fc", "mlp.proj"); none without.
  std::vector<std::pair<const char*, Linear*>> shared_linears();

  const MoeSpec& spec() const { return spec_; }
  /// The name of the selection bias in checkpoints: "<prefix>.router.expert_bias".
  std::string expert_bias_name() const { return prefix_ + ".router.expert_bias"; }
  Param router, gate_up, down;
  ExpertLora gate_up_lora, down_lora;  // the experts' LoRA adapters (none unless a plan adds)
  /// DeepSeek-V3's selection bias, fp32 [E], a view the model binds (and updates between
  /// steps); empty: none. It changes the choice only, never the weights or a gradient.
  Tensor expert_bias;

 private:
  enum : size_t {
    kLogits, kScores, kExpertIdx, kExpertWeight, kRows, kOffsets, kPermuted, kHidden, kAct,
    kExpertOut, kNumRouted
  };
  /// The layer's whole input x [N, C]: inp's rows, all-gathered into w.gathered under
  /// sequence parallelism.
  Tensor whole_input(Backend& be, Stream s, const Tensor& inp, const MoeScratch& w) const;
  /// The routed output y [N, C], partial sums over tp when split, into out: all-reduced
  /// in place (y is out), or reduce-scattered to the rank's rows under sequence
  /// parallelism; nothing when whole.
  void reduce_output(Backend& be, Stream s, const Tensor& out, const Tensor& y) const;
  /// The experts' and router's input gradient dx [N, C] (partial sums over tp when split)
  /// into dinp: all-reduced in place (dx is dinp), or reduce-scattered to the rank's rows.
  void reduce_input_grad(Backend& be, Stream s, const Tensor& dinp, const Tensor& dx) const;
  /// t as rows of C channels.
  Tensor rows_of(const Tensor& t) const { return t.reshape(Shape{t.numel() / C_, C_}); }
  /// Whether the experts are split over tp (their outputs partial sums).
  bool split() const { return placement_.active(); }
  /// logits (fp32, in fp32 whatever the dtype), the choice, weights and the permutation plan
  /// (capacity 0: dropless).
  void route(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& x,
             const MoeScratch& w, int64_t capacity) const;
  /// forward, with the capacity of spec().capacity_factor or `dropless`.
  void run(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
           const Tensor& inp, const MoeScratch& w, const MoeBalancePass& balance,
           bool recomputing, bool dropless) const;
  /// The router linear's backward: dx [N,C] (overwritten) and the weight's gradient.
  void router_backward(Backend& be, Stream s, const Tensor& dx, const Tensor& dlogits,
                       const Tensor& x, const MoeScratch& w) const;
  /// The grouped SwiGLU experts over rows grouped by expert (offsets int32 [local E + 1]):
  /// hidden [R,2F] = in [R,C] @ gate_up_e^T (+ its adapters), act [R,F] = swiglu(hidden),
  /// out [R,C] = act @ down_e^T (+ its adapters). `ragged`: rows past offsets[E] (dropped
  /// slots) are not computed; hidden's are zeroed so that the SwiGLU over them stays finite.
  void experts_forward(Backend& be, Stream s, const Tensor& out, const Tensor& hidden,
                       const Tensor& act, const Tensor& in, const Tensor& offsets,
                       bool ragged) const;
  /// Their backward: din [R,C] (rows past offsets[E] unwritten) from dout [R,C] and
  /// forward's in, hidden and act, with dh [R,2F] and dact [R,F] as scratch; the weights'
  /// and adapters' gradients +=.
  void experts_backward(Backend& be, Stream s, const Tensor& din, const Tensor& dh,
                        const Tensor& dact, const Tensor& dout, const Tensor& in,
                        const Tensor& hidden, const Tensor& act, const Tensor& offsets,
                        bool ragged) const;
  /// The shared experts' part of saved.
  std::span<const Tensor> shared_saved(std::span<const Tensor> saved) const {
    return saved.subspan(kNumRouted, Mlp::kNumSaved);
  }

  /// Each expert's hidden units on this rank: F, or F/tp when split.
  int64_t local_hidden() const { return down.local_shape()[2]; }

  /// The experts' side of an expert-parallel call, kept from forward to backward (see the
  /// top of this file): the dispatch and, per chunk, the received tokens [R_c,C] by local
  /// expert, the gate/up output [R_c,2F] and the SwiGLU [R_c,F].
  struct EpSaved {
    EpExchange exchange;
    struct Chunk {
      Tensor in, hidden, act;
    };
    std::array<Chunk, kEpChunks> chunks;
  };
  /// Forward's experts under expert parallelism: the dispatch planned from
  /// saved[kOffsets], saved[kRows] moved to chunk order, x [N,C] permuted into `permuted`
  /// [M,C], its kept rows sent to their experts' ranks chunk by chunk, the grouped SwiGLU
  /// there (chunk c while c+1 travels), the outputs back into expert_out [M,C] (chunk
  /// order); the expert side kept in ep_saved_ under expert_out's storage.
  void ep_experts_forward(Backend& be, Stream s, const Tensor& expert_out,
                          const Tensor& permuted, const Tensor& x,
                          std::span<const Tensor> saved) const;
  /// Backward's: dexp [M,C] (the expert outputs' gradient, chunk order) to the experts'
  /// ranks, their backward there chunk by chunk (weight gradients +=), the inputs'
  /// gradient back into dxp [M,C]; frees the call's kept expert side.
  void ep_experts_backward(Backend& be, Stream s, const Tensor& dxp, const Tensor& dexp,
                           const Tensor& expert_out) const;

  std::string prefix_;
  MoeSpec spec_;
  int64_t C_;
  TpPlacement placement_;  // the experts' gate_up (Column) placement: the group, SP
  EpGroup* ep_ = nullptr;  // expert parallelism's group (not owned); nullptr: none
  // Each call's expert side under expert parallelism, by its expert_out storage.
  mutable std::map<const void*, EpSaved> ep_saved_;
  std::optional<Mlp> shared_;
};

}  // namespace kiln::nn
