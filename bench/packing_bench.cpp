// kiln_bench_packing: what document packing gains. A synthetic corpus of documents of mixed
// lengths (log-uniform in [8, T]: many short, few long, as web text), trained three ways
// with the trainer's TrainStep on one process, the same model and rows of T tokens:
//   padded     one document per row (cut at T), padded; the padding's targets ignored;
//   packed     rows cut from the document stream, each document attending only to itself
//              (data.packing = "document": varlen attention, restarting positions);
//   unmasked   the same rows with attention across documents (data.packing = "none").
// Counters (rates over wall-clock time): useful_tokens/s, the targets in the loss per
// second (every token of a packed row; a padded row's document only), and tokens/s (all
// B*T). A padded step costs the same whatever its documents (dense shapes), so its useful
// tokens are counted at the corpus's useful fraction (the mean of min(L, T) / T over every
// document), not at that of the few documents the timed steps happen to hold. The last
// line prints packed / padded and packed / unmasked useful tokens/s.
#include "bench_util.h"

#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "data/packing.h"
#include "train/train_step.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace kiln::bench {
namespace {

// Documents of log-uniform lengths in [8, T] (their separator, token 0, first), laid end
// to end.
struct Corpus {
  std::vector<int32_t> stream;
  std::vector<int64_t> starts;
  double padded_fraction = 0;  // mean of min(L, T) / T over the documents
};

Corpus make_corpus(int64_t tokens, int T, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(std::log(8.0), std::log(static_cast<double>(T)));
  std::uniform_int_distribution<int32_t> id(1, vocab - 1);
  Corpus c;
  while (static_cast<int64_t>(c.stream.size()) < tokens) {
    c.starts.push_back(static_cast<int64_t>(c.stream.size()));
    const auto n = static_cast<int64_t>(std::exp(u(gen)));
    c.stream.push_back(0);
    for (int64_t i = 1; i < n; ++i) c.stream.push_back(id(gen));
    c.padded_fraction += static_cast<double>(std::min<int64_t>(n, T)) / T;
  }
  c.padded_fraction /= static_cast<double>(c.starts.size());
  return c;
}

enum class Mode { Padded, Packed, Unmasked };
const char* mode_name(Mode m) {
  return m == Mode::Padded ? "padded" : m == Mode::Packed ? "packed" : "unmasked";
}

// Step s's micro-batch of B rows: its inputs (tokens, and when packed positions and
// cu_seqlens), targets, and the targets in the loss (padded: at the corpus's fraction).
int64_t make_batch(const Corpus& c, Mode mode, int64_t s, int B, int T,
                   std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  const int64_t BT = int64_t{B} * T;
  inputs.assign(static_cast<size_t>(mode == Mode::Packed ? 3 * BT + 1 : BT), 0);
  targets.assign(static_cast<size_t>(BT), -1);
  if (mode == Mode::Padded) {
    const auto docs = static_cast<int64_t>(c.starts.size()) - 1;
    for (int b = 0; b < B; ++b) {
      const int64_t d = (s * B + b) % docs, begin = c.starts[static_cast<size_t>(d)];
      const int64_t n = std::min<int64_t>(c.starts[static_cast<size_t>(d) + 1] - begin, T);
      for (int64_t t = 0; t < n; ++t) {
        inputs[static_cast<size_t>(b * T + t)] = c.stream[static_cast<size_t>(begin + t)];
        targets[static_cast<size_t>(b * T + t)] = c.stream[static_cast<size_t>(begin + t + 1)];
      }
    }
    return std::llround(c.padded_fraction * static_cast<double>(BT));
  }
  std::vector<std::vector<int32_t>> starts(static_cast<size_t>(B));
  const auto rows = static_cast<int64_t>(c.stream.size() - 1) / T;
  for (int b = 0; b < B; ++b) {
    const int64_t p0 = ((s * B + b) % rows) * T;
    for (int64_t t = 0; t < T; ++t) {
      inputs[static_cast<size_t>(b * T + t)] = c.stream[static_cast<size_t>(p0 + t)];
      targets[static_cast<size_t>(b * T + t)] = c.stream[static_cast<size_t>(p0 + t + 1)];
    }
    auto& st = starts[static_cast<size_t>(b)];
    st.push_back(0);
    for (auto it = std::upper_bound(c.starts.begin(), c.starts.end(), p0);
         it != c.starts.end() && *it < p0 + T; ++it)
      st.push_back(static_cast<int32_t>(*it - p0));
  }
  if (mode == Mode::Packed) data::pack_documents(starts, T, inputs.data() + BT, inputs.data() + 2 * BT);
  return BT;
}

std::map<Mode, double> g_useful_rate;  // filled by the benchmarks, read by main

void register_mode(Backend& be, const Corpus& corpus, const ModelOptions& mo, Mode mode, int B,
                   int T, int64_t steps) {
  const std::string name = be.name() + "/" + mode_name(mode) + "/B:" + std::to_string(B) +
                           "/T:" + std::to_string(T);
  auto* b = benchmark::RegisterBenchmark(name.c_str(), [&be, &corpus, mo, mode, B, T](benchmark::State& st) {
    LocalCommunicator single;
    const std::string packing = mode == Mode::Packed ? "document" : "none";
    TrainStep step(step_config(mo, B, T, "fp32", {"data.packing=" + packing}), be, {.dp_cp = single});
    step.init_weights(1337);
    std::vector<int32_t> in, tg;
    int64_t s = 0, useful = 0;
    auto run = [&] {
      const int64_t u = make_batch(corpus, mode, s, B, T, in, tg);
      step.run(in.data(), tg.data(), s++);
      return u;
    };
    run();  // warm-up: allocation, GEMM primitives
    be.synchronize(be.default_stream());
    double seconds = 0.0;
    for (auto _ : st) {
      const auto t0 = std::chrono::steady_clock::now();
      useful += run();
      be.synchronize(be.default_stream());
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    st.counters["useful_tokens/s"] = benchmark::Counter(static_cast<double>(useful), benchmark::Counter::kIsRate);
    st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(B) * T, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["useful_fraction"] = static_cast<double>(useful) / (static_cast<double>(st.iterations()) * B * T);
    g_useful_rate[mode] = static_cast<double>(useful) / seconds;
  });
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  if (steps > 0) b->Iterations(steps);
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  using namespace kiln;
  bench::Flags flags({{"B", "4"}, {"T", "512"}, {"n_layer", "4"}, {"n_head", "4"},
                      {"n_embd", "256"}, {"vocab", "4096"}, {"steps", "4"}, {"backend", "cpu"}},
                     {{"B", "rows per step"},
                      {"T", "tokens per row (block size)"},
                      {"n_layer", "GPT-2 layers"},
                      {"n_head", "heads"},
                      {"n_embd", "width"},
                      {"vocab", "vocabulary"},
                      {"steps", "timed steps per mode (after one untimed warm-up)"},
                      {"backend", "a backend name (cpu, cuda)"}});
  flags.parse(&argc, argv);
  const int B = static_cast<int>(flags.i64("B")), T = static_cast<int>(flags.i64("T"));
  ModelOptions mo;
  mo.n_layer = static_cast<int>(flags.i64("n_layer"));
  mo.n_head = static_cast<int>(flags.i64("n_head"));
  mo.n_embd = static_cast<int>(flags.i64("n_embd"));
  mo.block_size = T;
  mo.vocab_size = static_cast<int>(flags.i64("vocab"));
  const int64_t steps = flags.i64("steps");
  const bench::Corpus corpus = bench::make_corpus((steps + 2) * B * T * 4, T, mo.vocab_size, 7);
  auto be = make_backend(flags.str("backend"));
  for (const bench::Mode m : {bench::Mode::Padded, bench::Mode::Packed, bench::Mode::Unmasked})
    bench::register_mode(*be, corpus, mo, m, B, T, steps);
  benchmark::AddCustomContext("model", fmt::format("gpt2 n_layer={} n_head={} n_embd={} vocab={}",
                                                   mo.n_layer, mo.n_head, mo.n_embd, mo.vocab_size));
  benchmark::AddCustomContext("documents", "log-uniform lengths in [8, T], mean " +
                                               fmt::format("{:.0f}", static_cast<double>(corpus.stream.size()) /
                                                                         static_cast<double>(corpus.starts.size())));
  bench::add_thread_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  using bench::Mode;
  auto& r = bench::g_useful_rate;
  if (r.count(Mode::Padded) && r.count(Mode::Packed) && r.count(Mode::Unmasked))
    std::printf("useful tokens/s: packed / padded = %.2fx, packed / unmasked = %.2fx\n",
                r[Mode::Packed] / r[Mode::Padded], r[Mode::Packed] / r[Mode::Unmasked]);
  return 0;
}
