// kiln_gpu_step: GPT-2 training steps (the trainer's TrainStep: forward with loss,
// backward, norm, clipping, AdamW) on the CUDA backend, for scripts/gpu-check.sh. Prints one JSON line:
//   {"impl":"kiln", "B":..., "T":..., "dtype":..., "ms_per_step":..., "tokens_per_s":...,
//    "model_tflops":..., "peak_bf16_tflops":..., "mfu":..., "loss":..., "peak_gib":...}
// MFU = B*T * flops_per_token(T) per second (6N + attention, GPT2Config) over the bf16
// GEMM rate measured here through the backend's own linear_forward (8192^3); ms_per_step
// is the median of --steps steps after --warmup.
// The model runs in bf16 (train.dtype = bf16: bf16 parameters and activations, fp32
// gradients; AdamW keeps fp32 master weights), like PyTorch's bf16 autocast in torch_gpt2.py;
// --fp32 runs the fp32 model instead (--set backend.tf32=true lets its GEMMs use TF32).
// --set section.key=value (repeatable): a training config key, as `kiln train --set`
// takes it, applied to the step's config and the backend (backend.*, optim.multi_tensor,
// train.classifier_chunk_mb, ...; scripts/gpu-check.sh's variants).
// --profile N: N more steps through a ProfilingBackend timing each op with CUDA events
// (OpTiming::DeviceEvents: no synchronisation per op, read after each step), printing the
// per-op and per-kind tables (gemm, attention, norms, elementwise, classifier, optimizer,
// memory, idle) in ms per step; --profile-sync times them with a synchronize per op.
// The JSON line then holds "profile_kinds": {kind: ms per step, ..., "idle": ms}.
// --repeat: the measured run again from the same seed; "deterministic" in the JSON says
// whether every step's loss was bitwise the same (issue 19, item 5).
// --peak-tflops X: MFU against X (bf16 TFLOP/s measured elsewhere: gpu-check.sh's one
// common peak for every run) instead of measuring the GEMM peak here.
// Usage: kiln_gpu_step [--model gpt2] [--B 16] [--T 1024] [--steps 30] [--warmup 3]
//                      [--profile N] [--profile-sync] [--repeat] [--fp32] [--set k=v]...
//                      [--peak-tflops X]
// When B does not fit, it halves B until it does (the B used is printed).
#include "backend/probe.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/gpt2/config.h"
#include "comm/local_communicator.h"
#include "train/device.h"
#include "train/train_step.h"
#include "profile/profiling_backend.h"
#include "profile/summary.h"
#include "profile/tracer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace kiln;

namespace {

struct Args {
  std::string model = "gpt2";
  int B = 16, T = 1024, steps = 30, warmup = 3;
  int profile = 0;  // > 0: that many more steps through a ProfilingBackend, per-op table
  bool profile_sync = false;  // profile with a synchronize per op instead of CUDA events
  bool repeat = false;        // run again from the same seed: losses bitwise the same?
  bool fp32 = false;  // the fp32 model instead of bf16 with fp32 gradients and masters
  int peak_tflops = 0;  // > 0: the bf16 GEMM peak to use, not measured here
  std::vector<std::string> sets;  // --set section.key=value, in order
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "kiln_gpu_step: %s (flags: --model NAME --B N --T N --steps N "
               "--warmup N --profile N --profile-sync --repeat --fp32 --set KEY=VALUE "
               "--peak-tflops N)\n",
               what.c_str());
  std::exit(2);
}

// A whole number >= lo, else a usage error naming the flag.
int number(const std::string& flag, const std::string& v, int lo) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > 1 << 20)
    usage_error("flag " + flag + " = '" + v + "': expected a whole number >= " + std::to_string(lo));
  return static_cast<int>(x);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--fp32" || k == "--repeat" || k == "--profile-sync") {
      (k == "--fp32" ? a.fp32 : k == "--repeat" ? a.repeat : a.profile_sync) = true;
      continue;
    }
    if (k != "--model" && k != "--B" && k != "--T" && k != "--steps" && k != "--warmup" &&
        k != "--profile" && k != "--set" && k != "--peak-tflops")
      usage_error("unknown flag " + k);
    if (i + 1 >= argc) usage_error("flag " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--set") a.sets.push_back(v);
    else if (k == "--model") a.model = v;
    else if (k == "--B") a.B = number(k, v, 1);
    else if (k == "--T") a.T = number(k, v, 1);
    else if (k == "--steps") a.steps = number(k, v, 1);
    else if (k == "--warmup") a.warmup = number(k, v, 0);
    else if (k == "--peak-tflops") a.peak_tflops = number(k, v, 1);
    else a.profile = number(k, v, 0);
  }
  return a;
}

