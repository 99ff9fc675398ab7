// GPT-2 and Llama (also with a mixture of experts: its balancing losses and expert loads
// too) split by the tensor-parallel plan against the single process, on every rank of
// the job (mpirun with 2 and 4 ranks; alone, a world of one where the plan does nothing):
// the same initial values by global element, the same loss sum, and every parameter
// gradient by global element (fp32, 1e-5), the partial ones (norms under sequence
// parallelism, QK-norm's gains) after their one reduction over tp.
#include "backend/registry.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "mpi_test_main.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_grads.h"
#include "parallel/tp_plan.h"
#include "parallel/tp_traffic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace kiln {
namespace {

// One CPU backend for the process, never destroyed (see tp_layers_test.cpp).
Backend& cpu() {
  static Backend* be = make_backend("cpu").release();
  return *be;
}

GPT2Config tiny() {
  GPT2Config c;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 16;
  c.vocab_size = 61, c.padded_vocab_size = 64, c.block_size = 16;
  return c;
}

Tensor upload_i32(const std::vector<int32_t>& v, const Shape& s) {
  Tensor t = cpu().empty(s, DType::I32, MemCategory::Activations);
  cpu().copy_from_host(cpu().default_stream(), t, v.data());
  return t;
}

// Llama with grouped-query attention (8 query heads over 4 key/value heads: n_kv_head =
// tp on 4 ranks), tied or untied head; or with Qwen3's attention: heads of 6 (NH HD = 48
// over C = 32) and QK-norm, whose gains' gradients are partial sums over tp.
// Or with a mixture of experts in block 1 (4 experts of width 8, top-2, a shared expert,
// the auxiliary and z losses on).
LlamaConfig tiny_llama(bool tied, bool qk_norm = false, bool moe = false) {
  LlamaConfig c;
  c.n_layer = 2, c.n_head = 8, c.n_kv_head = 4, c.n_embd = 32, c.ffn_hidden_size = 24;
  c.vocab_size = 61, c.padded_vocab_size = 64, c.block_size = 16, c.tie_embeddings = tied;
  if (qk_norm) c.explicit_head_dim = 6, c.qk_norm = true;
  if (moe) {
    c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.ffn_hidden_size = 8, c.moe.shared_experts = 1;
    c.moe.first_k_dense = 1, c.moe.aux_loss_coef = 0.01, c.moe.z_loss_coef = 0.001;
  }
  return c;
}

struct Case {
  bool sp;
  nn::ActivationCheckpointing ckpt;
  int arch = 0;  // 0 GPT-2, 1 Llama untied, 2 Llama tied, 3 Llama with QK-norm and head_dim,
                 // 4 Llama with a mixture of experts
  float dropout = 0.f;  // GPT-2's, at every site
};

std::unique_ptr<Model> build(const Case& k, Backend& be, const ModelStorage& st) {
  if (k.arch == 0) {
    GPT2Config c = tiny();
    c.dropout = k.dropout;
    return std::make_unique<GPT2>(c, be, st);
  }
  return std::make_unique<Llama>(tiny_llama(k.arch == 2, k.arch == 3, k.arch == 4), be, st);
}

void check(const Case& k) {
  Backend& be = cpu();
  CommTpGroup g(testing::world());
  SCOPED_TRACE(fmt::format("arch={} sp={} ckpt={} dropout={} tp={}", k.arch, k.sp,
                           static_cast<int>(k.ckpt), k.dropout, g.size()));
  const int V = 61, B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T), pos(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 17 + 3) % V, tgt[i] = (i * 5 + 1) % V;
  for (int i = 0; i < B * T; ++i) pos[i] = (i % T) + 2 * (i / T);  // Llama: shifted positions
  tgt[4] = -1;
  const Batch batch = Batch::of_tokens(upload_i32(tok, {B, T}), upload_i32(tgt, {B, T}),
                                       k.arch ? upload_i32(pos, {B, T}) : Tensor());

