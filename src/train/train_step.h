// TrainStep: the one training step, from a rank's micro-batches to an applied update
// (Megatron-LM's train_step, torchtitan's Trainer.train_step). The trainer, `kiln
// memplan` (on the Meta backend with a simulated communicator), `kiln bench` and the
// programs in bench/ all run it; nothing else calls the model's backward() or the
// optimizer's step().
//
// It builds, from a TrainConfig, the model (models/registry.h, by model.arch; split by the
// tensor-parallel plan over the tp group when parallel.tp > 1, parallel/tp_plan.h; only
// this pipeline rank's chunks when parallel.pp x virtual_stages > 1), the data-parallel
// wrapper (ZeRO stage parallel.zero_stage over the dp x cp group), AdamW over this rank's
// segments and the pipeline schedule with its executor (parallel/pipeline.h; pp = 1 is
// the trivial schedule F0 B0 F1 B1 ...). The tp and pp ranks of a dp rank run the same
// micro-batches and see the same losses. With parallel.cp > 1 the cp ranks of a dp rank
// get the same micro-batches and each keeps its chunks of every sequence (tokens,
// targets and positions: parallel/context_parallel.h); gradients are then reduced over
// the dp x cp group. One run():
//   1. the global batch's target count, summed over the dp x cp group (the loss is
//      the mean over every target of the global batch, whatever accumulation or world);
//   2. the schedule over grad_accum_steps micro-batches: forwards with the gradient
//      scaled by loss_scale / targets, backwards (gradients accumulate; ZeRO reduces as
//      it goes); a tied parameter split over the first and last stage (GPT-2's wte) has
//      its two gradients summed, so both copies take the same update;
//   3. the loss summed over ranks (computed on the last stage), the global gradient norm
//      (every element once over dp x tp x pp; every rank the same), the fp16 overflow
//      check (skip and halve the scale on every rank alike: Micikevicius et al. 2018),
//      global-norm clipping, the AdamW update at learning_rate(config, update) and the
//      ZeRO-1/2 parameter all-gather.
// The losses, the norm and the clipping coefficient stay on the device until the one
// host read of a step (its last act; before the update with fp16, whose skip decision
// the host takes): nothing inside the step waits for the device (docs/cuda.md).
#pragma once

#include "comm/communicator.h"
#include "core/trace_sink.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/fp8_plan.h"
#include "models/lora_plan.h"
#include "parallel/mesh.h"
#include "parallel/moe_balance_group.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_plan.h"
#include "models/registry.h"
#include "config/config.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>

