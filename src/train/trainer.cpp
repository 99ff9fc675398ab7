#include "train/trainer.h"

#include "backend/probe.h"
#include "backend/registry.h"
#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "profile/profiling_backend.h"
#include "profile/tracer.h"
#include "train/metrics_record.h"
#include "train/device.h"
#include "train/model_io.h"
#include "train/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

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

void check_config_on_all_ranks(Communicator& world, const TrainConfig& config) {
  if (world.size() == 1) return;
  // One line of to_toml() per key ("name = value" under "[section]"): a 32-bit hash each,
  // gathered from every rank, so that a mismatch names the first key that differs.
  std::vector<std::string> names, lines;
  std::string section;
  std::istringstream toml(config.to_toml());
  for (std::string line; std::getline(toml, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    names.push_back(section + "." + line.substr(0, line.find(" = ")));
    lines.push_back(line);
  }
  check_same_on_all_ranks(world, "config (its number of keys)", std::to_string(lines.size()));
  const auto n = static_cast<int64_t>(lines.size());
  std::vector<int32_t> mine(lines.size()), all(lines.size() * static_cast<size_t>(world.size()));
  for (size_t i = 0; i < lines.size(); ++i) {
    uint32_t h = 2166136261u;  // FNV-1a 32
    for (unsigned char ch : lines[i]) h = (h ^ ch) * 16777619u;
    mine[i] = static_cast<int32_t>(h);
  }
  world.all_gather(Tensor::view(all.data(), Shape{n * world.size()}, DType::I32),
                   Tensor::view(mine.data(), Shape{n}, DType::I32));
  for (size_t i = 0; i < lines.size(); ++i)
    for (int r = 0; r < world.size(); ++r)
      KILN_CHECK(all[static_cast<size_t>(r) * lines.size() + i] == mine[i],
                 "the config differs between ranks: {} is {} on rank {} but not on rank {} (every "
                 "rank must run the same config)", names[i],
                 lines[i].substr(lines[i].find(" = ") + 3), world.rank(), r);
}

void install_preemption_handlers() {
  std::signal(SIGTERM, on_preempt_signal);
  std::signal(SIGUSR1, on_preempt_signal);
  std::signal(SIGINT, on_preempt_signal);  // Ctrl-C: checkpoint and stop too
}
bool preemption_requested() { return g_preempt.load(); }

Trainer::Trainer(const TrainConfig& config, const TrainerOptions& options)
    : config_(config), options_(options), run_dir_(config.run.dir) {
  // The mesh first: every later choice (accumulation, data slice, ZeRO shards) depends
  // on the data-parallel size.
  world_ = make_device_world_communicator(config_.train.device);
  // parallel.timeout_s, unless KILN_COMM_TIMEOUT_S overrides it (tests, debugging).
  if (std::getenv("KILN_COMM_TIMEOUT_S") == nullptr) world_->set_timeout(config_.parallel.timeout_s);
  // Every rank must run the same config, the layout included: checked key by key before
  // the mesh is built from it.
  check_config_on_all_ranks(*world_, config_);
  mesh_ = std::make_unique<DeviceMesh>(*world_, config_.parallel.dp, config_.parallel.tp,
                                       config_.parallel.pp, config_.parallel.cp);
  dp_size_ = mesh_->dp();
  dp_rank_ = mesh_->coord()[Axis::DP];
  tp_rank_ = mesh_->coord()[Axis::TP];
  KILN_CHECK((mesh_->tp() == 1 && mesh_->pp() == 1 && mesh_->cp() == 1) ||
                 config_.sample.every == 0,
             "{}: sample.every = {} needs parallel.tp, parallel.pp and parallel.cp = 1 (sampling "
             "a tensor-, pipeline- or context-parallel model is not implemented; sample from a "
             "checkpoint with `kiln sample`)", config_.source, config_.sample.every);
  is_rank0_ = world_->rank() == 0;
  if (!is_rank0_) options_.verbose = false;
  if (config_.train.global_batch == 0) config_.train.global_batch = config_.train.micro_batch * dp_size_;
  config_.validate_for_training();
  KILN_CHECK(!config_.data.dir.empty(), "{}: data.dir is required for training", config_.source);
  accum_ = config_.grad_accum_steps(dp_size_);
  seq_len_ = config_.train.seq_len;
  train_data_ = open_train_data(config_.data.dir, "train", seq_len_,
                                static_cast<uint64_t>(config_.train.seed), /*shuffle=*/true);
  KILN_CHECK(config_.eval.every == 0 || train_data_->has_split("val"),
             "{}: eval.every = {} but {} has no val split (prepare text with --val-fraction, "
             "images with t10k-* IDX files or a val/ folder; or set eval.every = 0)",
             config_.source, config_.eval.every, config_.data.dir);
  // The val split is opened (and verified: sizes, checksums) once, now, not at the first
  // evaluation, so that a damaged one stops the run before any training.
  if (config_.eval.every > 0) val_data_ = train_data_->open_split("val");
  train_data_->check_arch(config_);
  train_data_->fill_model_keys(config_);
  // ... and the same data: compare fingerprints at start-up.
  check_same_on_all_ranks(*world_, "data set " + config_.data.dir,
                          train_data_->fingerprint().dump());

  backend_ = make_device_backend(config_.train.device);
  KILN_CHECK(mesh_->cp() == 1 || backend_->device().is_cpu(), "{}: parallel.cp = {} on {}: "
             "context parallelism runs on the CPU backend only so far (the CUDA ring-attention "
             "kernels are not written yet)", config_.source, mesh_->cp(), backend_->device().str());
  // Profiling wraps the backend (one trace event per op); off, nothing is wrapped.
  if (config_.profile.enabled())
    backend_ = profile::profiled(std::move(backend_), config_.profile.timing);
  // Gradients are reduced over dp x cp (the cp ranks hold replicas, each a part of
  // every sequence); the data comes by dp rank, the same to every cp rank.
  one_step_ = std::make_unique<TrainStep>(config_, *backend_, StepGroups::of_mesh(*mesh_));
  model_ = &one_step_->model();
  dp_ = &one_step_->data_parallel();
  optimizer_ = &one_step_->optimizer();
  fp16_ = one_step_->scaler().enabled;
  const int B = config_.train.micro_batch;
  KILN_CHECK(model_->language_model() || config_.sample.every == 0,
             "{}: sample.every = {}: sampling is for language models (set sample.every = 0)",
             config_.source, config_.sample.every);

  // Where to start: a checkpoint to resume, else init_from or a random init.
  const fs::path ckpt_root = run_dir_ / "ckpt";
  std::optional<fs::path> resume_dir;
  if (options_.resume == "auto") {
    resume_dir = checkpoint::find_latest_checkpoint(ckpt_root);
    // Checkpoints that all fail verification are not a fresh start: training from scratch
    // would bury them (find_latest_checkpoint has said what is wrong with each).
    KILN_CHECK(resume_dir || checkpoint::list_checkpoint_dirs(ckpt_root).empty(),
               "--resume auto: {} holds checkpoints but none is complete and intact (see the "
               "warnings above); repair or move them, or choose another run.dir", ckpt_root.string());
    if (!resume_dir && options_.verbose)
      fmt::print("kiln: --resume auto: no checkpoint in {}, starting fresh\n", ckpt_root.string());
  } else if (!options_.resume.empty()) {
    resume_dir = fs::path(options_.resume);
  }
  if (resume_dir) {
    load_checkpoint(*resume_dir);
    if (is_rank0_) abandon_newer_checkpoints(*resume_dir);
    world_->barrier();
  } else {
    KILN_CHECK(checkpoint::list_checkpoint_dirs(ckpt_root).empty(),
               "{} already holds checkpoints: pass --resume auto to continue, or choose another "
               "run.dir", ckpt_root.string());
    init_weights();
  }
  if (is_rank0_) {
    fs::create_directories(run_dir_);
    std::ofstream(run_dir_ / "config.toml") << config_.to_toml();
  }

  peak_flops_ = config_.log.peak_tflops > 0 ? config_.log.peak_tflops * 1e12
                                            : measure_gemm_flops(*backend_, mfu_peak_dtype(config_));
  if (config_.profile.enabled()) {
    profile::Tracer::global().set_rank(world_->rank());
    profile_ = std::make_unique<profile::ProfileWindow>(
        config_.profile.steps, run_dir_ / fmt::format("trace_rank{}.json", world_->rank()),
        profile::Peaks{peak_flops_, measure_copy_bandwidth(*backend_)}, profile::Tracer::global(),
        /*print=*/is_rank0_);
    profile_->set_backend(static_cast<profile::ProfilingBackend*>(backend_.get()));
  }
  if (options_.verbose) {
    fmt::print("kiln: {}\n", model_->describe());
    fmt::print("kiln: {} updates of {} sequences x {} tokens ({} micro-steps of {} on each of {} "
               "data-parallel ranks, ZeRO stage {}{}{}), backend {}, peak {:.1f} GFLOP/s per rank ({})\n",
               config_.train.steps, config_.train.global_batch, seq_len_, accum_, B, dp_size_,
               config_.parallel.zero_stage,
               (mesh_->cp() > 1 ? fmt::format(", context parallel over {} ranks ({} tokens each)",
                                              mesh_->cp(), seq_len_ / mesh_->cp())
                                : std::string()) +
               (mesh_->tp() > 1 ? fmt::format(", tensor parallel over {} ranks{}", mesh_->tp(),
                                             config_.parallel.sequence_parallel ? " with sequence parallelism" : "")
                                : std::string()),
               pipeline_description(),
               backend_->name(), peak_flops_ / 1e9,
               config_.log.peak_tflops > 0 ? std::string("log.peak_tflops") : fmt::format("measured {} GEMM", dtype_name(mfu_peak_dtype(config_))));
    fmt::print("kiln: {}\n", backend_->gemm_path(parse_dtype(config_.train.dtype)));
  }
}

Trainer::~Trainer() = default;

std::string Trainer::pipeline_description() const {
  if (mesh_->pp() == 1) return {};
  const pp::Schedule& s = one_step_->pipeline().schedule();
  std::string parts;  // this rank's (the printing rank's)
  for (const ModelPart& u : model_->parts()) parts += (parts.empty() ? "" : " ") + u.name;
  const pp::SimResult& sim = one_step_->pipeline().simulated();
  return fmt::format(", pipeline over {} stages ({}, {} virtual stage(s), simulated bubble {:.1f}% "
                     "vs theory {:.1f}%; rank 0 holds {})", s.pp, pp::schedule_kind_name(s.kind),
                     s.virtual_stages, 100.0 * sim.bubble_fraction,
                     100.0 * pp::theoretical_bubble(s.kind, s.pp, s.virtual_stages, s.micro_batches),
                     parts);
}

void Trainer::init_weights() {
  if (config_.model.init_from.empty()) {
    one_step_->init_weights(static_cast<uint64_t>(config_.train.seed));
    return;
  }
  // Each rank reads only the ranges it holds (all of every parameter below ZeRO-3).
  const auto source =
      open_model_weights(config_.model.init_from, model_options_from(config_), model_->params());
  std::vector<float> buf;
  for (const AdamWSegment& seg : dp_->load_segments()) {
    buf.resize(static_cast<size_t>(seg.size()));
    for (const auto& run : seg.spec.tp.global_runs(seg.spec.shape, seg.begin, seg.end))
      source->read(seg.spec, run.global_begin, run.global_end,
                   buf.data() + (run.local_begin - seg.begin));
    upload_f32(*backend_, seg.param, buf.data());
  }
  optimizer_->sync_master_from_params();
  if (options_.verbose) fmt::print("kiln: initialised from {}\n", config_.model.init_from);
}

void Trainer::dp_sum(std::span<double> values) {
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

double Trainer::train_step(double* grad_norm) {
  const int B = config_.train.micro_batch;
  // This rank's share of the whole global batch first: the step normalises the loss by
  // the targets of the global batch, known before the first backward.
  const BatchShape& shape = one_step_->batch_shape();
  const auto in_bytes = static_cast<size_t>(shape.required_bytes());
  const auto n_targets = static_cast<size_t>(shape.targets.numel());
  std::vector<std::byte> inputs(static_cast<size_t>(accum_) * in_bytes);
  std::vector<int32_t> targets(static_cast<size_t>(accum_) * n_targets);
  {
    auto scope = profile::trace_scope("data");
    for (int k = 0; k < accum_; ++k) {
      train_data_->next_batch(inputs.data() + static_cast<size_t>(k) * in_bytes,
                              targets.data() + static_cast<size_t>(k) * n_targets, B, dp_rank_,
                              dp_size_);
    }
  }
  const StepResult r = one_step_->run(inputs.data(), targets.data(), step_);
  *grad_norm = r.grad_norm;
  last_skipped_ = r.skipped;
  if (r.skipped) {
    if (options_.verbose)
      fmt::print("kiln: step {}: gradient overflow in fp16, update skipped, loss scale -> {}\n",
                 step_ + 1, scaler().scale);
    return r.loss;
  }
  ++step_;
  return r.loss;
}

Trainer::EvalResult Trainer::evaluate() {
  auto scope = profile::trace_scope("eval");
  if (!val_data_) val_data_ = train_data_->open_split("val");
  TrainData* val = val_data_.get();
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
  const int64_t per_call = int64_t{B} * dp_size_, n_val = val->samples_per_epoch();
  const int64_t calls = std::min<int64_t>(int64_t{config_.eval.batches} * accum_,
                                          (n_val + per_call - 1) / per_call);
  const size_t targets_per_sample = targets.size() / static_cast<size_t>(B);
  double sums[3] = {0.0, 0.0, 0.0};  // loss sum, targets, correct (classifiers)
  bool counted = false;
  for (int64_t i = 0; i < calls; ++i) {
    val->next_batch(inputs.data(), targets.data(), B, dp_rank_, dp_size_);
    for (int b = 0; b < B; ++b)
      if (i * per_call + int64_t{dp_rank_} * B + b >= n_val)
        std::fill_n(targets.begin() + static_cast<ptrdiff_t>(b * targets_per_sample),
                    targets_per_sample, -1);
    one_step_->upload_micro_batch(inputs.data(), targets.data());
    // Dropout off; the evaluation draws of models that draw per sample (a flow model's
    // noise) keyed by the call as in training, so each val sample draws alike every time.
    model_->set_dropout(false, static_cast<uint64_t>(config_.train.seed),
                        static_cast<uint64_t>(i * dp_size_ + dp_rank_));
    const LossSum l = one_step_->forward_only();
    dp_->end_forward_only();
    sums[0] += l.sum;
    sums[1] += static_cast<double>(l.targets);
    if (l.correct >= 0) sums[2] += static_cast<double>(l.correct), counted = true;
  }
  dp_sum(std::span<double>(sums, 3));
  EvalResult r;
  r.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  if (counted && sums[1] > 0) r.accuracy = sums[2] / sums[1];
  return r;
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
  dp_->gather_full_params();  // collective under ZeRO-3: every rank takes part
  if (is_rank0_) {
    ModelHooks none;
    model_->set_hooks(&none);
    const auto ids = sample_tokens(*model_, prompt, o);
    model_->set_hooks(dp_);
    fmt::print("kiln: sample at step {}: {}{}\n", step_, sc.prompt, tok->decode(ids));
  }
  dp_->release_full_params();
}

void Trainer::summarize_communication(TrainResult& r, int64_t timed_steps) {
  // Statistics of the gradient reduction's communicator (dp, or dp x cp) over the whole
  // run, scaled to the timed steps (the first step is warm-up) by the share they make.
  const Communicator& dp = mesh_->dp_cp_comm();
  const CommStats st = dp.stats();
  const int64_t steps = step_ - r.first_step;
  const double share = steps > 0 ? static_cast<double>(timed_steps) / static_cast<double>(steps) : 0.0;
  std::string table = fmt::format("{:<15} {:>7} {:>12} {:>10} {:>12} {:>12}\n", "collective",
                                  "calls", "MB/step", "ms/step", "algbw GB/s", "busbw GB/s");
  double busy = 0.0;
  for (int c = 0; c < kNumCollectives; ++c) {
    const CollectiveStats& s = st.per[static_cast<size_t>(c)];
    if (s.count == 0) continue;
    busy += s.seconds;
    const auto coll = static_cast<Collective>(c);
    table += fmt::format("{:<15} {:>7} {:>12.2f} {:>10.2f} {:>12.2f} {:>12.2f}\n",
                         collective_name(coll), s.count, s.bytes / 1e6 / std::max<int64_t>(steps, 1),
                         1e3 * s.seconds / std::max<int64_t>(steps, 1),
                         algorithm_bandwidth(s.bytes, s.seconds) / 1e9,
                         bus_bandwidth(coll, dp.size(), s.bytes, s.seconds) / 1e9);
  }
  r.comm_busy_s = busy * share;
  r.comm_hidden_fraction =
      r.comm_busy_s > 0 ? std::clamp(1.0 - r.comm_exposed_s / r.comm_busy_s, 0.0, 1.0) : 0.0;
  r.comm_table = table;
  if (options_.verbose)
    fmt::print("kiln: data-parallel communication over {} ranks{} (ZeRO stage {}):\n{}"
               "kiln: communication {:.1f} ms/step, exposed {:.1f} ms/step: {:.0f}% hidden under "
               "computation\n",
               dp.size(), mesh_->cp() > 1 ? " (dp x cp)" : "", config_.parallel.zero_stage, table,
               1e3 * r.comm_busy_s / std::max<int64_t>(timed_steps, 1),
               1e3 * r.comm_exposed_s / std::max<int64_t>(timed_steps, 1),
               100.0 * r.comm_hidden_fraction);
}

void Trainer::summarize_tp_traffic(TrainResult& r, int64_t steps) {
  // The formula (parallel/tp_traffic.h) is a decoder language model's.
  const LanguageModel* lm = model_->language_model();
  if (!lm) return;
  TpTrafficShape s;
  // This rank's parts (a pipeline stage holds some): blocks, and whether the two ends.
  const int n_parts = config_.model.n_layer + 2;
  s.has_embedding = s.has_head = false;
  s.n_layer = 0;
  for (const ModelPart& u : model_->parts()) {
    if (u.global_index == 0) s.has_embedding = true;
    else if (u.global_index == n_parts - 1) s.has_head = true;
    else ++s.n_layer;
  }
  s.rows = int64_t{config_.train.micro_batch} * seq_len_ / mesh_->cp();  // this rank's tokens
  s.n_embd = config_.model.n_embd;
  s.padded_vocab = lm->padded_vocab_size();
  s.tp = mesh_->tp();
  s.sequence_parallel = config_.parallel.sequence_parallel;
  s.full_recompute = config_.train.activation_checkpointing == "full";
  s.act_bytes = static_cast<int64_t>(dtype_size(model_->dtype()));
  s.grad_bytes = static_cast<int64_t>(dtype_size(model_->grad_dtype()));
  for (const AdamWSegment& seg : dp_->optimizer_segments()) {
    if (!seg.spec.tp_partial_grad || seg.size() == 0) continue;
    ++s.partial_grad_params;
    s.partial_grad_elems += seg.size();
  }
  r.tp_formula = tp_update_traffic(s, accum_);
  for (size_t c = 0; c < r.tp_measured.calls.size(); ++c) {
    r.tp_measured.calls[c] /= std::max<int64_t>(steps, 1);
    r.tp_measured.bytes[c] /= std::max<int64_t>(steps, 1);
  }
  if (!options_.verbose) return;
  fmt::print("kiln: tensor-parallel traffic per update over {} ranks{} (rank 0; formula: "
             "parallel/tp_traffic.h):\n{:<15} {:>7} {:>9} {:>12} {:>12}\n", s.tp,
             s.sequence_parallel ? " with sequence parallelism" : "", "collective", "calls",
             "formula", "MB", "formula MB");
  for (int c = 0; c < kNumCollectives; ++c) {
    const auto i = static_cast<size_t>(c);
    if (r.tp_measured.calls[i] == 0 && r.tp_formula.calls[i] == 0) continue;
    fmt::print("{:<15} {:>7} {:>9} {:>12.3f} {:>12.3f}\n", collective_name(static_cast<Collective>(c)),
               r.tp_measured.calls[i], r.tp_formula.calls[i], r.tp_measured.bytes[i] / 1e6,
               r.tp_formula.bytes[i] / 1e6);
  }
}

void Trainer::summarize_pipeline(TrainResult& r, double busy, double span) {
  const pp::Schedule& s = one_step_->pipeline().schedule();
  r.pp_bubble_simulated = one_step_->pipeline().simulated().bubble_fraction;
  r.pp_bubble_theory = pp::theoretical_bubble(s.kind, s.pp, s.virtual_stages, s.micro_batches);
  const int W = world_->size();
  std::vector<double> v(static_cast<size_t>(2 * W), 0.0);  // [busy, span] per rank
  v[static_cast<size_t>(2 * world_->rank())] = busy;
  v[static_cast<size_t>(2 * world_->rank() + 1)] = span;
  world_->all_reduce_sum(v);
  double longest = 0.0;
  for (int k = 0; k < W; ++k) longest = std::max(longest, v[static_cast<size_t>(2 * k + 1)]);
  std::vector<double> sum(static_cast<size_t>(s.pp), 0.0);
  std::vector<int> n(static_cast<size_t>(s.pp), 0);
  for (int k = 0; k < W; ++k) {
    const auto stage = static_cast<size_t>(mesh_->coord(k)[Axis::PP]);
    sum[stage] += longest > 0 ? 1.0 - v[static_cast<size_t>(2 * k)] / longest : 0.0;
    ++n[stage];
  }
  r.pp_bubble_measured.clear();
  std::string per;
  for (size_t stage = 0; stage < sum.size(); ++stage) {
    r.pp_bubble_measured.push_back(sum[stage] / std::max(n[stage], 1));
    per += fmt::format("{}{:.1f}%", per.empty() ? "" : ", ", 100.0 * r.pp_bubble_measured.back());
  }
  if (options_.verbose)
    fmt::print("kiln: pipeline bubble per stage (measured, host clock): {}; schedule {:.1f}% "
               "(simulated), {:.1f}% (theory)\n", per, 100.0 * r.pp_bubble_simulated,
               100.0 * r.pp_bubble_theory);
}

TrainResult Trainer::run() {
  TrainResult r;
  r.first_step = step_;
  std::optional<MetricsLog> metrics;
  if (is_rank0_) metrics.emplace(run_dir_, step_);
  if (metrics && !rollback_record_.is_null()) metrics->write(std::exchange(rollback_record_, nullptr));
  const double world_peak = peak_flops_ * world_->size();
  const int64_t tokens_per_step =
      static_cast<int64_t>(config_.train.global_batch) * static_cast<int64_t>(seq_len_);
  const double flops_per_step =
      model_->flops_per_token(seq_len_) * static_cast<double>(tokens_per_step);
  const CheckpointPolicy policy = checkpoint_policy();
  const int64_t stop_at = policy.stop_at();
  const auto run_start = Clock::now();
  double timed_seconds = 0.0;
  int64_t timed_steps = 0, tp_steps = 0;
  double pp_busy = 0.0, pp_span = 0.0;  // over the timed steps
  while (step_ < stop_at) {
    const auto t0 = Clock::now();
    double norm = 0.0;
    const float lr = static_cast<float>(learning_rate(config_, step_));
    if (profile_) profile_->begin_step(step_);
    const CommStats tp_before = mesh_->comm(Axis::TP).stats();
    const double loss = train_step(&norm);
    const CommStats tp_after = mesh_->comm(Axis::TP).stats();
    ++tp_steps;  // every step moves tp traffic, a skipped fp16 one too
    for (size_t c = 0; c < tp_after.per.size(); ++c) {  // summed here, per step at the end
      r.tp_measured.calls[c] += tp_after.per[c].count - tp_before.per[c].count;
      r.tp_measured.bytes[c] += tp_after.per[c].bytes - tp_before.per[c].bytes;
    }
    if (profile_) profile_->end_step();
    const double dt = seconds_since(t0);
    const double step_wait = dp_->take_wait_seconds();
    if (step_ > r.first_step + options_.untimed_steps) r.comm_exposed_s += step_wait;
    if (last_skipped_) {  // fp16 overflow: the update was not applied, try the next batch
      if (is_rank0_ && metrics) metrics->write(skipped_step_record(step_ + 1, loss, scaler()));
      continue;
    }
    const pp::PipelineExecutor::Timing pt = one_step_->pipeline().take_timing();
    if (step_ > r.first_step + options_.untimed_steps) {  // the first ones are warm-up
      timed_seconds += dt, ++timed_steps;
      pp_busy += pt.busy, pp_span += pt.span;
    }
    r.last_step = step_;
    r.last_loss = loss;

    StepMetrics sm;
    sm.step = step_;
    sm.loss = loss;
    sm.lr = lr;
    sm.grad_norm = norm;
    sm.tokens_per_step = tokens_per_step;
    sm.step_time_s = dt;
    sm.flops_per_step = flops_per_step;
    sm.world_peak_flops = world_peak;
    sm.fp16_scaler = fp16_ ? &scaler() : nullptr;
    nlohmann::json rec = step_record(sm);
    const bool eval_now = config_.eval.every > 0 &&
                          (step_ % config_.eval.every == 0 || step_ == config_.train.steps);
    if (eval_now) {
      const EvalResult e = evaluate();
      r.last_val_loss = e.loss;
      r.last_val_accuracy = e.accuracy;
      rec["val_loss"] = e.loss;
      if (e.accuracy >= 0) rec["val_accuracy"] = e.accuracy;
    }
    const bool log_now = config_.log.every > 0 &&
                         (step_ % config_.log.every == 0 || step_ == 1 || eval_now ||
                          step_ == stop_at);
    if (log_now || eval_now) {
      // Memory by category: this rank's keys, and every rank's in mem_by_rank.
      add_memory_record(rec, memory_by_rank() /* collective */, world_->rank(), step_wait);
      if (metrics) metrics->write(rec);
    }
    if (options_.verbose && (log_now || eval_now)) {
      const double per_step = timed_steps > 0 ? timed_seconds / timed_steps : dt;
      fmt::print("step {:>6}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | "
                 "MFU {:.1f}% | {:.0f} ms | ETA {}\n",
                 step_, config_.train.steps, loss,
                 eval_now ? fmt::format(" | val {:.4f}{}", r.last_val_loss,
                                        r.last_val_accuracy >= 0
                                            ? fmt::format(" acc {:.2f}%", 100.0 * r.last_val_accuracy)
                                            : std::string())
                          : std::string(), lr,
                 norm, static_cast<double>(tokens_per_step) / dt, 100.0 * flops_per_step / dt / world_peak,
                 dt * 1e3, format_duration(per_step * static_cast<double>(config_.train.steps - step_)));
      std::fflush(stdout);
    }
    maybe_sample();
    // A signal may reach only some ranks: agree on stopping (any rank asked).
    std::vector<float> asked{preemption_requested() ? 1.f : 0.f};
    if (world_->size() > 1) {
      Tensor t = Tensor::view(asked.data(), Shape{1}, DType::F32);
      world_->all_reduce(t, ReduceOp::Max);
    }
    const bool signalled = asked[0] > 0.f;
    const bool preempt = policy.preempt(step_, signalled);
    if (policy.save_now(step_, preempt)) save_checkpoint();
    if (preempt) {
      r.preempted = true;
      if (options_.verbose)
        fmt::print("kiln: stopping at step {} ({}); continue with --resume auto\n", step_,
                   signalled ? "signal" : "exit interval");
      break;
    }
  }
  if (profile_) profile_->finish();
  if (mesh_->dp_cp_comm().size() > 1) summarize_communication(r, timed_steps);
  if (mesh_->tp() > 1) summarize_tp_traffic(r, tp_steps);
  if (mesh_->pp() > 1) summarize_pipeline(r, pp_busy, pp_span);
  r.step_time_s = timed_steps > 0 ? timed_seconds / static_cast<double>(timed_steps) : 0.0;
  r.timed_steps = timed_steps;
  r.tokens_per_s = timed_steps > 0 ? static_cast<double>(tokens_per_step) * timed_steps / timed_seconds
                                   : 0.0;
  if (options_.verbose && step_ == r.first_step)
    fmt::print("kiln: already at update {} of {}: nothing to do\n", step_, config_.train.steps);
  else if (options_.verbose)
    fmt::print("kiln: done: {} updates in {}, last loss {:.4f}{}\n", step_ - r.first_step,
               format_duration(seconds_since(run_start)), r.last_loss,
               r.last_val_loss >= 0 ? fmt::format(", val loss {:.4f}", r.last_val_loss) : "");
  return r;
}

}  // namespace kiln
