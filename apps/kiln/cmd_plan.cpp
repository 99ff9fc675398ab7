// kiln plan: picks the parallel layout of a config for a cluster: every valid layout
// (dp x cp x tp x pp with virtual stages, ZeRO 0-3, activation checkpointing, micro-batch
// and accumulation for the global batch), pruned by the dry-run memory of every pipeline
// stage, ranked by the time model's step time (docs/plan.md).
//
//   kiln plan CONFIG.toml --world-size N --device-memory GiB [--gpus-per-node G]
//             [--cluster FILE] [--calibration FILE] [--backend cpu|cuda|none]
//             [--peak-tflops F] [--reserve-gib F] [--top K] [--json] [--write FILE]
//             [--set k=v]...
//
// Prints the time model's inputs with their sources, then the best K layouts that fit:
// peak GiB per category, step time split (compute, bubble, exposed tp/cp/pp/dp),
// tokens/s and MFU; writes the winner's `--set` lines to FILE (`kiln train CONFIG $(cat
// FILE)`). When nothing fits, names the closest layout and by how much it misses.
#include "apps/kiln/commands.h"
#include "core/error.h"
#include "plan/calibration.h"
#include "plan/memplan.h"
#include "checkpoint/file_util.h"
#include "config/config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>

namespace kiln::app {

namespace {

struct Args {
  std::string config;
  std::vector<std::string> sets;
  int world_size = 1;
  double device_gib = 0;
  int gpus_per_node = 0;
  std::string cluster;
  std::string calibration;
  std::string backend;  // "" = the config's train.device
  double peak_tflops = 0;
  double reserve_gib = -1;
  int top = 5;
  bool json = false;
  std::string write;
};

// The documented defaults of each link class (docs/plan.md, "Defaults").
plan::Link default_link(bool cuda, bool inter) {
  if (cuda && !inter)
    return {{400e9, "default: NVLink 4 within an H100 SXM node (nccl-tests all_reduce busbw ~360-480 GB/s)"},
            {10e-6, "default: NCCL latency within a node, ~10 us"}};
  if (cuda)
    return {{45e9, "default: one 400 Gb/s InfiniBand NDR NIC per GPU (50 GB/s line rate, ring busbw ~45 GB/s)"},
            {20e-6, "default: NCCL latency between nodes, ~20 us"}};
  if (!inter)
    return {{10e9, "default: MPI over shared memory between CPU ranks of one machine"},
            {5e-6, "default: MPI latency over shared memory, ~5 us"}};
  return {{5e9, "default: 40-100 Gb/s Ethernet between CPU machines"},
          {20e-6, "default: MPI latency over TCP, ~20 us"}};
}

// --cluster FILE: {"ranks_per_node": G, "intra": {"bandwidth_gbps": B, "latency_us": L},
// "inter": {...}}, each value optional; sources name the file.
void read_cluster(const std::string& file, plan::CostModel& cost) {
  const std::string text = checkpoint::detail::read_file(file);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  KILN_CHECK(j.is_object(), "{}: not a JSON object (a cluster description, docs/plan.md)", file);
  for (const auto& [key, v] : j.items())
    KILN_CHECK(key == "ranks_per_node" || key == "intra" || key == "inter" || key == "name",
               "{}: unknown key \"{}\" (ranks_per_node, intra, inter, name)", file, key);
  if (j.contains("ranks_per_node")) {
    KILN_CHECK(j["ranks_per_node"].is_number_integer() && j["ranks_per_node"].get<int>() > 0,
               "{}: \"ranks_per_node\" must be a positive integer", file);
    cost.ranks_per_node = j["ranks_per_node"].get<int>();
  }
  for (const char* cls : {"intra", "inter"}) {
    if (!j.contains(cls)) continue;
    const auto& l = j[cls];
    KILN_CHECK(l.is_object(), "{}: \"{}\" must be an object", file, cls);
    plan::Link& link = std::string(cls) == "intra" ? cost.intra : cost.inter;
    for (const auto& [key, v] : l.items()) {
      KILN_CHECK((key == "bandwidth_gbps" || key == "latency_us") && v.is_number() &&
                     v.get<double>() > 0,
                 "{}: \"{}.{}\": expected bandwidth_gbps or latency_us, a positive number", file,
                 cls, key);
      if (key == "bandwidth_gbps") link.bandwidth = {v.get<double>() * 1e9, "--cluster " + file};
      else link.latency = {v.get<double>() * 1e-6, "--cluster " + file};
    }
  }
}

plan::CostModel cost_model(const Args& a, const TrainConfig& cfg, bool cuda) {
  plan::CostModel cost;
  if (!cuda)
    cost.overlap = {0, "cpu: the communication thread and MPI's copies take the rank's own cores"};
  cost.intra = default_link(cuda, false);
  cost.inter = default_link(cuda, true);
  const std::string& dtype = cfg.train.dtype;
  if (!a.calibration.empty()) {
    cost.calibration = plan::load_calibration(a.calibration);
    const plan::Calibration& cal = *cost.calibration;
    KILN_CHECK(cal.backend == (cuda ? "cuda" : "cpu"), "{}: a calibration of the {} backend, but the "
               "plan is for {} (--backend, else train.device)", a.calibration, cal.backend,
               cuda ? "cuda" : "cpu");
    cost.calibration_file = a.calibration;
    const std::string from = fmt::format("measured: kiln bench --calibrate ({}: {}, {} threads, {})",
                                         a.calibration, cal.machine, cal.threads, cal.date);
    const auto it = cal.gemm.find(dtype);
    KILN_CHECK(it != cal.gemm.end(), "{}: no {} GEMM rates (train.dtype); calibrate with that dtype",
               a.calibration, dtype);
    double best = 0;
    for (const auto& [n, f] : it->second) best = std::max(best, f);
    cost.peak_flops = {best, "the calibration's best " + dtype + " GEMM rate, " + from};
    cost.mem_bandwidth = {cal.mem_bandwidth, from};
    if (cal.link.ranks > 1) {  // the launched ranks' all-reduce: one node's link
      const std::string src = fmt::format("measured: all-reduce over {} ranks, {}", cal.link.ranks, from);
      cost.intra = {{plan::interpolate(cal.link.busbw, 64 << 20), src + "; by message size"},
                    {cal.link.latency, src},
                    cal.link.busbw};
    }
  } else if (cuda) {
    cost.peak_flops = {(dtype == "fp32" ? 67.0 : 989.0) * 1e12,
                       dtype == "fp32" ? "default: H100 SXM fp32 (67 TFLOP/s, NVIDIA's datasheet)"
                                       : "default: H100 SXM dense bf16 (989 TFLOP/s, NVIDIA's datasheet)"};
    cost.mem_bandwidth = {3350e9, "default: H100 SXM HBM3 (3.35 TB/s, NVIDIA's datasheet)"};
  } else {
    KILN_CHECK(a.peak_tflops > 0, "plan: the CPU has no default GEMM rate: give --calibration FILE "
               "(kiln bench --calibrate FILE) or --peak-tflops");
    cost.mem_bandwidth = {50e9, "default: a CPU socket's DRAM, ~50 GB/s"};
  }
  // The cluster file over the defaults and the calibration's link; --gpus-per-node over it.
  if (!a.cluster.empty()) read_cluster(a.cluster, cost);
  if (a.gpus_per_node > 0) cost.ranks_per_node = a.gpus_per_node;
  if (a.peak_tflops > 0) {
    cost.peak_flops = {a.peak_tflops * 1e12, "--peak-tflops"};
    cost.calibration.reset();  // one flat rate, as given
  }
  return cost;
}

void print_inputs(const plan::CostModel& cost) {
  fmt::print("time model inputs:\n");
  fmt::print("  GEMM rate           {}\n",
             cost.calibration ? "by shape class, interpolated in the calibration (below)"
                              : fmt::format("{:.1f} TFLOP/s for every GEMM", cost.peak_flops.value / 1e12));
  if (cost.calibration) {
    for (const auto& [dtype, pts] : cost.calibration->gemm) {
      std::string row;
      for (const auto& [n, f] : pts) row += fmt::format(" {}^3 {:.0f}", n, f / 1e9);
      fmt::print("    {} GFLOP/s:{}\n", dtype, row);
    }
    fmt::print("  attention rate      {}\n", cost.calibration->attention.empty()
                                                 ? "as GEMMs (the calibration has none)"
                                                 : "by sequence length, interpolated in the calibration:");
    for (const auto& [dtype, pts] : cost.calibration->attention) {
      std::string row;
      for (const auto& [T, f] : pts) row += fmt::format(" T={} {:.1f}", T, f / 1e9);
      fmt::print("    {} GFLOP/s (forward + backward):{}\n", dtype, row);
    }
  }
  fmt::print("  peak (MFU)          {:.2f} TFLOP/s  [{}]\n", cost.peak_flops.value / 1e12, cost.peak_flops.source);
  fmt::print("  memory bandwidth    {:.0f} GB/s  [{}]\n", cost.mem_bandwidth.value / 1e9, cost.mem_bandwidth.source);
  for (const auto& [name, l] : {std::pair{"intra-node link", cost.intra}, std::pair{"inter-node link", cost.inter}})
  {
    std::string sizes;
    for (const auto& [bytes, bw] : l.busbw_by_bytes) sizes += fmt::format(" {} KiB:{:.3g}", bytes >> 10, bw / 1e9);
    fmt::print("  {:<19} {:.3g} GB/s busbw{} [{}], {:.3g} us [{}]\n", name, l.bandwidth.value / 1e9,
               sizes.empty() ? "" : " (by message:" + sizes + ")", l.bandwidth.source,
               l.latency.value * 1e6, l.latency.source);
  }
  fmt::print("  ranks per node      {}\n", cost.ranks_per_node > 0
                                              ? fmt::format("{}  [--gpus-per-node, else --cluster]", cost.ranks_per_node)
                                              : std::string("all on one node  [default]"));
  fmt::print("  overlap             {}  [{}]\n", cost.overlap.value != 0 ? "yes" : "no", cost.overlap.source);
}

nlohmann::json layout_json(const plan::Layout& l) {
  nlohmann::json mem;
  for (int k = 0; k < kNumMemCategories; ++k)
    mem[std::string(mem_category_name(static_cast<MemCategory>(k)))] = l.memory.peak[static_cast<size_t>(k)];
  const auto& t = l.time;
  return {{"dp", l.dp}, {"cp", l.cp}, {"tp", l.tp}, {"sequence_parallel", l.sequence_parallel},
          {"pp", l.pp}, {"virtual_stages", l.virtual_stages}, {"pp_schedule", l.pp_schedule},
          {"zero_stage", l.zero_stage}, {"activation_checkpointing", l.checkpointing},
          {"micro_batch", l.micro_batch}, {"grad_accum_steps", l.accum}, {"fits", l.fits},
          {"flops_per_token", l.flops_per_token},
          {"peak_bytes", l.peak_bytes}, {"peak_rank", l.memory.rank}, {"memory", mem},
          {"gemm_rate", t.gemm_rate}, {"attention_rate", t.attention_rate}, {"compute_s", t.compute}, {"recompute_s", t.recompute},
          {"bubble_s", t.bubble}, {"bubble_fraction", t.bubble_fraction}, {"tp_s", t.tp},
          {"cp_s", t.cp}, {"pp_s", t.pp}, {"dp_s", t.dp}, {"comm_total_s", t.comm_total},
          {"step_s", t.step}, {"tokens_per_s", t.tokens_per_s}, {"mfu", t.mfu}, {"sets", l.sets()}};
}

void print_layouts(const std::vector<plan::Layout>& ls, int top) {
  fmt::print("{:>2} {:>3} {:>3} {:>3} {:>3} {:>3} {:>2} {:>4} {:>9} {:>5} {:>5} | {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} | "
             "{:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>6} | {:>11} {:>6}\n",
             "#", "dp", "cp", "tp", "sp", "pp", "v", "zero", "ckpt", "micro", "accum", "peak GiB",
             "params", "grads", "optim", "activ", "temp", "step ms", "compute", "bubble", "tp", "cp",
             "pp", "dp", "tokens/s", "MFU");
  int shown = 0;
  for (const auto& l : ls) {
    if (!l.fits || shown >= top) continue;
    ++shown;
    auto cat = [&](MemCategory c) { return gib(l.memory.peak_of(c)); };
    const auto& t = l.time;
    fmt::print("{:>2} {:>3} {:>3} {:>3} {:>3} {:>3} {:>2} {:>4} {:>9} {:>5} {:>5} | {:>8.3f} {:>7.3f} {:>7.3f} "
               "{:>7.3f} {:>7.3f} {:>7.3f} | {:>9.2f} {:>8.2f} {:>7.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} | "
               "{:>11.0f} {:>5.1f}%\n",
               shown, l.dp, l.cp, l.tp, l.sequence_parallel ? "on" : "-", l.pp, l.virtual_stages,
               l.zero_stage, l.checkpointing, l.micro_batch, l.accum, gib(l.peak_bytes),
               cat(MemCategory::Parameters), cat(MemCategory::Gradients),
               cat(MemCategory::OptimizerState), cat(MemCategory::Activations),
               cat(MemCategory::Temporaries), t.step * 1e3, t.compute * 1e3, t.bubble * 1e3,
               t.tp * 1e3, t.cp * 1e3, t.pp * 1e3, t.dp * 1e3, t.tokens_per_s, 100 * t.mfu);
  }
}

void run(const Args& a) {
  // (CLI11's ranges let NaN through: every comparison with it is false.)
  for (const auto& [flag, v] : {std::pair{"--device-memory", a.device_gib}, std::pair{"--reserve-gib", a.reserve_gib},
                                std::pair{"--peak-tflops", a.peak_tflops}})
    KILN_CHECK(std::isfinite(v), "plan: {} must be a finite number, got {}", flag, v);
  KILN_CHECK(a.gpus_per_node == 0 || a.world_size % a.gpus_per_node == 0,
             "plan: --gpus-per-node {} does not divide --world-size {} (whole nodes only)",
             a.gpus_per_node, a.world_size);
  const TrainConfig cfg = load_config_file(a.config, a.sets);
  const std::string backend = a.backend.empty() ? cfg.train.device : a.backend;
  const bool cuda = backend == "cuda";
  const plan::CostModel cost = cost_model(a, cfg, cuda);
  KILN_CHECK(cost.ranks_per_node == 0 || a.world_size % cost.ranks_per_node == 0,
             "plan: {} ranks per node (--cluster {}) do not divide --world-size {} (whole nodes only)",
             cost.ranks_per_node, a.cluster, a.world_size);
  plan::MemPlanOptions o;
  o.world_size = a.world_size;
  o.backend = backend;
  const double reserve = a.reserve_gib >= 0 ? a.reserve_gib : cuda ? 1.0 : 0.0;
  KILN_CHECK(a.device_gib > reserve, "plan: --device-memory {} GiB leaves nothing after the {} GiB "
             "reserve (--reserve-gib)", a.device_gib, reserve);
  const auto usable = static_cast<int64_t>((a.device_gib - reserve) * kGiB);
  std::string refusal;
  const std::vector<plan::Layout> ls =
      plan::search_layouts(cfg, o, cost, usable, {.vary_pp = true}, &refusal);
  KILN_CHECK(!ls.empty(), "plan: no layout of {} ranks can run {}: each needs dp x cp x tp x pp = "
             "{} with the global batch ({}) a multiple of micro_batch x dp, tp dividing the heads "
             "({}) and pp the layers ({}){}", a.world_size, a.config, a.world_size,
             cfg.train.global_batch > 0 ? std::to_string(cfg.train.global_batch)
                                        : fmt::format("micro_batch x world = {}", cfg.train.micro_batch * a.world_size),
             cfg.model.n_head, cfg.model.n_layer,
             refusal.empty() ? std::string() : "; the first layout refused: " + refusal);
  const int fitting = static_cast<int>(std::count_if(ls.begin(), ls.end(), [](const auto& l) { return l.fits; }));
  if (a.json) {  // every layout considered, also when none fits
    nlohmann::json j;
    j["world_size"] = a.world_size;
    j["usable_bytes"] = usable;
    j["layouts_considered"] = ls.size();
    j["layouts_fitting"] = fitting;
    j["peak_flops"] = cost.peak_flops.value;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& l : ls) arr.push_back(layout_json(l));
    j["layouts"] = arr;
    fmt::print("{}\n", j.dump());
  }
  if (fitting == 0) {
    const auto closest = std::min_element(ls.begin(), ls.end(), [](const auto& x, const auto& y) {
      return x.peak_bytes < y.peak_bytes;
    });
    std::string sets;
    for (const auto& s : closest->sets()) sets += " --set " + s;
    throw Error(fmt::format("plan: no layout fits {:.2f} GiB per rank; the closest needs {:.3f} GiB "
                            "({:.3f} GiB over):{}", a.device_gib - reserve, gib(closest->peak_bytes),
                            gib(closest->peak_bytes - usable), sets));
  }
  if (!a.json) {
    fmt::print("kiln plan: {} on {} ranks of {:.1f} GiB ({:.1f} usable), global batch {} x {} "
               "tokens, {}\n", a.config, a.world_size, a.device_gib, a.device_gib - reserve,
               cfg.train.global_batch, cfg.train.seq_len, cfg.train.dtype);
    print_inputs(cost);
    fmt::print("\n{} layouts considered, {} fit; the best {} (times in ms per step; bubble and "
               "tp/cp/pp/dp: exposed; memory of the highest simulated rank):\n",
               ls.size(), fitting, std::min(fitting, a.top));
    print_layouts(ls, a.top);
  }
  const plan::Layout& best = ls.front();
  // The keys given to kiln plan first (what was planned), then the layout's (which win).
  std::string lines;
  for (const auto& s : a.sets) lines += "--set " + s + "\n";
  for (const auto& s : best.sets()) lines += "--set " + s + "\n";
  if (!a.json)
    fmt::print("\nthe winner, predicted {:.2f} ms per step, {:.0f} tokens/s:\n{}", best.time.step * 1e3,
               best.time.tokens_per_s, lines);
  if (!a.write.empty()) {
    checkpoint::detail::atomic_write_file(a.write, lines);
    if (!a.json)
      fmt::print("written to {} ({}kiln train {} $(cat {}))\n", a.write,
                 a.world_size > 1 ? fmt::format("mpirun -np {} ", a.world_size) : std::string(),
                 a.config, a.write);
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan", "Pick the parallel layout: every valid layout, pruned by memory, ranked by step time");
  auto a = std::make_shared<Args>();
  cmd->add_option("config", a->config, "The TOML config")->required();
  cmd->add_option("--set", a->sets, "Override a key: --set section.key=value (repeatable)");
  cmd->add_option("--world-size", a->world_size, "Ranks (dp x cp x tp x pp)")
      ->required()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--device-memory", a->device_gib, "GiB per rank")
      ->required()->check(CLI::Range(1e-3, 1e9));
  cmd->add_option("--gpus-per-node", a->gpus_per_node,
                  "Ranks per node: groups within a node use the intra-node link (default: all on one node)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--cluster", a->cluster,
                  "JSON: {\"ranks_per_node\", \"intra\"/\"inter\": {\"bandwidth_gbps\", \"latency_us\"}}");
  cmd->add_option("--calibration", a->calibration,
                  "The machine's GEMM rates and memory bandwidth (kiln bench --calibrate FILE)");
  cmd->add_option("--backend", a->backend,
                  "cpu, cuda or none: whose scratch the dry run counts and whose defaults apply "
                  "(default: the config's train.device)")
      ->check(CLI::IsMember({"cpu", "cuda", "none"}));
  cmd->add_option("--peak-tflops", a->peak_tflops, "One GEMM rate for everything (no calibration)")
      ->check(CLI::Range(1e-6, 1e9));
  cmd->add_option("--reserve-gib", a->reserve_gib,
                  "GiB of the device not for kiln (default: cuda 1 (context, NCCL), else 0)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--top", a->top, "Layouts to print (default 5)")->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", a->json, "Print one JSON object with every layout considered");
  cmd->add_option("--write", a->write, "Write the winner's --set lines to this file");
  cmd->callback([a] { run(*a); });
}

}  // namespace kiln::app