namespace kiln {

class WeightSource;  // train/model_io.h

/// fp16 dynamic loss scaling (Micikevicius et al. 2018, section 3.2): the loss, and so
/// every gradient, is multiplied by `scale`; the optimizer divides it out. An overflow
/// halves it (not below 1) and skips the update; growth_interval clean updates double it.
/// For fp32 and bf16 the scale stays 1.
struct LossScaler {
  bool enabled = false;
  double scale = 1.0;
  int64_t good_steps = 0, skipped_steps = 0;
  int64_t growth_interval = 2000;
};

/// Where a step is, for observers (profiling scopes, the planner's phase labels, bench
/// timings). Each phase is announced when it begins; Done after the update. Data: a
/// micro-batch is copied to the device (the first also zeroes the gradients).
enum class StepPhase { Data, Forward, Backward, GradSync, Optimizer, Done };
const char* step_phase_name(StepPhase p);
struct StepObserver {
  virtual ~StepObserver() = default;
  virtual void on_phase(StepPhase phase) {}
};

struct StepResult {
  double loss = 0.0;       // mean loss per target of the global batch (nats)
  double grad_norm = 0.0;  // global norm before clipping; +inf when skipped
  bool skipped = false;    // fp16 overflow: no update was applied
  float lr = 0.f;          // the learning rate of the update
  /// A mixture-of-experts model's balancing figures over the whole global batch: the aux
  /// and z losses as optimised (the mean over micro-batches and data-parallel ranks), the
  /// slots each expert received summed over them; nullopt for other models.
  std::optional<MoeStats> moe;
};

/// A training config for a step outside the trainer (benchmarks): the model `model`
/// (vocab_size required), micro_batch = global_batch = B, seq_len T, train.dtype `dtype`,
/// a constant learning rate, defaults elsewhere, then `overrides` ("section.key=value",
/// as --set takes them). Validated like a config file (errors name "--set" and the key).
TrainConfig step_config(const ModelOptions& model, int B, int T, const std::string& dtype = "fp32",
                        const std::vector<std::string>& overrides = {});

/// The communicators a step runs over; not owned. A trainer takes them from its mesh
/// (of_mesh); programs without one (benchmarks, `kiln memplan`, tests) name them.
struct StepGroups {
  /// The dp x cp group, over which gradients are reduced and ZeRO shards
  /// (DeviceMesh::dp_cp_comm: the dp group when cp is 1; one rank: a local communicator).
  Communicator& dp_cp;
  Communicator* tp = nullptr;  // the tensor-parallel group, of parallel.tp ranks; nullptr: 1
  Communicator* pp = nullptr;  // the pipeline group, of parallel.pp ranks; nullptr: 1
  Communicator* cp = nullptr;  // the context-parallel ring, of parallel.cp ranks; nullptr: 1
  /// The expert-parallel group (parallel.ep ranks of the dp x cp group) and the
  /// expert-data-parallel group (the dp x cp / ep ranks holding the same experts, over
  /// which expert weights are reduced and ZeRO shards them); nullptr: ep = 1.
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
  /// The MoE layers' expert-parallel group; nullptr: a CommEpGroup over `ep` (the planner
  /// passes one that models the routing, plan/planned_ep_group.h).
  nn::EpGroup* ep_group = nullptr;

  /// The groups of `mesh` (its communicators built): nullptr for an axis of size 1.
  static StepGroups of_mesh(const DeviceMesh& mesh);
};

class TrainStep {
 public:
  /// `config` resolved for training (global_batch set); `groups` of the sizes it names
  /// (parallel.tp, .pp, .cp; dp x cp ranks reduce). Throws kiln::Error on a bad config (a
  /// group of another size, a seq_len that 2 x cp does not divide, dropout with cp), a
  /// model the tp plan cannot split (naming the layer) or a pipeline schedule that
  /// deadlocks (pipeline_schedule.h's simulator, run here).
  TrainStep(const TrainConfig& config, Backend& backend, const StepGroups& groups);
  ~TrainStep();

