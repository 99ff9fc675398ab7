// The balancing losses of a decoder's mixture-of-experts blocks (issue 38's design
// sheet), over the statistics each MoeMlp adds in forward (nn/moe.h). For a micro-batch of
// N tokens, MoE layers l = 1..L of E experts taking k each, c_e the slots routed to expert
// e, p the balancing probabilities (softmax scores; with sigmoid scoring the sigmoids
// normalised per token, as Megatron-core):
//   per_layer (Switch, Fedus et al. 2021, eq. 4; GShard; Megatron-core):
//     aux = coef * sum_l E / (N k) * sum_e c_e^l * (1/N) sum_n p^l[n,e];
//   hf (transformers' load_balancing_loss_func, Mixtral and Qwen3-MoE): the layers'
//     routers concatenated to L N rows, C_e = sum_l c_e^l, S_e = sum_{l,n} p^l[n,e]:
//     aux = coef * E * sum_e (C_e / (L N)) (S_e / (L N))  (softmax scoring only);
//   z (ST-MoE, Zoph et al. 2022, eq. 5): z = z_coef * sum_l (1/N) sum_n lse^l_n^2.
// The counts are constants (no gradient flows through the choice), so backward adds
// dL/dp[n,e] = scale * coef * E / (N^2 k) * c_e^l (per_layer) or scale * coef * E /
// (L N)^2 * C_e (hf) and the z-loss's gradient to each router's logits. Every token counts,
// ignored targets too (as Hugging Face without an attention mask). `scale` is
// Model::set_aux_loss_scale's: the losses enter the optimised sum as their mean over the
// step's micro-batches and data-parallel ranks.
//
// The balancing group. aux_loss_scope "micro_batch" balances over the micro-batch, which
// context parallelism spreads over the Gc ranks of the cp group (each holds N = B T / Gc of
// its tokens; Gc = 1 without cp); "global" (Megatron-core's global_aux_loss) over the G =
// dp x Gc ranks' micro-batches of the same micro-step together. Either way, after the
// forward the counts (and the hf totals) are summed over the group (G = Gc for
// micro_batch), the aux's N becomes G N, and each rank weighs its own probabilities by
// them: rank r's term T_r = coef E / ((G N)^2 k) sum_e C_e P^r_e (P^r_e its tokens' sum of
// p) sums over the group to the formula over the concatenated tokens. A rank reports G T_r,
// so that the mean over the dp x cp ranks (the reported figure) is that aux, and
// differentiates (G / Gc) T_r: summed over the ranks at scale 1 / (grad_accum dp), the
// micro-batch's aux enters once per dp rank (micro_batch), the global aux once per
// micro-step (global), each with 1 / grad_accum. The z-loss is the micro-batch's mean: a
// rank reports its own tokens' mean (the mean over the cp ranks is the micro-batch's) and
// differentiates its sum over the micro-batch's Gc N tokens. The step's tokens per expert
// stay the rank's own (the trainer sums them). With G = 1 both scopes are the same, bit
// for bit.
//
// Pipeline parallelism: a stage holds some of the MoE layers (`held`); the statistics of
// each micro-batch in flight live in its own MoeMicroStats (a DecoderModel slot's), and a
// chunk's forward covers its own layers [first, end) (their global indices among the MoE
// layers). A stage's figures cover its layers (the others' rows zero): the trainer sums
// the stages' aux, z and tokens per expert over the pp group. The hf form couples every
// layer and runs as one chunk only.
//
// Auxiliary-loss-free balancing (DeepSeek-V3, Wang et al. 2024, "Auxiliary-Loss-Free Load
// Balancing Strategy"; Megatron-core's expert bias), with moe.expert_bias: each MoE layer
// chooses by scores + b (nn/moe.h), and after each applied update, at moe.bias_update_rate u
// (0: b frozen),
//   b_e <- b_e + u * sign(mean_e' c_e' - c_e),
// c the layer's tokens per expert over the step's global batch (summed over the
// micro-batches and data-parallel ranks), in fp32 on the host: the same bits on every
// rank. b starts at zero and is checkpointed (Model::buffers) for exact resume.
//
// The values stay on the device: each micro-batch adds its aux and z to fp32 sums and its
// per-expert counts to per-layer sums, which take() reads back once.
//
// Token dropping (the layers' capacity_factor > 0, nn/moe.h): the counts above are the
// router's choice before dropping (as Megatron-core's aux loss). The slots dropped in a
// micro-batch are sum over the layers and experts of max(0, c_e - capacity), read from
// its counts on the host once per training micro-batch (one [L, E] copy), summed for
// MoeStats::dropped_slots.
#pragma once

#include "backend/backend.h"
#include "models/model.h"
#include "nn/moe.h"

#include <vector>

