// The training loop: each update timed and accounted (RunAccounting), evaluated, logged
// (metrics.jsonl and the console), sampled and checkpointed as the config asks, until
// train.steps, the exit interval or a preemption signal; then the run's totals and
// summaries (trainer_summary.cpp).
#include "train/trainer.h"

#include "comm/ledger.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "profile/tracer.h"
#include "train/metrics_record.h"
#include "train/run_accounting.h"
#include "sampling/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <utility>

namespace kiln {

namespace {
std::atomic<bool> g_preempt{false};
extern "C" void on_preempt_signal(int) {
  g_preempt.store(true);
  note_stop_signal();  // a wait blocked long after it says where (comm/ledger.h)
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

void install_preemption_handlers() {
  std::signal(SIGTERM, on_preempt_signal);
  std::signal(SIGUSR1, on_preempt_signal);
  std::signal(SIGINT, on_preempt_signal);  // Ctrl-C: checkpoint and stop too
}
bool preemption_requested() { return g_preempt.load(); }

std::string mpirun_signal_note() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return {};
  // Open MPI 4.1 answers Ctrl-C or SIGTERM with SIGCONT to the ranks at once, SIGTERM
  // after this many seconds and SIGKILL as many seconds later (default 1).
  const char* env = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  const int seconds = env != nullptr ? std::atoi(env) : 1;
  if (seconds >= 10) return {};
  return fmt::format("under mpirun, Ctrl-C or SIGTERM leaves the ranks {} s to save before Open "
                     "MPI kills them (odls_base_sigkill_timeout): export "
                     "OMPI_MCA_odls_base_sigkill_timeout=60, or stop with kill -USR1 <mpirun's "
                     "pid> (docs/distributed.md, \"Stopping a run\")", seconds);
}

TrainResult Trainer::run() {
  TrainResult r;
  r.first_step = step_;
  std::optional<MetricsLog> metrics;
  if (is_rank0()) metrics.emplace(run_dir_, step_);
  if (metrics && !rollback_record_.is_null()) metrics->write(std::exchange(rollback_record_, nullptr));
  StepMetrics constants = update_constants();
  constants.session_start = unix_seconds();
  constants.session_first_step = r.first_step;
  const CheckpointPolicy policy = checkpoint_policy();
  const int64_t stop_at = policy.stop_at();
  const auto run_start = Clock::now();
  RunAccounting acct(r.first_step, options_.untimed_steps);
  auto write_save_records = [&] {  // background saves committed since the last call
    for (const nlohmann::json& rec : take_save_records())
      if (metrics) metrics->write(rec);
  };
  while (step_ < stop_at) {
    const TriedStep t = timed_train_step(acct);
    if (last_skipped_) {  // fp16 overflow: the update was not applied, try the next batch
      if (metrics) metrics->write(skipped_step_record(step_ + 1, t.loss, scaler()));
      continue;
    }
    acct.add_update(step_, t.seconds, one_step_->pipeline().take_timing());
    straggler_window_.add(t.seconds, t.comm_wait_s);
    r.last_step = step_;
    r.last_loss = t.loss;
    StepMetrics m = constants;
    m.step = step_;
    m.loss = t.loss;
    m.lr = t.lr;
    m.grad_norm = t.grad_norm;
    m.step_time_s = t.seconds;
    m.moe = t.moe ? &*t.moe : nullptr;
    m.tokens_by_data = train_data_->tokens_by_dataset();
    if (eval_due()) {
      const EvalResult e = evaluate();
      r.last_val_loss = m.val_loss = e.loss;
      r.last_val_accuracy = m.val_accuracy = e.accuracy;
      m.val_loss_by_data = e.loss_by_data;
      m.evaluated = true;
    }
    log_update(m, metrics ? &*metrics : nullptr, t.comm_wait_s, stop_at, acct);
    if (std::optional<std::string> text = maybe_sample(); text && metrics)
      metrics->write({{"step", step_}, {"event", "sample"}, {"text", *text}});
    const bool stop = checkpoint_or_stop(policy, r);
    write_save_records();
    if (stop) break;
  }
  drain_background_save(/*last=*/true);  // the last save, if still writing
  write_save_records();
  finish_run(r, acct, run_start);
  return r;
}

Trainer::TriedStep Trainer::timed_train_step(RunAccounting& acct) {
  TriedStep t;
  const auto t0 = Clock::now();
  t.lr = static_cast<float>(learning_rate(config_, step_));
  if (profile_) profile_->begin_step(step_);
  const CommStats tp_before = mesh_->comm(Axis::TP).stats();
  const CommStats ep_before = mesh_->ep() > 1 ? mesh_->ep_comm()->stats() : CommStats{};
  StepResult r = train_step();
  if (injected_delay_s_ > 0)  // KILN_SLOW_RANK: a straggler, for tests
    std::this_thread::sleep_for(std::chrono::duration<double>(injected_delay_s_));
  t.loss = r.loss;
  t.grad_norm = r.grad_norm;
  t.moe = std::move(r.moe);
  acct.add_tp_traffic(tp_before, mesh_->comm(Axis::TP).stats());
  if (profile_) profile_->end_step();
  t.seconds = seconds_since(t0);
  t.comm_wait_s = one_step_->data_parallel().take_wait_seconds();
  acct.add_comm_wait(step_, t.comm_wait_s);
  if (mesh_->ep() > 1)
    acct.add_ep_traffic(step_, ep_before, mesh_->ep_comm()->stats(),
                        one_step_->take_ep_wait_seconds());
  return t;
}

StepResult Trainer::train_step() {
  const int B = config_.train.micro_batch, accum = one_step_->grad_accum_steps();
  // This rank's share of the whole global batch first: the step normalises the loss by
  // the targets of the global batch, known before the first backward.
  const BatchShape& shape = one_step_->batch_shape();
  const auto in_bytes = static_cast<size_t>(shape.required_bytes());
  const auto n_targets = static_cast<size_t>(shape.targets.numel());
  std::vector<std::byte> inputs(static_cast<size_t>(accum) * in_bytes);
  std::vector<int32_t> targets(static_cast<size_t>(accum) * n_targets);
  {
    auto scope = profile::trace_scope("data");
    for (int k = 0; k < accum; ++k) {
      train_data_->next_batch(inputs.data() + static_cast<size_t>(k) * in_bytes,
                              targets.data() + static_cast<size_t>(k) * n_targets, B, dp_rank(),
                              mesh_->dp());
    }
  }
  StepResult r = one_step_->run(inputs.data(), targets.data(), step_);
  last_skipped_ = r.skipped;
  if (r.skipped) {
    if (options_.verbose)
      fmt::print("kiln: step {}: gradient overflow in fp16, update skipped, loss scale -> {}\n",
                 step_ + 1, scaler().scale);
    return r;
  }
  ++step_;
  return r;
}

StepMetrics Trainer::update_constants() const {
  StepMetrics m;
  m.tokens_per_step = static_cast<int64_t>(config_.train.global_batch) *
                      static_cast<int64_t>(config_.train.seq_len);
  m.flops_per_step = one_step_->model().flops_per_token(config_.train.seq_len) *
                     static_cast<double>(m.tokens_per_step);
  m.world_peak_flops = peak_flops_ * world_->size();
  // An image model's sequence positions are its patches (ViT, DiT), not tokens.
  if (!one_step_->model().language_model()) m.throughput_unit = "pos/s";
  m.fp16_scaler = one_step_->scaler().enabled ? &one_step_->scaler() : nullptr;
  return m;
}

bool Trainer::eval_due() const {
  return config_.eval.every > 0 &&
         (step_ % config_.eval.every == 0 || step_ == config_.train.steps);
}

void Trainer::log_update(const StepMetrics& m, MetricsLog* metrics, double comm_wait_s,
                         int64_t stop_at, const RunAccounting& acct) {
  const bool log_now = config_.log.every > 0 &&
                       (step_ % config_.log.every == 0 || step_ == 1 || m.evaluated ||
                        step_ == stop_at);
  if (!log_now && !m.evaluated) return;
  nlohmann::json rec = step_record(m);
  if (config_.log.expert_counts && m.moe) rec["moe_expert_counts"] = m.moe->tokens_per_expert;
  // Memory by category: this rank's keys, and every rank's in mem_by_rank.
  add_memory_record(rec, memory_by_rank() /* collective */, world_->rank(), comm_wait_s);
  if (world_->size() > 1) note_stragglers(rec);  // collective
  if (metrics) metrics->write(rec);
  if (!options_.verbose) return;
  const double per_step = acct.mean_update_seconds(m.step_time_s);
  fmt::print("{}\n", progress_line(m, config_.train.steps,
                                   per_step * static_cast<double>(config_.train.steps - step_)));
  std::fflush(stdout);
}

void Trainer::note_stragglers(nlohmann::json& rec) {
  const StragglerSummary s = summarize_ranks(gather_rank_times(*world_, straggler_window_.take()));
  rec["slowest_rank"] = s.slowest_rank;
  rec["slowest_step_s"] = s.slowest_step_s;
  rec["median_step_s"] = s.median_step_s;
  rec["slowest_compute_s"] = s.slowest_compute_s;
  rec["median_compute_s"] = s.median_compute_s;
  const std::optional<std::string> warning = straggler_watch_->observe(s);
  if (warning && options_.verbose) fmt::print("kiln: warning: {}\n", *warning);
}

Trainer::EvalResult Trainer::evaluate() {
  auto scope = profile::trace_scope("eval");
  if (!val_data_) open_val();
  EvalResult r = evaluate_split(*val_data_);
  for (auto& [name, part] : val_by_data_) r.loss_by_data[name] = evaluate_split(*part).loss;
  return r;
}

Trainer::EvalResult Trainer::evaluate_split(TrainData& val_split) {
  TrainData* val = &val_split;
  val->set_state({});  // from the start of the split, every evaluation
  const int B = config_.train.micro_batch;
  const BatchShape& shape = one_step_->batch_shape();
  std::vector<std::byte> inputs(static_cast<size_t>(shape.required_bytes()));
  std::vector<int32_t> targets(static_cast<size_t>(shape.targets.numel()));
  // The first eval.batches global batches of the val split (global_batch samples each),
  // or the whole split when it has fewer, whatever the world size: each rank scores its
  // part in micro-batches, and the samples past the split's end in the last of them (the
  // loader wraps into the next epoch there) get ignored targets, so every sample counts
  // once and every layout scores the same samples.
  const int dp_size = mesh_->dp(), dp_rank = this->dp_rank();
  const int64_t per_call = int64_t{B} * dp_size, n_val = val->samples_per_epoch();
  const int64_t calls = std::min<int64_t>(int64_t{config_.eval.batches} * one_step_->grad_accum_steps(),
                                          (n_val + per_call - 1) / per_call);
  const size_t targets_per_sample = targets.size() / static_cast<size_t>(B);
  double sums[3] = {0.0, 0.0, 0.0};  // loss sum, targets, correct (classifiers)
  bool counted = false;
  for (int64_t i = 0; i < calls; ++i) {
    val->next_batch(inputs.data(), targets.data(), B, dp_rank, dp_size);
    for (int b = 0; b < B; ++b)
      if (i * per_call + int64_t{dp_rank} * B + b >= n_val)
        std::fill_n(targets.begin() + static_cast<ptrdiff_t>(b * targets_per_sample),
                    targets_per_sample, -1);
    one_step_->upload_micro_batch(inputs.data(), targets.data());
    // Dropout off; the evaluation draws of models that draw per sample (a flow model's
    // noise) keyed by the global sample index as in training, so each val sample draws
    // alike every time.
    one_step_->model().set_dropout(false, static_cast<uint64_t>(config_.train.seed),
                                   static_cast<uint64_t>(i * per_call + int64_t{dp_rank} * B));
    const LossSum l = one_step_->forward_only();
    one_step_->data_parallel().end_forward_only();
    sums[0] += l.sum;
    sums[1] += static_cast<double>(l.targets);
    if (l.correct >= 0) sums[2] += static_cast<double>(l.correct), counted = true;
  }
  const CommSite site("eval.sum loss over dp x cp");
  dp_cp_sum(std::span<double>(sums, 3));
  EvalResult r;
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  if (counted && sums[1] > 0) r.accuracy = sums[2] / sums[1];
  return r;
}

std::optional<std::string> Trainer::maybe_sample() {
  const auto& sc = config_.sample;
  if (sc.every <= 0 || step_ % sc.every != 0) return std::nullopt;
  const auto tok = data::load_tokenizer(tokenizer_data_dir(config_));
  std::vector<int32_t> prompt = sc.prompt.empty() ? std::vector<int32_t>{tok->eot_id()}
                                                  : tok->encode(sc.prompt);
  SampleOptions o;
  o.max_new_tokens = sc.tokens;
  o.temperature = static_cast<float>(sc.temperature);
  o.top_k = sc.top_k;
  o.seed = static_cast<uint64_t>(config_.train.seed) + static_cast<uint64_t>(step_);
  Model& model = one_step_->model();
  DataParallel& dp = one_step_->data_parallel();
  dp.gather_full_params();  // collective under ZeRO-3: every rank takes part
  std::optional<std::string> text;
  if (is_rank0()) {
    ModelHooks none;
    model.set_hooks(&none);
    const auto ids = sample_tokens(model, prompt, o);
    model.set_hooks(&dp);
    text = sc.prompt + tok->decode(ids);
    fmt::print("kiln: sample at step {}: {}\n", step_, *text);
  }
  dp.release_full_params();
  return text;
}

bool Trainer::checkpoint_or_stop(const CheckpointPolicy& policy, TrainResult& r) {
  // A signal may reach only some ranks: agree on stopping (any rank asked). The same
  // reduction tells whether a background save is still writing anywhere, and which rank
  // (the highest, as rank + 1) failed to write its part.
  const BackgroundSave* save = pending_save_.get();
  std::vector<float> agree{preemption_requested() ? 1.f : 0.f,
                           save && !save->finished() ? 1.f : 0.f,
                           save && save->finished() && !save->error().empty()
                               ? static_cast<float>(world_->rank() + 1) : 0.f};
  if (world_->size() > 1) {
    Tensor t = Tensor::view(agree.data(), Shape{3}, DType::F32);
    const CommSite site("train.all_reduce stop agreement");
    world_->all_reduce(t, ReduceOp::Max);
  }
  if (save && agree[1] == 0.f) finish_background_save(static_cast<int>(agree[2]) - 1);
  const bool signalled = agree[0] > 0.f;
  const bool preempt = policy.preempt(step_, signalled);
  if (policy.save_now(step_, preempt)) save_checkpoint();
  if (!preempt) return false;
  drain_background_save(/*last=*/true);  // the save of this step, if written in the background
  r.preempted = true;
  if (options_.verbose)
    fmt::print("kiln: stopping at step {} ({}); continue with --resume auto{}\n", step_,
               signalled ? "signal" : "exit interval",
               signalled ? "" : " and a larger --exit-interval, or none");
  return true;
}

void Trainer::finish_run(TrainResult& r, const RunAccounting& acct,
                         std::chrono::steady_clock::time_point run_start) {
  if (profile_) profile_->finish();
  acct.fill(r, update_constants().tokens_per_step);
  if (mesh_->dp_cp_comm().size() > 1) summarize_communication(r, acct.timed_steps());
  if (mesh_->tp() > 1) summarize_tp_traffic(r, acct.tried_steps());
  if (mesh_->pp() > 1) summarize_pipeline(r, acct.pipeline_busy_s(), acct.pipeline_span_s());
  if (mesh_->ep() > 1) summarize_ep_traffic(r);
  if (options_.verbose && step_ == r.first_step && step_ < config_.train.steps)
    fmt::print("kiln: already at update {} of {}, where --exit-interval {} stops: resume with a "
               "larger --exit-interval, or none, to continue\n", step_, config_.train.steps,
               options_.exit_interval);
  else if (options_.verbose && step_ == r.first_step)
    fmt::print("kiln: already at update {} of {}: nothing to do (to train on, resume with a "
               "larger train.steps: --resume auto --set train.steps=N)\n", step_,
               config_.train.steps);
  else if (options_.verbose)
    fmt::print("kiln: done: {} updates in {}, last loss {:.4f}{}\n", step_ - r.first_step,
               format_duration(seconds_since(run_start)), r.last_loss,
               r.last_val_loss >= 0 ? fmt::format(", val loss {:.4f}", r.last_val_loss) : "");
}

void Trainer::dp_cp_sum(std::span<double> values) {
  Communicator& c = mesh_->dp_cp_comm();
  if (c.size() > 1) c.all_reduce_sum(values);
}

std::vector<std::vector<int64_t>> Trainer::memory_by_rank() {
  // Per rank: current bytes of each category, then the peak of each, then the peak of
  // the total; sent as two int32 halves each so that sizes past 2 GiB survive.
  const MemoryStats mem = backend_->allocator().stats();
  std::vector<int64_t> values(mem.current.begin(), mem.current.end());
  values.insert(values.end(), mem.peak.begin(), mem.peak.end());
  values.push_back(mem.total_peak);
  std::vector<int32_t> mine;
  for (int64_t v : values) {
    mine.push_back(static_cast<int32_t>(v >> 31));
    mine.push_back(static_cast<int32_t>(v & 0x7fffffff));
  }
  const auto n = static_cast<int64_t>(mine.size());
  std::vector<int32_t> all = mine;
  if (world_->size() > 1) {
    const CommSite site("train.all_gather memory peaks");
    all.resize(static_cast<size_t>(n * world_->size()));
    world_->all_gather(Tensor::view(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::I32),
                       Tensor::view(mine.data(), Shape{n}, DType::I32));
  }
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(world_->size()));
  for (size_t r = 0; r < out.size(); ++r)
    for (int64_t i = 0; i < n; i += 2)
      out[r].push_back((static_cast<int64_t>(all[r * n + i]) << 31) | all[r * n + i + 1]);
  return out;
}

}  // namespace kiln