  Model& model() { return *model_; }
  /// The fp8 plan (train.fp8; its delayed-scaling state for checkpoints); nullptr without.
  Fp8Plan* fp8_plan() { return fp8_plan_.get(); }
  /// The LoRA plan of train.lora (nullptr without adapters).
  const LoraPlan* lora_plan() const { return lora_plan_.get(); }
  const Model& model() const { return *model_; }
  DataParallel& data_parallel() { return *dp_; }
  /// Seconds the MoE layers waited for the expert-parallel all_to_alls since the last call
  /// (exposed, not hidden); 0 without expert parallelism or with the planner's group.
  double take_ep_wait_seconds() { return ep_group_ ? ep_group_->take_wait_seconds() : 0.0; }
  const DataParallel& data_parallel() const { return *dp_; }
  AdamW& optimizer() { return *optimizer_; }
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  int grad_accum_steps() const { return accum_; }
  pp::PipelineExecutor& pipeline() { return *pipeline_; }
  /// The whole model's parameters (every stage's; global shapes, a tied one once, padding
  /// rows included): elements that train and that are frozen (train.freeze, or frozen by
  /// the model itself), and the frozen ones' names in layout order.
  struct ParamTally {
    int64_t trainable = 0, frozen = 0;
    std::vector<std::string> frozen_names;
  };
  const ParamTally& param_tally() const { return tally_; }
  /// Throws kiln::Error, on the first and the last pipeline stage, unless their copies of
  /// the tied parameters (GPT-2's wte) are bitwise equal (parameters and master weights).
  /// Collective over those two stages; no-op elsewhere and without a split tie.
  void check_tied_copies();
  /// One micro-batch's shapes as the caller gives it (Model::batch_shape of micro_batch x
  /// seq_len): the model's named inputs (e.g. int32 tokens [micro_batch, seq_len], or fp32
  /// images) and int32 targets. Whole sequences, also under cp.
  const BatchShape& batch_shape() const { return shape_; }
  /// The context-parallel size (1 without).
  int cp() const { return cp_group_ ? cp_group_->size() : 1; }
  /// Device micro-batch buffer k (0 .. the micro-batches a step keeps at once - 1) as the
  /// model's Batch: its required inputs, [micro_batch, seq_len / cp] per-token ones under
  /// cp, with "positions" added under cp; upload_micro_batch fills buffer 0.
  Batch device_batch(int k = 0) const;
  /// The loss of device_batch() without gradient (evaluation), through every pipeline
  /// stage: the sums over the pp group (every rank gets them). Collective over pp.
  LossSum forward_only();

  /// The device micro-batch <- inputs (host: batch_shape()'s required inputs, each in its
  /// dtype, concatenated in declaration order) and targets (host int32,
  /// batch_shape().targets); this rank's chunks of the per-token ones under cp,
  /// read before returning, through the
  /// backend's staging buffer (pinned host memory on CUDA, so the copies are asynchronous
  /// DMA; see Backend::staging_allocator). Waits for the stream first: the previous
  /// micro-batch's copies out of the staging buffer must be done before it is overwritten.
  /// (run() does not wait: each of its micro-batches has its own staging slot.)
  void upload_micro_batch(const void* inputs, const int32_t* targets, int k = 0);
  /// The staging buffer: host memory, per micro-batch of a step (slot) the inputs then
  /// the targets as they go to the device (staged_bytes() each).
  const Tensor& staging() const { return staging_; }

  /// Random initial weights from the model (this rank's elements), then fp32 masters.
  void init_weights(uint64_t seed);
  /// The one "load weights" path (model.init_from; a later LoRA base or a model's parts
  /// read from elsewhere): every element this rank holds read from `source` in fp32, the
  /// fp32 master weights set at full precision and the low-precision parameters rounded
  /// to nearest from them (AdamW::set_weights), the moving average of the weights reset.
  /// Throws what WeightSource::read throws. `which`: every parameter, or a LoRA
  /// fine-tune's base (model.init_from) or adapters (train.lora.init_from) only, the others
  /// keeping their values.
  /// `only`, when given, picks the parameters to load (the others keep their values).
  enum class Load { All, Base, Adapters };
  void load_weights(const WeightSource& source, Load which = Load::All,
                    const std::function<bool(const ParamSpec&)>& only = {});
  /// The weights a run starts from (`kiln train` and `kiln bench` alike): model.init_from's
  /// (a kiln checkpoint or a Hugging Face folder, load_weights) or the seed's random ones
  /// (init_weights); under LoRA the adapters fresh (init_weights: B = 0) on that base.
  /// Then model.init_parts (init_parts). Throws what open_model_weights and load_weights
  /// throw.
  void init_start_weights(uint64_t seed);
  /// model.init_parts: each "PREFIX=PATH" loads the parameters PREFIX.* from another
  /// model (open_part_weights). Throws kiln::Error naming the config and entry when it is
  /// not PREFIX=PATH or no parameter has the prefix, and what open_part_weights throws.
  void init_parts();
  /// Observer of the phases; nullptr for none. Not owned.
  void set_observer(StepObserver* o) { observer_ = o; }
  /// Where the phases are reported for a trace (spans "forward" and "backward" from the
  /// pipeline, "grad_sync", "optimizer"); nullptr (the default): nowhere. Not owned.
  void set_tracer(TraceSink* tracer) {
    tracer_ = tracer;
    pipeline_->set_tracer(tracer);
  }

