#include "train/metrics_record.h"

#include "core/allocator.h"

#include <string>

namespace kiln {

nlohmann::json step_record(const StepMetrics& m) {
  nlohmann::json rec;
  rec["step"] = m.step;
  rec["loss"] = m.loss;
  rec["lr"] = m.lr;
  rec["grad_norm"] = m.grad_norm;
  rec["tokens"] = m.step * m.tokens_per_step;
  rec["step_time_s"] = m.step_time_s;
  rec["tokens_per_s"] = static_cast<double>(m.tokens_per_step) / m.step_time_s;
  rec["mfu"] = m.flops_per_step / m.step_time_s / m.world_peak_flops;
  if (m.fp16_scaler) {
    rec["loss_scale"] = m.fp16_scaler->scale;
    rec["skipped_steps"] = m.fp16_scaler->skipped_steps;
  }
  return rec;
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
