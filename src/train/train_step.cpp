#include "train/train_step.h"

#include "comm/ledger.h"
#include "config/components.h"
#include "core/error.h"
#include "models/registry.h"
#include "model_io/model_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

namespace kiln {

const char* step_phase_name(StepPhase p) {
  switch (p) {
    case StepPhase::Data: return "data";
    case StepPhase::Forward: return "forward";
    case StepPhase::Backward: return "backward";
    case StepPhase::GradSync: return "grad_sync";
    case StepPhase::Optimizer: return "optimizer";
    case StepPhase::Done: return "done";
  }
  return "?";
}

TrainConfig step_config(const ModelOptions& m, int B, int T, const std::string& dtype,
                        const std::vector<std::string>& overrides) {
  return load_config_string(fmt::format(R"([model]
arch = "{}"
n_layer = {}
n_head = {}
n_embd = {}
block_size = {}
vocab_size = {}
[train]
steps = 1000000000
micro_batch = {}
global_batch = {}
seq_len = {}
dtype = "{}"
[schedule]
kind = "constant"
)", m.arch, m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size, B, B, T, dtype),
                            overrides, "step_config");
}

namespace {
int size_of(const Communicator* group) { return group ? group->size() : 1; }
}  // namespace

StepGroups StepGroups::of_mesh(const DeviceMesh& mesh) {
  return StepGroups{.dp_cp = mesh.dp_cp_comm(),
                    .tp = mesh.tp() > 1 ? &mesh.comm(Axis::TP) : nullptr,
                    .pp = mesh.pp() > 1 ? &mesh.comm(Axis::PP) : nullptr,
                    .cp = mesh.cp() > 1 ? &mesh.comm(Axis::CP) : nullptr,
                    .ep = mesh.ep() > 1 ? mesh.ep_comm() : nullptr,
                    .edp = mesh.ep() > 1 ? &mesh.edp_comm() : nullptr};
}

TrainStep::TrainStep(const TrainConfig& config, Backend& backend, const StepGroups& groups)
    : config_(config), backend_(backend), groups_(groups) {
  check_groups();
  accum_ = config_.grad_accum_steps(groups_.dp_cp.size() / size_of(groups_.cp));
  ModelStorage storage = plan_parallelism();
  const ModelOptions options = model_options_from(config_);
  count_params(options, storage);
  storage.held_parts = plan_stages(options, storage);
  build_model(options, storage);
  // A pipeline keeps every micro-batch of the step on the device (several are in flight,
  // on several chunks); one buffer serves the trivial schedule.
  allocate_buffers(storage.held_parts.empty() ? 1 : accum_);
  const pp::ScheduleKind kind = pp::parse_schedule_kind(config_.parallel.pp_schedule);
  pp::Schedule schedule = pp::make_schedule(kind, size_of(groups_.pp),
                                            config_.parallel.virtual_stages, accum_);
  pipeline_ = std::make_unique<pp::PipelineExecutor>(*model_, groups_.pp, std::move(schedule),
                                                     boundaries_, config_.train.micro_batch,
                                                     config_.train.seq_len / cp());
}

void TrainStep::check_groups() const {
  const int tp = size_of(groups_.tp), pp = size_of(groups_.pp), cp = size_of(groups_.cp);
  KILN_CHECK(cp == config_.parallel.cp, "{}: parallel.cp = {} but the context-parallel group has "
             "{} ranks", config_.source, config_.parallel.cp, cp);
  KILN_CHECK(groups_.dp_cp.size() % cp == 0, "{}: the dp x cp group has {} ranks, not a multiple of "
             "cp = {}", config_.source, groups_.dp_cp.size(), cp);
  KILN_CHECK(tp == config_.parallel.tp, "{}: parallel.tp = {} but the tensor-parallel group has "
             "{} ranks", config_.source, config_.parallel.tp, tp);
  KILN_CHECK(pp == config_.parallel.pp, "{}: parallel.pp = {} but the pipeline group has {} ranks",
             config_.source, config_.parallel.pp, pp);
  const int ep = size_of(groups_.ep);
  KILN_CHECK(ep == config_.parallel.ep && (ep == 1) == (groups_.edp == nullptr),
             "{}: parallel.ep = {} but the expert-parallel group has {} ranks{}", config_.source,
             config_.parallel.ep, ep, groups_.edp ? "" : " and no expert-data-parallel group");
}

ModelStorage TrainStep::plan_parallelism() {
  const int tp = size_of(groups_.tp), cp = size_of(groups_.cp);
  // ZeRO shards over the whole dp x cp group, so parts align to its size.
  ModelStorage storage = zero_model_storage(config_.parallel.zero_stage, groups_.dp_cp.size(),
                                            parse_dtype(config_.train.dtype),
                                            parse_dtype(config_.train.grad_dtype));
  storage.classifier_chunk_mb = config_.train.classifier_chunk_mb;
  storage.freeze = config_.train.freeze;
  if (cp > 1) {
    KILN_CHECK(config_.model.dropout == 0.0, "{}: model.dropout = {} with parallel.cp = {}: "
               "dropout under context parallelism is not supported yet (set model.dropout = 0)",
               config_.source, config_.model.dropout, cp);
    cp_group_ = std::make_unique<CommCpGroup>(*groups_.cp);
    cp_plan_ = std::make_unique<ContextParallelPlan>(*cp_group_);
    storage.plans.push_back(cp_plan_.get());
  }
  if (tp > 1) {
    const int64_t rows = int64_t{config_.train.micro_batch} * (config_.train.seq_len / cp);
    KILN_CHECK(!config_.parallel.sequence_parallel || rows % tp == 0,
               "{}: parallel.sequence_parallel splits the micro-batch's micro_batch x seq_len{} = "
               "{} rows over parallel.tp = {}, which does not divide them", config_.source,
               cp > 1 ? " / cp" : "", rows, tp);
    tp_group_ = std::make_unique<CommTpGroup>(*groups_.tp);
    tp_plan_ = std::make_unique<TensorParallelPlan>(*tp_group_, config_.parallel.sequence_parallel);
    storage.plans.push_back(tp_plan_.get());
  }
  if (config_.train.fp8 != "none") {
    require_ops(backend_, OpFamily::Fp8, parse_dtype(config_.train.dtype), "train.fp8");
    // Tensorwise: each call's amaxes over the ranks that cut a micro-batch's tensors;
    // delayed: each step's over every rank.
    amax_group_ = std::make_unique<CommAmaxGroup>(std::vector<Communicator*>{groups_.tp, groups_.cp});
    step_amax_group_ = std::make_unique<CommAmaxGroup>(
        std::vector<Communicator*>{&groups_.dp_cp, groups_.tp, groups_.pp});
    const Fp8Options options{config_.train.fp8, config_.train.fp8_layers,
                             config_.train.fp8_amax_history_len,
                             config_.train.fp8_amax_compute_algo == "most_recent", config_.source};
    fp8_plan_ = std::make_unique<Fp8Plan>(
        backend_, options, amax_group_->empty() ? nullptr : amax_group_.get(),
        step_amax_group_->empty() ? nullptr : step_amax_group_.get());
    storage.plans.push_back(fp8_plan_.get());
  }
  if (config_.train.lora.rank > 0) {  // after tp: an adapter takes its Linear's placement
    const LoraSection& l = config_.train.lora;
    KILN_CHECK(l.dropout == 0.0 || cp == 1, "{}: train.lora.dropout = {} with parallel.cp = {}: "
               "dropout under context parallelism is not supported yet", config_.source,
               l.dropout, cp);
    const nn::LoraSpec spec{l.rank, static_cast<float>(l.alpha), l.rslora,
                            static_cast<float>(l.dropout)};
    lora_plan_ = std::make_unique<LoraPlan>(LoraOptions{spec, l.targets, config_.source});
    storage.plans.push_back(lora_plan_.get());
    storage.trainable_dtype = parse_dtype(l.dtype);  // the adapters' buffer
  }
  if (size_of(groups_.ep) > 1) {  // after tp: the ep cut keeps the tp cut of the hidden units
    if (!groups_.ep_group) ep_group_ = std::make_unique<CommEpGroup>(*groups_.ep);
    ep_plan_ = std::make_unique<ExpertParallelPlan>(groups_.ep_group ? *groups_.ep_group
                                                                     : *ep_group_);
    storage.plans.push_back(ep_plan_.get());
  }
  return storage;
}

void TrainStep::build_model(const ModelOptions& options, const ModelStorage& storage) {
  const int cp = this->cp();
  const int T = config_.train.seq_len;
  model_ = make_model(options, backend_, storage);  // a model without ring attention throws
  // A micro-batch balances over its cp ranks, moe.aux_loss_scope "global" over dp x cp.
  if (cp > 1) moe_micro_group_ = std::make_unique<CommMoeBalanceGroup>(*groups_.cp);
  if (groups_.dp_cp.size() > 1)
    moe_global_group_ = std::make_unique<CommMoeBalanceGroup>(groups_.dp_cp);
  model_->set_moe_balance_groups(moe_micro_group_.get(), moe_global_group_.get());
  KILN_CHECK(cp == 1 || T % (2 * cp) == 0, "{}: train.seq_len = {} is not a multiple of 2 x "
             "parallel.cp = {} (context parallelism cuts each sequence into 2 x cp equal chunks)",
             config_.source, T, 2 * cp);
  if (boundaries_.empty()) boundaries_ = {0, static_cast<int>(model_->parts().size())};
  model_->set_activation_checkpointing(
      nn::parse_activation_checkpointing(config_.train.activation_checkpointing));
  wrap_data_parallel(storage.held_parts);
  optimizer_ = std::make_unique<AdamW>(backend_, dp_->optimizer_segments(),
                                       adamw_config_from(config_));
  scaler_.enabled = model_->dtype() == DType::F16;
  scaler_.scale = scaler_.enabled ? config_.train.loss_scale : 1.0;
  scaler_.growth_interval = config_.train.loss_scale_growth_interval;
  shape_ = model_->batch_shape(config_.train.micro_batch, T);
  local_shape_ = model_->batch_shape(config_.train.micro_batch, T / cp);
  KILN_CHECK(cp == 1 || local_shape_.find("positions"), "{}: parallel.cp = {}: model.arch = "
             "\"{}\" takes no \"positions\" input, which context parallelism needs (each rank "
             "holds chunks of the sequence)", config_.source, cp, model_->arch());
  if (config_.data.packing == "document") {
    take_packed_inputs(shape_);
    take_packed_inputs(local_shape_);
  }
  // An input every cp rank takes whole (cu_seqlens) has the whole sequences' shape here too.
  for (BatchInput& in : local_shape_.inputs)
    if (in.whole_under_cp) in.shape = shape_.find(in.name)->shape;
  // What the data supplies, once: the required inputs, then the targets.
  staged_ = shape_.required();
  staged_.push_back(BatchInput{.name = "targets", .shape = shape_.targets, .dtype = DType::I32,
                               .per_token = shape_.targets.ndim() == 2});
  for (const BatchInput& in : staged_)
    KILN_CHECK(cp == 1 || in.per_token || in.whole_under_cp, "{}: parallel.cp = {}: the batch "
               "input '{}' {} is not laid out per token, so context parallelism cannot split it",
               config_.source, cp, in.name, in.shape.str());
}

// Document packing: the data supplies positions and cu_seqlens after the tokens
// (data/packing.h), so the model must declare them, in that order.
void TrainStep::take_packed_inputs(BatchShape& shape) const {
  static const char* const kPacked[] = {"tokens", "positions", "cu_seqlens"};
  for (size_t i = 0; i < std::size(kPacked); ++i) {
    KILN_CHECK(shape.find(kPacked[i]), "{}: data.packing = \"document\": model.arch = \"{}\" "
               "takes no \"{}\" input (packed documents need token positions and document "
               "boundaries); use data.packing = \"none\"", config_.source, model_->arch(),
               kPacked[i]);
    KILN_CHECK(i < shape.inputs.size() && shape.inputs[i].name == kPacked[i], "{}: data.packing "
               "= \"document\": model.arch = \"{}\" declares its inputs in another order than "
               "tokens, positions, cu_seqlens", config_.source, model_->arch());
    shape.inputs[i].optional = false;
  }
  KILN_CHECK(shape.required().size() == std::size(kPacked), "{}: data.packing = \"document\": "
             "model.arch = \"{}\" takes inputs beyond tokens, positions and cu_seqlens",
             config_.source, model_->arch());
}

void TrainStep::wrap_data_parallel(const std::vector<int>& held_parts) {
  dp_ = std::make_unique<DataParallel>(*model_, groups_.dp_cp, config_.parallel.zero_stage,
                                       config_.parallel.bucket_mb,
                                       size_of(groups_.tp) > 1 ? groups_.tp : nullptr,
                                       groups_.edp);
  if (held_parts.empty()) return;
  // Several micro-batches in flight: a resident part's gradient and a tied parameter's
  // (summed over its stages first) are reduced over dp once the schedule is done.
  std::vector<int> deferred;
  for (const ModelPart& part : model_->parts())
    if (part.resident) deferred.push_back(part.index);
  for (const ParamSpec& s : model_->params())  // a tied parameter, where this stage holds it
    if (std::count(tied_names_.begin(), tied_names_.end(), s.name)) deferred.push_back(s.part);
  dp_->defer_reduction(deferred);
}

void TrainStep::allocate_buffers(int buffers) {
  batch_buffers_ = buffers;
  for (int k = 0; k < batch_buffers_; ++k) {
    DeviceBatch& b = device_batches_.emplace_back();
    for (const BatchInput& in : local_shape_.required())
      b.inputs.push_back(backend_.empty(in.shape, in.dtype, MemCategory::Activations));
    b.targets = backend_.empty(local_shape_.targets, DType::I32, MemCategory::Activations);
  }
  // Room for every micro-batch of a step, so that none waits for the one before.
  staging_ = Tensor::empty(backend_.staging_allocator(), Shape{accum_ * staged_bytes() / 4},
                           DType::I32, MemCategory::Activations);
  stats_ = backend_.empty(Shape{3}, DType::F64, MemCategory::Activations);
  coef_ = backend_.empty(Shape{1}, DType::F32, MemCategory::Activations);
  if (cp() > 1) {  // the rank's chunks; and where the data gives no positions, theirs
    cp_positions_ = nn::cp_positions(config_.train.seq_len, cp(), cp_group_->rank());
    if (!local_shape_.find("positions")->optional) return;
    std::vector<int32_t> rows;
    for (int b = 0; b < config_.train.micro_batch; ++b)
      rows.insert(rows.end(), cp_positions_.begin(), cp_positions_.end());
    positions_ = backend_.empty(local_shape_.targets, DType::I32, MemCategory::Activations);
    backend_.copy_from_host(backend_.default_stream(), positions_, rows.data());
    backend_.synchronize(backend_.default_stream());
  }
}

std::vector<int> TrainStep::plan_stages(const ModelOptions& options, ModelStorage storage) {
  const int pp = size_of(groups_.pp);
  const int chunks = pp * config_.parallel.virtual_stages;
  KILN_CHECK(chunks > 1 || config_.parallel.pp_split.empty(), "{}: parallel.pp_split is set but "
             "parallel.pp x parallel.virtual_stages = 1: there is nothing to split",
             config_.source);
  if (chunks == 1) return {};  // one chunk, the whole model (boundaries set once it exists)
  // The whole model's parts and costs (they do not depend on tensor parallelism); which
  // parameters train decides which tied copies are summed below.
  storage = probe_storage(storage);
  const auto probe = make_model(options, backend_, storage);
  const auto n_parts = static_cast<int>(probe->parts().size());
  KILN_CHECK(model_arch(options.arch).stages, "{}: parallel.pp = {}, virtual_stages = {}: "
             "model.arch = \"{}\" does not run as pipeline stages ({} do)", config_.source, pp,
             config_.parallel.virtual_stages, options.arch,
             fmt::join(model_archs_with(&ModelArch::stages), ", "));
  std::vector<double> costs;
  for (const ModelPart& part : probe->parts()) costs.push_back(part.cost);
  boundaries_ = pp::split_stages(costs, chunks, config_.parallel.pp_split);
  boundaries_.push_back(n_parts);

  KILN_CHECK(config_.parallel.zero_stage <= 2, "{}: parallel.zero_stage = 3 with parallel.pp = {}: "
             "ZeRO-3 gathers each part for every pass, which several micro-batches in flight "
             "would repeat per micro-batch; use zero_stage 0-2 with pipeline parallelism",
             config_.source, pp);
  std::vector<int> held;
  const int rank = groups_.pp ? groups_.pp->rank() : 0;
  for (int c = 0; c < chunks; ++c)
    if (pp::Schedule::rank_of_chunk(c, pp) == rank)
      for (int k = boundaries_[static_cast<size_t>(c)]; k < boundaries_[static_cast<size_t>(c) + 1]; ++k)
        held.push_back(k);
  // Tied parameters: what the last part holds as copies when it is alone.
  storage.held_parts = {n_parts - 1};
  const auto last_alone = make_model(options, backend_, storage);
  for (const ParamSpec& s : last_alone->params())  // a frozen one never changes: no sum
    if (s.tied_copy && s.trainable) tied_names_.push_back(s.name);
  const int first = 0, last = pp::Schedule::rank_of_chunk(chunks - 1, pp);
  if (!tied_names_.empty() && first != last && (rank == first || rank == last))
    tied_comm_ = groups_.pp->new_group({first, last}, "tied");
  return held;
}

ModelStorage TrainStep::probe_storage(ModelStorage storage) const {
  storage.allocate_params = storage.allocate_grads = false;  // names and shapes only
  storage.plans.clear();  // global shapes: no split over ranks
  if (lora_plan_) storage.plans.push_back(lora_plan_.get());  // which parameters exist and train
  return storage;
}

void TrainStep::count_params(const ModelOptions& options, ModelStorage storage) {
  storage = probe_storage(storage);
  storage.held_parts.clear();
  const auto whole = make_model(options, backend_, storage);
  tally_.trainable = whole->trainable_elements();
  tally_.frozen = whole->frozen_elements();
  for (const ParamSpec& p : whole->params())
    if (!p.trainable) tally_.frozen_names.push_back(p.name);
}

void TrainStep::reduce_tied_grads() {
  if (!tied_comm_) return;
  const CommSite site("pp.all_reduce tied grads");
  for (const std::string& name : tied_names_)
    tied_comm_->all_reduce(model_->grad(name), ReduceOp::Sum, backend_.default_stream());
}

void TrainStep::check_tied_copies() {
  if (!tied_comm_) return;
  uint64_t h = 1469598103934665603ull;
  for (const std::string& name : tied_names_) h = hash_bytes(backend_, model_->param(name), h);
  const auto& segs = optimizer_->segments();
  for (size_t i = 0; i < segs.size(); ++i)
    if (optimizer_->master(i) &&
        std::count(tied_names_.begin(), tied_names_.end(), segs[i].spec.name))
      h = hash_bytes(backend_, optimizer_->master(i), h);
  check_same_on_all_ranks(*tied_comm_, "tied parameters (the first and last pipeline stage's "
                          "copies)", fmt::format("{:016x}", h));
}

Batch TrainStep::device_batch(int k) const {
  const DeviceBatch& d = device_batches_[static_cast<size_t>(k)];
  Batch b;
  for (size_t i = 0; i < d.inputs.size(); ++i) b.set(staged_[i].name, d.inputs[i]);
  if (positions_) b.set("positions", positions_);
  b.targets = d.targets;
  return b;
}

int64_t TrainStep::staged_bytes() const {
  const int64_t bytes = local_shape_.required_bytes() + local_shape_.targets.numel() * 4;
  return (bytes + 3) / 4 * 4;  // each slot 4-byte aligned
}

int64_t TrainStep::count_targets(const int32_t* targets) const {
  const int64_t n = shape_.targets.numel();
  int64_t count = 0;
  if (cp() == 1) {
    for (int64_t i = 0; i < n; ++i) count += targets[i] != -1 ? 1 : 0;
    return count;
  }
  const int64_t T = config_.train.seq_len;
  for (const int32_t t : cp_positions_)
    for (int64_t b = 0; b < n / T; ++b) count += targets[b * T + t] != -1 ? 1 : 0;
  return count;
}

void TrainStep::upload_micro_batch(const void* inputs, const int32_t* targets, int k) {
  backend_.synchronize(backend_.default_stream());
  stage_micro_batch(inputs, targets, k, 0);
}

void TrainStep::stage_micro_batch(const void* inputs, const int32_t* targets, int k, int slot) {
  const Stream s = backend_.default_stream();
  const DeviceBatch& d = device_batches_[static_cast<size_t>(k)];
  std::byte* host = static_cast<std::byte*>(staging_.raw()) + static_cast<int64_t>(slot) * staged_bytes();
  const auto* in = static_cast<const std::byte*>(inputs);
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    stage_rows(host, in, staged_[i]);
    backend_.copy_from_host(s, d.inputs[i], host);
    host += d.inputs[i].nbytes();
    in += staged_[i].nbytes();
  }
  stage_rows(host, reinterpret_cast<const std::byte*>(targets), staged_.back());
  backend_.copy_from_host(s, d.targets, host);
}