  /// One update from this rank's grad_accum_steps micro-batches: inputs and targets int32,
  /// each micro-batch laid out as upload_micro_batch takes it, one after another (targets
  /// may hold -1). `update` counts the
  /// updates applied before this one (learning rate, dropout masks). Collective over
  /// the dp x cp group. Throws when the global batch has no target or the loss or
  /// gradient norm is not finite (fp16 overflows are skipped instead, see LossScaler).
  StepResult run(const void* inputs, const int32_t* targets, int64_t update);

 private:
  void announce(StepPhase p) {
    if (observer_) observer_->on_phase(p);
  }
  class StepBatches;
  // The constructor's parts, in order.
  /// Throws kiln::Error unless the groups have the sizes the config names.
  void check_groups() const;
  /// ZeRO's storage over the reduction group, with the context- and tensor-parallel
  /// plans (cp_plan_, tp_plan_ over their groups) when cp, tp > 1.
  ModelStorage plan_parallelism();
  /// This rank's model (`storage.held_parts`, from plan_stages), its data-parallel
  /// wrapper, AdamW over its segments, the loss scaler and the batch shapes.
  void build_model(const ModelOptions& options, const ModelStorage& storage);
  /// Wraps the model in data parallelism (dp_); under a pipeline (`held_parts` not
  /// empty), defers the reduction of resident parts and tied parameters.
  void wrap_data_parallel(const std::vector<int>& held_parts);
  /// The device micro-batches (`buffers` of them), the staging buffer, the step's device
  /// statistics and, under cp, this rank's positions.
  void allocate_buffers(int buffers);

  // run()'s parts.
  /// The targets of the global batch (this rank's chunks under cp), summed over the
  /// reduction group; throws kiln::Error naming update + 1 when there are none.
  int64_t global_target_count(const int32_t* targets, int64_t update);
  /// stats_'s loss and gradient sum of squares summed over the ranks, and the clipping
  /// coefficient coef_, all on the device.
  void reduce_stats_and_clip();
  /// The step's one host read (stats_): r.loss and r.grad_norm; returns the gradient sum
  /// of squares (scaled).
  double read_stats(StepResult& r, int64_t n_targets);
  /// The model's balancing figures of this step, over every data-parallel rank and
  /// pipeline stage (collective over dp x cp and pp when the model has MoE blocks; one
  /// host read).
  std::optional<MoeStats> global_moe_stats();
  /// Each pipeline stage's moved selection biases (its MoE layers' rows) to every stage,
  /// so that m.expert_bias covers every layer (collective over pp).
  void gather_stage_bias(MoeStats& m);
  /// fp16 overflow: skips the update on every rank alike and halves the scale (r
  /// records the skip); throws kiln::Error once the scale is 1.
  void skip_update(StepResult& r, int64_t update);

