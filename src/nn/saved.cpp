#include "nn/saved.h"

#include "core/error.h"

namespace kiln::nn {

ActivationCheckpointing parse_activation_checkpointing(std::string_view s) {
  if (s == "none") return ActivationCheckpointing::None;
  if (s == "selective") return ActivationCheckpointing::Selective;
  if (s == "full") return ActivationCheckpointing::Full;
  KILN_FAIL("activation_checkpointing must be none, selective or full, got '{}'", s);
}

bool keeps(ActivationCheckpointing mode, Recompute r) {
  switch (mode) {
    case ActivationCheckpointing::None: return true;
    case ActivationCheckpointing::Selective: return r != Recompute::Cheap;
    case ActivationCheckpointing::Full: return r == Recompute::Never;
  }
  return true;
}

void SavedActivations::reserve(Backend& be, const std::vector<SavedSpec>& specs, int n_blocks,
                               ActivationCheckpointing mode) {
  blocks_.clear();  // free first so that the peak is not doubled
  mode_ = mode;
  rerun_block_ = recompute_cheap_ = false;
  blocks_.resize(static_cast<size_t>(n_blocks));
  std::vector<Tensor> shared(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const SavedSpec& sp = specs[i];
    if (keeps(mode, sp.recompute)) continue;
    rerun_block_ |= sp.recompute == Recompute::WithBlock;
    recompute_cheap_ |= sp.recompute == Recompute::Cheap;
    if (n_blocks > 0) shared[i] = be.empty(sp.shape, sp.dtype, MemCategory::Activations);
  }
  for (auto& b : blocks_) {
    b.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i)
      b[i] = keeps(mode, specs[i].recompute)
                 ? be.empty(specs[i].shape, specs[i].dtype, MemCategory::Activations)
                 : shared[i];
  }
}

std::span<const Tensor> SavedActivations::block(int l) const {
  KILN_CHECK(l >= 0 && l < static_cast<int>(blocks_.size()), "saved activations: no block {}", l);
  return blocks_[static_cast<size_t>(l)];
}

}  // namespace kiln::nn