void TrainStep::stage_rows(std::byte* local, const std::byte* whole, const BatchInput& in) const {
  if (cp() == 1 || in.whole_under_cp) {
    std::memcpy(local, whole, static_cast<size_t>(in.nbytes()));
    return;
  }
  // Under cp, this rank's chunks of each sequence (every staged input is per token: checked
  // at construction): the columns cp_positions_ of [B, T, ...].
  const int64_t B = in.shape[0], T = in.shape[1];
  const int64_t token_bytes = in.nbytes() / (B * T);
  cp_split_rows(local, whole, B, T, token_bytes, cp_positions_);
}

namespace {
// Micro-batch 0 as uploaded (evaluation).
class OneBatch final : public pp::MicroBatches {
 public:
  explicit OneBatch(Batch b) : b_(std::move(b)) {}
  Batch batch(int) override { return b_; }
  void before_pass(int, bool) override {}

 private:
  Batch b_;
};
}  // namespace

LossSum TrainStep::forward_only() {
  OneBatch one(device_batch());
  LossSum l = pipeline_->forward_only(one);
  if (size_of(groups_.pp) == 1) return l;
  // Only the last stage computed the loss: the sums over pp reach every rank.
  std::vector<double> v{l.sum, static_cast<double>(l.targets), static_cast<double>(l.correct)};
  const CommSite site("eval.sum loss over pp");
  pp_sum(v);
  return {v[0], static_cast<int64_t>(v[1]), l.correct < 0 ? -1 : static_cast<int64_t>(v[2])};
}

