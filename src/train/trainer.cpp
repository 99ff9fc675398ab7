// Trainer set-up: the world and its mesh, the data, the backend and the one step, the
// profiling window and the start-up lines. Where the run starts (resume or fresh weights)
// is trainer_resume.cpp; the loop, trainer_run.cpp; checkpoints, trainer_checkpoint.cpp;
// the end-of-run summaries, trainer_summary.cpp.
#include "train/trainer.h"

#include "comm/ledger.h"

#include "backend/probe.h"
#include "comm/launch.h"
#include "comm/ledger.h"
#include "config/components.h"
#include "core/error.h"
#include "model_io/lora_io.h"
#include "models/registry.h"
#include "profile/profiling_backend.h"
#include "profile/tracer.h"
#include "train/device.h"
#include "train/gemm_peak.h"
#include "train/run_dir_lock.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

namespace kiln {

namespace fs = std::filesystem;

namespace {
// The keys of a to_toml() text in order: "section.key" and its "key = value" line.
void config_key_lines(const std::string& text, std::vector<std::string>& names,
                      std::vector<std::string>& lines) {
  std::string section;
  std::istringstream toml(text);
  for (std::string line; std::getline(toml, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.find(']') - 1);
      continue;
    }
    names.push_back(section + "." + line.substr(0, line.find(" = ")));
    lines.push_back(line);
  }
}

// What a user of `lora`'s adapters would otherwise learn late: adapters PEFT has no module
// for (a fused Linear Hugging Face splits), which `kiln export --format peft` refuses;
// adapters whose rank exceeds min(in, out), whose update B A cannot use it all.
void note_lora_adapters(const LoraPlan& lora, const ModelOptions& options) {
  if (const ModelArch& arch = model_arch(options.arch); arch.hf_layout) {
    bool folder = true;
    try {
      arch.hf_layout(options);  // the model itself may have no Hugging Face folder
    } catch (const Error& e) {
      folder = false;
      fmt::print("kiln: note: {}: `kiln export` will write neither a PEFT folder of these "
                 "adapters nor a merged Hugging Face folder (their checkpoints are kiln's)\n",
                 e.what());
    }
    try {
      if (folder) peft_modules(options, lora.units());
    } catch (const Error& e) {
      fmt::print("kiln: note: {} (`kiln export --format peft` will refuse these adapters; "
                 "--format hf --merge-lora writes them merged)\n", e.what());
    }
  }
  std::vector<std::string> wide;
  for (const LoraUnit& u : lora.units())
    if (u.rank > std::min(u.in, u.rows))
      wide.push_back(fmt::format("{} ({} in, {} out)", u.name, u.in, u.rows));
  if (!wide.empty())
    fmt::print("kiln: note: train.lora.rank = {} exceeds min(in, out) of {} adapter{} ({}{}): "
               "their update B A has rank at most min(in, out)\n", lora.units()[0].rank,
               wide.size(), wide.size() == 1 ? "" : "s", wide[0], wide.size() > 1 ? ", ..." : "");
}
}  // namespace

std::vector<std::string> config_keys_that_differ(const std::string& toml_a,
                                                 const std::string& toml_b) {
  std::vector<std::string> names_a, lines_a, names_b, lines_b;
  config_key_lines(toml_a, names_a, lines_a);
  config_key_lines(toml_b, names_b, lines_b);
  std::map<std::string, std::string> b;
  for (size_t i = 0; i < names_b.size(); ++i) b[names_b[i]] = lines_b[i];
  std::vector<std::string> differ;
  for (size_t i = 0; i < names_a.size(); ++i) {
    const auto it = b.find(names_a[i]);
    if (it == b.end() || it->second != lines_a[i]) differ.push_back(names_a[i]);
    if (it != b.end()) b.erase(it);
  }
  for (const auto& [name, line] : b) differ.push_back(name);  // only in b
  return differ;
}