struct Result {
  double ms = 0, loss = 0, peak_gib = 0;
  std::vector<double> losses;  // every step's, warm-up included
};

// prof: `be` itself when profiling: its tracer is enabled after the warm-up, each step
// recorded as a "step" event and its ops flushed, and disabled at the end.
ModelOptions model_options(const GPT2Config& cfg) {
  ModelOptions mo;
  mo.n_layer = cfg.n_layer, mo.n_head = cfg.n_head, mo.n_embd = cfg.n_embd;
  mo.block_size = cfg.block_size, mo.vocab_size = cfg.vocab_size;
  return mo;
}

Result run(Backend& be, const GPT2Config& cfg, const std::string& dtype, int B, int T,
           int warmup, int steps, const std::vector<std::string>& sets,
           profile::ProfilingBackend* prof = nullptr) {
  be.allocator().reset_peak();
  // The trainer's own step (train/train_step.h) on one process: parameters and
  // activations in `dtype`, fp32 gradients and master weights; the --set keys applied.
  LocalCommunicator single;
  TrainStep one_step(step_config(model_options(cfg), B, T, dtype, sets), be, {.dp_cp = single});
  one_step.init_weights(1337);
  std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
  Philox rng(20240601, 7);
  for (auto& x : tok) x = static_cast<int32_t>(rng.next_u32() % cfg.vocab_size);
  for (size_t i = 0; i < tok.size(); ++i) tgt[i] = tok[(i + 1) % tok.size()];
  const Stream s = be.default_stream();
  double loss = 0;
  int64_t update = 0;
  Result r;
  auto step = [&] {
    loss = one_step.run(tok.data(), tgt.data(), update++).loss;
    r.losses.push_back(loss);
  };
  for (int i = 0; i < warmup; ++i) step();
  be.synchronize(s);
  if (prof) prof->tracer().enable();
  // Each step ends with its one host read (the loss), so the GPU is idle between two
  // steps and the host clock around one step is its time; the median of the steps.
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(1e3 * std::chrono::duration<double>(t1 - t0).count());
    if (prof) {
      prof->tracer().record_complete("step", "step", t0, t1);
      prof->flush();
    }
  }
  be.synchronize(s);
  if (prof) prof->tracer().disable();
  std::sort(ms.begin(), ms.end());
  r.ms = ms[ms.size() / 2];
  r.loss = loss;
  r.peak_gib = static_cast<double>(be.allocator().stats().total_peak) / (1024.0 * 1024 * 1024);
  return r;
}