// The step's micro-batches for the executor: uploaded at their first use, dropout keyed
// by the global index of the micro-batch's first sample, the data-parallel micro-step
// announced.
class TrainStep::StepBatches final : public pp::MicroBatches {
 public:
  StepBatches(TrainStep& step, const void* inputs, const int32_t* targets, int64_t update)
      : step_(step), inputs_(static_cast<const char*>(inputs)), targets_(targets), update_(update),
        uploaded_(static_cast<size_t>(step.accum_), false) {}
  Batch batch(int j) override {
    const int k = j % step_.batch_buffers_;
    if (!uploaded_[static_cast<size_t>(j)]) {
      uploaded_[static_cast<size_t>(j)] = true;
      step_.announce(StepPhase::Data);
      const auto in_bytes = static_cast<size_t>(step_.shape_.required_bytes());
      const auto per_micro = static_cast<size_t>(step_.shape_.targets.numel());
      // Staging slot j is free: the last step ended with a host read (the stream idle).
      step_.stage_micro_batch(inputs_ + static_cast<size_t>(j) * in_bytes,
                              targets_ + static_cast<size_t>(j) * per_micro, k, j);
    }
    Batch b = step_.device_batch(k);
    b.loss = step_.stats_.view_at(0, Shape{2});  // the loss stays on the device
    return b;
  }
  void before_pass(int j, bool forward) override {
    step_.dp_->begin_micro_step(j);
    // The cp ranks of a dp rank hold the same samples (dp x cp ranks are dp-major).
    const int cp = step_.cp(), dp = step_.groups_.dp_cp.size() / cp;
    const int rank = step_.groups_.dp_cp.rank() / cp;
    const int64_t micro = (update_ * step_.accum_ + j) * dp + rank;
    const auto seed = static_cast<uint64_t>(step_.config_.train.seed);
    const auto first_sample = static_cast<uint64_t>(micro * step_.config_.train.micro_batch);
    step_.model_->set_dropout(true, seed, first_sample);
    if (step_.lora_plan_)
      step_.lora_plan_->set_dropout(true, seed,
                                    first_sample * static_cast<uint64_t>(step_.config_.train.seq_len));
    step_.announce(forward ? StepPhase::Forward : StepPhase::Backward);
  }