  TensorParallelPlan plan(g, k.sp);
  ModelStorage st;
  st.plans = {&plan};
  auto full_model = build(k, be, {}), part_model = build(k, be, st);
  Model& full = *full_model;
  Model& part = *part_model;
  for (Model* m : {&full, &part}) {
    m->init_weights(11);
    m->set_activation_checkpointing(k.ckpt);
    m->set_dropout(k.dropout > 0.f, 9, 3);
    m->set_aux_loss_scale(1.f / 15.f);
  }
  EXPECT_LT(part.flat_size(), g.size() > 1 ? full.flat_size() : full.flat_size() + 1);
  const LossSum want = full.forward(batch, 1.f / 15.f);
  full.backward();
  const LossSum got = part.forward(batch, 1.f / 15.f);
  part.backward();
  EXPECT_EQ(got.targets, want.targets);
  EXPECT_NEAR(got.sum, want.sum, 1e-5 * std::fabs(want.sum));
  if (k.arch == 4) {  // the balancing losses and loads: the single process's, not tp times
    const MoeStats ws = full.take_moe_stats().value(), gs = part.take_moe_stats().value();
    EXPECT_NEAR(gs.aux_loss, ws.aux_loss, 1e-5 * ws.aux_loss);
    EXPECT_NEAR(gs.z_loss, ws.z_loss, 1e-5 * ws.z_loss);
    EXPECT_EQ(gs.tokens_per_expert, ws.tokens_per_expert);
  }
  // The update's view: partial sums reduced once, the norm counting every element once.
  reduce_partial_grads(part, testing::world());
  const double want_sq = read_sum_squares(be, full.grad_buffer());
  EXPECT_NEAR(tp_grad_sum_squares(part, testing::world()), want_sq, 1e-5 * want_sq);
  ASSERT_EQ(part.params().size(), full.params().size());
  for (size_t i = 0; i < part.params().size(); ++i) {
    const ParamSpec& p = part.params()[i];
    const auto idx = p.slice.global_indices(p.shape);
    const auto wv = download_f32(be, full.param(full.params()[i])), wg = download_f32(be, full.grad(full.params()[i]));
    const auto gv = download_f32(be, part.param(p));
    const auto gg = download_f32(be, part.grad(p));
    if (!p.slice.tp_sharded()) {  // replicated: bitwise the same gradient on every tp rank
      std::vector<float> rank0(gg);
      testing::world().broadcast(Tensor::view(rank0.data(), {static_cast<int64_t>(rank0.size())}, DType::F32), 0);
      EXPECT_EQ(std::memcmp(rank0.data(), gg.data(), gg.size() * sizeof(float)), 0) << p.name;
    }
    ASSERT_EQ(gv.size(), idx.size()) << p.name;
    double scale = 1e-30;
    for (float x : wg) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    for (size_t j = 0; j < idx.size(); ++j) {
      ASSERT_EQ(gv[j], wv[static_cast<size_t>(idx[j])]) << p.name << " initial value " << j;
      ASSERT_NEAR(gg[j], wg[static_cast<size_t>(idx[j])], 1e-5 * std::max(1.0, scale)) << p.name << " grad " << j;
    }
  }
}

TEST(TpModel, Gpt2) { check({false, nn::ActivationCheckpointing::None}); }
TEST(TpModel, Gpt2SequenceParallel) { check({true, nn::ActivationCheckpointing::None}); }
TEST(TpModel, Gpt2FullCheckpointing) { check({false, nn::ActivationCheckpointing::Full}); }
TEST(TpModel, Gpt2SequenceParallelSelective) { check({true, nn::ActivationCheckpointing::Selective}); }
TEST(TpModel, Gpt2Dropout) { check({false, nn::ActivationCheckpointing::None, 0, 0.1f}); }
TEST(TpModel, Gpt2SequenceParallelDropoutFull) { check({true, nn::ActivationCheckpointing::Full, 0, 0.1f}); }
TEST(TpModel, LlamaGqa) { check({false, nn::ActivationCheckpointing::None, 1}); }
TEST(TpModel, LlamaGqaSequenceParallel) { check({true, nn::ActivationCheckpointing::None, 1}); }
TEST(TpModel, LlamaTiedSequenceParallelFull) { check({true, nn::ActivationCheckpointing::Full, 2}); }
TEST(TpModel, LlamaMoe) { check({false, nn::ActivationCheckpointing::None, 4}); }
TEST(TpModel, LlamaMoeSequenceParallelFull) { check({true, nn::ActivationCheckpointing::Full, 4}); }
TEST(TpModel, LlamaMoeSequenceParallelSelective) {
  check({true, nn::ActivationCheckpointing::Selective, 4});
}
TEST(TpModel, LlamaQkNormHeadDim) { check({false, nn::ActivationCheckpointing::None, 3}); }
TEST(TpModel, LlamaQkNormHeadDimSequenceParallelSelective) {
  check({true, nn::ActivationCheckpointing::Selective, 3});
}

