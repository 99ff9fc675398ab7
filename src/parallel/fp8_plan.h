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
// The amaxes are reduced over the ranks that cut one micro-batch's tensors: the tensor-
// and context-parallel groups (CommAmaxGroup), so every layout computes the single
// process's scales.
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

class Fp8Plan final : public LayerPlan {
 public:
  /// `recipe` is train.fp8 ("tensorwise"), `layers` train.fp8_layers, `source` the config
  /// file (messages). `backend` allocates each fp8 Linear's amax buffer; `group` (nullptr:
  /// one rank holds whole tensors) is not owned and must outlive the model.
  Fp8Plan(Backend& backend, std::string recipe, std::vector<std::string> layers,
          nn::AmaxGroup* group, std::string source);
  std::string what() const override;
  /// Throws kiln::Error naming the arch when it has no transformer blocks, naming the
  /// pattern of train.fp8_layers that matches no Linear, or when no Linear is chosen.
  void apply(const LayerRoles& layers) const override;
  /// The names of the Linears the last apply() put in fp8 (e.g. "transformer.h.1.attn.c_attn").
  const std::vector<std::string>& chosen() const { return chosen_; }

 private:
  Backend& backend_;
  std::string recipe_, source_;
  std::vector<std::string> patterns_;
  nn::AmaxGroup* group_;
  mutable std::vector<std::string> chosen_;
};

}  // namespace kiln
