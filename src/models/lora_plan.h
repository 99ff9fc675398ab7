// The LoRA plan (train.lora, docs/lora.md): puts low-rank adapters (nn/lora.h) on the
// chosen Linears of a model's transformer blocks and freezes everything else, before the
// model lays out its parameters: a plan applied from outside, as the parallel plans and
// the fp8 plan are, so no model names LoRA. It changes the model, not its layout over
// ranks, and needs no communicator: the trainer, `kiln sample` and `kiln export` build a
// LoRA checkpoint's model with it alike.
//
// Which Linears (train.lora.targets): roles, the same in every decoder family,
//   q, k, v   the query, key and value pieces of the attention's fused input projection
//   qkv       that projection whole (GPT-2's c_attn, as PEFT adapts it)
//   o         the attention's output projection
//   gate, up  the pieces of a SwiGLU MLP's fused input projection
//   fc        the MLP's input projection whole (GPT-2's c_fc)
//   down      the MLP's output projection
// or glob patterns over the adapted units' names (nn::dotted_tail_matches: a Linear
// "model.layers.0.self_attn.o_proj", a piece "model.layers.0.self_attn.qkv_proj.q"), which
// must each match one. A unit named both whole and by a piece is an error. On a
// mixture-of-experts block the MLP roles adapt its experts' projections (nn/expert_lora.h:
// "model.layers.0.mlp.experts.gate_up_proj.gate", every expert its own A and B) and its
// shared experts' Linears alike; train.lora.dropout must then be 0.
//
// The frozen base: every parameter of the model but the adapters is frozen
// (nn::Param::trainable false): no gradient, optimizer state or reduction, and ZeRO-3
// shards it with the rest (parallel/data_parallel.h's frozen regions). The adapters are
// trainable parameters of their Linear's part, kept like any other in the model's dtype
// with fp32 master weights and AdamW state (optim/adamw.h).
#pragma once

#include "models/layer_plan.h"
#include "nn/lora.h"

#include <string>
#include <vector>

namespace kiln {

/// train.lora's keys, as the plan takes them.
struct LoraOptions {
  nn::LoraSpec spec;                  // rank, alpha, rslora, dropout
  std::vector<std::string> targets;   // roles or glob patterns (above)
  std::string source;                 // the config file, for messages
};

/// The roles of train.lora.targets, in the order above.
const std::vector<std::string>& lora_roles();

/// One adapted unit as files need it (PEFT folders, merged weights).
struct LoraUnit {
  std::string name;    // "model.layers.0.self_attn.qkv_proj.q": its adapter's prefix
  std::string linear;  // "model.layers.0.self_attn.qkv_proj": the Linear (its weight: + ".weight")
  int piece = -1;      // the Linear's piece (nn::Linear::pieces); -1: the whole Linear
  int64_t row0 = 0;    // its first row of the Linear's weight
  int64_t rows = 0;
  int64_t rank = 0;
  float scale = 1.f;   // alpha / r, or alpha / sqrt(r)
  int64_t experts = 0; // a MoE layer's experts (A [E, r, in], B [E, rows, r], the rows
                       // those of each expert's [E, out, in] weight); 0: a Linear
  int64_t in = 0;      // the adapted layer's input width (A's last dimension)
};

class LoraPlan final : public LayerPlan {
 public:
  explicit LoraPlan(LoraOptions options);
  std::string what() const override;
  /// Adds the adapters and freezes the base. Throws kiln::Error naming the config file and
  /// the target when the model has no transformer blocks, a target matches nothing, a unit
  /// is named whole and by a piece, or dropout meets experts or a row-parallel Linear.
  void apply(const LayerRoles& layers) const override;
  /// The adapted units the last apply() chose (e.g. "model.layers.0.self_attn.qkv_proj.q").
  const std::vector<std::string>& adapted() const { return adapted_; }
  /// The same units with their geometry, in the same order.
  const std::vector<LoraUnit>& units() const { return units_; }

  /// Before each pass: the adapters' dropout on (a training pass) or off, drawn from `seed`
  /// at the pass's first global input row (its first sample x the sequence length).
  void set_dropout(bool on, uint64_t seed, uint64_t first_row);

 private:
  LoraOptions options_;
  mutable std::vector<std::string> adapted_;
  mutable std::vector<LoraUnit> units_;
  nn::LoraDropout dropout_;
};

}  // namespace kiln
