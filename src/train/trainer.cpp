#include "train/trainer.h"

#include "backend/probe.h"
#include "backend/registry.h"
#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "train/model_io.h"
#include "train/sampler.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>

namespace kiln {

namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_preempt{false};
extern "C" void on_preempt_signal(int) { g_preempt.store(true); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

void install_preemption_handlers() {
  std::signal(SIGTERM, on_preempt_signal);
  std::signal(SIGUSR1, on_preempt_signal);
}
bool preemption_requested() { return g_preempt.load(); }

Trainer::Trainer(const TrainConfig& config, const TrainerOptions& options)
    : config_(config), options_(options), run_dir_(config.run.dir) {
  config_.validate_for_training();
  KILN_CHECK(!config_.data.dir.empty(), "{}: data.dir is required for training", config_.source);
  accum_ = config_.grad_accum_steps(dp_size_);
  seq_len_ = config_.train.seq_len;
  train_loader_ = std::make_unique<data::DataLoader>(config_.data.dir, "train", seq_len_,
                                                     static_cast<uint64_t>(config_.train.seed),
                                                     /*shuffle=*/true);
  const int data_vocab = train_loader_->meta().vocab_size;
  if (config_.model.vocab_size == 0) config_.model.vocab_size = data_vocab;
  KILN_CHECK(config_.model.vocab_size >= data_vocab,
             "{}: model.vocab_size {} is smaller than the data set's vocabulary ({} in {})",
             config_.source, config_.model.vocab_size, data_vocab, config_.data.dir);

  backend_ = make_backend("cpu");
  model_ = std::make_unique<GPT2>(gpt2_config_from(config_), *backend_);
  AdamWConfig oc;
  oc.lr = static_cast<float>(config_.optim.lr);
  oc.beta1 = static_cast<float>(config_.optim.beta1);
  oc.beta2 = static_cast<float>(config_.optim.beta2);
  oc.eps = static_cast<float>(config_.optim.eps);
  oc.weight_decay = static_cast<float>(config_.optim.weight_decay);
  optimizer_ = std::make_unique<AdamW>(*backend_, model_->params(), model_->param_buffer(),
                                       model_->grad_buffer(), oc);
  const int B = config_.train.micro_batch;
  tokens_ = backend_->empty(Shape{B, seq_len_}, DType::I32, MemCategory::Activations);
  targets_ = backend_->empty(Shape{B, seq_len_}, DType::I32, MemCategory::Activations);

  // Where to start: a checkpoint to resume, else init_from or a random init.
  fs::create_directories(run_dir_);
  const fs::path ckpt_root = run_dir_ / "ckpt";
  std::optional<fs::path> resume_dir;
  if (options_.resume == "auto") {
    resume_dir = checkpoint::find_latest_checkpoint(ckpt_root);
    if (!resume_dir) fmt::print("kiln: --resume auto: no checkpoint in {}, starting fresh\n",
                                ckpt_root.string());
  } else if (!options_.resume.empty()) {
    resume_dir = fs::path(options_.resume);
  }
  if (resume_dir) {
    load_checkpoint(*resume_dir);
  } else {
    KILN_CHECK(checkpoint::list_checkpoint_dirs(ckpt_root).empty(),
               "{} already holds checkpoints: pass --resume auto to continue, or choose another "
               "run.dir", ckpt_root.string());
    init_weights();
  }
  std::ofstream(run_dir_ / "config.toml") << config_.to_toml();

  peak_flops_ = config_.log.peak_tflops > 0 ? config_.log.peak_tflops * 1e12
                                            : measure_gemm_flops(*backend_, DType::F32);
  if (options_.verbose) {
    fmt::print("kiln: {}\n", model_->config().str());
    fmt::print("kiln: {} updates of {} sequences x {} tokens ({} micro-steps of {} per rank), "
               "backend {}, peak {:.1f} GFLOP/s ({})\n",
               config_.train.steps, config_.train.global_batch, seq_len_, accum_, B,
               backend_->name(), peak_flops_ / 1e9,
               config_.log.peak_tflops > 0 ? "log.peak_tflops" : "measured fp32 GEMM");
  }
}

Trainer::~Trainer() = default;

void Trainer::init_weights() {
  if (config_.model.init_from.empty()) {
    model_->init_weights(static_cast<uint64_t>(config_.train.seed));
    return;
  }
  load_weights_into(*model_, config_.model.init_from);
  if (options_.verbose) fmt::print("kiln: initialised from {}\n", config_.model.init_from);
}

double Trainer::train_step(double* grad_norm) {
  const int B = config_.train.micro_batch, T = seq_len_;
  // Fetch the whole global batch's share of this rank first: the loss is normalised by
  // the number of target tokens in the global batch, known before the first backward.
  std::vector<int32_t> inputs(static_cast<size_t>(accum_) * B * T), targets(inputs.size());
  int64_t n_targets = 0;
  for (int k = 0; k < accum_; ++k) {
    train_loader_->next_batch(inputs.data() + static_cast<size_t>(k) * B * T,
                              targets.data() + static_cast<size_t>(k) * B * T, B, dp_rank_,
                              dp_size_);
  }
  for (int32_t t : targets) n_targets += t != -1;
  KILN_CHECK(n_targets > 0, "step {}: the global batch has no target tokens", step_ + 1);
  const float grad_scale = 1.f / static_cast<float>(n_targets);

  model_->zero_grad();
  double loss_sum = 0.0;
  const Stream s = backend_->default_stream();
  for (int k = 0; k < accum_; ++k) {
    backend_->copy_from_host(s, tokens_, inputs.data() + static_cast<size_t>(k) * B * T);
    backend_->copy_from_host(s, targets_, targets.data() + static_cast<size_t>(k) * B * T);
    model_->set_dropout(true, static_cast<uint64_t>(config_.train.seed),
                        static_cast<uint64_t>(step_ * accum_ + k));
    loss_sum += model_->forward(tokens_, targets_, grad_scale);
    model_->backward();
  }
  const double loss = loss_sum / static_cast<double>(n_targets);
  KILN_CHECK(std::isfinite(loss), "step {}: the loss is {} (diverged); lower optim.lr or check "
             "the data", step_ + 1, loss);
  const double norm = std::sqrt(backend_->sum_squares(backend_->default_stream(), model_->grad_buffer()));
  KILN_CHECK(std::isfinite(norm), "step {}: the gradient norm is {}", step_ + 1, norm);
  *grad_norm = norm;
  const float lr = static_cast<float>(learning_rate(config_, step_));
  optimizer_->step(lr, clip_scale(norm, config_.optim.grad_clip));
  ++step_;
  return loss;
}

double Trainer::evaluate() {
  data::DataLoader val(config_.data.dir, "val", seq_len_, 0, /*shuffle=*/false);
  const int B = config_.train.micro_batch, T = seq_len_;
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  const Stream s = backend_->default_stream();
  model_->set_dropout(false, 0, 0);
  double loss_sum = 0.0;
  int64_t n = 0;
  const int64_t batches =
      std::min<int64_t>(config_.eval.batches, std::max<int64_t>(1, val.samples_per_epoch() / B));
  for (int64_t i = 0; i < batches; ++i) {
    val.next_batch(inputs.data(), targets.data(), B, 0, 1);
    backend_->copy_from_host(s, tokens_, inputs.data());
    backend_->copy_from_host(s, targets_, targets.data());
    int64_t k = 0;
    loss_sum += model_->forward(tokens_, targets_, 0.f, &k);
    n += k;
  }
  return n > 0 ? loss_sum / static_cast<double>(n) : 0.0;
}

void Trainer::maybe_sample() {
  const auto& sc = config_.sample;
  if (sc.every <= 0 || step_ % sc.every != 0) return;
  const auto tok = data::load_tokenizer(config_.data.dir);
  std::vector<int32_t> prompt = sc.prompt.empty() ? std::vector<int32_t>{tok->eot_id()}
                                                  : tok->encode(sc.prompt);
  SampleOptions o;
  o.max_new_tokens = sc.tokens;
  o.temperature = static_cast<float>(sc.temperature);
  o.top_k = sc.top_k;
  o.seed = static_cast<uint64_t>(config_.train.seed) + static_cast<uint64_t>(step_);
  const auto ids = sample_tokens(*model_, prompt, o);
  fmt::print("kiln: sample at step {}: {}{}\n", step_, sc.prompt, tok->decode(ids));
}

TrainResult Trainer::run() {
  TrainResult r;
  r.first_step = step_;
  MetricsLog metrics(run_dir_, step_);
  const int64_t tokens_per_step =
      static_cast<int64_t>(config_.train.global_batch) * static_cast<int64_t>(seq_len_);
  const double flops_per_step =
      model_->config().flops_per_token(seq_len_) * static_cast<double>(tokens_per_step);
  const int64_t stop_at =
      options_.exit_interval > 0 ? std::min(options_.exit_interval, config_.train.steps)
                                 : config_.train.steps;
  const auto run_start = Clock::now();
  double timed_seconds = 0.0;
  int64_t timed_steps = 0;
  while (step_ < stop_at) {
    const auto t0 = Clock::now();
    double norm = 0.0;
    const float lr = static_cast<float>(learning_rate(config_, step_));
    const double loss = train_step(&norm);
    const double dt = seconds_since(t0);
    if (step_ > r.first_step + 1) timed_seconds += dt, ++timed_steps;  // the first is warm-up
    r.last_step = step_;
    r.last_loss = loss;

    nlohmann::json rec;
    rec["step"] = step_;
    rec["loss"] = loss;
    rec["lr"] = lr;
    rec["grad_norm"] = norm;
    rec["tokens"] = step_ * tokens_per_step;
    rec["step_time_s"] = dt;
    rec["tokens_per_s"] = static_cast<double>(tokens_per_step) / dt;
    rec["mfu"] = flops_per_step / dt / peak_flops_;
    const MemoryStats mem = backend_->allocator().stats();
    rec["peak_mem_bytes"] = mem.total_peak;
    for (int c = 0; c < kNumMemCategories; ++c)
      rec[fmt::format("mem_{}_bytes", mem_category_name(static_cast<MemCategory>(c)))] =
          mem.current[static_cast<size_t>(c)];
    const bool eval_now = config_.eval.every > 0 &&
                          (step_ % config_.eval.every == 0 || step_ == config_.train.steps);
    if (eval_now) {
      r.last_val_loss = evaluate();
      rec["val_loss"] = r.last_val_loss;
    }
    const bool log_now = config_.log.every > 0 &&
                         (step_ % config_.log.every == 0 || step_ == 1 || eval_now ||
                          step_ == stop_at);
    if (log_now || eval_now) metrics.write(rec);
    if (options_.verbose && (log_now || eval_now)) {
      const double per_step = timed_steps > 0 ? timed_seconds / timed_steps : dt;
      fmt::print("step {:>6}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | "
                 "MFU {:.1f}% | {:.0f} ms | ETA {}\n",
                 step_, config_.train.steps, loss,
                 eval_now ? fmt::format(" | val {:.4f}", r.last_val_loss) : std::string(), lr,
                 norm, static_cast<double>(tokens_per_step) / dt, 100.0 * flops_per_step / dt / peak_flops_,
                 dt * 1e3, format_duration(per_step * static_cast<double>(config_.train.steps - step_)));
      std::fflush(stdout);
    }
    maybe_sample();
    const bool preempt =
        preemption_requested() || (step_ == stop_at && stop_at < config_.train.steps);
    const bool periodic = config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0;
    if (periodic || preempt || step_ == config_.train.steps) save_checkpoint();
    if (preempt) {
      r.preempted = true;
      if (options_.verbose)
        fmt::print("kiln: stopping at step {} ({}); continue with --resume auto\n", step_,
                   preemption_requested() ? "signal" : "exit interval");
      break;
    }
  }
  r.tokens_per_s = timed_steps > 0 ? static_cast<double>(tokens_per_step) * timed_steps / timed_seconds
                                   : 0.0;
  if (options_.verbose)
    fmt::print("kiln: done: {} updates in {}, last loss {:.4f}{}\n", step_ - r.first_step,
               format_duration(seconds_since(run_start)), r.last_loss,
               r.last_val_loss >= 0 ? fmt::format(", val loss {:.4f}", r.last_val_loss) : "");
  return r;
}

}  // namespace kiln
