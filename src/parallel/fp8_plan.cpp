#include "parallel/fp8_plan.h"

#include "comm/ledger.h"
#include "core/error.h"
#include "nn/block.h"
#include "nn/linear.h"
#include "nn/param.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln {

CommAmaxGroup::CommAmaxGroup(std::vector<Communicator*> comms) {
  for (Communicator* c : comms)
    if (c && c->size() > 1) comms_.push_back(c);
}

void CommAmaxGroup::all_reduce_max(Stream s, const Tensor& t) {
  for (Communicator* c : comms_) {
    const CommSite site("fp8 amax all_reduce max");
    c->all_reduce(t, ReduceOp::Max, s);
  }
}

Fp8Plan::Fp8Plan(Backend& backend, std::string recipe, std::vector<std::string> layers,
                 nn::AmaxGroup* group, std::string source)
    : backend_(backend), recipe_(std::move(recipe)), source_(std::move(source)),
      patterns_(std::move(layers)), group_(group) {}

std::string Fp8Plan::what() const { return fmt::format("fp8 (train.fp8 = \"{}\")", recipe_); }

namespace {
// "<name>.weight" -> "<name>": a Linear's name.
std::string linear_name(const nn::Linear& l) {
  const std::string& w = l.weight.name;
  return w.substr(0, w.size() - std::string(".weight").size());
}
}  // namespace

void Fp8Plan::apply(const LayerRoles& layers) const {
  KILN_CHECK(!layers.blocks.empty(), "{}: {} is not supported for {}: it has no transformer "
             "blocks", source_, what(), layers.arch);
  chosen_.clear();
  std::vector<int> matched(patterns_.size(), 0);
  const size_t L = layers.blocks.size();
  for (size_t i = 0; i < L; ++i) {
    for (nn::Linear* l : layers.blocks[i]->linears()) {
      const std::string name = linear_name(*l);
      bool on = patterns_.empty() && i != 0 && i + 1 != L;
      for (size_t k = 0; k < patterns_.size(); ++k)
        if (nn::freeze_pattern_matches(patterns_[k], name)) on = true, ++matched[k];
      if (!on) continue;
      l->set_fp8({backend_.empty(Shape{3}, DType::F32, MemCategory::Activations), group_});
      chosen_.push_back(name);
    }
  }
  for (size_t k = 0; k < patterns_.size(); ++k)
    KILN_CHECK(matched[k] > 0, "{}: train.fp8_layers pattern '{}' matches no Linear of the "
               "transformer blocks (e.g. {})", source_, patterns_[k],
               linear_name(*layers.blocks[0]->linears()[0]));
  KILN_CHECK(!chosen_.empty(), "{}: {} puts no Linear in fp8: by default the first and last of "
             "the model's {} blocks stay in train.dtype; name the Linears with "
             "train.fp8_layers", source_, what(), L);
}

}  // namespace kiln