 private:
  TrainStep& step_;
  const char* inputs_;
  const int32_t* targets_;
  int64_t update_;
  std::vector<bool> uploaded_;
};

TrainStep::~TrainStep() = default;

void TrainStep::init_weights(uint64_t seed) {
  dp_->init_weights(seed);
  optimizer_->sync_master_from_params();
}

void TrainStep::init_start_weights(uint64_t seed) {
  const bool lora = lora_plan_ != nullptr;
  const std::string& init_from = config_.model.init_from;
  if (init_from.empty() || lora) init_weights(seed);
  if (!init_from.empty()) {
    // Each rank reads only the ranges it holds (all of every parameter below ZeRO-3).
    std::vector<ParamSpec> base;
    for (const ParamSpec& p : model().params())
      if (!p.adapter) base.push_back(p);
    const auto source = open_model_weights(init_from, model_options_from(config_), base);
    load_weights(*source, lora ? Load::Base : Load::All);
  }
  init_parts();
}

void TrainStep::init_parts() {
  for (const std::string& entry : config_.model.init_parts) {
    const size_t eq = entry.find('=');
    KILN_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < entry.size(),
               "{}: model.init_parts entry '{}' is not PREFIX=PATH", config_.source, entry);
    const std::string prefix = entry.substr(0, eq), path = entry.substr(eq + 1);
    std::vector<ParamSpec> part;
    for (const ParamSpec& p : model().params())
      if (!p.adapter && p.name.starts_with(prefix + ".")) part.push_back(p);
    KILN_CHECK(!part.empty(), "{}: model.init_parts '{}': no parameter of this {} is named "
               "{}.*", config_.source, entry, model().arch(), prefix);
    const auto options = model().part_options(prefix);
    if (options) {  // a whole model reading the data's token ids
      const std::string data_dir = !config_.data.dir.empty() ? config_.data.dir
                                   : config_.data.blend.size() >= 2 ? config_.data.blend[1]
                                                                    : std::string();
      if (!data_dir.empty())
        check_part_tokenizer(path, data_dir, fmt::format("model.init_parts {}", entry));
    }
    const auto source = open_part_weights(path, prefix, part, options);
    load_weights(*source, Load::All, [&](const ParamSpec& p) {
      return !p.adapter && p.name.starts_with(prefix + ".");
    });
  }
}

