// The records of metrics.jsonl (one JSON object per logged update; MetricsLog writes
// them): built from what the trainer measured, apart from the loop that measures it.
#pragma once

#include "train/train_step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace kiln {

/// What one applied update measured.
struct StepMetrics {
  int64_t step = 0;              // updates done, this one included
  double loss = 0;               // mean training loss (nats per target token)
  float lr = 0;                  // learning rate of the update
  double grad_norm = 0;          // global L2 gradient norm (before clipping)
  int64_t tokens_per_step = 0;   // global batch x sequence length
  double step_time_s = 0;        // wall seconds of the update
  double flops_per_step = 0;     // Model::flops_per_token x tokens_per_step
  double world_peak_flops = 0;   // peak FLOP/s of all ranks together (for MFU)
  const LossScaler* fp16_scaler = nullptr;  // fp16 dynamic loss scaling; nullptr without
};

/// {"step", "loss", "lr", "grad_norm", "tokens" (tokens seen so far), "step_time_s",
/// "tokens_per_s", "mfu"} and, with fp16_scaler, {"loss_scale", "skipped_steps"}.
nlohmann::json step_record(const StepMetrics& m);

/// The record of an update skipped for an fp16 gradient overflow: {"step" (the update
/// tried, 1-based), "skipped": true, "loss", "loss_scale", "skipped_steps"}.
nlohmann::json skipped_step_record(int64_t step, double loss, const LossScaler& scaler);

/// Adds memory in bytes to `record`. `mem[r]` is rank r's current bytes per MemCategory,
/// then its peak per category, then its total peak (2 * kNumMemCategories + 1 values;
/// Trainer::memory_by_rank). `rank`'s as "peak_mem_bytes", "mem_<category>_bytes" and
/// "mem_peak_<category>_bytes"; with more than one rank also every rank's in
/// "mem_by_rank" ([{"<category>", "peak_<category>", "peak"}]) and `comm_wait_s`
/// (seconds this rank waited for communication in the update) as "comm_wait_s".
void add_memory_record(nlohmann::json& record, const std::vector<std::vector<int64_t>>& mem,
                       int rank, double comm_wait_s);

}  // namespace kiln