  /// upload_micro_batch's copy through staging slot `slot`, without waiting.
  void stage_micro_batch(const void* inputs, const int32_t* targets, int k, int slot);
  /// local <- the whole host input `in` (whole sequences), or this rank's chunks of each
  /// sequence under cp.
  void stage_rows(std::byte* local, const std::byte* whole, const BatchInput& in) const;
  /// Bytes of one staging slot (a local micro-batch's inputs and targets, 4-byte aligned).
  int64_t staged_bytes() const;
  /// data.packing = "document": marks shape's tokens, positions and cu_seqlens required;
  /// throws kiln::Error naming the key when the model lacks one.
  void take_packed_inputs(BatchShape& shape) const;
  /// Sums `values` over the dp x cp (pipeline) group, exactly in 64 bits.
  void dp_cp_sum(std::span<int64_t> values);
  void pp_sum(std::span<double> values);
  /// Cuts the model into the schedule's chunks (boundaries_) and finds the tied
  /// parameters split over stages (tied_names_); returns the global parts this rank
  /// holds (empty: all, one chunk; boundaries_ then stay empty until the model exists).
  std::vector<int> plan_stages(const ModelOptions& options, ModelStorage storage);
  /// Sums the gradients of the tied parameters over their stages (tied_comm_).
  void reduce_tied_grads();
  /// tally_, from the whole model built without storage.
  void count_params(const ModelOptions& options, ModelStorage storage);
  /// `storage` for a probe of the whole model: nothing allocated, no plan but LoRA's (the
  /// plans that split over ranks change no global shape; LoRA's adds and freezes).
  ModelStorage probe_storage(ModelStorage storage) const;

  TrainConfig config_;
  Backend& backend_;
  StepGroups groups_;
  std::unique_ptr<CommTpGroup> tp_group_;   // with tp > 1; outlive the model
  std::unique_ptr<TensorParallelPlan> tp_plan_;
  std::unique_ptr<CommCpGroup> cp_group_;   // with cp > 1; outlive the model
  std::unique_ptr<ContextParallelPlan> cp_plan_;
  std::unique_ptr<CommAmaxGroup> amax_group_;       // train.fp8: the tp and cp groups
  std::unique_ptr<CommAmaxGroup> step_amax_group_;  // train.fp8: dp x cp, tp, pp
  std::unique_ptr<Fp8Plan> fp8_plan_;
  std::unique_ptr<LoraPlan> lora_plan_;
  std::unique_ptr<CommEpGroup> ep_group_;   // with ep > 1; outlive the model
  std::unique_ptr<ExpertParallelPlan> ep_plan_;
  // The balancing groups (Model::set_moe_balance_groups), outliving the model: the cp
  // group (with cp > 1) and dp x cp (with dp x cp > 1).
  std::unique_ptr<CommMoeBalanceGroup> moe_micro_group_, moe_global_group_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<pp::PipelineExecutor> pipeline_;
  std::vector<int> boundaries_;           // chunk c: parts [b[c], b[c+1])
  std::vector<std::string> tied_names_;   // tied parameters whose users sit on other stages
  std::unique_ptr<Communicator> tied_comm_;  // the first and last pipeline stage
  ParamTally tally_;
  int batch_buffers_ = 1;
  std::unique_ptr<AdamW> optimizer_;
  LossScaler scaler_;
  StepObserver* observer_ = nullptr;
  TraceSink* tracer_ = nullptr;
  int accum_ = 1;
  BatchShape shape_;        // the caller's micro-batch (whole sequences)
  BatchShape local_shape_;  // the model's: [B, T/cp] under cp, else shape_
  std::vector<BatchInput> staged_;  // shape_'s required inputs then the targets, as staged
  /// This rank's targets of a host micro-batch (batch_shape().targets) not ignored.
  int64_t count_targets(const int32_t* targets) const;
  struct DeviceBatch {
    std::vector<Tensor> inputs;  // local_shape_'s required inputs, in order
    Tensor targets;
  };
  std::vector<DeviceBatch> device_batches_;  // micro-batches on the device (local_shape_)
  std::vector<int32_t> cp_positions_;  // under cp: this rank's global positions, [T/cp]
  Tensor positions_;        // int32 [B, T/cp] under cp: cp_positions_ for every row
  Tensor staging_;           // per slot: inputs then targets, backend's staging memory
  Tensor stats_;  // fp64 [3] on the device: loss sum, target count, gradient sum of squares
  Tensor coef_;   // fp32 [1] on the device: the optimizer's gradient multiplier (clipping)
  Tensor moe_sums_;  // fp64 on the device: global_moe_stats's figures, summed over dp x cp
};

}  // namespace kiln