void TrainStep::load_weights(const WeightSource& source, Load which,
                             const std::function<bool(const ParamSpec&)>& only) {
  // Each optimizer segment lies inside the load segment of its parameter (the whole
  // parameter below ZeRO-3, the same slice at ZeRO-3).
  const std::vector<AdamWSegment>& opt = optimizer_->segments();
  std::vector<float> buf;
  for (const AdamWSegment& seg : dp_->load_segments()) {
    if ((which == Load::Base && seg.spec.adapter) || (which == Load::Adapters && !seg.spec.adapter))
      continue;
    if (only && !only(seg.spec)) continue;
    buf.resize(static_cast<size_t>(seg.size()));
    for (const auto& run : seg.spec.slice.global_runs(seg.spec.shape, seg.begin, seg.end))
      source.read(seg.spec, run.global_begin, run.global_end,
                  buf.data() + (run.local_begin - seg.begin));
    upload_f32(backend_, seg.param, buf.data());  // rounded where no master is kept here
    for (size_t i = 0; i < opt.size(); ++i)
      if (opt[i].spec.name == seg.spec.name && opt[i].begin >= seg.begin && opt[i].end <= seg.end)
        optimizer_->set_weights(i, buf.data() + (opt[i].begin - seg.begin));
  }
  optimizer_->reset_ema();
}

