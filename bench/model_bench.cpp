// kiln_bench_model: one full GPT-2 training step (the trainer's TrainStep: forward with
// the loss and its gradient, backward, norm, clipping, AdamW) on every backend of
// available_backends().
//
// Counters (rates over real, wall-clock time):
//   tokens/s      B*T tokens per step.
//   FLOP/s        B*T * GPT2Config::flops_per_token(T) per step: 6 N + 12 * n_layer * T *
//                 n_embd per token (matmul FLOPs forward + backward, attention without the
//                 causal halving; see models/gpt2/config.h). AdamW, norms, GELU etc. are
//                 not counted: this is the model FLOP rate used for MFU.
//   loss          mean loss (nats per token) of the last timed step: a sanity check that
//                 the step ran on real numbers (about ln(50257) = 10.8 at init).
//   peak_MiB      peak bytes held by the backend's allocator during the benchmark (all
//                 categories: parameters, gradients, AdamW state, activations, scratch).
#include "bench_util.h"

#include "backend/registry.h"
#include "models/gpt2/config.h"
#include "comm/local_communicator.h"
#include "models/gpt2/config.h"
#include "train/train_step.h"
#include "optim/adamw.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace kiln::bench {
namespace {

void register_step(Backend& be, const GPT2Config& cfg, const std::string& model, int B, int T,
                   int64_t steps) {
  const std::string name = be.name() + "/" + model + "/train_step/B:" + std::to_string(B) +
                           "/T:" + std::to_string(T) + "/layers:" + std::to_string(cfg.n_layer) +
                           "/C:" + std::to_string(cfg.n_embd);
  auto* b = benchmark::RegisterBenchmark(name.c_str(), [&be = be, cfg, B, T](benchmark::State& st) {
    be.allocator().reset_peak();
    // The trainer's own step (train/train_step.h) on one process.
    ModelOptions mo;
    mo.n_layer = cfg.n_layer, mo.n_head = cfg.n_head, mo.n_embd = cfg.n_embd;
    mo.block_size = cfg.block_size, mo.vocab_size = cfg.vocab_size;
    LocalCommunicator single;
    TrainStep one_step(step_config(mo, B, T), be, {.dp_cp = single});
    one_step.init_weights(1337);
    // Targets are the tokens shifted by one, as the data loader makes them.
    Tensor ids = random_ids(be, {B, T + 1}, cfg.vocab_size, 100);
    std::vector<int32_t> h(static_cast<size_t>(B) * (T + 1));
    be.copy_to_host(be.default_stream(), h.data(), ids);
    std::vector<int32_t> tok(static_cast<size_t>(B) * T), tgt(tok.size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        tok[static_cast<size_t>(b * T + t)] = h[static_cast<size_t>(b * (T + 1) + t)];
        tgt[static_cast<size_t>(b * T + t)] = h[static_cast<size_t>(b * (T + 1) + t + 1)];
      }
    double loss = 0.0;
    int64_t update = 0;
    auto step = [&] { loss = one_step.run(tok.data(), tgt.data(), update++).loss; };
    // Untimed warm-up step: activation allocation, GEMM primitive creation, first touch.
    step();
    be.synchronize(be.default_stream());
    for (auto _ : st) {
      step();
      be.synchronize(be.default_stream());
    }
    const double tokens_per_step = static_cast<double>(B) * T;
    st.counters["tokens/s"] =
        benchmark::Counter(tokens_per_step, benchmark::Counter::kIsIterationInvariantRate);
    set_flops(st, tokens_per_step * cfg.flops_per_token(T));
    st.counters["loss"] = loss;
    st.counters["peak_MiB"] =
        static_cast<double>(be.allocator().stats().total_peak) / (1024.0 * 1024.0);
  });
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  if (steps > 0) b->Iterations(steps);
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  using namespace kiln;
  bench::Flags flags({{"model", "gpt2"},
                      {"B", "4"},
                      {"T", "64"},
                      {"n_layer", "0"},
                      {"n_head", "0"},
                      {"n_embd", "0"},
                      {"steps", "3"},
                      {"backend", "all"}},
                     {{"model", "GPT-2 preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
                      {"B", "batch size"},
                      {"T", "sequence length"},
                      {"n_layer", "override the preset's layer count (0: keep)"},
                      {"n_head", "override the preset's head count (0: keep)"},
                      {"n_embd", "override the preset's width (0: keep)"},
                      {"steps", "timed steps (after one untimed warm-up); 0: let "
                                "--benchmark_min_time decide"},
                      {"backend", "a backend name (cpu, cuda) or all"}});
  flags.parse(&argc, argv);

  const std::string model = flags.str("model");
  GPT2Config cfg = GPT2Config::preset(model);
  if (flags.i64("n_layer") > 0) cfg.n_layer = static_cast<int>(flags.i64("n_layer"));
  if (flags.i64("n_head") > 0) cfg.n_head = static_cast<int>(flags.i64("n_head"));
  if (flags.i64("n_embd") > 0) cfg.n_embd = static_cast<int>(flags.i64("n_embd"));
  cfg.validate();
  const int B = static_cast<int>(flags.i64("B"));
  const int T = static_cast<int>(flags.i64("T"));

  std::vector<std::unique_ptr<Backend>> backends;
  if (flags.str("backend") == "all") {
    backends = available_backends();
    for (const auto& why : skipped_backends()) std::fprintf(stderr, "skipped backend: %s\n", why.c_str());
  } else {
    backends.push_back(make_backend(flags.str("backend")));
  }
  for (auto& be : backends) bench::register_step(*be, cfg, model, B, T, flags.i64("steps"));

  benchmark::AddCustomContext("model", cfg.str());
  benchmark::AddCustomContext("num_parameters", std::to_string(cfg.num_parameters()));
  benchmark::AddCustomContext("flops_per_token", std::to_string(cfg.flops_per_token(T)));
  bench::add_thread_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
