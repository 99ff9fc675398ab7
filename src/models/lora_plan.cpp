#include "models/lora_plan.h"

#include "core/error.h"
#include "nn/block.h"
#include "nn/embedding.h"
#include "nn/expert_lora.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace kiln {

namespace {

// The adapters' dropout streams: one per adapter, in model order, apart from the models'.
constexpr uint64_t kLoraDropoutStreams = uint64_t{0x10A} << 40;

// A role of train.lora.targets: the block Linear it adapts (nn::TransformerBlock::linears'
// role) and its piece ("" for the whole Linear).
struct Role {
  const char* name;
  const char* linear;
  const char* piece;
};
constexpr Role kRoles[] = {
    {"q", "attention.qkv", "q"},  {"k", "attention.qkv", "k"},    {"v", "attention.qkv", "v"},
    {"qkv", "attention.qkv", ""}, {"o", "attention.proj", ""},    {"gate", "mlp.fc", "gate"},
    {"up", "mlp.fc", "up"},       {"fc", "mlp.fc", ""},           {"down", "mlp.proj", ""}};

const Role* find_role(const std::string& target) {
  for (const Role& r : kRoles)
    if (target == r.name) return &r;
  return nullptr;
}

void check_dropout(const LoraOptions& o, const nn::Linear& linear, const std::string& unit) {
  const nn::TpPlacement& place = linear.placement();
  KILN_CHECK(o.spec.dropout == 0.f || !place.active() || place.style != nn::TpStyle::Row,
             "{}: train.lora.dropout = {} on {}, a row-parallel Linear under tensor "
             "parallelism, is not supported (its input is split in columns)", o.source,
             o.spec.dropout, unit);
}
void check_dropout(const LoraOptions& o, const nn::ExpertLora&, const std::string& unit) {
  KILN_CHECK(o.spec.dropout == 0.f, "{}: train.lora.dropout = {} on {}, a mixture-of-experts "
             "layer's experts, is not supported (set it to 0, or leave the experts out of "
             "train.lora.targets)", o.source, o.spec.dropout, unit);
}

// One apply(): the targets' matches so far and what it chose.
struct Adapting {
  const LoraOptions& options;
  const nn::LoraDropout* dropout;
  std::vector<std::string>& adapted;
  std::vector<LoraUnit>& units;
  std::vector<int> matched;
  uint64_t stream = kLoraDropoutStreams;

  // Adds the adapters the targets choose on `host` of `role`: a block's nn::Linear, or a MoE
  // layer's experts' projection (nn::ExpertLora; `experts` their count, 0 for a Linear),
  // which name their units and take adapters alike.
  template <class Host>
  void adapt(Host& host, const std::string& role, int64_t experts) {
    const std::vector<std::string>& targets = options.targets;
    const auto n_pieces = static_cast<int>(host.pieces().size());
    for (int piece = -1; piece < n_pieces; ++piece) {
      const std::string piece_name =
          piece < 0 ? "" : host.pieces()[static_cast<size_t>(piece)].name;
      const std::string unit = piece < 0 ? host.name() : host.name() + "." + piece_name;
      bool chosen = false;
      for (size_t k = 0; k < targets.size(); ++k) {
        const Role* r = find_role(targets[k]);
        const bool hit = r ? (role == std::string(r->linear) && piece_name == r->piece)
                           : nn::dotted_tail_matches(targets[k], unit);
        if (hit) chosen = true, ++matched[k];
      }
      if (!chosen) continue;
      for (const nn::LoraAdapter& a : host.lora())  // whole and a piece: one line naming both
        KILN_CHECK(a.piece >= 0 && piece >= 0, "{}: train.lora.targets choose both {} and {}: "
                   "a Linear takes adapters whole or on its pieces, not both (a glob that "
                   "matches the whole, as '*.experts.*' does, matches its pieces too: name "
                   "the pieces, '*.gate_up_proj.*', or use the roles)", options.source,
                   a.name, unit);
      check_dropout(options, host, unit);
      host.add_lora(piece, options.spec);
      nn::LoraAdapter& a = host.lora().back();
      a.dropout = dropout;
      a.dropout_stream = stream++;
      adapted.push_back(unit);
      units.push_back({unit, host.name(), piece, a.row0, a.rows, a.spec.rank, a.spec.scale(),
                       experts, a.A.shape[-1]});
    }
  }
};

}  // namespace

const std::vector<std::string>& lora_roles() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Role& r : kRoles) out.emplace_back(r.name);
    return out;
  }();
  return names;
}

LoraPlan::LoraPlan(LoraOptions options) : options_(std::move(options)) {}

std::string LoraPlan::what() const {
  return fmt::format("LoRA (train.lora.rank = {})", options_.spec.rank);
}

void LoraPlan::apply(const LayerRoles& layers) const {
  const std::string& source = options_.source;
  const std::vector<std::string>& targets = options_.targets;
  KILN_CHECK(!layers.blocks.empty(), "{}: {} is not supported for {}: it has no transformer "
             "blocks", source, what(), layers.arch);
  adapted_.clear();
  units_.clear();
  Adapting run{options_, &dropout_, adapted_, units_, std::vector<int>(targets.size(), 0)};
  for (nn::TransformerBlock* block : layers.blocks) {
    for (const auto& [role, linear] : block->linears()) run.adapt(*linear, role, 0);
    nn::MoeMlp* moe = block->moe();
    if (!moe) continue;
    for (const auto& [role, experts] : moe->expert_projections())
      run.adapt(*experts, role, experts->experts());
    for (const auto& [role, linear] : moe->shared_linears()) run.adapt(*linear, role, 0);
  }
  const std::vector<int>& matched = run.matched;
  // Names a glob may match: an attention piece, and an expert piece where there are experts.
  std::string examples = layers.blocks[0]->linears()[0].linear->name() + ".q";
  for (nn::TransformerBlock* block : layers.blocks)
    if (block->moe()) {
      examples += ", " + block->moe()->gate_up_lora.name() + ".gate";
      break;
    }
  for (size_t k = 0; k < targets.size(); ++k)
    KILN_CHECK(matched[k] > 0, "{}: train.lora.targets '{}' matches no Linear of the "
               "transformer blocks (roles: {}; or a glob over names such as {})", source,
               targets[k], fmt::join(lora_roles(), ", "), examples);
  KILN_CHECK(!adapted_.empty(), "{}: {} adapts no Linear: train.lora.targets is empty", source,
             what());
  // The base: every parameter but the adapters, frozen.
  std::vector<nn::Param*> params;
  if (layers.embedding) layers.embedding->collect(params);
  for (nn::TransformerBlock* block : layers.blocks) block->collect(params);
  if (layers.final_norm) layers.final_norm->collect(params);
  if (layers.lm_head) layers.lm_head->collect(params);
  for (nn::Param* p : params)
    if (!p->adapter) p->trainable = false;
}

void LoraPlan::set_dropout(bool on, uint64_t seed, uint64_t first_row) {
  dropout_ = nn::LoraDropout{on, seed, first_row};
}

}  // namespace kiln