namespace kiln {

/// The balancing settings of a model's MoE blocks (the [model] moe.* keys).
struct MoeBalanceSpec {
  enum class AuxType { PerLayer, Hf };
  float aux_coef = 0.f;  // moe.aux_loss_coef
  AuxType aux_type = AuxType::PerLayer;
  float z_coef = 0.f;    // moe.z_loss_coef
  bool global = false;   // moe.aux_loss_scope "global": counts summed over dp x cp
  bool expert_bias = false;      // moe.expert_bias: a selection bias per layer
  float bias_update_rate = 0.f;  // moe.bias_update_rate: its step per update
};

/// One micro-batch's statistics from its forward to its backward (one per micro-batch in
/// flight): load fp32 [L + 1, E] (row L: the sum over the layers), prob fp32 [L, E] (hf:
/// row 0 for every layer), this rank's N tokens and the MoE layers [first, end) its chunk
/// runs.
struct MoeMicroStats {
  Tensor load, prob;
  int64_t N = 0;
  int first = 0, end = 0;
};

class MoeBalance {
 public:
  /// `layers`: every MoE layer of the model in block order (all of one E and k); `held`:
  /// whether this pipeline stage holds each (empty: all). With an expert_bias, binds each
  /// layer's expert_bias to its row of a zeroed fp32 [L, E].
  MoeBalance(Backend& be, const MoeBalanceSpec& spec, std::vector<nn::MoeMlp*> layers,
             std::vector<bool> held = {});

  void set_grad_scale(float scale) { grad_scale_ = scale; }
  /// The ranks sharing each micro-batch (the cp group) and those of the "global" scope (dp
  /// x cp); not owned; nullptr: a group of one.
  void set_groups(MoeBalanceGroup* micro_batch, MoeBalanceGroup* global) {
    micro_group_ = micro_batch;
    global_group_ = global;
  }
  /// Buffers for one micro-batch in flight.
  MoeMicroStats micro_stats() const;
  /// A training forward of this rank's N tokens through MoE layers [first, end) begins on
  /// `mb` (zeroed). `count`: this pass counts the micro-batch for take()'s means (once per
  /// micro-batch on each rank: its first chunk). Throws kiln::Error for the hf form on
  /// fewer than all layers.
  void begin_forward(MoeMicroStats& mb, int64_t N, int first, int end, bool count);
  /// The buffers and scales of MoE layer `m` (global index, in mb's range) for its forward
  /// and backward in micro-batch `mb`.
  nn::MoeBalancePass pass(const MoeMicroStats& mb, int m) const;
  /// After the forward of mb's layers: their counts summed over the balancing group, the
  /// micro-batch's aux loss and counts added to the step's sums (collective over the group
  /// when mb has layers and the aux loss is on), and with dropping its dropped slots.
  void end_forward(MoeMicroStats& mb);
  /// The figures since the last take(), then reset (one host read). Rows of layers this
  /// stage does not hold are zero.
  MoeStats take();
  /// The bias update above of the held layers from step.tokens_per_expert (the step's
  /// global counts); the bias of every layer into step.expert_bias (zero rows for those
  /// not held). Nothing without an expert_bias.
  void update_bias(MoeStats& step);
  /// The held layers' selection biases (none without an expert_bias).
  std::vector<ModelBuffer> buffers() const;

 private:
  /// The micro-batch's slots dropped past the capacity in mb's layers, from this rank's
  /// counts (host read).
  double dropped_slots(const MoeMicroStats& mb) const;
  /// The balancing group (by scope), its size G and the micro-batch group's size Gc.
  MoeBalanceGroup* group() const { return spec_.global ? global_group_ : micro_group_; }
  double group_size() const { return group() ? static_cast<double>(group()->size()) : 1.0; }
  double micro_group_size() const {
    return micro_group_ ? static_cast<double>(micro_group_->size()) : 1.0;
  }

  Backend& be_;
  MoeBalanceSpec spec_;
  int L_ = 0;
  int64_t E_ = 0, k_ = 0;
  double capacity_factor_ = 0.0;  // the layers' (nn::MoeSpec); 0: dropless
  double dropped_ = 0.0;          // since the last take()
  std::vector<bool> held_;  // [L]
  float grad_scale_ = 1.f;
  MoeBalanceGroup* micro_group_ = nullptr;
  MoeBalanceGroup* global_group_ = nullptr;
  int64_t micro_batches_ = 0;
  // The step's: sums [2] (aux, z), load_sum [L, E]; dot [1, 1] scratch.
  Tensor sums_, load_sum_, dot_;
  Tensor bias_;  // fp32 [L, E], with an expert_bias
  std::vector<std::string> bias_names_;  // [L], with an expert_bias
};

}  // namespace kiln