// The tensor-parallel traffic of one forward and backward against the formula
// (parallel/tp_traffic.h: Megatron-LM's per-layer counts, the vocab-parallel embedding
// and loss, full recomputation's replay), exact in calls and bytes as Communicator::stats
// counts them, for GPT-2 and Llama (untied and tied), with and without sequence
// parallelism, under every checkpointing mode.
TEST(TpModel, TrafficMatchesTheFormula) {
  CommTpGroup g(testing::world());
  const int n = g.size();
  if (n == 1) GTEST_SKIP() << "no traffic on one rank";
  Backend& be = cpu();
  const int B = 2, T = 8;
  const Batch batch = Batch::of_tokens(upload_i32(std::vector<int32_t>(B * T, 5), {B, T}),
                                       upload_i32(std::vector<int32_t>(B * T, 7), {B, T}));
  for (int arch : {0, 1, 2}) {
    for (bool sp : {false, true}) {
      for (auto ckpt : {nn::ActivationCheckpointing::None, nn::ActivationCheckpointing::Selective,
                        nn::ActivationCheckpointing::Full}) {
        SCOPED_TRACE(fmt::format("arch={} sp={} ckpt={} tp={}", arch, sp, static_cast<int>(ckpt), n));
        TensorParallelPlan plan(g, sp);
        ModelStorage st;
        st.plans = {&plan};
        auto m = build({sp, ckpt, arch}, be, st);
        m->init_weights(1);
        m->set_activation_checkpointing(ckpt);
        TpTrafficShape shape;
        shape.n_layer = 2, shape.rows = B * T, shape.tp = n, shape.sequence_parallel = sp;
        shape.n_embd = arch == 0 ? tiny().n_embd : tiny_llama(false).n_embd;
        shape.padded_vocab = 64;
        shape.full_recompute = ckpt == nn::ActivationCheckpointing::Full;
        const TpTraffic want = tp_micro_step_traffic(shape);
        testing::world().reset_stats();
        m->forward(batch, 1.f / 16.f);
        m->backward();
        const CommStats s = testing::world().stats();
        for (int c = 0; c < kNumCollectives; ++c) {
          EXPECT_EQ(s.per[static_cast<size_t>(c)].count, want.calls[static_cast<size_t>(c)])
              << collective_name(static_cast<Collective>(c));
          EXPECT_EQ(s.per[static_cast<size_t>(c)].bytes, want.bytes[static_cast<size_t>(c)])
              << collective_name(static_cast<Collective>(c));
        }
      }
    }
  }
}

TEST(TpModel, IndivisibleLayoutsAreOneLineErrors) {
  CommTpGroup g(testing::world());
  if (g.size() == 1) GTEST_SKIP() << "nothing is split on one rank";
  TensorParallelPlan plan(g, false);
  ModelStorage st;
  st.plans = {&plan};
  GPT2Config c = tiny();
  c.n_head = 2, c.n_embd = 12;  // 2 heads over 4 ranks
  if (g.size() == 4) {
    EXPECT_THROW(GPT2(c, cpu(), st), Error);
  }
  c = tiny();
  c.padded_vocab_size = 62;  // 62 rows over 4 ranks
  if (g.size() == 4) {
    EXPECT_THROW(GPT2(c, cpu(), st), Error);
  }
}

}  // namespace
}  // namespace kiln
