// The records of a logged update: metrics.jsonl's JSON object (MetricsLog writes it) and
// the console's progress line, built from what the trainer measured, apart from the loop
// that measures it.
#pragma once

#include "train/train_step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

/// What one applied update measured.
struct StepMetrics {
  int64_t step = 0;              // updates done, this one included
  double loss = 0;               // mean training loss (nats per target token)
  float lr = 0;                  // learning rate of the update
  double grad_norm = 0;          // global L2 gradient norm (before clipping)
  int64_t tokens_per_step = 0;   // global batch x sequence length
  const char* throughput_unit = "tok/s";  // the console's: "pos/s" (positions) for image models
  double session_start = 0;      // unix seconds at which this process began training
  int64_t session_first_step = 0;  // the update it began at (0, or the one resumed)
  double step_time_s = 0;        // wall seconds of the update
  double flops_per_step = 0;     // Model::flops_per_token x tokens_per_step
  double world_peak_flops = 0;   // peak FLOP/s of all ranks together (for MFU)
  const LossScaler* fp16_scaler = nullptr;  // fp16 dynamic loss scaling; nullptr without
  bool evaluated = false;        // an evaluation ran at this update, which measured:
  double val_loss = 0;           //   the mean validation loss (nats per target token)
  double val_accuracy = -1;      //   a classifier's top-1 accuracy; -1 for other models
  const MoeStats* moe = nullptr;  // a mixture of experts' balancing figures of the update
                                  // (TrainStep's, over the global batch); nullptr without
  std::map<std::string, int64_t> tokens_by_data;  // a blend's tokens seen per data set (dir)
  std::map<std::string, double> val_loss_by_data;  // when evaluated: a blend's per data set
};

/// Tokens per expert of the MoE layers, summarised: the fewest, the mean and the most
/// (token, choice) slots an expert received in the update's global batch.
struct ExpertLoad {
  double min = 0, mean = 0, max = 0;
};
/// Each MoE layer's load (in block order), and over all of them (min of the minima, the
/// mean, max of the maxima).
std::vector<ExpertLoad> expert_loads(const MoeStats& moe);
ExpertLoad overall_expert_load(const std::vector<ExpertLoad>& layers);
/// With token dropping (moe.capacity_factor > 0), the slots dropped past an expert's
/// capacity over all of the update's slots (every MoE layer, micro-batch and rank), in
/// [0, 1]; nullopt when dropless.
std::optional<double> dropped_fraction(const MoeStats& moe);

/// {"step", "loss", "lr", "grad_norm", "tokens" (tokens seen so far), "step_time_s",
/// "tokens_per_s", "mfu", "time" (unix seconds now), "session_start" (unix seconds this
/// process began training: a run resumed n times has n + 1 sessions), "session_first_step"
/// (the update it began at)}; with fp16_scaler, {"loss_scale", "skipped_steps"}; when
/// evaluated, "val_loss" and (val_accuracy >= 0) "val_accuracy"; with moe, "moe_aux_loss"
/// and "moe_z_loss" (as optimised, coefficients applied; apart from "loss", the LM loss),
/// "moe_tokens_per_expert" {"min", "mean", "max"} over every MoE layer and expert and
/// "moe_tokens_per_expert_by_layer" [[min, mean, max] per MoE layer] and, with an
/// auxiliary-loss-free selection bias, "moe_expert_bias" {"min", "max"} after the update
/// and, with token dropping, "moe_dropped_fraction" (dropped_fraction); with a blend
/// (data.blend), "tokens_by_data" {dir: tokens seen} and, when evaluated,
/// "val_loss_by_data" {dir: val loss}.
nlohmann::json step_record(const StepMetrics& m);

/// Seconds since the Unix epoch, now (the records' "time").
double unix_seconds();

/// The console's line for a logged update, without newline: "step    100/1000 | loss
/// 2.3456 | val 2.4567 acc 91.20% | lr 3.00e-04 | norm 1.234 | 12345 tok/s | MFU 12.3% |
/// 456 ms | ETA 1m02s" (" | val ..." when evaluated, " acc ..." for a classifier; " | aux
/// 0.0102 z 0.0031 | load 1.42" after the norm for a mixture of experts: load = the most
/// slots an expert received over the mean, the worst MoE layer's; " dropped 3.25%" after it
/// with token dropping; the
/// throughput in `throughput_unit`; an MFU above 100% says the peak is stale), of
/// `total_steps` updates with `eta_s` seconds left.
std::string progress_line(const StepMetrics& m, int64_t total_steps, double eta_s);

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
