#include "config/components.h"

#include "core/error.h"
#include "models/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

namespace kiln {

ModelOptions model_options_from(const TrainConfig& config) {
  ModelOptions o;
  o.arch = config.model.arch;
  o.n_layer = config.model.n_layer;
  o.n_head = config.model.n_head;
  o.n_embd = config.model.n_embd;
  o.block_size = config.model.block_size;
  o.vocab_size = config.model.vocab_size;
  o.dropout = static_cast<float>(config.model.dropout);
  o.family = config.model.family;
  o.family_lists = config.model.family_lists;
  return o;
}

void check_layout_supported(const TrainConfig& config,
                            const std::function<std::string(std::string_view key)>& where) {
  const ModelArch arch = model_arch(config.model.arch);
  const ParallelSection& p = config.parallel;
  auto origin = [&](std::string_view key) { return where ? where(key) : config.source; };
  auto check = [&](bool ok, std::string_view key, int value, bool ModelArch::*flag,
                   std::string_view what) {
    KILN_CHECK(ok || value == 1, "{}: parallel.{} = {}: model.arch = \"{}\" {} ({} do)",
               origin(fmt::format("parallel.{}", key)), key, value, config.model.arch, what,
               fmt::join(model_archs_with(flag), ", "));
  };
  check(arch.stages, "pp", p.pp, &ModelArch::stages, "does not run as pipeline stages");
  check(arch.tensor_parallel, "tp", p.tp, &ModelArch::tensor_parallel,
        "takes no tensor-parallel plan");
  check(arch.context_parallel, "cp", p.cp, &ModelArch::context_parallel,
        "takes no context-parallel plan");
  if (p.ep > 1) {
    const int64_t experts = arch.num_experts ? arch.num_experts(model_options_from(config)) : 0;
    KILN_CHECK(experts > 0, "{}: parallel.ep = {}: model.arch = \"{}\" has no mixture-of-experts "
               "layers{} to split over the ep ranks", origin("parallel.ep"), p.ep,
               config.model.arch, arch.num_experts ? " (model.moe.num_experts = 0)" : "");
    KILN_CHECK(experts % p.ep == 0, "{}: parallel.ep = {} does not divide model.moe.num_experts = "
               "{} (each ep rank holds num_experts / ep experts of every MoE layer)",
               origin("parallel.ep"), p.ep, experts);
  }
  if (p.tp > 1 && arch.tp_split_reason) {
    const std::string why = arch.tp_split_reason(model_options_from(config), p.tp);
    KILN_CHECK(why.empty(), "{}: parallel.tp = {}: {}", origin("parallel.tp"), p.tp, why);
  }
  if (!arch.single_layout_reason) return;
  const ModelOptions options = model_options_from(config);
  using KeyValue = std::pair<const char*, int>;
  for (const auto& [key, value] : {KeyValue{"pp", p.pp}, KeyValue{"tp", p.tp}, KeyValue{"cp", p.cp}}) {
    const std::string why = value == 1 ? "" : arch.single_layout_reason(options, key);
    KILN_CHECK(why.empty(), "{}: parallel.{} = {}: {} runs with parallel.{} = 1 only, for now",
               origin(fmt::format("parallel.{}", key)), key, value, why, key);
  }
}

AdamWConfig adamw_config_from(const TrainConfig& config) {
  AdamWConfig oc;
  oc.lr = static_cast<float>(config.optim.lr);
  oc.beta1 = config.optim.beta1;
  oc.beta2 = config.optim.beta2;
  oc.eps = static_cast<float>(config.optim.eps);
  oc.weight_decay = static_cast<float>(config.optim.weight_decay);
  oc.stochastic_rounding = config.train.stochastic_rounding != 0;
  oc.seed = static_cast<uint64_t>(config.train.seed) ^ 0x5eed5eedull;
  oc.ema_decay = static_cast<float>(config.train.ema_decay);
  oc.multi_tensor = config.optim.multi_tensor;
  KILN_CHECK(oc.ema_decay < 1.f, "{}: key 'train.ema_decay' ({}) is 1 in fp32, where the "
             "average is kept (at most 0.99999994)", config.source, config.train.ema_decay);
  return oc;
}

}  // namespace kiln