void check_config_on_all_ranks(Communicator& world, const TrainConfig& config) {
  if (world.size() == 1) return;
  // One line of to_toml() per key ("name = value" under "[section]"): a 32-bit hash each,
  // gathered from every rank, so that a mismatch names the first key that differs.
  std::vector<std::string> names, lines;
  config_key_lines(config.to_toml(), names, lines);
  const CommSite site("train.config check");
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

Trainer::Trainer(const TrainConfig& config, const TrainerOptions& options)
    : config_(config), options_(options), run_dir_(config.run.dir) {
  // The mesh first: every later choice (accumulation, data slice, ZeRO shards) depends
  // on the data-parallel size.
  set_up_mesh();
  open_data();
  set_up_backend();
  set_up_step();
  // One run per run directory: held until the trainer is destroyed. Taken before start()
  // reads or writes anything there (a rollback moves checkpoints; the metrics get appended).
  if (is_rank0()) run_lock_ = std::make_unique<RunDirLock>(run_dir_);
  // Where to start: a checkpoint to resume, else init_from or a random init.
  start();
  if (is_rank0()) {
    std::ofstream(run_dir_ / "config.toml") << config_.to_toml();
  }
  set_up_profiling();
  if (options_.verbose) print_start_up();
}

Trainer::~Trainer() = default;

void Trainer::set_up_mesh() {
  // Before the ranks connect (said once under mpirun) and before the data set opens.
  check_layout_supported(config_);
  world_ = make_device_world_communicator(config_.train.device, config_.parallel.communicator);
  world_->set_tracer(&profile::Tracer::global());  // the groups built from it inherit it
  world_->set_timeout(config_.parallel.timeout_s);
  // Where each rank writes its collective ledger when the job hangs or fails (comm/ledger.h).
  if (world_->size() > 1) set_ledger_dir((run_dir_ / "ledger").string());
  // Every rank must run the same config, the layout included: checked key by key before
  // the mesh is built from it.
  check_config_on_all_ranks(*world_, config_);
  launch_ = launch_summary(*world_);
  straggler_watch_.emplace(config_.log.straggler_factor, config_.log.straggler_windows);
  injected_delay_s_ = injected_update_delay_s(world_->rank(), world_->size());
  mesh_ = std::make_unique<DeviceMesh>(*world_, MeshSizes{.dp = config_.parallel.dp,
                                                           .cp = config_.parallel.cp,
                                                           .tp = config_.parallel.tp,
                                                           .pp = config_.parallel.pp,
                                                           .ep = config_.parallel.ep});
  KILN_CHECK((mesh_->tp() == 1 && mesh_->pp() == 1 && mesh_->cp() == 1 && mesh_->ep() == 1) ||
                 config_.sample.every == 0,
             "{}: sample.every = {} needs parallel.tp, parallel.pp, parallel.cp and parallel.ep = 1 "
             "(sampling a tensor-, pipeline-, context- or expert-parallel model is not "
             "implemented; sample from a checkpoint with `kiln sample`)", config_.source,
             config_.sample.every);
  if (!is_rank0()) options_.verbose = false;
  if (config_.train.global_batch == 0) config_.train.global_batch = config_.train.micro_batch * mesh_->dp();
  config_.validate_for_training();
}

void Trainer::open_val() {
  val_data_ = train_data_->open_split("val");
  val_by_data_ = train_data_->open_split_by_dataset("val");
}

void Trainer::open_data() {
  train_data_ = open_train_data(config_, "train", /*shuffle=*/true);
  KILN_CHECK(config_.eval.every == 0 || train_data_->has_split("val"),
             "{}: eval.every = {} but {} has no val split (prepare text with --val-fraction, "
             "images with t10k-* IDX files or a val/ folder; or set eval.every = 0)",
             config_.source, config_.eval.every, without_val_split(config_));
  // The val split is opened (and verified: sizes, checksums) once, now, not at the first
  // evaluation, so that a damaged one stops the run before any training.
  if (config_.eval.every > 0) open_val();
  train_data_->check_arch(config_);
  train_data_->fill_model_keys(config_);
  // ... and the same data: compare fingerprints at start-up.
  check_same_on_all_ranks(*world_, describe_data(config_),
                          train_data_->fingerprint().dump());
}

void Trainer::set_up_backend() {
  backend_ = make_device_backend(config_.train.device, backend_options(config_));
  if (mesh_->cp() > 1)  // ring attention's tile ops
    require_ops(*backend_, OpFamily::RingAttention, parse_dtype(config_.train.dtype),
                fmt::format("{}: parallel.cp = {}", config_.source, mesh_->cp()));
  else if (config_.data.packing == "document")  // document masks
    require_ops(*backend_, OpFamily::VarlenAttention, parse_dtype(config_.train.dtype),
                fmt::format("{}: data.packing = \"document\"", config_.source));
  // Profiling wraps the backend (one trace event per op); off, nothing is wrapped.
  if (config_.profile.enabled())
    backend_ = profile::profiled(std::move(backend_), config_.profile.timing);
}

void Trainer::set_up_step() {
  // Gradients are reduced over dp x cp (the cp ranks hold replicas, each a part of
  // every sequence); the data comes by dp rank, the same to every cp rank.
  one_step_ = std::make_unique<TrainStep>(config_, *backend_, StepGroups::of_mesh(*mesh_));
  one_step_->set_tracer(&profile::Tracer::global());
  check_input_bytes(*train_data_, one_step_->batch_shape(), config_.train.micro_batch, config_.source);
  KILN_CHECK(one_step_->model().language_model() || config_.sample.every == 0,
             "{}: sample.every = {}: sampling is for language models (set sample.every = 0)",
             config_.source, config_.sample.every);
}

void Trainer::set_up_profiling() {
  const GemmPeak peak = stable_gemm_peak(*backend_, mfu_peak_dtype(config_), config_.log.peak_tflops,
                                         peak_cache_file());
  peak_flops_ = peak.flops;
  peak_source_ = peak.source;
  if (config_.profile.enabled()) {
    profile::Tracer::global().set_rank(world_->rank());
    profile_ = std::make_unique<profile::ProfileWindow>(
        config_.profile.steps, run_dir_ / fmt::format("trace_rank{}.json", world_->rank()),
        profile::Peaks{peak_flops_, measure_copy_bandwidth(*backend_)}, profile::Tracer::global(),
        /*print=*/is_rank0());
    profile_->set_backend(static_cast<profile::ProfilingBackend*>(backend_.get()));
  }
}

void Trainer::print_start_up() const {
  const int seq_len = config_.train.seq_len;
  if (config_.schedule.warmup_steps > config_.train.steps)
    fmt::print("kiln: warning: {}: schedule.warmup_steps ({}) exceeds train.steps ({}): the "
               "warmup is clamped to {} updates\n", config_.source, config_.schedule.warmup_steps,
               config_.train.steps, config_.train.steps);
  if (!launch_.empty()) fmt::print("kiln: {}\n", launch_);
  fmt::print("kiln: {}\n", one_step_->model().describe());
  const TrainStep::ParamTally& tally = one_step_->param_tally();  // as Hugging Face PEFT says it
  const int64_t all = tally.trainable + tally.frozen;
  fmt::print("kiln: trainable params: {} || all params: {} || trainable%: {:.4f}{}\n",
             tally.trainable, all, all > 0 ? 100.0 * static_cast<double>(tally.trainable) / all : 0.0,
             tally.frozen > 0 ? fmt::format(" ({} tensors frozen by train.freeze, train.lora or the model)",
                                            tally.frozen_names.size())
                              : std::string());
  if (const LoraPlan* lora = one_step_->lora_plan()) {
    const LoraSection& l = config_.train.lora;
    const auto& on = lora->adapted();  // never empty: the plan refuses a choice of none
    const DType stored = one_step_->model().trainable_dtype();
    fmt::print("kiln: LoRA rank {}, alpha {} (scale {:.4g}{}), {} adapter{} ({}) in {}{}; the "
               "base frozen{} (docs/lora.md)\n", l.rank, l.alpha,
               nn::LoraSpec{l.rank, static_cast<float>(l.alpha), l.rslora, 0.f}.scale(),
               l.rslora ? ", rsLoRA" : "", on.size(), on.size() == 1 ? "" : "s",
               on.size() == 1 ? on.front() : on.front() + " ... " + on.back(),
               dtype_name(stored), stored == DType::F32 ? "" : " with fp32 masters",
               config_.model.init_from.empty()
                              ? std::string(" (random: no model.init_from)")
                              : " from " + config_.model.init_from);
    note_lora_adapters(*lora, model_options_from(config_));
  }
  if (const Fp8Plan* fp8 = one_step_->fp8_plan()) {
    const auto& on = fp8->chosen();  // never empty: the plan refuses a choice of none
    fmt::print("kiln: fp8 {}{}: {} Linear{} of the blocks ({}{}{}), E4M3 inputs and weights, "
               "E5M2 output gradients (docs/fp8.md)\n", config_.train.fp8,
               fp8->delayed() ? fmt::format(" (amax history {}, {})",
                                            config_.train.fp8_amax_history_len,
                                            config_.train.fp8_amax_compute_algo)
                              : std::string(),
               on.size(), on.size() == 1 ? "" : "s", on.front(), on.size() > 1 ? " ... " : "",
               on.size() > 1 ? on.back() : std::string());
  }
  fmt::print("kiln: {} updates of {} sequences x {} tokens{} ({} micro-step{} of {} on each of {} "
             "data-parallel rank{}, ZeRO stage {}{}{}), backend {}, peak {:.1f} GFLOP/s per rank ({})\n",
             config_.train.steps, config_.train.global_batch, seq_len,
             config_.data.packing == "document" ? " of packed documents" : "",
             one_step_->grad_accum_steps(), one_step_->grad_accum_steps() == 1 ? "" : "s",
             config_.train.micro_batch, mesh_->dp(), mesh_->dp() == 1 ? "" : "s",
             config_.parallel.zero_stage,
             (mesh_->cp() > 1 ? fmt::format(", context parallel over {} ranks ({} tokens each)",
                                            mesh_->cp(), seq_len / mesh_->cp())
                              : std::string()) +
             (mesh_->tp() > 1 ? fmt::format(", tensor parallel over {} ranks{}", mesh_->tp(),
                                           config_.parallel.sequence_parallel ? " with sequence parallelism" : "")
                              : std::string()),
             pipeline_description(),
             backend_->name(), peak_flops_ / 1e9,
             peak_source_);
  fmt::print("kiln: {}\n", backend_->gemm_path(parse_dtype(config_.train.dtype)));
  if (const std::string note = mpirun_signal_note(); !note.empty()) fmt::print("kiln: note: {}\n", note);
}

std::string Trainer::pipeline_description() const {
  if (mesh_->pp() == 1) return {};
  const pp::Schedule& s = one_step_->pipeline().schedule();
  std::string parts;  // this rank's (the printing rank's)
  for (const ModelPart& part : one_step_->model().parts())
    parts += (parts.empty() ? "" : " ") + part.name;
  const pp::SimResult& sim = one_step_->pipeline().simulated();
  return fmt::format(", pipeline over {} stages ({}, {} virtual stage(s), simulated bubble {:.1f}% "
                     "vs theory {:.1f}%; rank 0 holds {})", s.pp, pp::schedule_kind_name(s.kind),
                     s.virtual_stages, 100.0 * sim.bubble_fraction,
                     100.0 * pp::theoretical_bubble(s.kind, s.pp, s.virtual_stages, s.micro_batches),
                     parts);
}

}  // namespace kiln
