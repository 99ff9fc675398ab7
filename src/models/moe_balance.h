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
// step's micro-batches and data-parallel ranks. Each rank balances over its own
// micro-batch (aux_loss_scope "micro_batch").
//
// aux_loss_scope "global" (Megatron-core's global_aux_loss) balances over the G ranks'
// micro-batches of the same micro-step together: after the forward, the counts (and the
// hf totals) are summed over the MoeBalanceGroup, N becomes the global G N, and each rank
// weighs its own probabilities by them. Rank r's term T_r = coef E / ((G N)^2 k) sum_e
// C_e P^r_e (P^r_e its tokens' sum of p) sums over the ranks to the micro_batch formula
// over the concatenated tokens; a rank reports and differentiates G T_r, so that the mean
// over the ranks (the reported figure) is that global aux and, with the gradients summed
// over the ranks at scale 1 / (grad_accum G), the global aux enters once per micro-step
// with 1 / grad_accum. The step's tokens per expert stay the rank's own (the trainer sums
// them). The z-loss stays per micro-batch. With G = 1 both scopes are the same, bit for bit.
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
  bool global = false;   // moe.aux_loss_scope "global": counts summed over the group
  bool expert_bias = false;      // moe.expert_bias: a selection bias per layer
  float bias_update_rate = 0.f;  // moe.bias_update_rate: its step per update
};

class MoeBalance {
 public:
  /// `layers`: the MoE layers of the model in block order (all of one E and k). With an
  /// expert_bias, binds each layer's expert_bias to its row of a zeroed fp32 [L, E].
  MoeBalance(Backend& be, const MoeBalanceSpec& spec, std::vector<nn::MoeMlp*> layers);

  void set_grad_scale(float scale) { grad_scale_ = scale; }
  /// The data-parallel group of the "global" scope (not owned; nullptr: a group of one).
  void set_group(MoeBalanceGroup* group) { group_ = group; }
  /// A training forward of N tokens begins: the micro-batch's statistics are zeroed.
  void begin_forward(int64_t N);
  /// The buffers and scales of MoE layer `m` (0-based among the MoE layers) for its
  /// forward and backward in the current micro-batch.
  nn::MoeBalancePass pass(int m) const;
  /// After every MoE layer's forward: the micro-batch's aux loss and counts added to the
  /// step's sums (the hf form's totals over the layers made first), and with dropping its
  /// dropped slots.
  void end_forward();
  /// The figures since the last take(), then reset (one host read).
  MoeStats take();
  /// The bias update above from step.tokens_per_expert (the step's global counts); the
  /// moved bias into step.expert_bias. Nothing without an expert_bias.
  void update_bias(MoeStats& step);
  /// The layers' selection biases (none without an expert_bias).
  std::vector<ModelBuffer> buffers() const;

 private:
  /// The micro-batch's slots dropped past the capacity, from its counts (host read).
  double dropped_slots() const;

  Backend& be_;
  MoeBalanceSpec spec_;
  int L_ = 0;
  int64_t E_ = 0, k_ = 0, N_ = 0;
  double capacity_factor_ = 0.0;  // the layers' (nn::MoeSpec); 0: dropless
  double dropped_ = 0.0;          // since the last take()
  float grad_scale_ = 1.f;
  MoeBalanceGroup* group_ = nullptr;
  int64_t micro_batches_ = 0;
  // The micro-batch's: load [L + 1, E] (row L: the sum over the layers), prob [L, E]
  // (hf: row 0 for every layer); the step's: sums [2] (aux, z), load_sum [L, E]; dot [1, 1].
  Tensor load_, prob_, sums_, load_sum_, dot_;
  Tensor bias_;  // fp32 [L, E], with an expert_bias
  std::vector<std::string> bias_names_;  // [L]
};

}  // namespace kiln
