#include "parallel/fp8_plan.h"

#include "comm/ledger.h"
#include "core/error.h"
#include "nn/block.h"
#include "nn/linear.h"
#include "nn/param.h"

#include <fmt/format.h>


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

Fp8Plan::Fp8Plan(Backend& backend, Fp8Options options, nn::AmaxGroup* call_group,
                 nn::AmaxGroup* step_group)
    : backend_(backend), options_(std::move(options)), call_group_(call_group),
      step_group_(step_group) {}

std::string Fp8Plan::what() const {
  return fmt::format("fp8 (train.fp8 = \"{}\")", options_.recipe);
}

void Fp8Plan::apply(const LayerRoles& layers) const {
  const std::string& source = options_.source;
  const std::vector<std::string>& patterns = options_.layers;
  KILN_CHECK(!layers.blocks.empty(), "{}: {} is not supported for {}: it has no transformer "
             "blocks", source, what(), layers.arch);
  chosen_.clear();
  std::vector<nn::Linear*> on;
  std::vector<int> matched(patterns.size(), 0);
  const size_t L = layers.blocks.size();
  for (size_t i = 0; i < L; ++i) {
    for (const auto& [role, l] : layers.blocks[i]->linears()) {
      const std::string name = l->name();
      bool chosen = patterns.empty() && i != 0 && i + 1 != L;
      for (size_t k = 0; k < patterns.size(); ++k)
        if (nn::freeze_pattern_matches(patterns[k], name)) chosen = true, ++matched[k];
      if (!chosen) continue;
      on.push_back(l);
      chosen_.push_back(name);
    }
  }
  for (size_t k = 0; k < patterns.size(); ++k)
    KILN_CHECK(matched[k] > 0, "{}: train.fp8_layers pattern '{}' matches no Linear of the "
               "transformer blocks (e.g. {}; the embedding, head, norms and a MoE block's "
               "router and experts never run in fp8)", source, patterns[k],
               layers.blocks[0]->linears()[0].linear->name());
  KILN_CHECK(!on.empty(), "{}: {} puts no Linear in fp8: by default the first and last of "
             "the model's {} blocks stay in train.dtype; name the Linears with "
             "train.fp8_layers", source, what(), L);
  // One table for all: delayed scaling's step is one op and one reduction over them.
  const auto n = static_cast<int64_t>(on.size());
  auto zeros = [&](const Shape& shape) {
    Tensor t = backend_.empty(shape, DType::F32, MemCategory::Activations);
    backend_.fill(backend_.default_stream(), t, 0.f);
    return t;
  };
  amax_ = zeros(Shape{n, 3});  // delayed: amax 0 is scale 1 for the first step (as TE)
  if (delayed()) {
    step_amax_ = zeros(Shape{n, 3});
    history_ = zeros(Shape{n, options_.history_len, 3});
  }
  for (int64_t i = 0; i < n; ++i)
    on[static_cast<size_t>(i)]->set_fp8(
        {amax_.view_at(3 * i, Shape{3}), delayed() ? step_amax_.view_at(3 * i, Shape{3}) : Tensor(),
         &recording_, delayed() ? nullptr : call_group_});
}

void Fp8Plan::end_step(int64_t update) {
  recording_ = false;
  if (!delayed()) return;
  const Stream s = backend_.default_stream();
  if (step_group_) step_group_->all_reduce_max(s, step_amax_);
  backend_.fp8_amax_history(s, amax_, history_, step_amax_, update % options_.history_len,
                            options_.most_recent);
}

std::vector<Fp8Plan::StateTensor> Fp8Plan::state() const {
  std::vector<StateTensor> out;
  if (!delayed()) return out;
  const int64_t H = options_.history_len;
  for (size_t i = 0; i < chosen_.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    out.push_back({"fp8.amax_history." + chosen_[i], Shape{H, 3},
                   history_.view_at(k * H * 3, Shape{H, 3})});
    out.push_back({"fp8.amax." + chosen_[i], Shape{3}, amax_.view_at(k * 3, Shape{3})});
  }
  return out;
}

}  // namespace kiln
