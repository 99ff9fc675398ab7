#include "train/metrics_record.h"

#include "core/allocator.h"
#include "train/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>

namespace kiln {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::optional<double> dropped_fraction(const MoeStats& moe) {
  if (!moe.dropped_slots) return std::nullopt;
  double slots = 0.0;
  for (const std::vector<double>& layer : moe.tokens_per_expert)
    slots = std::accumulate(layer.begin(), layer.end(), slots);
  return slots > 0.0 ? *moe.dropped_slots / slots : 0.0;
}

std::vector<ExpertLoad> expert_loads(const MoeStats& moe) {
  std::vector<ExpertLoad> out;
  for (const std::vector<double>& layer : moe.tokens_per_expert) {
    if (layer.empty()) continue;
    const auto [lo, hi] = std::minmax_element(layer.begin(), layer.end());
    const double sum = std::accumulate(layer.begin(), layer.end(), 0.0);
    out.push_back({*lo, sum / static_cast<double>(layer.size()), *hi});
  }
  return out;
}

ExpertLoad overall_expert_load(const std::vector<ExpertLoad>& layers) {
  if (layers.empty()) return {};
  ExpertLoad all{layers.front().min, 0.0, layers.front().max};
  for (const ExpertLoad& l : layers) {
    all.min = std::min(all.min, l.min);
    all.max = std::max(all.max, l.max);
    all.mean += l.mean / static_cast<double>(layers.size());
  }
  return all;
}

namespace {

// The selection bias's range over every MoE layer and expert; {0, 0} without one.
std::pair<float, float> expert_bias_range(const MoeStats& moe) {
  std::pair<float, float> r{0.f, 0.f};
  bool first = true;
  for (const std::vector<float>& layer : moe.expert_bias)
    for (float b : layer) {
      r = first ? std::pair{b, b} : std::pair{std::min(r.first, b), std::max(r.second, b)};
      first = false;
    }
  return r;
}

void add_moe_record(nlohmann::json& rec, const MoeStats& moe) {
  rec["moe_aux_loss"] = moe.aux_loss;
  rec["moe_z_loss"] = moe.z_loss;
  const std::vector<ExpertLoad> layers = expert_loads(moe);
  const ExpertLoad all = overall_expert_load(layers);
  rec["moe_tokens_per_expert"] = {{"min", all.min}, {"mean", all.mean}, {"max", all.max}};
  nlohmann::json by_layer = nlohmann::json::array();
  for (const ExpertLoad& l : layers) by_layer.push_back({l.min, l.mean, l.max});
  rec["moe_tokens_per_expert_by_layer"] = by_layer;
  if (const std::optional<double> f = dropped_fraction(moe)) rec["moe_dropped_fraction"] = *f;
  if (moe.expert_bias.empty()) return;
  const auto [lo, hi] = expert_bias_range(moe);
  rec["moe_expert_bias"] = {{"min", lo}, {"max", hi}};
}

// " | aux .. z .. | load .." (and " bias [lo, hi]" with a selection bias) for a mixture of
// experts (progress_line), else empty.
std::string moe_progress(const MoeStats* moe) {
  if (!moe) return {};
  double load = 0.0;  // the worst layer's max / mean
  for (const ExpertLoad& l : expert_loads(*moe))
    if (l.mean > 0) load = std::max(load, l.max / l.mean);
  std::string bias, dropped;
  if (!moe->expert_bias.empty()) {
    const auto [lo, hi] = expert_bias_range(*moe);
    bias = fmt::format(" bias [{:+.4f}, {:+.4f}]", lo, hi);
  }
  if (const std::optional<double> f = dropped_fraction(*moe))
    dropped = fmt::format(" dropped {:.2f}%", 100.0 * *f);
  return fmt::format(" | aux {:.4f} z {:.4f} | load {:.2f}{}{}", moe->aux_loss, moe->z_loss, load,
                     bias, dropped);
}

}  // namespace

nlohmann::json step_record(const StepMetrics& m) {
  nlohmann::json rec;
  rec["step"] = m.step;
  rec["loss"] = m.loss;
  rec["lr"] = m.lr;
  rec["grad_norm"] = m.grad_norm;
  rec["tokens"] = m.step * m.tokens_per_step;
  rec["time"] = unix_seconds();
  rec["session_start"] = m.session_start;
  rec["session_first_step"] = m.session_first_step;
  rec["step_time_s"] = m.step_time_s;
  rec["tokens_per_s"] = static_cast<double>(m.tokens_per_step) / m.step_time_s;
  rec["mfu"] = m.flops_per_step / m.step_time_s / m.world_peak_flops;
  if (m.fp16_scaler) {
    rec["loss_scale"] = m.fp16_scaler->scale;
    rec["skipped_steps"] = m.fp16_scaler->skipped_steps;
  }
  if (m.evaluated) {
    rec["val_loss"] = m.val_loss;
    if (m.val_accuracy >= 0) rec["val_accuracy"] = m.val_accuracy;
  }
  if (m.moe) add_moe_record(rec, *m.moe);
  if (!m.tokens_by_data.empty()) rec["tokens_by_data"] = m.tokens_by_data;
  if (m.evaluated && !m.val_loss_by_data.empty()) rec["val_loss_by_data"] = m.val_loss_by_data;
  return rec;
}

std::string progress_line(const StepMetrics& m, int64_t total_steps, double eta_s) {
  const std::string val =
      m.evaluated ? fmt::format(" | val {:.4f}{}", m.val_loss,
                                m.val_accuracy >= 0 ? fmt::format(" acc {:.2f}%", 100.0 * m.val_accuracy)
                                                    : std::string())
                  : std::string();
  const double mfu = m.flops_per_step / m.step_time_s / m.world_peak_flops;
  return fmt::format("step {:>6}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f}{} | {:.0f} {} | "
                     "MFU {:.1f}%{} | {:.0f} ms | ETA {}",
                     m.step, total_steps, m.loss, val, m.lr, m.grad_norm, moe_progress(m.moe),
                     static_cast<double>(m.tokens_per_step) / m.step_time_s, m.throughput_unit,
                     100.0 * mfu, mfu > 1.0 ? " (above 100%: the GEMM peak is stale, set log.peak_tflops)" : "",
                     m.step_time_s * 1e3, format_duration(eta_s));
}

nlohmann::json skipped_step_record(int64_t step, double loss, const LossScaler& scaler) {
  return {{"step", step}, {"skipped", true}, {"loss", loss}, {"loss_scale", scaler.scale},
          {"skipped_steps", scaler.skipped_steps}};
}

void add_memory_record(nlohmann::json& rec, const std::vector<std::vector<int64_t>>& mem,
                       int rank, double comm_wait_s) {
  const auto& mine = mem[static_cast<size_t>(rank)];
  auto category = [](int c) { return std::string(mem_category_name(static_cast<MemCategory>(c))); };
  rec["peak_mem_bytes"] = mine[2 * kNumMemCategories];
  for (int c = 0; c < kNumMemCategories; ++c) {
    rec["mem_" + category(c) + "_bytes"] = mine[static_cast<size_t>(c)];
    rec["mem_peak_" + category(c) + "_bytes"] = mine[static_cast<size_t>(kNumMemCategories + c)];
  }
  if (mem.size() > 1) {
    nlohmann::json per_rank = nlohmann::json::array();
    for (const auto& m : mem) {
      nlohmann::json j;
      for (int c = 0; c < kNumMemCategories; ++c) {
        j[category(c)] = m[static_cast<size_t>(c)];
        j["peak_" + category(c)] = m[static_cast<size_t>(kNumMemCategories + c)];
      }
      j["peak"] = m[2 * kNumMemCategories];
      per_rank.push_back(j);
    }
    rec["mem_by_rank"] = per_rank;
    rec["comm_wait_s"] = comm_wait_s;
  }
}

}  // namespace kiln