void TrainStep::dp_cp_sum(std::span<int64_t> values) {
  if (groups_.dp_cp.size() > 1) groups_.dp_cp.all_reduce_sum(values);
}
void TrainStep::pp_sum(std::span<double> values) {
  if (size_of(groups_.pp) > 1) groups_.pp->all_reduce_sum(values);
}

int64_t TrainStep::global_target_count(const int32_t* targets, int64_t update) {
  const auto per_micro = static_cast<size_t>(shape_.targets.numel());
  // Target count over the dp x cp group (this rank's chunks under cp), exact in 64
  // bits, from the host's targets.
  int64_t n_targets = 0;
  for (int j = 0; j < accum_; ++j) n_targets += count_targets(targets + static_cast<size_t>(j) * per_micro);
  const CommSite site("train.sum target count");
  dp_cp_sum(std::span<int64_t>(&n_targets, 1));
  KILN_CHECK(n_targets > 0, "step {}: the global batch has no target tokens", update + 1);
  return n_targets;
}

void TrainStep::reduce_stats_and_clip() {
  const Stream s = backend_.default_stream();
  // stats_ = {loss sum, local target count, gradient sum of squares}, summed over ranks
  // on the device: every rank gets the same bits and takes the same decision.
  const Tensor loss_sum = stats_.view_at(0, Shape{1}), sumsq = stats_.view_at(2, Shape{1});
  if (groups_.dp_cp.size() > 1) {
    const CommSite site("train.all_reduce loss");
    groups_.dp_cp.all_reduce(loss_sum, ReduceOp::Sum, s);
  }
  dp_->grad_sum_squares(sumsq);
  if (size_of(groups_.pp) > 1) {
    const CommSite site("train.all_reduce step statistics over pp");
    groups_.pp->all_reduce(stats_, ReduceOp::Sum, s);  // the last stage's loss
  }
  // The clipping coefficient (and the loss scale's division) stays on the device too:
  // NaN, so that the update is skipped, when the norm or the loss is not finite.
  backend_.clip_coefficient(s, coef_, sumsq, loss_sum, config_.optim.grad_clip,
                            static_cast<float>(scaler_.scale));
}

