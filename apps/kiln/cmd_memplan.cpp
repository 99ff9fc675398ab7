// kiln memplan: predicts the memory of each rank of a training run, by category, and the
// layouts of the config that fit a device, fastest first (docs/memplan.md).
//
//   kiln memplan CONFIG.toml [--world-size N] [--device-memory GiB] [--json] [--set k=v]...
//                [--backend cpu|cuda|none] [--threads N] [--peak-tflops F]
//                [--link-gbps F] [--latency-us F] [--mem-bandwidth-gbps F] [--reserve-gib F]
//                [--moe-routing worst|balanced]
//
// No data set is needed: model.vocab_size comes from the config or its preset, else from
// data.dir's meta.json. The prediction is a dry run of one training step on a meta
// backend (plan/memplan.h).
#include "apps/kiln/commands.h"
#include "backend/probe.h"
#include "backend/registry.h"
#include "core/error.h"
#include "plan/memplan.h"
#include "config/config.h"
#include "train/device.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <cmath>
#include <memory>

namespace kiln::app {

namespace {

struct Args {
  std::string config;
  std::vector<std::string> sets;
  int world_size = 1;
  double device_gib = 0;
  bool json = false;
  std::string backend;  // "" = the config's train.device
  int threads = 0;
  double peak_tflops = 0;
  double link_gbps = 0;
  double latency_us = -1;
  double mem_gbps = 0;
  double reserve_gib = -1;
  int polls = -1;
  std::string moe_routing = "worst";
};

// A mixture-of-experts model: the routing planned and what depends on it.
void print_moe(const plan::MemPlan& p) {
  const bool worst = p.moe_routing == plan::MoeRouting::Worst;
  fmt::print("  mixture of experts: {} experts, top {}; routing planned: {}\n", p.moe_experts,
             p.moe_top_k,
             worst ? "worst (any spread: one expert may receive all N tokens of a micro-batch)"
                   : "balanced (each expert N x k / E of the N x k slots)");
  const int ep = p.config.parallel.ep;
  if (ep > 1) {
    fmt::print("    expert parallel over {} ranks: the rows each rank receives follow the routing "
               "(plan/planned_ep_group.h): {}; their activations, kept to backward, and the "
               "grouped linears' CPU GEMM scratch depend on it\n", ep,
               worst ? "worst, every rank of the group sends this rank min(k, E / ep) slots of "
                       "each token (ep x N x min(k, E / ep) rows per MoE layer and micro-batch)"
                     : "balanced, N x k rows per MoE layer and micro-batch");
  } else {
    fmt::print("    the experts' activations are allocated for all N x k slots whatever the "
               "routing (the bound is the allocation); only the CPU GEMM scratch of the "
               "experts' grouped linears depends on it\n");
  }
  if (p.moe_other)
    fmt::print("    {} routing: peak {:.3f} GiB ({} bytes; activations {}, temporaries {} bytes; "
               "here {} and {})\n",
               worst ? "balanced" : "worst", gib(p.moe_other->peak_total), p.moe_other->peak_total,
               p.moe_other->peak_of(MemCategory::Activations),
               p.moe_other->peak_of(MemCategory::Temporaries),
               p.rank0().peak_of(MemCategory::Activations),
               p.rank0().peak_of(MemCategory::Temporaries));
  fmt::print("    step time: the same for both (dropless: every slot is computed); FLOPs of the "
             "active parameters, {:.4g} per token\n", p.flops_per_token);
}

nlohmann::json rank_json(const plan::RankMemory& r) {
  nlohmann::json j;
  j["rank"] = r.rank;
  j["peak_bytes"] = r.peak_total;
  for (int c = 0; c < kNumMemCategories; ++c) {
    const std::string name(mem_category_name(static_cast<MemCategory>(c)));
    j[name] = r.peak[static_cast<size_t>(c)];
  }
  return j;
}

void run(const Args& a) {
  // (CLI11's ranges let NaN through: every comparison with it is false.)
  KILN_CHECK(std::isfinite(a.device_gib) && std::isfinite(a.peak_tflops) && std::isfinite(a.reserve_gib) &&
                 std::isfinite(a.link_gbps) && std::isfinite(a.latency_us) && std::isfinite(a.mem_gbps),
             "memplan: --device-memory, --peak-tflops, --reserve-gib, --link-gbps, --latency-us and "
             "--mem-bandwidth-gbps must be finite numbers");
  const TrainConfig cfg = load_config_file(a.config, a.sets);
  plan::MemPlanOptions o;
  o.world_size = a.world_size;
  o.backend = a.backend.empty() ? cfg.train.device : a.backend;
  o.cpu_threads = a.threads;
  o.completion_polls = a.polls;
  o.moe_routing = plan::parse_moe_routing(a.moe_routing, "memplan: --moe-routing");
  const plan::MemPlan p = plan::plan_memory(cfg, o);
  const plan::RankMemory& r0 = p.rank0();
  const plan::RankMemory& rmax = p.max_rank();
  const TrainConfig& c = p.config;
  const bool cuda = (a.backend.empty() ? cfg.train.device : a.backend) == "cuda";

  // The cost model's machine (defaults per backend; see docs/memplan.md).
  plan::CostModel cost;
  std::string peak_from = "--peak-tflops";
  double peak = 0;
  if (a.peak_tflops > 0) {
    peak = a.peak_tflops * 1e12;
  } else if (cuda) {
    peak = (c.train.dtype == "fp32" ? 67.0 : 989.0) * 1e12;  // H100 SXM dense
    peak_from = c.train.dtype == "fp32" ? "H100 fp32 (67 TFLOP/s)" : "H100 bf16 (989 TFLOP/s)";
  } else if (a.device_gib > 0) {
    auto be = make_device_backend("cpu");
    const int saved = omp_get_max_threads();
    if (a.threads > 0) omp_set_num_threads(a.threads);
    peak = measure_gemm_flops(*be, DType::F32);
    omp_set_num_threads(saved);
    peak_from = "measured fp32 GEMM";
  }
  cost.peak_flops = {peak, peak_from};
  cost.intra.bandwidth = {(a.link_gbps > 0 ? a.link_gbps : cuda ? 400.0 : 10.0) * 1e9, "memplan"};
  cost.intra.latency = {(a.latency_us >= 0 ? a.latency_us : cuda ? 10.0 : 5.0) * 1e-6, "memplan"};
  cost.inter = cost.intra;  // (memplan prices every collective on one link)
  cost.mem_bandwidth = {(a.mem_gbps > 0 ? a.mem_gbps : cuda ? 3350.0 : 50.0) * 1e9, "memplan"};
  const double reserve = a.reserve_gib >= 0 ? a.reserve_gib : cuda ? 1.0 : 0.0;
  const auto usable = static_cast<int64_t>((a.device_gib - reserve) * kGiB);
  std::vector<plan::Layout> layouts;
  if (a.device_gib > 0) layouts = plan::search_layouts(cfg, o, cost, usable);

  if (a.json) {
    nlohmann::json j = rank_json(r0);
    j["world_size"] = p.world_size;
    j["dp"] = p.dp;
    j["cp"] = p.cp;
    j["tp"] = p.tp;
    j["pp"] = p.pp;
    j["sequence_parallel"] = c.parallel.sequence_parallel;
    j["zero_stage"] = c.parallel.zero_stage;
    j["activation_checkpointing"] = c.train.activation_checkpointing;
    j["dtype"] = c.train.dtype;
    j["micro_batch"] = c.train.micro_batch;
    j["grad_accum_steps"] = p.accum;
    j["seq_len"] = c.train.seq_len;
    j["scratch_model"] = p.scratch_model;
    j["comm_model"] = p.comm_model;
    j["ranks_differ"] = p.ranks_differ();
    j["max_peak_bytes"] = rmax.peak_total;
    j["max_peak_rank"] = rmax.rank;
    j["upper_peak_bytes"] = p.upper.peak_total;  // ZeRO-2/3 when no reduction overlaps
    j["flops_per_token"] = p.flops_per_token;
    if (p.moe_experts > 0) {
      j["moe_routing"] = plan::moe_routing_name(p.moe_routing);
      if (p.moe_other) j["moe_other_routing"] = rank_json(*p.moe_other);
    }
    nlohmann::json per = nlohmann::json::array();
    for (const auto& r : p.ranks) per.push_back(rank_json(r));
    j["ranks"] = per;
    if (a.device_gib > 0) {
      j["device_memory_bytes"] = static_cast<int64_t>(a.device_gib * kGiB);
      j["usable_bytes"] = usable;
      j["peak_flops"] = cost.peak_flops.value;
      nlohmann::json ls = nlohmann::json::array();
      for (const auto& l : layouts) {
        if (!l.fits) continue;
        ls.push_back({{"cp", l.cp}, {"tp", l.tp}, {"sequence_parallel", l.sequence_parallel},
                      {"zero_stage", l.zero_stage}, {"activation_checkpointing", l.checkpointing},
                      {"micro_batch", l.micro_batch}, {"grad_accum_steps", l.accum},
                      {"peak_bytes", l.peak_bytes}, {"step_s", l.time.step},
                      {"compute_s", l.time.compute}, {"comm_s", l.time.comm_total},
                      {"comm_exposed_s", l.time.comm_exposed},
                      {"tokens_per_s", l.time.tokens_per_s}});
      }
      j["layouts"] = ls;
    }
    fmt::print("{}\n", j.dump());
    return;
  }

  fmt::print("kiln memplan: {}\n", p.model);
  fmt::print("  world {} (data-parallel {}{}{}{}{}), ZeRO stage {}, micro_batch {} x {} micro-step(s) "
             "(global batch {}), seq_len {}, {}, activation checkpointing {}\n",
             p.world_size, p.dp,
             p.cp > 1 ? fmt::format(" x context-parallel {} ({} tokens per rank)", p.cp,
                                    c.train.seq_len / p.cp)
                      : std::string(),
             p.tp > 1 ? fmt::format(" x tensor-parallel {}{}", p.tp,
                                    c.parallel.sequence_parallel ? " with sequence parallelism" : "")
                      : std::string(),
             p.pp > 1 ? fmt::format(" x pipeline {} ({}, {} virtual stage(s))", p.pp,
                                    c.parallel.pp_schedule, c.parallel.virtual_stages)
                      : std::string(),
             c.parallel.ep > 1 ? fmt::format("; expert-parallel {} of the dp x cp ranks",
                                             c.parallel.ep)
                               : std::string(),
             c.parallel.zero_stage, c.train.micro_batch, p.accum,
             c.train.global_batch, c.train.seq_len, c.train.dtype,
             c.train.activation_checkpointing);
  fmt::print("  scratch model: {}\n", p.scratch_model);
  if (p.world_size > 1) fmt::print("  communication model: {}\n", p.comm_model);
  if (p.moe_experts > 0) print_moe(p);
  fmt::print("\n");
  fmt::print("{:<18} {:>12} {:>18}\n", "per rank (rank 0)", "peak GiB", "peak bytes");
  for (int k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    fmt::print("{:<18} {:>12.3f} {:>18}\n", mem_category_name(cat), gib(r0.peak_of(cat)),
               r0.peak_of(cat));
  }
  fmt::print("{:<18} {:>12.3f} {:>18}\n", "PEAK (total)", gib(r0.peak_total), r0.peak_total);
  if (p.ranks_differ()) {
    fmt::print("ranks differ ({}): highest peak {:.3f} GiB on rank {} of the {} simulated\n",
               p.pp > 1 ? "pipeline stages hold different parts and micro-batches in flight"
                        : "zero padding of the last slices",
               gib(rmax.peak_total), rmax.rank, p.ranks.size());
  } else {
    fmt::print("all {} simulated ranks have the same bytes\n", p.ranks.size());
  }
  if (p.upper.peak_total != r0.peak_total)
    fmt::print("if communication falls behind (no reduce-scatter completes before the step waits "
               "for it), gradient buffers pile up: up to {:.3f} GiB ({} bytes; gradients {:.3f} GiB)\n",
               gib(p.upper.peak_total), p.upper.peak_total,
               gib(p.upper.peak_of(MemCategory::Gradients)));
  fmt::print("(per-category values are each category's own peak; PEAK is the peak of the sum)\n");
  fmt::print("not counted: allocator fragmentation and rounding, the CUDA context and NCCL/MPI "
             "internal buffers, host memory (data loader, MPI staging)\n");
  if (a.device_gib <= 0) return;

  fmt::print("\nlayouts that fit {:.1f} GiB per rank ({:.1f} GiB usable), fastest first; peak "
             "{:.1f} TFLOP/s ({}), link {:.0f} GB/s busbw, {:.0f} us per collective:\n",
             a.device_gib, a.device_gib - reserve, cost.peak_flops.value / 1e12, peak_from,
             cost.intra.bandwidth.value / 1e9, cost.intra.latency.value * 1e6);
  fmt::print("{:>3} {:>3} {:>3} {:>4} {:>10} {:>6} {:>6} {:>10} {:>11} {:>9} {:>11} {:>9} {:>12}\n",
             "cp", "tp", "sp", "zero", "ckpt", "micro", "accum", "peak GiB", "compute ms", "comm ms",
             "exposed ms", "step ms", "tokens/s");
  int fitting = 0;
  for (const auto& l : layouts) {
    if (!l.fits) continue;
    ++fitting;
    fmt::print("{:>3} {:>3} {:>3} {:>4} {:>10} {:>6} {:>6} {:>10.2f} {:>11.1f} {:>9.1f} {:>11.1f} {:>9.1f} "
               "{:>12.0f}\n", l.cp, l.tp, l.sequence_parallel ? "on" : "-", l.zero_stage, l.checkpointing, l.micro_batch, l.accum, gib(l.peak_bytes),
               l.time.compute * 1e3, l.time.comm_total * 1e3, l.time.comm_exposed * 1e3,
               l.time.step * 1e3, l.time.tokens_per_s);
  }
  if (fitting == 0) {
    int64_t least = layouts.empty() ? 0 : layouts.front().peak_bytes;
    for (const auto& l : layouts) least = std::min(least, l.peak_bytes);
    fmt::print("none: the smallest layout needs {:.2f} GiB per rank\n", gib(least));
  }
}

}  // namespace

void register_memplan(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "memplan", "Predict per-rank memory by category, and the layouts that fit a device");
  auto a = std::make_shared<Args>();
  cmd->add_option("config", a->config, "The TOML config")->required();
  cmd->add_option("--set", a->sets, "Override a key: --set section.key=value (repeatable)");
  cmd->add_option("--world-size", a->world_size, "Ranks (dp x cp x tp x pp)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--device-memory", a->device_gib,
                  "GiB per rank: list the layouts that fit, fastest first")
      ->check(CLI::Range(1e-3, 1e9));
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->add_option("--backend", a->backend,
                  "Whose op scratch to count: cpu (oneDNN), cuda, none (default: the config's train.device)")
      ->check(CLI::IsMember({"cpu", "cuda", "none"}));
  cmd->add_option("--threads", a->threads,
                  "OpenMP threads per rank for the oneDNN scratchpad (default: this process's)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--peak-tflops", a->peak_tflops,
                  "Per-rank peak for the cost model (default: cuda 989 bf16 / 67 fp32 (H100); "
                  "cpu: measured)")
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_option("--link-gbps", a->link_gbps, "Bus bandwidth GB/s (default: cuda 400, cpu 10)")
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_option("--latency-us", a->latency_us, "Latency per collective (default: cuda 10, cpu 5)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--mem-bandwidth-gbps", a->mem_gbps,
                  "Memory bandwidth GB/s for memory-bound recompute (default: cuda 3350, cpu 50)")
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_option("--reserve-gib", a->reserve_gib,
                  "GiB of the device not for kiln (default: cuda 1 (context, NCCL), cpu 0)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--moe-routing", a->moe_routing,
                  "Mixture of experts: plan the GEMM scratch for the worst spread of tokens over "
                  "the experts or the balanced one (default worst)")
      ->check(CLI::IsMember({"worst", "balanced"}));
  cmd->add_option("--completion-polls", a->polls,
                  "Simulated collectives complete after this many polls (default: cpu never (only waits), "
                  "cuda 1)");
  cmd->callback([a] { run(*a); });
}

}  // namespace kiln::app
