// What a block's forward saves for its backward, and activation checkpointing as one
// policy over those declarations (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models").
//
// Every layer declares the tensors it saves (SavedSpec), each with a recompute class:
//   Never      always kept (the residual stream: a block's input and output, owned by
//              the model, not declared here).
//   Cheap      recomputed from another saved tensor by one cheap elementwise op (the
//              MLP's activation output), so "selective" drops it.
//   WithBlock  recomputed only by running the block's forward again ("full").
// A policy (ActivationCheckpointing) keeps or drops each class; SavedActivations
// allocates per-block storage for what is kept and ONE block's worth of shared storage
// for what is not, which backward refills (re-running the same kernels on the same
// inputs with the same dropout masks, so gradients are bitwise those without
// checkpointing). Attention never keeps its [T,T] probabilities in any mode: it saves
// the row log-sum-exp and its backward recomputes them (FlashAttention).
#pragma once

#include "backend/backend.h"

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::nn {

enum class Recompute { Never, Cheap, WithBlock };

///   None       every saved tensor is kept.
///   Selective  all but Cheap ones (the MLP activation, recomputed from its input).
///   Full       none of a block's own tensors: only its input; backward re-runs it.
enum class ActivationCheckpointing { None, Selective, Full };
/// Parses "none" | "selective" | "full"; throws kiln::Error otherwise.
ActivationCheckpointing parse_activation_checkpointing(std::string_view s);
/// Whether `mode` keeps a tensor of class `r` from forward to backward.
bool keeps(ActivationCheckpointing mode, Recompute r);

/// One saved tensor: a name for messages, its shape for this (B, T), its dtype
/// (activations in the model dtype, statistics fp32) and its recompute class.
struct SavedSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  Recompute recompute = Recompute::WithBlock;
};

/// Storage for the saved tensors of a model's blocks.
class SavedActivations {
 public:
  /// Allocates (category Activations) what `mode` keeps per block, plus one shared set
  /// for what it drops. Frees the previous storage first.
  void reserve(Backend& be, const std::vector<SavedSpec>& specs, int n_blocks,
               ActivationCheckpointing mode);
  /// The same for blocks of different specs (dense and mixture-of-experts blocks):
  /// specs[l] are block l's. What `mode` drops is shared between the blocks whose spec at
  /// the same position has the same shape and dtype.
  void reserve(Backend& be, const std::vector<std::vector<SavedSpec>>& specs,
               ActivationCheckpointing mode);
  /// Block l's tensors in spec order: its own where kept, the shared ones otherwise.
  std::span<const Tensor> block(int l) const;
  /// Backward must re-run block l's forward first (some WithBlock tensor is shared).
  bool rerun_block() const { return rerun_block_; }
  /// Backward must recompute the Cheap tensors first (they are shared).
  bool recompute_cheap() const { return recompute_cheap_; }
  ActivationCheckpointing mode() const { return mode_; }

 private:
  std::vector<std::vector<Tensor>> blocks_;
  ActivationCheckpointing mode_ = ActivationCheckpointing::None;
  bool rerun_block_ = false, recompute_cheap_ = false;
};

}  // namespace kiln::nn
