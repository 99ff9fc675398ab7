// What a training step asks of the device, counted on the CPU through a backend that
// forwards and counts every call (tests/support/forwarding_backend.h), so that CI keeps
// the GPU's properties without a GPU (docs/cuda.md, "Host synchronisation"):
//   - at most one host wait (copy_to_host or synchronize) per update: the losses, the
//     gradient norm and the clipping coefficient stay on the device;
//   - no allocation after the first update (every buffer is made once);
//   - backend calls growing by the same count per layer, within a pinned budget (a
//     fusion lowers it; an accidental per-layer extra shows).
#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "support/forwarding_backend.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace kiln {
namespace {

struct Case {
  std::string arch;
  int accum;
  std::string dtype = "fp32";
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.arch << " accum " << c.accum << " " << c.dtype;
  }
};

struct Counts {
  std::map<std::string, int64_t> calls;  // of one update (the second)
  int64_t total = 0;
};

// Updates 1..4 of a tiny model with n_layer = L; checks waits and allocations on updates
// 2..4 and returns update 2's calls.
Counts run_updates(const Case& c, int L) {
  ModelOptions mo;
  mo.arch = c.arch;
  mo.n_layer = L, mo.n_head = 2, mo.n_embd = 16, mo.block_size = 8, mo.vocab_size = 37;
  if (c.arch == "llama") mo.family["n_kv_head"] = 1;
  const int B = 2, T = 8;
  TrainConfig config = step_config(mo, B, T, c.dtype);
  config.train.global_batch = c.accum * B;
  config.optim.grad_clip = 0.5;  // clipping active: its coefficient is computed every step
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  testing::CountingBackend be(*cpu);
  LocalCommunicator single;
  TrainStep step(config, be, {.dp_cp = single});
  EXPECT_EQ(step.grad_accum_steps(), c.accum);
  step.init_weights(7);
  const size_t n = static_cast<size_t>(c.accum) * B * T;
  std::vector<int32_t> tokens(n), targets(n);
  Counts second;
  for (int update = 0; update < 4; ++update) {
    for (size_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + 3 + update) % 37);
      targets[i] = i % 11 == 4 ? -1 : static_cast<int32_t>((i * 5 + 1 + update) % 37);
    }
    const auto before = be.counts;
    const int64_t waits = be.host_waits();
    const int64_t allocs = be.allocator().stats().allocations +
                           be.staging_allocator().stats().allocations;
    const StepResult r = step.run(tokens.data(), targets.data(), update);
    EXPECT_TRUE(std::isfinite(r.loss) && r.loss > 0.0) << "update " << update + 1;
    EXPECT_TRUE(std::isfinite(r.grad_norm) && r.grad_norm > 0.0) << "update " << update + 1;
    if (update == 0) continue;
    EXPECT_LE(be.host_waits() - waits, 1) << c.arch << " accum " << c.accum << " L " << L
                                          << ": host waits in update " << update + 1;
    EXPECT_EQ(be.allocator().stats().allocations + be.staging_allocator().stats().allocations,
              allocs)
        << c.arch << " accum " << c.accum << " L " << L << ": allocations in update "
        << update + 1;
    if (update == 1) {
      for (const auto& [name, count] : be.counts) {
        const auto it = before.find(name);
        const int64_t d = count - (it == before.end() ? 0 : it->second);
        if (d > 0) second.calls[name] = d, second.total += d;
      }
    }
  }
  return second;
}

class StepSync : public ::testing::TestWithParam<Case> {};

// The per-layer budget of backend calls, as the code stands (lower it when a fusion
// lands). Per micro-batch, forward and backward: GPT-2's block is 2 norms, 4 linears,
// attention, GELU and 2 residual adds each way (18); Llama's has RMSNorms, rotary
// embeddings and SwiGLU instead (20). Per update, the optimizer adds nothing per layer:
// one adamw_multi_step updates every tensor (and rounds the masters to bf16/fp16
// parameters); per tensor it took an adamw_step and a copy (GPT-2 12 tensors, Llama 6).
struct Budget { int64_t per_micro, per_update; };
Budget per_layer_budget(const Case& c) { return {c.arch == "llama" ? 20 : 18, 0}; }
bool per_update(const std::string& method) {
  return method == "adamw_step" || method == "adamw_multi_step" || method == "copy";
}

TEST_P(StepSync, OneHostWaitNoAllocationAndCallsPerLayer) {
  const Case& c = GetParam();
  std::vector<Counts> counts;
  for (int L : {1, 2, 3}) counts.push_back(run_updates(c, L));
  // Each layer adds the same calls, method by method.
  std::map<std::string, int64_t> per_layer;
  for (const auto& [name, n2] : counts[1].calls) {
    const int64_t n1 = counts[0].calls.count(name) ? counts[0].calls.at(name) : 0;
    const int64_t n3 = counts[2].calls.count(name) ? counts[2].calls.at(name) : 0;
    EXPECT_EQ(n3 - n2, n2 - n1) << name << ": layers 2 and 3 add different counts";
    if (n2 != n1) per_layer[name] = n2 - n1;
  }
  int64_t micro = 0, update = 0;
  std::string listing;
  for (const auto& [name, d] : per_layer) {
    (per_update(name) ? update : micro) += d;
    listing += " " + name + "=" + std::to_string(d);
  }
  EXPECT_EQ(counts[2].total - counts[1].total, counts[1].total - counts[0].total);
  EXPECT_EQ(micro % c.accum, 0) << "forward/backward calls not the same per micro-batch:" << listing;
  const Budget budget = per_layer_budget(c);
  EXPECT_LE(micro / c.accum, budget.per_micro) << c.arch << " per layer:" << listing;
  EXPECT_LE(update, budget.per_update) << c.arch << " per layer:" << listing;
  std::printf("%s %s accum %d: per layer %lld calls per micro-batch + %lld per update (%lld "
              "calls per update at L=1):%s\n", c.arch.c_str(), c.dtype.c_str(), c.accum,
              static_cast<long long>(micro / c.accum), static_cast<long long>(update),
              static_cast<long long>(counts[0].total), listing.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Models, StepSync,
    ::testing::Values(Case{"gpt2", 1}, Case{"gpt2", 2}, Case{"llama", 1}, Case{"llama", 2},
                      Case{"gpt2", 1, "bf16"}, Case{"gpt2", 2, "fp16"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return i.param.arch + "_accum" + std::to_string(i.param.accum) + "_" + i.param.dtype;
    });

}  // namespace
}  // namespace kiln
