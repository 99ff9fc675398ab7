// Packed documents (data.packing = "document") against running each document alone: a
// global batch of 4 sequences of 16 tokens cut from a stream of random documents (one-token
// documents among them, documents crossing sequences and, under context parallelism,
// chunks and ranks), through the training step of a layout; the reference runs every
// document (each sequence's piece of it) as a sequence of its own, padded with ignored
// targets, in one process without packing. Per-token losses (one target at a time, the
// other targets ignored) within 1e-6 relative; after one update every gradient this rank
// holds within 1e-6 of the largest of its tensor. GPT-2 (learned positions) and Llama
// (rotary, grouped-query) on 1 process, cp2 (np2), cp2 x tp2 and dp2 x pp2 (np4); with
// full activation checkpointing, ZeRO 1 and 2, and bf16 (2e-2, against bf16 alone).
#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "data/packing.h"
#include "mpi_test_main.h"
#include "parallel/mesh.h"
#include "step_grads.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kiln {
namespace {

Backend& cpu() {  // never destroyed (see tp_layers_test.cpp)
  static Backend* be = make_backend("cpu").release();
  return *be;
}

constexpr int kRows = 4, kMicro = 2, kT = 16, kV = 61;

struct Layout {
  std::string name;
  int dp = 1, cp = 1, tp = 1, pp = 1;
  int zero_stage = 0;
  std::string checkpointing = "none", dtype = "fp32";
  double tol() const { return dtype == "fp32" ? 1e-6 : 2e-2; }
};

TrainConfig config_of(const std::string& arch, const Layout& l, bool packed, int micro, int global) {
  const std::string model = arch == "gpt2" ? "n_head = 4\nn_embd = 32\n"
                                           : "arch = \"llama\"\nn_head = 4\nn_kv_head = 2\n"
                                             "n_embd = 32\nffn_hidden_size = 24\n";
  return load_config_string(fmt::format(R"([model]
{}n_layer = 2
block_size = {}
vocab_size = {}
dropout = 0.0
[data]
packing = "{}"
[train]
steps = 1
micro_batch = {}
global_batch = {}
seq_len = {}
activation_checkpointing = "{}"
dtype = "{}"
[optim]
lr = 1e-3
[parallel]
cp = {}
tp = {}
pp = {}
sequence_parallel = {}
zero_stage = {}
)", model, kT, kV, packed ? "document" : "none", micro, global, kT, l.checkpointing, l.dtype,
                                        l.cp, l.tp, l.pp, l.tp > 1 ? "true" : "false",
                                        l.zero_stage),
                            {}, arch + " " + l.name);
}

// The token stream of random documents, each its separator 0 then 0..11 tokens of [1, V),
// and where they start; sequence g holds inputs [g T, g T + T) and targets one later.
struct Stream {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> starts;  // per sequence, in [0, T), 0 first
};

Stream make_stream(uint32_t seed) {
  std::mt19937 gen(seed);
  Stream s;
  std::vector<int64_t> doc_starts;
  while (static_cast<int>(s.tokens.size()) < kRows * kT + 1) {
    doc_starts.push_back(static_cast<int64_t>(s.tokens.size()));
    s.tokens.push_back(0);
    const int n = static_cast<int>(gen() % 12);
    for (int i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(1 + gen() % (kV - 1)));
  }
  for (int g = 0; g < kRows; ++g) {
    std::vector<int32_t> row{0};
    for (const int64_t d : doc_starts)
      if (d > int64_t{g} * kT && d < int64_t{g + 1} * kT) row.push_back(static_cast<int32_t>(d - g * kT));
    s.starts.push_back(row);
  }
  return s;
}

// Micro-batch j of the packed global batch (sequences j kMicro ..): tokens, positions and
// cu_seqlens as the data gives them (data/packing.h), then the targets.
void packed_micro_batch(const Stream& s, int j, std::vector<int32_t>& inputs,
                        std::vector<int32_t>& targets) {
  const int64_t BT = int64_t{kMicro} * kT;
  inputs.assign(static_cast<size_t>(data::packed_input_bytes(kMicro, kT) / 4 + BT), 0);
  targets.assign(static_cast<size_t>(BT), -1);
  std::vector<std::vector<int32_t>> starts;
  for (int b = 0; b < kMicro; ++b) {
    const int g = j * kMicro + b;
    for (int t = 0; t < kT; ++t) {
      inputs[static_cast<size_t>(b * kT + t)] = s.tokens[static_cast<size_t>(g * kT + t)];
      targets[static_cast<size_t>(b * kT + t)] = s.tokens[static_cast<size_t>(g * kT + t + 1)];
    }
    starts.push_back(s.starts[static_cast<size_t>(g)]);
  }
  data::pack_documents(starts, kT, inputs.data() + BT, inputs.data() + 2 * BT);
}

// Each sequence's documents alone: one sequence each, padded (token 0, target ignored).
struct Pieces {
  std::vector<int32_t> tokens, targets;  // [n, T]
  std::vector<std::pair<int, int>> at;   // piece i's first token: (sequence, position)
  int count() const { return static_cast<int>(at.size()); }
};

Pieces alone(const Stream& s) {
  Pieces p;
  for (int g = 0; g < kRows; ++g) {
    const std::vector<int32_t>& st = s.starts[static_cast<size_t>(g)];
    for (size_t d = 0; d < st.size(); ++d) {
      const int begin = st[d], end = d + 1 < st.size() ? st[d + 1] : kT;
      for (int t = 0; t < kT; ++t) {
        const bool in = begin + t < end;
        const size_t at = static_cast<size_t>(g * kT + begin + t);
        p.tokens.push_back(in ? s.tokens[at] : 0);
        p.targets.push_back(in ? s.tokens[at + 1] : -1);
      }
      p.at.emplace_back(g, begin);
    }
  }
  return p;
}

