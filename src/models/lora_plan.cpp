#include "models/lora_plan.h"

#include "core/error.h"
#include "nn/block.h"
#include "nn/embedding.h"
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
  std::vector<int> matched(targets.size(), 0);
  uint64_t stream = kLoraDropoutStreams;
  for (nn::TransformerBlock* block : layers.blocks) {
    for (const std::string& t : targets) {
      const Role* r = find_role(t);
      KILN_CHECK(!(block->moe() && r && std::string(r->linear).starts_with("mlp.")),
                 "{}: train.lora.targets '{}' names the MLP of a mixture-of-experts block ({}): "
                 "its experts take no LoRA adapters yet", source, t,
                 block->moe() ? block->moe()->router.name : std::string());
    }
    for (const auto& [role, linear] : block->linears()) {
      const auto n_pieces = static_cast<int>(linear->pieces().size());
      for (int piece = -1; piece < n_pieces; ++piece) {
        const std::string piece_name =
            piece < 0 ? "" : linear->pieces()[static_cast<size_t>(piece)].name;
        const std::string unit = piece < 0 ? linear->name() : linear->name() + "." + piece_name;
        bool chosen = false;
        for (size_t k = 0; k < targets.size(); ++k) {
          const Role* r = find_role(targets[k]);
          const bool hit = r ? (role == std::string(r->linear) && piece_name == r->piece)
                             : nn::dotted_tail_matches(targets[k], unit);
          if (hit) chosen = true, ++matched[k];
        }
        if (!chosen) continue;
        for (const nn::LoraAdapter& a : linear->lora())  // whole and a piece: one line naming both
          KILN_CHECK(a.piece >= 0 && piece >= 0, "{}: train.lora.targets choose both {} and {}: "
                     "a Linear takes adapters whole or on its pieces, not both", source, a.name, unit);
        const nn::TpPlacement& place = linear->placement();
        KILN_CHECK(options_.spec.dropout == 0.f || !place.active() ||
                       place.style != nn::TpStyle::Row,
                   "{}: train.lora.dropout = {} on {}, a row-parallel Linear under tensor "
                   "parallelism, is not supported (its input is split in columns)", source,
                   options_.spec.dropout, unit);
        linear->add_lora(piece, options_.spec);
        nn::LoraAdapter& a = linear->lora().back();
        a.dropout = &dropout_;
        a.dropout_stream = stream++;
        adapted_.push_back(unit);
        units_.push_back({unit, linear->name(), piece, a.row0, a.rows, a.spec.rank, a.spec.scale()});
      }
    }
  }
  for (size_t k = 0; k < targets.size(); ++k)
    KILN_CHECK(matched[k] > 0, "{}: train.lora.targets '{}' matches no Linear of the "
               "transformer blocks (roles: {}; or a glob over names such as {}.q)", source,
               targets[k], fmt::join(lora_roles(), ", "),
               layers.blocks[0]->linears()[0].linear->name());
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
