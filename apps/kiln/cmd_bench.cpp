// kiln bench: steady-state training throughput of a config, and the machine's peaks.
//
//   kiln bench CONFIG.toml [--set k=v]... [--steps N] [--warmup N] [--trace PATH]
//              [--dump-init PATH]
//   kiln bench --peak
//   kiln bench --calibrate FILE [--device cpu|cuda]   (the planner's rates, plan/calibration.h)
//   mpirun -np N kiln bench CONFIG.toml ...   (data parallel: see run_distributed_bench)
//
// The step is the trainer's own (TrainStep, train/train_step.h): zero_grad, then per
// micro-step forward (loss and its gradient scaled by 1 / targets of the global batch)
// and backward, then the global gradient norm, clipping and AdamW with the config's
// learning-rate schedule. Batches
// come from data.dir or data.blend (the train split, shuffled with train.seed) or, when
// neither names a data set, from synthetic tokens: uniform ids in [0, vocab_size) drawn from
// Philox(train.seed, stream 0x62656e6368 "bench"), each sample T + 1 tokens with the
// targets the inputs shifted by one.
//
// Reported over the timed steps (after --warmup untimed ones):
//   tokens/s = accum * micro_batch * T * steps / (summed step time)
//   phases   data (batches fetched and copied to the device, gradients zeroed),
//            forward, backward, optimizer (gradient norm, clipping, AdamW); each timed
//            with the backend synchronised at its end (TrainStep's phases)
//   MFU      = flops_per_token(T) * tokens/s / peak_flops, flops_per_token from
//              Model::flops_per_token (GPT-2: 6 N + 12 n_layer T C, models/gpt2/config.h)
//              and peak_flops the best fp32 GEMM rate measured in the same run
//              (measure_gemm_flops, backend/probe.h: n = 1024, best of 1 s of runs,
//              before and after the timed steps, the higher of the two)
//   memory   the allocator's peak bytes, in total and by category
//   MoE      (a mixture-of-experts model) per step the balancing losses and the expert
//            load: the most slots an expert received over the mean, in the worst MoE
//            layer (1 = balanced; the step's time depends on it on the CPU, whose grouped
//            linear runs each expert's rows in power-of-two pieces); MFU counts the
//            active parameters (Model::flops_per_token)
// The last line of output is one JSON object with these numbers (tokens_per_s, mfu,
// peak_flops, step_ms, ..., and the loss of every step).
#include "apps/kiln/commands.h"
#include "backend/probe.h"
#include "plan/calibration.h"
#include "backend/registry.h"
#include "checkpoint/safetensors.h"
#include "config/components.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "profile/profiling_backend.h"
#include "profile/summary.h"
#include "profile/tracer.h"
#include "config/config.h"
#include "train/device.h"
#include "train/metrics_record.h"
#include "model_io/model_io.h"
#include "train/train_data.h"
#include "train/train_step.h"
#include "train/trainer.h"
#include "comm/communicator.h"
#include "comm/local_communicator.h"

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace kiln::app {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
constexpr uint64_t kSyntheticStream = 0x62656e6368;  // "bench"

struct Args {
  std::string config;
  std::vector<std::string> sets;
  int steps = 10;
  int warmup = 2;
  std::string trace;
  std::string dump_init;
  bool peak = false;
  bool isa = false;
  std::string calibrate;  // write the machine's calibration here
  std::string device = "cpu";
};

// One line: how GEMMs of each dtype run on this machine (instruction set, native or not).
std::string gemm_paths(const Backend& be) {
  return fmt::format("{}; {}; {}", be.gemm_path(DType::F32), be.gemm_path(DType::BF16),
                     be.gemm_path(DType::F16));
}

// --calibrate FILE: the rates kiln plan's time model reads (plan/calibration.h).
// Under mpirun/srun also the all-reduce between the launched ranks (one node: the plan's
// intra-node link); every rank measures, rank 0 writes.
void run_calibrate(const std::string& file, const std::string& device) {
  auto be = make_device_backend(device);
  auto world = make_device_world_communicator(device);
  plan::Calibration c = plan::measure_calibration(*be, {DType::F32, DType::BF16});
  if (world->size() > 1) c.link = plan::measure_link(*world, *be);
  if (world->rank() != 0) return;
  plan::save_calibration(c, file);
  fmt::print("kiln bench --calibrate: {} ({}, {} threads)\n", c.machine, be->name(), c.threads);
  for (const auto& [dtype, pts] : c.gemm) {
    std::string row;
    for (const auto& [n, f] : pts) row += fmt::format(" {}:{:.1f}", n, f / 1e9);
    fmt::print("  GEMM {} GFLOP/s by n:{}\n", dtype, row);
  }
  for (const auto& [dtype, pts] : c.attention) {
    std::string row;
    for (const auto& [T, f] : pts) row += fmt::format(" T={}:{:.1f}", T, f / 1e9);
    fmt::print("  attention {} GFLOP/s (forward + backward) by T:{}\n", dtype, row);
  }
  fmt::print("  copy bandwidth {:.1f} GB/s\n", c.mem_bandwidth / 1e9);
  if (c.link.ranks > 1) {
    std::string row;
    for (const auto& [bytes, bw] : c.link.busbw) row += fmt::format(" {} KiB:{:.3g}", bytes >> 10, bw / 1e9);
    fmt::print("  all-reduce over {} ranks: latency {:.1f} us; busbw GB/s by message:{}\n",
               c.link.ranks, c.link.latency * 1e6, row);
  }
  fmt::print("written to {}\n", file);
}

void run_peak() {
  auto be = make_device_backend("cpu");
  nlohmann::json j;
  fmt::print("kiln bench --peak: backend {}, {} OpenMP threads\n", be->name(), omp_get_max_threads());
  fmt::print("{}\n", gemm_paths(*be));
  fmt::print("{:<28} {:>12}\n", "measurement", "rate");
  double best32 = 0.0;
  for (int64_t n : {512, 1024, 2048}) {
    const double f = measure_gemm_flops(*be, DType::F32, n, 0.4);
    best32 = std::max(best32, f);
    fmt::print("{:<28} {:>8.1f} GFLOP/s\n", fmt::format("GEMM fp32 n={}", n), f / 1e9);
    j[fmt::format("gemm_fp32_n{}_flops", n)] = f;
  }
  j["gemm_fp32_flops"] = best32;
  j["peak_flops"] = best32;
  if (be->supports(OpFamily::Linear, DType::BF16)) {
    double best = 0.0;
    for (int64_t n : {1024, 2048}) {
      const double f = measure_gemm_flops(*be, DType::BF16, n, 0.4);
      best = std::max(best, f);
      fmt::print("{:<28} {:>8.1f} GFLOP/s\n", fmt::format("GEMM bf16 n={}", n), f / 1e9);
    }
    j["gemm_bf16_flops"] = best;
  } else {
    fmt::print("{:<28} {:>12}\n", "GEMM bf16", "unsupported");
    j["gemm_bf16_flops"] = nullptr;
  }
  const double bw = measure_copy_bandwidth(*be, 256ll << 20, 0.4);
  fmt::print("{:<28} {:>8.1f} GB/s (read + write)\n", "copy 256 MiB", bw / 1e9);
  j["copy_bytes_per_s"] = bw;
  j["threads"] = omp_get_max_threads();
  j["backend"] = be->name();
  fmt::print("{}\n", j.dump());
}

// The batches of successive steps: accum micro-batches of inputs and targets as the
// model takes them (TrainStep::batch_shape), from the train split of data.dir (shuffled
// with train.seed; token or image data, train/train_data.h) or synthetic: random tokens
// (targets the next ones) or random pixels in [-1, 1] with random labels. Two sources
// made from the same config yield the same sequence (the dump uses a second one).
class BatchSource {
 public:
  BatchSource(const TrainConfig& c, int accum) : c_(c), accum_(accum),
      rng_(static_cast<uint64_t>(c.train.seed), kSyntheticStream) {
    if (!c.data.blend.empty() || (!c.data.dir.empty() && fs::exists(fs::path(c.data.dir) / "meta.json")))
      data_ = open_train_data(c, "train", /*shuffle=*/true);
  }
  const TrainData* data() const { return data_.get(); }
  /// in: each micro-batch's required inputs (BatchShape's host layout), tg: its targets.
  /// Synthetic data: a language model's tokens as sequences of T + 1 random tokens (the
  /// targets the next ones); otherwise random pixels for fp32 inputs and random ids in
  /// each int32 input's range, the targets in shape.target_range.
  void next(const BatchShape& shape, std::vector<std::byte>& in, std::vector<int32_t>& tg) {
    const int64_t in_bytes = shape.required_bytes(), n_tg = shape.targets.numel();
    in.resize(static_cast<size_t>(accum_ * in_bytes));
    tg.resize(static_cast<size_t>(accum_ * n_tg));
    if (data_) {
      check_input_bytes(*data_, shape, c_.train.micro_batch, "bench");
      for (int k = 0; k < accum_; ++k)
        data_->next_batch(in.data() + static_cast<size_t>(k * in_bytes), tg.data() + k * n_tg,
                          c_.train.micro_batch, 0, 1);
      return;
    }
    const BatchInput* tokens = shape.find("tokens");
    const bool packed = c_.data.packing == "document";
    if (tokens && shape.required().size() == (packed ? 3u : 1u) && tokens->shape == shape.targets)
      next_sequences(tokens->range, packed, in, tg);
    else
      next_random(shape, in, tg);
  }

 private:
  int32_t draw(int64_t range) {
    return static_cast<int32_t>(rng_.next_u32() % static_cast<uint32_t>(range));
  }
  // Token sequences: tg is in shifted by one. Packed (data.packing = "document"): each
  // sequence one document, its positions and cu_seqlens after the tokens (data/packing.h).
  void next_sequences(int64_t vocab, bool packed, std::vector<std::byte>& in,
                      std::vector<int32_t>& tg) {
    const int B = c_.train.micro_batch, T = c_.train.seq_len;
    const size_t per_micro = in.size() / 4 / static_cast<size_t>(accum_);
    std::vector<int32_t> words(in.size() / 4);
    std::vector<int32_t> sample(static_cast<size_t>(T) + 1);
    const std::vector<std::vector<int32_t>> one_each(static_cast<size_t>(B), std::vector<int32_t>{0});
    for (int k = 0; k < accum_; ++k) {
      int32_t* tokens = words.data() + k * per_micro;
      for (int b = 0; b < B; ++b) {
        for (auto& t : sample) t = draw(vocab);
        const size_t r = static_cast<size_t>(k * B + b);
        std::copy(sample.begin(), sample.begin() + T, tokens + b * T);
        std::copy(sample.begin() + 1, sample.end(), tg.begin() + static_cast<ptrdiff_t>(r * T));
      }
      const int64_t BT = int64_t{B} * T;
      if (packed) data::pack_documents(one_each, T, tokens + BT, tokens + 2 * BT);
    }
    std::memcpy(in.data(), words.data(), in.size());
  }
  // Every input at random (pixels in [-1, 1], ids in range), then the targets.
  void next_random(const BatchShape& shape, std::vector<std::byte>& in, std::vector<int32_t>& tg) {
    std::byte* out = in.data();
    for (int k = 0; k < accum_; ++k) {
      for (const BatchInput& x : shape.required()) {
        KILN_CHECK(x.dtype == DType::F32 || (x.dtype == DType::I32 && x.range > 0), "bench: no "
                   "synthetic data for the batch input '{}' ({}); give data.dir", x.name,
                   dtype_name(x.dtype));
        std::vector<int32_t> v(static_cast<size_t>(x.shape.numel()));
        for (int32_t& e : v) {
          if (x.dtype == DType::F32) {
            const float p = static_cast<float>(rng_.next_u32() % 256u) / 127.5f - 1.f;
            std::memcpy(&e, &p, 4);
          } else {
            e = draw(x.range);
          }
        }
        std::memcpy(out, v.data(), static_cast<size_t>(x.nbytes()));
        out += x.nbytes();
      }
    }
    KILN_CHECK(shape.target_range > 0, "bench: no synthetic targets for this model; give data.dir");
    for (int32_t& y : tg) y = draw(shape.target_range);
  }

  const TrainConfig& c_;
  int accum_;
  Philox rng_;
  std::unique_ptr<TrainData> data_;
};

// The most slots an expert received over the mean, in the worst MoE layer (1 = balanced).
double worst_expert_load(const MoeStats& moe) {
  double load = 0.0;
  for (const ExpertLoad& l : expert_loads(moe))
    if (l.mean > 0) load = std::max(load, l.max / l.mean);
  return load;
}

// Initial weights, batches and per-step learning rates as one safetensors file, in
// kiln's names and layouts (linear weights [out, in], embeddings and heads with Vp
// rows), for the PyTorch comparison (bench/compare_pytorch.sh; bench/pytorch/*_train.py
// per arch). Any model: the metadata names its arch and holds its config_json().
void dump_init(const fs::path& path, const Model& model, const TrainConfig& c, int accum,
               int warmup, int steps) {
  KILN_CHECK(c.data.packing == "none", "{}: bench --dump-init (the PyTorch comparison) runs the peer "
             "without document masks; use data.packing = \"none\"", c.source);
  Backend& be = model.backend();
  safetensors::Writer w(path.string());
  for (const ParamSpec& p : model.params()) {
    std::vector<float> host(static_cast<size_t>(p.shape.numel()));
    be.copy_to_host(be.default_stream(), host.data(), model.param(p));
    std::vector<int64_t> shape;
    for (int i = 0; i < p.shape.ndim(); ++i) shape.push_back(p.shape[i]);
    w.add_f32(p.name, shape, host);
  }
  const int S = warmup + steps;
  const int64_t rows = static_cast<int64_t>(accum) * c.train.micro_batch;
  const BatchShape shape = model.batch_shape(c.train.micro_batch, c.train.seq_len);
  const BatchInput* tokens = shape.find("tokens");
  KILN_CHECK(tokens && shape.required().size() == 1, "bench: --dump-init (the PyTorch "
             "comparison) is for language models; {} takes other inputs", model.arch());
  std::vector<int32_t> in(static_cast<size_t>(S * accum * tokens->shape.numel())), tg, bt;
  std::vector<std::byte> bi;
  BatchSource source(c, accum);  // the same sequence as the timed run's own source
  for (int s = 0; s < S; ++s) {
    source.next(shape, bi, bt);
    std::memcpy(in.data() + static_cast<size_t>(s) * bi.size() / 4, bi.data(), bi.size());
    tg.insert(tg.end(), bt.begin(), bt.end());
  }
  w.add_i32("bench.inputs", {S, rows, c.train.seq_len}, in);
  w.add_i32("bench.targets", {S, rows, c.train.seq_len}, tg);
  std::vector<float> lr;
  for (int s = 0; s < S; ++s) lr.push_back(static_cast<float>(learning_rate(c, s)));
  w.add_f32("bench.lr", {S}, lr);
  // What the PyTorch side builds: the arch and the model's own hyper-parameters (as its
  // checkpoints store them, Model::config_json), then the training step's settings.
  w.set_metadata("arch", model.arch());
  w.set_metadata("model", model.config_json().dump());
  auto meta = [&](const char* k, auto v) { w.set_metadata(k, fmt::format("{}", v)); };
  meta("micro_batch", c.train.micro_batch);
  meta("accum", accum);
  meta("seq_len", c.train.seq_len);
  meta("warmup", warmup);
  meta("steps", steps);
  meta("beta1", c.optim.beta1);
  meta("beta2", c.optim.beta2);
  meta("eps", c.optim.eps);
  meta("weight_decay", c.optim.weight_decay);
  meta("grad_clip", c.optim.grad_clip);
  meta("seed", c.train.seed);
  w.write();
}

// Under mpirun/srun: the trainer itself (data parallel with the configured ZeRO stage,
// tensor parallel with parallel.tp) for warmup + steps updates in a scratch run
// directory, then step time, tokens/s and the communication table (algbw/busbw per
// collective, nccl-tests convention) with the fraction of communication hidden under
// computation, and with tp > 1 the tensor-parallel traffic per update against the
// formula (parallel/tp_traffic.h), with pp > 1 each stage's measured bubble against the
// schedule's (simulated, theory). Needs data.dir.
void run_distributed_bench(const Args& a) {
  TrainConfig c = load_config_file(a.config, a.sets);
  c.train.steps = a.warmup + a.steps;
  c.schedule.warmup_steps = std::min<int64_t>(c.schedule.warmup_steps, c.train.steps);
  c.eval.every = 0;
  c.sample.every = 0;
  c.checkpoint.every = 0;
  c.checkpoint.keep = 1;
  c.log.every = 0;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  c.run.dir = (fs::temp_directory_path() /
               fmt::format("kiln-bench-{}", std::getenv("OMPI_COMM_WORLD_JOBID")
                                                ? std::getenv("OMPI_COMM_WORLD_JOBID")
                                                : std::to_string(::getppid())))
                  .string();
  TrainerOptions o;
  o.verbose = rank == nullptr || std::string(rank) == "0";
  o.untimed_steps = a.warmup;
  TrainResult r;
  {
    Trainer t(c, o);
    r = t.run();
  }
  if (o.verbose) {
    fs::remove_all(c.run.dir);
    nlohmann::json j{{"world_size", launcher_world_size()},
                     {"zero_stage", c.parallel.zero_stage},
                     {"step_ms", 1e3 * r.step_time_s},
                     {"tokens_per_s", r.tokens_per_s},
                     {"timed_steps", r.timed_steps},
                     {"comm_ms_per_step", 1e3 * r.comm_busy_s / std::max<int64_t>(r.timed_steps, 1)},
                     {"comm_exposed_ms_per_step",
                      1e3 * r.comm_exposed_s / std::max<int64_t>(r.timed_steps, 1)},
                     {"comm_hidden_fraction", r.comm_hidden_fraction}};
    if (c.parallel.cp > 1) j["cp"] = c.parallel.cp;
    if (c.parallel.pp > 1) {
      j["pp"] = c.parallel.pp;
      j["pp_schedule"] = c.parallel.pp_schedule;
      j["virtual_stages"] = c.parallel.virtual_stages;
      j["pp_bubble_measured"] = r.pp_bubble_measured;  // per stage
      j["pp_bubble_simulated"] = r.pp_bubble_simulated;
      j["pp_bubble_theory"] = r.pp_bubble_theory;
    }
    if (c.parallel.tp > 1) {
      // The tensor-parallel traffic per update, measured against the formula.
      nlohmann::json t = nlohmann::json::object();
      int64_t measured = 0, formula = 0;
      for (int k = 0; k < kNumCollectives; ++k) {
        const auto i = static_cast<size_t>(k);
        measured += r.tp_measured.bytes[i];
        formula += r.tp_formula.bytes[i];
        if (r.tp_measured.calls[i] == 0 && r.tp_formula.calls[i] == 0) continue;
        t[collective_name(static_cast<Collective>(k))] = {
            {"calls", r.tp_measured.calls[i]}, {"bytes", r.tp_measured.bytes[i]},
            {"formula_calls", r.tp_formula.calls[i]}, {"formula_bytes", r.tp_formula.bytes[i]}};
      }
      j["tp"] = c.parallel.tp;
      j["sequence_parallel"] = c.parallel.sequence_parallel;
      j["tp_traffic_per_update"] = t;
      j["tp_traffic_ratio"] = formula > 0 ? static_cast<double>(measured) / static_cast<double>(formula) : 0.0;
    }
    if (c.parallel.ep > 1) {
      // The expert-parallel all_to_all per update, measured against the balanced formula.
      const double steps = static_cast<double>(std::max<int64_t>(r.timed_steps, 1));
      j["ep"] = c.parallel.ep;
      j["ep_all_to_all_per_update"] = {
          {"calls", r.ep_measured.count / steps}, {"bytes", r.ep_measured.bytes / steps},
          {"ms", 1e3 * r.ep_measured.seconds / steps}, {"formula_calls", r.ep_formula.calls},
          {"formula_bytes", r.ep_formula.bytes}};
      // null where rank 0's pipeline stage holds no MoE layer (nothing to compare).
      j["ep_all_to_all_ratio"] =
          r.ep_formula.bytes > 0
              ? nlohmann::json(r.ep_measured.bytes / steps / static_cast<double>(r.ep_formula.bytes))
              : nlohmann::json();
      j["ep_all_to_all_exposed_ms_per_update"] = 1e3 * r.ep_exposed_s / steps;
    }
    fmt::print("{}\n", j.dump());
  }
}

void run_bench(const Args& a) {
  if (launcher_world_size() > 1) {
    run_distributed_bench(a);
    return;
  }
  TrainConfig c = load_config_file(a.config, a.sets);
  KILN_CHECK(a.steps >= 1, "bench: --steps must be >= 1");
  KILN_CHECK(a.warmup >= 0, "bench: --warmup must be >= 0");
  KILN_CHECK(c.model.n_layer > 0 && c.model.n_embd > 0 && c.model.n_head > 0 &&
                 c.model.block_size > 0,
             "{}: the model shape is incomplete (set model.preset or n_layer, n_head, n_embd, "
             "block_size)", c.source);
  const int accum = c.grad_accum_steps(1);
  const int B = c.train.micro_batch, T = c.train.seq_len;

  BatchSource source(c, accum);
  const bool images = model_arch(c.model.arch).takes_images;
  std::string data_desc = images ? "synthetic images" : "synthetic tokens";
  if (source.data()) {
    source.data()->check_arch(c);
    source.data()->fill_model_keys(c);
    data_desc = c.data.blend.empty() ? c.data.dir : describe_data(c);
  } else if (c.model.vocab_size == 0 && !images) {
    c.model.vocab_size = 50257;  // the GPT-2 tokenizer's
  }

  auto raw = make_device_backend(c.train.device, backend_options(c));
  // Peaks first, on the raw backend, so that the model's memory peak is its own. The
  // GEMM peak is measured again after the timed steps and the better of the two kept:
  // on a shared machine one measurement can fall in a moment of load.
  const double peak_before = measure_gemm_flops(*raw, DType::F32, 1024, 1.0);
  double peak_flops = peak_before;
  const bool tracing = !a.trace.empty();
  profile::Peaks peaks{peak_flops, tracing ? measure_copy_bandwidth(*raw) : 0.0};
  raw->allocator().reset_peak();
  std::unique_ptr<profile::ProfilingBackend> prof;
  if (tracing)
    prof = std::make_unique<profile::ProfilingBackend>(*raw, profile::Tracer::global(),
                                                       profile::op_timing(c.profile.timing));
  Backend& be = prof ? static_cast<Backend&>(*prof) : *raw;

  // One process: the layout's sizes must make a mesh of one rank (the mesh's own error).
  (void)DeviceMesh(1, 0, MeshSizes{.dp = c.parallel.dp, .cp = c.parallel.cp, .tp = c.parallel.tp,
                                   .pp = c.parallel.pp, .ep = c.parallel.ep});
  LocalCommunicator single;
  single.set_tracer(&profile::Tracer::global());
  TrainStep one_step(c, be, {.dp_cp = single});
  one_step.set_tracer(&profile::Tracer::global());
  Model& model = one_step.model();
  one_step.init_start_weights(static_cast<uint64_t>(c.train.seed));  // as kiln train starts

  const int total = a.warmup + a.steps;
  if (!a.dump_init.empty()) {
    dump_init(a.dump_init, model, c, accum, a.warmup, a.steps);
    fmt::print("kiln bench: initial weights and batches written to {}\n", a.dump_init);
  }

  const int64_t tokens_per_step = static_cast<int64_t>(accum) * B * T;
  fmt::print("kiln bench: {} | {} | {} micro-step(s) of B={} T={} ({} tokens/step) | {} "
             "warm-up + {} timed steps | backend {}, {} threads (OMP_WAIT_POLICY={}) | fp32 GEMM "
             "{:.1f} GFLOP/s{}\n",
             model.describe(), data_desc, accum, B, T, tokens_per_step, a.warmup, a.steps, be.name(),
             omp_get_max_threads(), std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "unset",
             peak_flops / 1e9,
             c.train.fp8 == "none" ? std::string() : fmt::format(" | train.fp8 = {}", c.train.fp8));
  const std::string gemm_path = be.gemm_path(parse_dtype(c.train.dtype));
  fmt::print("kiln bench: {}\n", gemm_path);
  std::fflush(stdout);

  profile::ProfileWindow window(tracing ? std::vector<int64_t>{a.warmup, total}
                                        : std::vector<int64_t>{},
                                a.trace, peaks);
  if (prof)
    window.set_backend(prof.get());  // flushes device-timed ops (profile.timing = "events")
  else
    window.set_allocator(&be.allocator());
  // Phase times: each phase runs until the next is announced, the backend synchronised
  // at every boundary. Gradient sync (nothing to do on one process) counts as backward.
  struct PhaseClock final : StepObserver {
    Backend& be;
    Clock::time_point last = Clock::now();
    int current = 0;               // 0 data, 1 forward, 2 backward, 3 optimizer
    double sec[4] = {0, 0, 0, 0};
    explicit PhaseClock(Backend& b) : be(b) {}
    void on_phase(StepPhase p) override {
      be.synchronize(be.default_stream());
      const auto now = Clock::now();
      sec[current] += seconds(last, now);
      last = now;
      switch (p) {
        case StepPhase::Data: current = 0; break;
        case StepPhase::Forward: current = 1; break;
        case StepPhase::Backward:
        case StepPhase::GradSync: current = 2; break;
        case StepPhase::Optimizer:
        case StepPhase::Done: current = 3; break;
      }
    }
  } clock(be);
  one_step.set_observer(&clock);
  std::vector<std::byte> inputs;
  std::vector<int32_t> targets_host;
  double t_data = 0, t_fwd = 0, t_bwd = 0, t_opt = 0, t_step = 0, t_min = 1e30;
  std::vector<double> losses, moe_aux, moe_load;
  for (int step = 0; step < total; ++step) {
    window.begin_step(step);
    const auto t0 = Clock::now();
    {
      auto sc = profile::trace_scope("data");
      source.next(one_step.batch_shape(), inputs, targets_host);
    }
    clock.last = Clock::now();
    clock.current = 0;
    for (double& x : clock.sec) x = 0;
    const StepResult r = one_step.run(inputs.data(), targets_host.data(), step);
    const auto t4 = Clock::now();
    const double d_data = seconds(t0, t4) - clock.sec[1] - clock.sec[2] - clock.sec[3];
    const double d_fwd = clock.sec[1], d_bwd = clock.sec[2], d_opt = clock.sec[3];
    window.end_step();
    const double loss = r.loss;
    KILN_CHECK(std::isfinite(loss), "bench: step {}: the loss is {}", step, loss);
    losses.push_back(loss);
    std::string moe;
    if (r.moe) {
      moe_aux.push_back(r.moe->aux_loss + r.moe->z_loss);
      moe_load.push_back(worst_expert_load(*r.moe));
      moe = fmt::format(" | aux {:.4f} z {:.4f} load {:.2f}", r.moe->aux_loss, r.moe->z_loss,
                        moe_load.back());
    }
    const double dt = seconds(t0, t4);  // data, forward, backward and optimizer
    if (step >= a.warmup) {
      t_data += d_data, t_fwd += d_fwd, t_bwd += d_bwd, t_opt += d_opt, t_step += dt;
      t_min = std::min(t_min, dt);
    }
    fmt::print("step {:>3}{} | loss {:.6f}{} | {:.1f} ms (data {:.1f}, fwd {:.1f}, bwd {:.1f}, "
               "opt {:.1f}) | {:.0f} tok/s\n",
               step, step < a.warmup ? " (warm-up)" : "", loss, moe, dt * 1e3, d_data * 1e3,
               d_fwd * 1e3, d_bwd * 1e3, d_opt * 1e3, static_cast<double>(tokens_per_step) / dt);
    std::fflush(stdout);
  }
  window.finish();
  const MemoryStats mem = be.allocator().stats();  // before the GEMM probe's temporaries
  const double peak_after = measure_gemm_flops(*raw, DType::F32, 1024, 1.0);
  peak_flops = std::max(peak_before, peak_after);

  const double n = static_cast<double>(a.steps);
  const double tok_s = static_cast<double>(tokens_per_step) * n / t_step;
  const double fpt = model.flops_per_token(T);
  const double mfu = fpt * tok_s / peak_flops;
  auto ms = [&](double x) { return x / n * 1e3; };
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  fmt::print("\n{:<34} {:>14}\n", "kiln bench (mean of timed steps)", "value");
  fmt::print("{:<34} {:>14.1f}\n", "tokens/s", tok_s);
  fmt::print("{:<34} {:>14.1f}\n", "step ms", ms(t_step));
  fmt::print("{:<34} {:>14.1f}\n", "step ms (fastest)", t_min * 1e3);
  fmt::print("{:<34} {:>14.1f}  {:>5.1f}%\n", "  data ms", ms(t_data), 100 * t_data / t_step);
  fmt::print("{:<34} {:>14.1f}  {:>5.1f}%\n", "  forward ms", ms(t_fwd), 100 * t_fwd / t_step);
  fmt::print("{:<34} {:>14.1f}  {:>5.1f}%\n", "  backward ms", ms(t_bwd), 100 * t_bwd / t_step);
  fmt::print("{:<34} {:>14.1f}  {:>5.1f}%\n", "  optimizer ms", ms(t_opt), 100 * t_opt / t_step);
  fmt::print("{:<34} {:>14.3e}\n",
             moe_load.empty() ? "model FLOPs per token" : "model FLOPs per token (active)", fpt);
  fmt::print("{:<34} {:>14.1f}\n", "achieved GFLOP/s", fpt * tok_s / 1e9);
  fmt::print("{:<34} {:>14.1f}  (before {:.1f}, after {:.1f})\n", "peak GFLOP/s (fp32 GEMM)",
             peak_flops / 1e9, peak_before / 1e9, peak_after / 1e9);
  fmt::print("{:<34} {:>13.1f}%\n", "MFU", 100 * mfu);
  if (!moe_load.empty()) {
    double load = 0.0;
    for (size_t i = static_cast<size_t>(a.warmup); i < moe_load.size(); ++i) load += moe_load[i] / n;
    fmt::print("{:<34} {:>14.2f}  (most slots of an expert / mean, worst layer; 1 = balanced)\n",
               "MoE expert load", load);
  }
  fmt::print("{:<34} {:>14.1f}\n", "peak memory MiB", mib(mem.total_peak));
  for (int k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    fmt::print("{:<34} {:>14.1f}\n", fmt::format("  {} MiB (peak)", mem_category_name(cat)),
               mib(mem.peak_of(cat)));
  }
  nlohmann::json j;
  j["tokens_per_s"] = tok_s;
  j["gemm_path"] = gemm_path;
  j["dtype"] = c.train.dtype;
  j["fp8"] = c.train.fp8;  // "none", "tensorwise", "delayed": which numbers these are
  j["mfu"] = mfu;
  j["peak_flops"] = peak_flops;
  j["peak_flops_before"] = peak_before;
  j["peak_flops_after"] = peak_after;
  j["flops_per_token"] = fpt;
  j["step_ms"] = ms(t_step);
  j["step_ms_min"] = t_min * 1e3;
  j["data_ms"] = ms(t_data);
  j["forward_ms"] = ms(t_fwd);
  j["backward_ms"] = ms(t_bwd);
  j["optimizer_ms"] = ms(t_opt);
  j["peak_mem_bytes"] = mem.total_peak;
  for (int k = 0; k < kNumMemCategories; ++k) {
    const auto cat = static_cast<MemCategory>(k);
    j[fmt::format("peak_mem_{}_bytes", mem_category_name(cat))] = mem.peak_of(cat);
  }
  j["tokens_per_step"] = tokens_per_step;
  j["micro_batch"] = B;
  j["seq_len"] = T;
  j["accum"] = accum;
  j["steps"] = a.steps;
  j["warmup"] = a.warmup;
  j["threads"] = omp_get_max_threads();
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  j["omp_wait_policy"] = wait ? wait : "";
  j["backend"] = be.name();
  j["model"] = model.describe();
  j["num_parameters"] = model.num_parameters();
  j["data"] = data_desc;
  j["packing"] = c.data.packing;
  j["profiled"] = tracing;
  j["losses"] = losses;
  if (!moe_load.empty()) {
    j["moe_aux_plus_z_losses"] = moe_aux;  // as optimised, per step
    j["moe_expert_load"] = moe_load;       // per step, worst layer's max / mean
  }
  fmt::print("{}\n", j.dump());
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Measure training throughput (tokens/s, phases, MFU, memory) or, with --peak, "
               "the machine's GEMM and copy peaks");
  auto a = std::make_shared<Args>();
  cmd->add_option("config", a->config, "The TOML config (required unless --peak)");
  cmd->add_option("--set", a->sets, "Override a key: --set section.key=value (repeatable)");
  cmd->add_option("--steps", a->steps, "Timed steps (default 10)");
  cmd->add_option("--warmup", a->warmup, "Untimed warm-up steps first (default 2)");
  cmd->add_option("--trace", a->trace,
                  "Profile the timed steps: write a Chrome trace here and print the per-op summary");
  cmd->add_option("--dump-init", a->dump_init,
                  "Write the initial weights, the batches and learning rates as safetensors "
                  "(for bench/compare_pytorch.sh)");
  cmd->add_flag("--peak", a->peak, "Measure fp32 (and bf16) GEMM FLOP/s and copy bandwidth");
  cmd->add_option("--calibrate", a->calibrate,
                  "Measure GEMM FLOP/s by size (fp32, bf16) and memory bandwidth for kiln plan "
                  "--calibration, and write them to this file");
  cmd->add_option("--device", a->device, "The backend --calibrate measures (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--isa", a->isa, "Print how GEMMs of each dtype run here (oneDNN ISA, path)");
  cmd->callback([a] {
    if (a->isa) {
      fmt::print("{}\n", gemm_paths(*make_device_backend("cpu")));
      return;
    }
    if (a->peak) {
      run_peak();
      return;
    }
    if (!a->calibrate.empty()) {
      run_calibrate(a->calibrate, a->device);
      return;
    }
    KILN_CHECK(!a->config.empty(), "bench: a config file is required (or --peak or --isa)");
    run_bench(*a);
  });
}

}  // namespace kiln::app