// The per-kind table as a JSON member: `, "profile_kinds": {"gemm": 12.3, ..., "idle": 1.2}`
// in ms per profiled step (as the table's ms/step column).
std::string profile_kinds_json(const profile::Summary& s) {
  const double per = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
  std::string out = ", \"profile_kinds\": {";
  char buf[96];
  for (const auto& k : s.kinds) {
    std::snprintf(buf, sizeof buf, "\"%s\": %.3f, ", k.name.c_str(), k.total_ns / 1e6 / per);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "\"idle\": %.3f}", s.idle_ns / 1e6 / per);
  return out + buf;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    GPT2Config cfg = GPT2Config::preset(a.model);
    const std::string dtype = a.fp32 ? "fp32" : "bf16";
    // The --set keys, checked before any GPU work; the backend is made with [backend]'s.
    const TrainConfig keys = step_config(model_options(cfg), a.B, a.T, dtype, a.sets);
    auto be = make_backend("cuda", backend_options(keys));
    const double peak = a.peak_tflops > 0 ? a.peak_tflops * 1e12
                                          : measure_gemm_flops(*be, DType::BF16, 8192, 1.0);
    // (The fp32 peak only rates the fp32 model's profile.)
    const double peak_fp32 = a.peak_tflops > 0 && !(a.fp32 && a.profile > 0)
                                 ? 0.0
                                 : measure_gemm_flops(*be, DType::F32, 4096, 0.5);
    std::fprintf(stderr, "kiln_gpu_step: GEMM peak bf16 %.1f TFLOP/s (%s), fp32%s %.1f TFLOP/s\n",
                 peak / 1e12, a.peak_tflops > 0 ? "given" : "measured",
                 keys.backend.tf32 ? " (TF32 allowed)" : "", peak_fp32 / 1e12);
    int B = a.B;
    Result r;
    for (;;) {
      try {
        r = run(*be, cfg, dtype, B, a.T, a.warmup, a.steps, a.sets);
        break;
      } catch (const Error& e) {
        if (B == 1 || std::strstr(e.what(), "out of memory") == nullptr) throw;
        std::fprintf(stderr, "kiln_gpu_step: B=%d does not fit (%s); trying B=%d\n", B, e.what(),
                     B / 2);
        B /= 2;
      }
    }
    // (A NaN or infinite loss has no JSON spelling, and the step that made it is wrong.)
    KILN_CHECK(std::isfinite(r.loss), "the loss after {} steps is {} (not finite)",
               a.warmup + a.steps, r.loss);
    const double tps = static_cast<double>(B) * a.T / (r.ms / 1e3);
    const double model_flops = tps * cfg.flops_per_token(a.T);
    // Item 5: the same steps from the same seed, bitwise the same losses?
    int deterministic = -1;  // -1: not checked
    if (a.repeat) {
      const Result again = run(*be, cfg, dtype, B, a.T, a.warmup, a.steps, a.sets);
      deterministic = again.losses == r.losses ? 1 : 0;
      for (size_t i = 0; deterministic == 0 && i < r.losses.size(); ++i)
        if (again.losses[i] != r.losses[i]) {
          std::fprintf(stderr, "kiln_gpu_step: NOT deterministic: step %zu loss %.17g, then %.17g\n",
                       i, r.losses[i], again.losses[i]);
          break;
        }
      if (deterministic == 1)
        std::fprintf(stderr, "kiln_gpu_step: deterministic: %zu steps' losses bitwise the same in a "
                     "second run\n", r.losses.size());
    }
    std::string kinds_json;  // ", \"profile_kinds\": {...}" when profiled
    if (a.profile > 0) {
      // Per-op device times from CUDA events around each op (or, --profile-sync, every op
      // synchronised: then the sum exceeds the unprofiled step).
      const double bw = measure_copy_bandwidth(*be);
      profile::Tracer tracer;
      profile::ProfilingBackend pb(*be, tracer,
                                   a.profile_sync ? profile::OpTiming::Synchronize
                                                  : profile::OpTiming::DeviceEvents);
      const Result p = run(pb, cfg, dtype, B, a.T, 1, a.profile, a.sets, &pb);
      const profile::Summary summary = profile::summarize(tracer.events());
      std::fprintf(stderr, "kiln_gpu_step: profiled %d steps (%s): %.1f ms/step; "
                   "copy bandwidth %.0f GB/s\n%s", a.profile,
                   a.profile_sync ? "ops synchronised" : "CUDA events per op", p.ms, bw / 1e9,
                   profile::format_summary(summary, profile::Peaks{a.fp32 ? peak_fp32 : peak, bw})
                       .c_str());
      kinds_json = profile_kinds_json(summary);
    }
    const char* precision = !a.fp32 ? "bf16 (fp32 grads)"
                        : keys.backend.tf32 ? "fp32 (tf32 GEMMs)"
                                            : "fp32";
    std::printf(
        "{\"impl\": \"kiln\", \"B\": %d, \"T\": %d, \"dtype\": \"%s\", \"ms_per_step\": %.3f, "
        "\"tokens_per_s\": %.1f, \"model_tflops\": %.2f, \"peak_bf16_tflops\": %.1f, "
        "\"mfu\": %.4f, \"loss\": %.4f, \"loss_exact\": %.17g, \"peak_gib\": %.2f, "
        "\"deterministic\": %s%s}\n",
        B, a.T, precision, r.ms, tps,
        model_flops / 1e12, peak / 1e12, model_flops / peak, r.loss, r.loss, r.peak_gib,
        deterministic < 0 ? "null" : deterministic ? "true" : "false", kinds_json.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_gpu_step: error: %s\n", e.what());
    return 1;
  }
}
