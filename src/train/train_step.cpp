#include "train/train_step.h"

#include "core/error.h"
#include "models/registry.h"
#include "profile/tracer.h"
#include "train/model_io.h"

#include <fmt/format.h>

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

TrainConfig step_config(const ModelOptions& m, int B, int T, const std::string& dtype) {
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
                            {}, "step_config");
}

TrainStep::TrainStep(const TrainConfig& config, Backend& backend, Communicator& dp_comm,
                     Communicator* tp_comm)
    : config_(config), backend_(backend), comm_(dp_comm) {
  const int dp = comm_.size();
  const int tp = tp_comm ? tp_comm->size() : 1;
  KILN_CHECK(tp == config_.parallel.tp, "{}: parallel.tp = {} but the tensor-parallel group has "
             "{} ranks", config_.source, config_.parallel.tp, tp);
  accum_ = config_.grad_accum_steps(dp);
  ModelStorage storage = zero_model_storage(config_.parallel.zero_stage, dp,
                                            parse_dtype(config_.train.dtype),
                                            parse_dtype(config_.train.grad_dtype));
  if (tp > 1) {
    const int64_t rows = int64_t{config_.train.micro_batch} * config_.train.seq_len;
    KILN_CHECK(!config_.parallel.sequence_parallel || rows % tp == 0,
               "{}: parallel.sequence_parallel splits the micro-batch's micro_batch x seq_len = {} "
               "rows over parallel.tp = {}, which does not divide them", config_.source, rows, tp);
    tp_group_ = std::make_unique<CommTpGroup>(*tp_comm);
    tp_plan_ = std::make_unique<TensorParallelPlan>(*tp_group_, config_.parallel.sequence_parallel);
    storage.plan = tp_plan_.get();
  }
  model_ = make_model(model_options_from(config_), backend_, storage);
  model_->set_activation_checkpointing(
      nn::parse_activation_checkpointing(config_.train.activation_checkpointing));
  dp_ = std::make_unique<DataParallel>(*model_, comm_, config_.parallel.zero_stage,
                                       config_.parallel.bucket_mb, tp > 1 ? tp_comm : nullptr);
  optimizer_ = std::make_unique<AdamW>(backend_, dp_->optimizer_segments(),
                                       adamw_config_from(config_));
  scaler_.enabled = model_->dtype() == DType::F16;
  scaler_.scale = scaler_.enabled ? config_.train.loss_scale : 1.0;
  scaler_.growth_interval = config_.train.loss_scale_growth_interval;
  shape_ = model_->batch_shape(config_.train.micro_batch, config_.train.seq_len);
  inputs_ = backend_.empty(shape_.inputs, shape_.input_dtype, MemCategory::Activations);
  targets_ = backend_.empty(shape_.targets, DType::I32, MemCategory::Activations);
  staging_ = Tensor::empty(backend_.staging_allocator(),
                           Shape{shape_.inputs.numel() + shape_.targets.numel()}, DType::I32,
                           MemCategory::Activations);
}

Batch TrainStep::device_batch() const {
  Batch b;
  (shape_.images() ? b.images : b.tokens) = inputs_;
  b.targets = targets_;
  return b;
}

void TrainStep::upload_micro_batch(const void* inputs, const int32_t* targets) {
  const Stream s = backend_.default_stream();
  backend_.synchronize(s);
  auto* host = staging_.data<int32_t>();
  std::memcpy(host, inputs, inputs_.nbytes());
  std::memcpy(host + inputs_.numel(), targets, targets_.nbytes());
  backend_.copy_from_host(s, inputs_, host);
  backend_.copy_from_host(s, targets_, host + inputs_.numel());
}

TrainStep::~TrainStep() = default;

void TrainStep::init_weights(uint64_t seed) {
  dp_->init_weights(seed);
  optimizer_->sync_master_from_params();
}

void TrainStep::dp_sum(std::span<int64_t> values) {
  if (comm_.size() > 1) comm_.all_reduce_sum(values);
}
void TrainStep::dp_sum(std::span<double> values) {
  if (comm_.size() > 1) comm_.all_reduce_sum(values);
}

