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
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"
#include "parallel/tp_traffic.h"
#include "profile/summary.h"
#include "train/checkpoint_policy.h"
#include "config/config.h"
#include "model_io/model_io.h"
#include "train/background_save.h"
#include "train/metrics.h"
#include "train/stragglers.h"
#include "train/train_data.h"
#include "train/train_step.h"

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace kiln {

namespace checkpoint {
class CheckpointReader;
class CheckpointWriter;
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
  /// Expert parallel only: the ep group's all_to_all over the timed updates (rank 0; its
  /// seconds on the communication thread or stream), the seconds the MoE layers waited for
  /// them (exposed), and per update by formula under balanced routing
  /// (parallel/expert_parallel.h).
  CollectiveStats ep_measured;
  double ep_exposed_s = 0.0;
  EpTraffic ep_formula;
};

class RunAccounting;
class RunDirLock;
struct StepMetrics;

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
    std::map<std::string, double> loss_by_data;  // a blend's: each data set's val loss
  };
  /// The val split's loss (and a blend's per data set).
  EvalResult evaluate();
  const Model& model() const { return one_step_->model(); }
  const DataParallel& data_parallel() const { return one_step_->data_parallel(); }
  const AdamW& optimizer() const { return one_step_->optimizer(); }
  int64_t step() const { return step_; }

 private:
  // Set-up (trainer.cpp), in the order the constructor runs them.
  /// The world communicator, the config checked on every rank, the mesh, and the config
  /// resolved for its data-parallel size (global_batch) and validated for training.
  void set_up_mesh();
  /// The train split (and the val split when evaluating), checked against the model
  /// keys and the same on every rank.
  void open_data();
  /// The device's backend, wrapped for profiling when [profile] is on.
  void set_up_backend();
  /// The one step: model, data parallel, optimizer and pipeline over the mesh's groups.
  void set_up_step();
  /// The GEMM peak for MFU (log.peak_tflops or measured) and the [profile] window.
  void set_up_profiling();
  /// The start-up lines: the model, the run's layout, the backend's GEMM path.
  void print_start_up() const;
  /// ", pipeline over N stages (...)" for the start-up line; "" for pp = 1.
  std::string pipeline_description() const;

  // Where the run starts (trainer_resume.cpp).
  /// The checkpoint to resume from (--resume: "auto" or a directory), or none.
  std::optional<std::filesystem::path> resume_dir() const;
  /// Resumes from resume_dir(), or starts fresh (init_weights) where the run directory
  /// holds no checkpoint.
  void start();
  /// model.init_from's weights, or random ones; with `peft_adapters`, a LoRA run's adapters
  /// from train.lora.init_from when set (a resume reads its checkpoint's instead).
  void init_weights(bool peft_adapters = true);
  /// Restores model, optimizer, step and loader from checkpoint `dir`; throws kiln::Error
  /// naming the manifest when its state is malformed or does not fit this run.
  void load_checkpoint(const std::filesystem::path& dir);
  void restore_from(const checkpoint::CheckpointReader& reader);
  struct ResumePoint;
  /// The integers of a checkpoint's state: in range or one line naming the key
  /// (json_util.h).
  static ResumePoint read_resume_point(const checkpoint::CheckpointReader& reader);
  /// Throws kiln::Error naming the checkpoint unless it was saved by the same model,
  /// seed, data and batch shape.
  void check_same_run(const checkpoint::CheckpointReader& reader, const ResumePoint& saved) const;
  /// train.lora as a checkpoint records it ("lora": rank, alpha, rslora, dropout, targets,
  /// the number of adapters and the base: model.init_from's weights_identity, or the seed
  /// of a random base); null without LoRA. Computed once (the base's files read whole).
  const nlohmann::json& lora_state() const;
  /// Throws kiln::Error naming the checkpoint unless it and this run agree on LoRA: both
  /// without, or the same adapters (rank, alpha, rslora, targets) on the same base.
  void check_same_lora(const checkpoint::CheckpointReader& reader) const;
  /// The parameters and the fp32 master weights this rank holds, from `reader`; the
  /// model's buffers.
  void load_parameters(const checkpoint::CheckpointReader& reader);
  /// The model's buffers (Model::buffers) from `reader`; a note names those it lacks.
  void load_buffers(const checkpoint::CheckpointReader& reader);
  /// Rank 0, after load_checkpoint(): a rollback (checkpoints newer than the resumed step
  /// exist) moves them to ckpt/abandoned/ (checkpoint::move_checkpoints_aside), copies
  /// metrics.jsonl beside them and prepares the "rollback" record for metrics.jsonl.
  void abandon_newer_checkpoints(const std::filesystem::path& resumed_from);

  // Checkpoints (trainer_checkpoint.cpp).
  /// Saves a checkpoint of this update: at once (collective), or with checkpoint.async
  /// on a writer thread, committed later by finish_background_save().
  void save_checkpoint();
  /// Every rank's part of a checkpoint of this update: the writer with every tensor added
  /// (their host copies in host_copies_), and (rank 0) the state and extra files to
  /// commit. Collective.
  SaveContents capture_checkpoint();
  /// Rank 0, once every rank has written its files: the manifest, the rename, the pruning.
  void commit_checkpoint(SaveContents& contents);
  /// The agreement's verdict on the save in flight, all of whose writers have finished:
  /// `failed_rank` < 0 commits it; else checkpoint.on_error (stop: throws kiln::Error
  /// naming the rank and, on that rank, the file; warn: a warning, training goes on).
  /// `last`: the save a stop or the end of training waits for, whose failure always throws.
  void finish_background_save(int failed_rank, bool last = false);
  /// Waits for the save in flight, if any, and finishes it (collective; `last` as above);
  /// returns the seconds this rank waited.
  double drain_background_save(bool last);
  /// Rank 0's records of finished background saves ("event": "checkpoint"), for
  /// metrics.jsonl.
  std::vector<nlohmann::json> take_save_records() { return std::exchange(save_records_, {}); }
  /// Throws kiln::Error unless the replicas (dp, tp, the tied copies over pipeline
  /// stages) hold the same bits. Collective.
  void check_replicas();
  /// Adds this rank's tensors to `writer` (each element written by one rank only); their
  /// host copies go to `keep`, which must outlive the write.
  void add_tensors(checkpoint::CheckpointWriter& writer, HostCopies& copies);
  /// The manifest's state: what exact resume needs and checks.
  nlohmann::json checkpoint_state() const;
  /// When to save, stop and prune (train.steps, [checkpoint], the exit interval).
  CheckpointPolicy checkpoint_policy() const;

  // The loop (trainer_run.cpp).
  /// What one step tried measured.
  struct TriedStep {
    double loss = 0.0, grad_norm = 0.0;
    float lr = 0.f;
    double seconds = 0.0;      // wall time of the step
    double comm_wait_s = 0.0;  // waiting for data-parallel communication
    std::optional<MoeStats> moe;  // a mixture of experts' balancing figures
  };
  /// One step, timed and accounted (tp traffic, communication wait) in `acct`.
  TriedStep timed_train_step(RunAccounting& acct);
  /// Fetches this rank's share of the next global batch and runs the one training step.
  StepResult train_step();
  LossScaler& scaler() { return one_step_->scaler(); }
  /// What every update's metrics share: tokens, FLOPs, peak, the fp16 scaler.
  StepMetrics update_constants() const;
  /// Whether eval.every (or the last update) asks for an evaluation now.
  bool eval_due() const;
  /// An applied update's metrics.jsonl record (with memory: collective) and console line,
  /// when log.every, the first or last update (`stop_at`) or an evaluation asks for them.
  void log_update(const StepMetrics& m, MetricsLog* metrics, double comm_wait_s, int64_t stop_at,
                  const RunAccounting& acct);
  /// Every rank's update and compute time since the last logged update, gathered (collective):
  /// the slowest rank's against the median in `rec`, and the straggler warning when due.
  void note_stragglers(nlohmann::json& rec);
  /// At sample.every: rank 0's sample (prompt and continuation), printed; else nullopt.
  std::optional<std::string> maybe_sample();
  /// After an update: agrees over the world on stopping (a signal may reach only some
  /// ranks), saves a checkpoint when `policy` says so; true (r.preempted) to stop.
  bool checkpoint_or_stop(const CheckpointPolicy& policy, TrainResult& r);
  /// The run's totals into `r`, the summaries printed, the closing line.
  void finish_run(TrainResult& r, const RunAccounting& acct,
                  std::chrono::steady_clock::time_point run_start);
  /// Sums `values` over the dp x cp group, exactly in 64 bits (no-op for one rank).
  void dp_cp_sum(std::span<double> values);
  /// Per-rank memory by category, gathered to every rank: [rank][category] bytes.
  std::vector<std::vector<int64_t>> memory_by_rank();

  // The run's summaries (trainer_summary.cpp).
  void summarize_communication(TrainResult& r, int64_t timed_steps);
  /// r.tp_formula, and r.tp_measured from the run's sum over its `steps` training steps
  /// (skipped fp16 ones included); prints both.
  void summarize_tp_traffic(TrainResult& r, int64_t steps);
  /// r.pp_bubble_*: from this rank's compute (busy) and schedule (span) seconds over the
  /// timed steps, gathered from every rank. Collective over the world.
  void summarize_pipeline(TrainResult& r, double busy, double span);
  /// r.ep_formula, and prints the ep group's all_to_all per update against it.
  void summarize_ep_traffic(TrainResult& r);

  bool is_rank0() const { return world_->rank() == 0; }
  int dp_rank() const { return mesh_->coord()[Axis::DP]; }

  TrainConfig config_;
  TrainerOptions options_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<DeviceMesh> mesh_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<profile::ProfileWindow> profile_;  // [profile] steps = [a, b]
  /// The one step: owns the model, its data parallelism, the optimizer and the loss scaler.
  std::unique_ptr<TrainStep> one_step_;
  std::unique_ptr<TrainData> train_data_;
  std::unique_ptr<TrainData> val_data_;  // the val split, opened once (unshuffled)
  std::vector<std::pair<std::string, std::unique_ptr<TrainData>>> val_by_data_;  // a blend's parts'
  /// Opens the val split (and a blend's per data set) into val_data_ and val_by_data_.
  void open_val();
  /// The loss (and accuracy) of `val`, from the start of it.
  EvalResult evaluate_split(TrainData& val);
  std::filesystem::path run_dir_;
  std::unique_ptr<RunDirLock> run_lock_;  // rank 0's, from before the run dir is touched
  int64_t step_ = 0;
  double peak_flops_ = 0.0;
  std::string launch_;  // who launched the ranks and where they run (launch_summary)
  RankWindow straggler_window_;  // this rank's update and wait times since the last log
  std::optional<StragglerWatch> straggler_watch_;  // log.straggler_factor / _windows
  double injected_delay_s_ = 0;  // KILN_SLOW_RANK's sleep per update on this rank (tests)
  std::string peak_source_;  // where peak_flops_ comes from (GemmPeak::source)
  bool last_skipped_ = false;
  mutable nlohmann::json lora_state_;  // lora_state(), once computed
  nlohmann::json rollback_record_;  // written first to metrics.jsonl by run(); null: none
  HostCopies host_copies_;  // what the save being written borrows (kept for the next, async)
  std::unique_ptr<BackgroundSave> pending_save_;  // checkpoint.async: the save in flight
  std::vector<nlohmann::json> save_records_;  // rank 0: finished saves, not yet in metrics
};

/// The "section.key" names whose lines differ between two to_toml() texts (or that only
/// one has), in the first text's order, then those only the second has.
std::vector<std::string> config_keys_that_differ(const std::string& toml_a,
                                                 const std::string& toml_b);

/// Throws kiln::Error, on every rank of `world`, naming the first key (and this rank's
/// value) whose value differs between ranks. Collective.
void check_config_on_all_ranks(Communicator& world, const TrainConfig& config);

/// Installs SIGTERM / SIGUSR1 / SIGINT handlers that ask the running trainer to
/// checkpoint and stop after the current update.
void install_preemption_handlers();
bool preemption_requested();

/// Under Open MPI's mpirun (OMPI_COMM_WORLD_SIZE set) with odls_base_sigkill_timeout not
/// raised to 10 s or more in the environment (OMPI_MCA_odls_base_sigkill_timeout, which
/// `mpirun --mca` sets too): a one-line note that Ctrl-C or SIGTERM to mpirun kills the
/// ranks before they can save, and what to do (docs/distributed.md, "Stopping a run").
/// Otherwise "".
std::string mpirun_signal_note();

}  // namespace kiln