double TrainStep::read_stats(StepResult& r, int64_t n_targets) {
  double host[3] = {0.0, 0.0, 0.0};
  backend_.copy_to_host(backend_.default_stream(), host, stats_);
  r.loss = host[0] / static_cast<double>(n_targets);
  r.grad_norm = std::sqrt(host[2]) / scaler_.scale;
  return host[2];
}

std::optional<MoeStats> TrainStep::global_moe_stats() {
  std::optional<MoeStats> m = model_->take_moe_stats();
  const int pp = size_of(groups_.pp);
  if (!m || (groups_.dp_cp.size() == 1 && pp == 1)) return m;
  // Each rank's aux and z are the means over its micro-batches: their mean over the dp x
  // cp ranks is the step's share of the stage's MoE layers, and the shares add up over
  // the stages. The counts add up (a stage's rows of the other stages' layers are zero).
  std::vector<double> host{m->aux_loss, m->z_loss, m->dropped_slots.value_or(0.0)};
  for (const std::vector<double>& layer : m->tokens_per_expert)
    host.insert(host.end(), layer.begin(), layer.end());
  const Stream s = backend_.default_stream();
  const int64_t n = static_cast<int64_t>(host.size());
  if (!moe_sums_ || moe_sums_.numel() != n)
    moe_sums_ = backend_.empty(Shape{n}, DType::F64, MemCategory::CommBuffers);
  backend_.copy_from_host(s, moe_sums_, host.data());
  const CommSite site("train.all_reduce moe statistics");
  if (groups_.dp_cp.size() > 1) groups_.dp_cp.all_reduce(moe_sums_, ReduceOp::Sum, s);
  if (pp > 1) groups_.pp->all_reduce(moe_sums_, ReduceOp::Sum, s);
  backend_.copy_to_host(s, host.data(), moe_sums_);
  const double ranks = groups_.dp_cp.size();
  m->aux_loss = host[0] / ranks;
  m->z_loss = host[1] / ranks;
  m->micro_batches *= groups_.dp_cp.size() / cp();  // a dp rank's cp ranks run the same ones
  if (m->dropped_slots) m->dropped_slots = host[2];
  size_t i = 3;
  for (std::vector<double>& layer : m->tokens_per_expert)
    for (double& c : layer) c = host[i++];
  return m;
}