StepResult TrainStep::run(const void* inputs, const int32_t* targets, int64_t update) {
  const int dp_size = comm_.size(), dp_rank = comm_.rank();
  const auto in_bytes = static_cast<size_t>(inputs_.nbytes());
  const auto per_micro = static_cast<size_t>(targets_.numel());
  // Target count and loss sum over the data-parallel group, exact in 64 bits.
  int64_t n_targets = 0;
  for (size_t i = 0; i < per_micro * static_cast<size_t>(accum_); ++i) n_targets += targets[i] != -1 ? 1 : 0;
  dp_sum(std::span<int64_t>(&n_targets, 1));
  KILN_CHECK(n_targets > 0, "step {}: the global batch has no target tokens", update + 1);
  const float grad_scale = static_cast<float>(scaler_.scale) / static_cast<float>(n_targets);
  announce(StepPhase::Data);
  dp_->begin_step(accum_);
  double loss_sum = 0.0;
  for (int k = 0; k < accum_; ++k) {
    if (k > 0) announce(StepPhase::Data);
    dp_->begin_micro_step(k);
    upload_micro_batch(static_cast<const char*>(inputs) + static_cast<size_t>(k) * in_bytes,
                       targets + static_cast<size_t>(k) * per_micro);
    model_->set_dropout(true, static_cast<uint64_t>(config_.train.seed),
                        static_cast<uint64_t>((update * accum_ + k) * dp_size + dp_rank));
    {
      announce(StepPhase::Forward);
      auto scope = profile::trace_scope("forward");
      loss_sum += model_->forward(device_batch(), grad_scale).sum;
    }
    announce(StepPhase::Backward);
    auto scope = profile::trace_scope("backward");
    model_->backward();
  }
  {
    announce(StepPhase::GradSync);
    auto scope = profile::trace_scope("grad_sync");
    dp_->finish_gradients();
  }
  announce(StepPhase::Optimizer);
  auto optimizer_scope = profile::trace_scope("optimizer");
  StepResult r;
  dp_sum(std::span<double>(&loss_sum, 1));
  r.loss = loss_sum / static_cast<double>(n_targets);
  // Summed over all ranks: every rank sees the same value and takes the same decision.
  const double sumsq = dp_->grad_sum_squares();
  r.lr = static_cast<float>(learning_rate(config_, update));
  if (scaler_.enabled && !(std::isfinite(sumsq) && std::isfinite(r.loss))) {
    // Overflow: skip the update on every rank alike, halve the scale; neither the
    // schedule nor the optimizer's step count advances.
    KILN_CHECK(scaler_.scale > 1.0, "step {}: fp16 gradients are not finite even with loss scale "
               "1; the model diverged (lower optim.lr or use bf16)", update + 1);
    scaler_.scale = std::max(scaler_.scale / 2.0, 1.0);
    scaler_.good_steps = 0;
    ++scaler_.skipped_steps;
    r.grad_norm = std::numeric_limits<double>::infinity();
    r.skipped = true;
    announce(StepPhase::Done);
    return r;
  }
  KILN_CHECK(std::isfinite(r.loss), "step {}: the loss is {} (diverged); lower optim.lr or check "
             "the data", update + 1, r.loss);
  r.grad_norm = std::sqrt(sumsq) / scaler_.scale;
  KILN_CHECK(std::isfinite(r.grad_norm), "step {}: the gradient norm is {}", update + 1, r.grad_norm);
  optimizer_->step(r.lr, clip_scale(r.grad_norm, config_.optim.grad_clip) /
                             static_cast<float>(scaler_.scale));
  dp_->after_optimizer_step();
  if (scaler_.enabled && ++scaler_.good_steps >= scaler_.growth_interval) {
    scaler_.scale *= 2.0;
    scaler_.good_steps = 0;
  }
  announce(StepPhase::Done);
  return r;
}

}  // namespace kiln
