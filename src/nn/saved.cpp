#include "nn/saved.h"

#include "core/error.h"

#include <map>
#include <tuple>

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
  reserve(be, std::vector<std::vector<SavedSpec>>(static_cast<size_t>(n_blocks), specs), mode);
}

void SavedActivations::reserve(Backend& be, const std::vector<std::vector<SavedSpec>>& specs,
                               ActivationCheckpointing mode) {
  blocks_.clear();  // free first so that the peak is not doubled
  mode_ = mode;
  rerun_block_ = recompute_cheap_ = false;
  // One shared tensor per (position, shape, dtype) of what the mode drops.
  std::map<std::tuple<size_t, std::string, DType>, Tensor> shared;
  blocks_.resize(specs.size());
  for (size_t l = 0; l < specs.size(); ++l) {
    for (size_t i = 0; i < specs[l].size(); ++i) {
      const SavedSpec& sp = specs[l][i];
      if (keeps(mode, sp.recompute)) {
        blocks_[l].push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
        continue;
      }
      rerun_block_ |= sp.recompute == Recompute::WithBlock;
      recompute_cheap_ |= sp.recompute == Recompute::Cheap;
      Tensor& t = shared[{i, sp.shape.str(), sp.dtype}];
      if (!t) t = be.empty(sp.shape, sp.dtype, MemCategory::Activations);
      blocks_[l].push_back(t);
    }
  }
}

std::span<const Tensor> SavedActivations::block(int l) const {
  KILN_CHECK(l >= 0 && l < static_cast<int>(blocks_.size()), "saved activations: no block {}", l);
  return blocks_[static_cast<size_t>(l)];
}

}  // namespace kiln::nn