double max_over_world(Communicator& world, double v) {
  world.all_reduce(Tensor::view(&v, Shape{1}, DType::F64), ReduceOp::Max);
  return v;
}

void check(const std::string& arch, const Layout& l) {
  Communicator& world = testing::world();
  if (world.size() != l.dp * l.cp * l.tp * l.pp)
    GTEST_SKIP() << l.name << " runs on " << l.dp * l.cp * l.tp * l.pp << " ranks";
  SCOPED_TRACE(arch + " " + l.name);
  Backend& be = cpu();
  DeviceMesh mesh(world, {.dp = l.dp, .cp = l.cp, .tp = l.tp, .pp = l.pp});
  const int dp_rank = mesh.coord()[Axis::DP];
  const Stream stream = make_stream(2024);
  const Pieces pieces = alone(stream);
  LocalCommunicator single("single");
  const Layout one{.name = "alone", .dtype = l.dtype};
  TrainStep ref(config_of(arch, one, false, 1, pieces.count()), be, {.dp_cp = single});
  TrainStep got(config_of(arch, l, true, kMicro, kRows), be, StepGroups::of_mesh(mesh));
  ref.init_weights(5);
  got.init_weights(5);
  const int accum = got.grad_accum_steps();
  ASSERT_EQ(accum * l.dp * kMicro, kRows);

  // Per-token losses: at round k dp rank r holds micro-batch k dp + r (as the loader deals
  // them); every target but one ignored.
  std::vector<int32_t> in, tg;
  double worst = 0.0;  // the largest relative difference of a token's loss
  for (int piece = 0; piece < pieces.count(); ++piece) {
    const auto [g, begin] = pieces.at[static_cast<size_t>(piece)];
    for (int t = 0; t < kT; ++t) {
      std::vector<int32_t> one(static_cast<size_t>(kT), -1);
      const int target = pieces.targets[static_cast<size_t>(piece * kT + t)];
      if (target < 0) continue;
      one[static_cast<size_t>(t)] = target;
      ref.upload_micro_batch(&pieces.tokens[static_cast<size_t>(piece * kT)], one.data());
      const double want = ref.forward_only().sum;
      const int j = g / kMicro, round = j / l.dp;
      packed_micro_batch(stream, round * l.dp + dp_rank, in, tg);
      for (int i = 0; i < kMicro * kT; ++i)
        if (round * l.dp + dp_rank != j || i != (g % kMicro) * kT + begin + t) tg[static_cast<size_t>(i)] = -1;
      got.upload_micro_batch(in.data(), tg.data());
      const double have = max_over_world(world, got.forward_only().sum);
      ASSERT_NEAR(have, want, l.tol() * std::max(1.0, std::fabs(want)))
          << "sequence " << g << " position " << begin + t;
      worst = std::max(worst, std::fabs(have - want) / std::max(1.0, std::fabs(want)));
    }
  }
  if (world.rank() == 0)
    fmt::print("{} {}: {} pieces, per-token losses within {:.2e} relative\n", arch, l.name,
               pieces.count(), worst);

  // One update each: the packed global batch, and every piece as its own micro-batch.
  std::vector<int32_t> all_in, all_tg;
  for (int k = 0; k < accum; ++k) {
    packed_micro_batch(stream, k * l.dp + dp_rank, in, tg);
    all_in.insert(all_in.end(), in.begin(), in.end());
    all_tg.insert(all_tg.end(), tg.begin(), tg.end());
  }
  const StepResult want = ref.run(pieces.tokens.data(), pieces.targets.data(), 0);
  const StepResult have = got.run(all_in.data(), all_tg.data(), 0);
  ASSERT_NEAR(have.loss, want.loss, l.tol() * want.loss);
  EXPECT_TRUE(testing::grads_match(be, got, ref, l.tol(), 0.0));
}

TEST(PackingStep, Gpt2OneProcess) { check("gpt2", {"1 process"}); }
TEST(PackingStep, LlamaOneProcess) { check("llama", {"1 process"}); }
TEST(PackingStep, Gpt2Cp2) { check("gpt2", {"cp2", 1, 2}); }
TEST(PackingStep, LlamaCp2) { check("llama", {"cp2", 1, 2}); }
TEST(PackingStep, Gpt2Cp2Tp2) { check("gpt2", {"cp2 x tp2", 1, 2, 2}); }
TEST(PackingStep, LlamaCp2Tp2) { check("llama", {"cp2 x tp2", 1, 2, 2}); }
TEST(PackingStep, Gpt2Dp2Pp2) { check("gpt2", {"dp2 x pp2", 2, 1, 1, 2}); }
TEST(PackingStep, LlamaDp2Pp2) { check("llama", {"dp2 x pp2", 2, 1, 1, 2}); }
// Activation checkpointing, ZeRO and bf16 compose (bf16: against bf16 alone, loosely).
TEST(PackingStep, Gpt2OneProcessFullCheckpointing) {
  check("gpt2", {.name = "1 process, full checkpointing", .checkpointing = "full"});
}
TEST(PackingStep, LlamaOneProcessBf16) { check("llama", {.name = "1 process, bf16", .dtype = "bf16"}); }
TEST(PackingStep, LlamaCp2FullCheckpointingZero2) {
  check("llama", {.name = "cp2, full checkpointing, ZeRO 2", .cp = 2, .zero_stage = 2,
                  .checkpointing = "full"});
}
TEST(PackingStep, LlamaDp2Pp2Zero1) {
  check("llama", {.name = "dp2 x pp2, ZeRO 1", .dp = 2, .pp = 2, .zero_stage = 1});
}

}  // namespace
}  // namespace kiln
