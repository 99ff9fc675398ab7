// The training step on a dp x tp mesh against the single process (issue 16's rows): 20
// updates with gradient accumulation and dropout on, every loss within 1e-5 relative of
// one process running the same global batch; after the first update every gradient this
// rank holds, placed by global name and element, within 1e-5 of the single process's;
// after the last, the tp-replicated parameters bitwise identical over each tp group.
// Run on 2 ranks (tp2 rows) and 4 ranks (tp4 and dp2 x tp2 rows); each row skips on other
// world sizes (ctest runs no world of one: it has no row).
#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "mpi_test_main.h"
#include "parallel/mesh.h"
#include "step_grads.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace kiln {
namespace {

// One CPU backend for the process, never destroyed (see tp_layers_test.cpp).
Backend& cpu() {
  static Backend* be = make_backend("cpu").release();
  return *be;
}

struct Row {
  std::string name;
  int dp, tp;
  bool sp;
  int zero_stage;
  std::string arch = "gpt2";
  std::string checkpointing = "none";
};

constexpr int kMicro = 1, kGlobal = 4, kT = 8, kV = 61, kUpdates = 20;

TrainConfig config_of(const Row& r, bool single) {
  const std::string model =
      r.arch == "gpt2" ? "n_head = 4\nn_embd = 32\ndropout = 0.1\n"
                       : "arch = \"llama\"\nn_head = 4\nn_kv_head = 2\nn_embd = 32\nffn_hidden_size = 24\n";
  return load_config_string(fmt::format(R"([model]
{}n_layer = 2
block_size = 16
vocab_size = {}
[train]
steps = {}
micro_batch = {}
global_batch = {}
seq_len = {}
activation_checkpointing = "{}"
[optim]
lr = 3e-3
[schedule]
warmup_steps = 3
[parallel]
tp = {}
sequence_parallel = {}
zero_stage = {}
bucket_mb = 0.004
)", model, kV, kUpdates, kMicro, kGlobal, kT, r.checkpointing, single ? 1 : r.tp,
                                        single ? "false" : (r.sp ? "true" : "false"),
                                        single ? 0 : r.zero_stage),
                            {}, r.name);
}

// Micro-batch j (of the global batch's kGlobal / kMicro) of update u: tokens and targets.
void micro_batch(int64_t u, int j, int32_t* tokens, int32_t* targets) {
  for (int i = 0; i < kMicro * kT; ++i) {
    const int64_t x = (u * 131 + j * 37 + i * 11) % kV;
    tokens[i] = static_cast<int32_t>(x);
    targets[i] = (i + j) % 5 == 3 ? -1 : static_cast<int32_t>((x * 7 + 3) % kV);
  }
}

void check(const Row& row) {
  Communicator& world = testing::world();
  if (world.size() != row.dp * row.tp) GTEST_SKIP() << row.name << " runs on " << row.dp * row.tp << " ranks";
  SCOPED_TRACE(row.name);
  Backend& be = cpu();
  DeviceMesh mesh(world, {.dp = row.dp, .tp = row.tp});
  const int dp_rank = mesh.coord()[Axis::DP];
  LocalCommunicator alone("single");
  TrainStep ref(config_of(row, true), be, {.dp_cp = alone});
  TrainStep got(config_of(row, false), be,
                {.dp_cp = mesh.comm(Axis::DP), .tp = &mesh.comm(Axis::TP)});
  ref.init_weights(5);
  got.init_weights(5);
  const int accum_ref = kGlobal / kMicro, accum = accum_ref / row.dp, n = kMicro * kT;
  ASSERT_EQ(got.grad_accum_steps(), accum);
  std::vector<int32_t> ti(accum_ref * n), tt(ti.size()), mi(accum * n), mt(mi.size());
  for (int64_t u = 0; u < kUpdates; ++u) {
    // The single process runs micro-batches 0..accum_ref-1 in order; dp rank r runs
    // micro-batch k * dp + r at micro-step k (as the data loader deals them).
    for (int j = 0; j < accum_ref; ++j) micro_batch(u, j, &ti[j * n], &tt[j * n]);
    for (int k = 0; k < accum; ++k) micro_batch(u, k * row.dp + dp_rank, &mi[k * n], &mt[k * n]);
    const StepResult want = ref.run(ti.data(), tt.data(), u);
    const StepResult have = got.run(mi.data(), mt.data(), u);
    ASSERT_NEAR(have.loss, want.loss, 1e-5 * std::fabs(want.loss)) << "update " << u + 1;
    // The first update's norm within 1e-5; later ones follow weights that AdamW moved
    // apart by rounding (the tp split sums its GEMMs in another order): within 1e-4
    // (1.3e-5 seen at update 10 on an Intel Xeon with AVX512-BF16).
    ASSERT_NEAR(have.grad_norm, want.grad_norm, (u == 0 ? 1e-5 : 1e-4) * want.grad_norm)
        << "update " << u + 1;
    if (u > 0) continue;
    // The first update's gradients (still in place after the update), by global element.
    EXPECT_TRUE(testing::grads_match(be, got, ref, 1e-5, 1.0));
  }
  // Replicated parameters: bitwise the same over the tp group (hash halves as exact floats).
  const uint64_t h = std::stoull(got.data_parallel().tp_replica_hash(), nullptr, 16);
  std::vector<float> lo(4), hi(4);
  for (int i = 0; i < 4; ++i) hi[i] = static_cast<float>((h >> (16 * i)) & 0xffff), lo[i] = -hi[i];
  mesh.comm(Axis::TP).all_reduce(Tensor::view(lo.data(), Shape{4}, DType::F32), ReduceOp::Max);
  mesh.comm(Axis::TP).all_reduce(Tensor::view(hi.data(), Shape{4}, DType::F32), ReduceOp::Max);
  for (float& x : lo) x = -x;  // the minimum over the group
  EXPECT_EQ(lo, hi) << "tp-replicated parameters differ between tp ranks";
}

TEST(TpStep, Gpt2Tp2) { check({"gpt2 tp2", 1, 2, false, 0}); }
TEST(TpStep, Gpt2Tp2SequenceParallel) { check({"gpt2 tp2 sp", 1, 2, true, 0}); }
TEST(TpStep, Gpt2Tp2FullCheckpointing) { check({"gpt2 tp2 full", 1, 2, false, 0, "gpt2", "full"}); }
TEST(TpStep, LlamaTp2SequenceParallel) { check({"llama tp2 sp", 1, 2, true, 0, "llama"}); }
TEST(TpStep, Gpt2Tp4SequenceParallel) { check({"gpt2 tp4 sp", 1, 4, true, 0}); }
TEST(TpStep, Gpt2Dp2Tp2SequenceParallelZero1) { check({"gpt2 dp2 tp2 sp zero1", 2, 2, true, 1}); }
TEST(TpStep, Gpt2Dp2Tp2SequenceParallelZero3) { check({"gpt2 dp2 tp2 sp zero3", 2, 2, true, 3}); }
TEST(TpStep, LlamaDp2Tp2SequenceParallelZero2) { check({"llama dp2 tp2 sp zero2", 2, 2, true, 2, "llama"}); }

}  // namespace
}  // namespace kiln
