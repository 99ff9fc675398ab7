// The fp8 plan (train.fp8, docs/fp8.md): chooses which of a model's Linears run their GEMMs
// in fp8 and installs nn::Fp8Linear on them (nn/fp8.h) before the model lays out its
// parameters, as the parallel plans install placements: a plan applied from outside, so
// no model names fp8.
//
// Which Linears: those of the transformer blocks (nn::TransformerBlock::linears: attention
// qkv and proj, a dense MLP's fc and proj) that train.fp8_layers' patterns name, or by
// default those of every block but the first and the last (the blocks nearest the
// embedding and the loss are the most sensitive; torchtitan and Megatron-core leave them
// in bf16 for the same reason). The embedding, the output head, the norms and a MoE
// block's router and experts never run in fp8.
//
// Tensorwise scaling reduces each call's amaxes over the ranks that cut one micro-batch's
// tensors: the tensor- and context-parallel groups (CommAmaxGroup), so every layout
// computes the single process's scales. Delayed scaling keeps, per fp8 Linear and
// operand, the amaxes of the last train.fp8_amax_history_len steps (one table [n, H, 3]
// for the model's n fp8 Linears); a step's GEMMs scale by the max of that history (or its
// most recent entry) and record their amaxes; end_step() reduces the step's amaxes over
// every rank (dp x cp, tp, pp: each rank then holds every Linear's history, whichever
// stage runs it) and writes them into slot `update % H`: the same for every layout and on
// resume. The history is checkpointed (fp8.amax_history.<Linear> [H, 3], and the amaxes
// of the next step, fp8.amax.<Linear> [3]).
#pragma once

#include "comm/communicator.h"
#include "models/layer_plan.h"
#include "nn/fp8.h"

#include <string>
#include <vector>

namespace kiln {

/// The element-wise max over each of `comms` in turn (the max over their product), on the
/// caller's stream. The communicators are not owned; nullptr entries are skipped.
class CommAmaxGroup final : public nn::AmaxGroup {
 public:
  explicit CommAmaxGroup(std::vector<Communicator*> comms);
  void all_reduce_max(Stream s, const Tensor& t) override;
  bool empty() const { return comms_.empty(); }

 private:
  std::vector<Communicator*> comms_;
};

/// train.fp8's keys, as the plan takes them.
struct Fp8Options {
  std::string recipe;                // "tensorwise" | "delayed"
  std::vector<std::string> layers;   // train.fp8_layers
  int history_len = 16;              // train.fp8_amax_history_len (delayed)
  bool most_recent = false;          // train.fp8_amax_compute_algo = "most_recent" (delayed)
  std::string source;                // the config file, for messages
};

class Fp8Plan final : public LayerPlan {
 public:
  /// `backend` allocates the amax tables; `call_group` (tensorwise: tp and cp; nullptr:
  /// whole tensors here) and `step_group` (delayed: every rank; nullptr: one rank) are not
  /// owned and must outlive the model.
  Fp8Plan(Backend& backend, Fp8Options options, nn::AmaxGroup* call_group,
          nn::AmaxGroup* step_group);
  std::string what() const override;
  /// Throws kiln::Error naming the arch when it has no transformer blocks, naming the
  /// pattern of train.fp8_layers that matches no Linear, or when no Linear is chosen.
  void apply(const LayerRoles& layers) const override;
  /// The names of the Linears the last apply() put in fp8 (e.g. "transformer.h.1.attn.c_attn").
  const std::vector<std::string>& chosen() const { return chosen_; }
  bool delayed() const { return options_.recipe == "delayed"; }

  /// Delayed scaling: the passes between begin_step() and end_step() record their amaxes
  /// (a training step's; evaluation and sampling outside them only read the scales).
  void begin_step() { recording_ = true; }
  /// Delayed scaling, after every micro-batch of update `update` (0-based) ran its
  /// backward: the step's amaxes reduced over every rank, written into the history, the
  /// next step's amaxes taken from it. Ends the recording. Nothing for tensorwise scaling.
  void end_step(int64_t update);
  /// Delayed scaling's state for checkpoints: each chosen Linear's history
  /// "fp8.amax_history.<Linear>" [H, 3] and next amaxes "fp8.amax.<Linear>" [3], as views of
  /// the device tables (read them to save, write them to resume). Empty for tensorwise.
  struct StateTensor {
    std::string name;
    Shape shape;
    Tensor value;
  };
  std::vector<StateTensor> state() const;

 private:
  Backend& backend_;
  Fp8Options options_;
  nn::AmaxGroup* call_group_;
  nn::AmaxGroup* step_group_;
  mutable std::vector<std::string> chosen_;
  // [n, 3] the amaxes the GEMMs scale by (tensorwise: each call's); delayed: [n, 3] the
  // step's so far and [n, H, 3] the history.
  mutable Tensor amax_, step_amax_, history_;
  bool recording_ = false;  // inside a training step (delayed scaling)
};

}  // namespace kiln