void TrainStep::gather_stage_bias(MoeStats& m) {
  if (size_of(groups_.pp) == 1 || m.expert_bias.empty()) return;
  std::vector<double> rows;
  for (const std::vector<float>& layer : m.expert_bias)
    rows.insert(rows.end(), layer.begin(), layer.end());
  const CommSite site("moe.sum expert bias over pp");
  pp_sum(rows);  // one stage's value and zeros: exact
  size_t i = 0;
  for (std::vector<float>& layer : m.expert_bias)
    for (float& b : layer) b = static_cast<float>(rows[i++]);
}

void TrainStep::skip_update(StepResult& r, int64_t update) {
  // Neither the schedule nor the optimizer's step count advances.
  KILN_CHECK(scaler_.scale > 1.0, "step {}: fp16 gradients are not finite even with loss "
             "scale 1; the model diverged (lower optim.lr or use bf16)", update + 1);
  scaler_.scale = std::max(scaler_.scale / 2.0, 1.0);
  scaler_.good_steps = 0;
  ++scaler_.skipped_steps;
  r.grad_norm = std::numeric_limits<double>::infinity();
  r.skipped = true;
}

StepResult TrainStep::run(const void* inputs, const int32_t* targets, int64_t update) {
  const int64_t n_targets = global_target_count(targets, update);
  const float grad_scale = static_cast<float>(scaler_.scale) / static_cast<float>(n_targets);
  backend_.fill(backend_.default_stream(), stats_, 0.f);
  // A model's own auxiliary losses (MoE balancing) enter as their mean over the step's
  // micro-batches on every dp rank.
  const int dp = groups_.dp_cp.size() / cp();
  model_->set_aux_loss_scale(static_cast<float>(scaler_.scale / (accum_ * dp)));
  dp_->begin_step(accum_);
  StepBatches batches(*this, inputs, targets, update);
  if (fp8_plan_) fp8_plan_->begin_step();  // delayed scaling records this step's amaxes
  pipeline_->run(batches, grad_scale);  // the loss sums land in stats_[0:2]
  {
    announce(StepPhase::GradSync);
    TraceScope scope(tracer_, "grad_sync");
    dp_->finish_gradients([this] { reduce_tied_grads(); });
  }
  if (fp8_plan_) fp8_plan_->end_step(update);  // delayed scaling's amax history
  if (lora_plan_) lora_plan_->set_dropout(false, 0, 0);  // evaluation and sampling: none
  announce(StepPhase::Optimizer);
  TraceScope optimizer_scope(tracer_, "optimizer");
  reduce_stats_and_clip();
  StepResult r;
  r.lr = static_cast<float>(learning_rate(config_, update));
  if (scaler_.enabled) {
    const double sumsq = read_stats(r, n_targets);  // fp16: the skip decision precedes the update
    if (!(std::isfinite(sumsq) && std::isfinite(r.loss))) {
      skip_update(r, update);  // overflow: on every rank alike
      r.moe = global_moe_stats();  // the skipped step's figures, not the next one's
      announce(StepPhase::Done);
      return r;
    }
  }
  optimizer_->step(r.lr, 1.f, coef_);
  dp_->after_optimizer_step();
  if (!scaler_.enabled) read_stats(r, n_targets);  // after the update is queued: the stream stays busy
  r.moe = global_moe_stats();
  // A non-finite loss or norm skipped the update on the device (coef_ NaN); stop here.
  KILN_CHECK(std::isfinite(r.loss), "step {}: the loss is {} (diverged); lower optim.lr or check "
             "the data", update + 1, r.loss);
  KILN_CHECK(std::isfinite(r.grad_norm), "step {}: the gradient norm is {}", update + 1, r.grad_norm);
  if (r.moe) {
    model_->update_moe_bias(*r.moe);  // DeepSeek-V3's bias follows the applied update
    gather_stage_bias(*r.moe);
  }
  if (scaler_.enabled && ++scaler_.good_steps >= scaler_.growth_interval) {
    scaler_.scale *= 2.0;
    scaler_.good_steps = 0;
  }
  announce(StepPhase::Done);
  return r;
}

}  // namespace kiln
