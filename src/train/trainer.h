// The training loop: micro-batches accumulated to the global batch, LR schedule, AdamW
// with global-norm clipping, evaluation, samples, metrics, checkpoints, exact resume and
// clean exit on SIGTERM / SIGUSR1 (cluster preemption).
//
// One update ("step") = grad_accum_steps micro-steps of micro_batch sequences on each
// data-parallel rank. The loss is the mean over every target token of the global batch:
// each micro-step's loss sum is scaled by 1 / (targets in the global batch), so the
// gradient equals that of one big batch whatever the accumulation or world size.
//
// Launched under mpirun/srun, the trainer builds the device mesh (parallel.dp x tp x pp
// = world size) and trains with the configured ZeRO stage (parallel/data_parallel.h),
// tensor-parallel plan and pipeline schedule (train/train_step.h): each dp rank reads a
// disjoint part of every global batch (its tp and pp ranks the same part), and rank 0
// writes metrics and the checkpoint manifest.
#pragma once

#include "backend/backend.h"
#include "comm/communicator.h"
#include "data/loader.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/tp_traffic.h"
#include "profile/summary.h"
#include "train/checkpoint_policy.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/train_data.h"
#include "train/train_step.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace kiln {

namespace checkpoint {
class CheckpointReader;
}

struct TrainerOptions {
  /// "" = start fresh (refusing a run dir that already has checkpoints), "auto" = newest
  /// complete checkpoint of the run dir if any, else a checkpoint directory.
  std::string resume;
  /// Stop (with a checkpoint) after this many updates in total, as if preempted; 0 =
  /// run to train.steps. Megatron calls this --exit-interval.
  int64_t exit_interval = 0;
  /// Print one line per logged step to stdout.
  bool verbose = true;
  /// The first updates of the run that the timing (step_time_s, tokens/s, communication)
  /// leaves out as warm-up.
  int64_t untimed_steps = 1;
};

/// What a run did, for callers and tests.
struct TrainResult {
  int64_t first_step = 0;  // the update the run started from (0, or the resumed step)
  int64_t last_step = 0;   // updates completed when the run ended
  double last_loss = 0.0;
  double last_val_loss = -1.0;  // -1 when never evaluated
  double last_val_accuracy = -1.0;  // classifiers: top-1 accuracy on the val split; else -1
  double tokens_per_s = 0.0;    // mean over the run's steps after the first
  bool preempted = false;       // stopped by a signal or exit_interval
  double step_time_s = 0.0;     // mean step time over the run's steps after the first
  int64_t timed_steps = 0;      // those steps
  /// Data parallel only: the communication of the run. comm_busy_s is the time the
  /// collectives took on the communication thread, comm_exposed_s the time the training
  /// thread waited for them; hidden = 1 - exposed / busy is the fraction overlapped with
  /// computation (backward).
  double comm_busy_s = 0.0, comm_exposed_s = 0.0, comm_hidden_fraction = 0.0;
  std::string comm_table;  // per collective: count, bytes, algbw and busbw (nccl-tests)
  /// Tensor parallel only: the tp communicator's traffic per update, measured over the
  /// run's training steps (evaluation and checkpoints excluded) and by formula
  /// (parallel/tp_traffic.h).
  TpTraffic tp_measured, tp_formula;
  /// Pipeline parallel only: each stage's idle fraction over the timed steps, 1 - its
  /// compute time / the longest schedule time of any stage (host clock: meaningful where
  /// every rank has its own core), and the schedule's by the simulator and by theory.
  std::vector<double> pp_bubble_measured;
  double pp_bubble_simulated = 0.0, pp_bubble_theory = 0.0;
};

class Trainer {
 public:
  /// Validates the config, opens the data, builds model and optimizer (random init,
  /// init_from, or the resumed checkpoint). Throws kiln::Error on bad input.
  Trainer(const TrainConfig& config, const TrainerOptions& options);
  ~Trainer();

  TrainResult run();

  /// Mean validation loss over eval.batches global batches from the start of the val
  /// split, and a classifier's top-1 accuracy over the same samples (-1 for others).
  struct EvalResult {
    double loss = 0.0;
    double accuracy = -1.0;
  };
  EvalResult evaluate();
  const Model& model() const { return *model_; }
  const DataParallel& data_parallel() const { return *dp_; }
  int64_t step() const { return step_; }

 private:
  /// Fetches this rank's share of the next global batch and runs the one training step.
  double train_step(double* grad_norm);
  LossScaler& scaler() { return one_step_->scaler(); }
  void save_checkpoint();
  /// When to save, stop and prune (train.steps, [checkpoint], the exit interval).
  CheckpointPolicy checkpoint_policy() const;
  /// Restores model, optimizer, step and loader from checkpoint `dir`; throws kiln::Error
  /// naming the manifest when its state is malformed or does not fit this run.
  void load_checkpoint(const std::filesystem::path& dir);
  void restore_from(const checkpoint::CheckpointReader& reader);
  /// Rank 0, after load_checkpoint(): a rollback (checkpoints newer than the resumed step
  /// exist) moves them to ckpt/abandoned/ (checkpoint::move_checkpoints_aside), copies
  /// metrics.jsonl beside them and prepares the "rollback" record for metrics.jsonl.
  void abandon_newer_checkpoints(const std::filesystem::path& resumed_from);
  void maybe_sample();
  void summarize_communication(TrainResult& r, int64_t timed_steps);
  /// r.tp_formula, and r.tp_measured from the run's sum over its `steps` training steps
  /// (skipped fp16 ones included); prints both.
  void summarize_tp_traffic(TrainResult& r, int64_t steps);
  /// r.pp_bubble_*: from this rank's compute (busy) and schedule (span) seconds over the
  /// timed steps, gathered from every rank. Collective over the world.
  void summarize_pipeline(TrainResult& r, double busy, double span);
  void init_weights();
  /// ", pipeline over N stages (...)" for the start-up line; "" for pp = 1.
  std::string pipeline_description() const;
  /// Sums `values` over the dp x cp group, exactly in 64 bits (no-op for one rank).
  void dp_cp_sum(std::span<double> values);
  /// Per-rank memory by category, gathered to every rank: [rank][category] bytes.
  std::vector<std::vector<int64_t>> memory_by_rank();

  TrainConfig config_;
  TrainerOptions options_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<profile::ProfileWindow> profile_;  // [profile] steps = [a, b]
  std::unique_ptr<TrainStep> one_step_;  // owns model, data parallel and optimizer
  Model* model_ = nullptr;
  DataParallel* dp_ = nullptr;
  AdamW* optimizer_ = nullptr;
  std::unique_ptr<TrainData> train_data_;
  std::unique_ptr<TrainData> val_data_;  // the val split, opened once (unshuffled)
  std::filesystem::path run_dir_;
  int dp_rank_ = 0, dp_size_ = 1, tp_rank_ = 0;
  bool is_rank0_ = true;
  int accum_ = 1;
  int seq_len_ = 0;
  int64_t step_ = 0;
  double peak_flops_ = 0.0;
  bool fp16_ = false;  // dynamic loss scaling (TrainStep's LossScaler)
  bool last_skipped_ = false;
  nlohmann::json rollback_record_;  // written first to metrics.jsonl by run(); null: none
};

/// Throws kiln::Error, on every rank of `world`, naming the first key (and this rank's
/// value) whose value differs between ranks. Collective.
void check_config_on_all_ranks(Communicator& world, const TrainConfig& config);

/// Installs SIGTERM / SIGUSR1 handlers that ask the running trainer to checkpoint and
/// stop after the current update.
void install_preemption_handlers();
bool preemption_requested();

}  // namespace kiln
