// GPT-2 split by the tensor-parallel plan against the single process, on every rank of
// the job (mpirun with 2 and 4 ranks; alone, a world of one where the plan does nothing):
// the same initial values by global element, the same loss sum, and every parameter
// gradient by global element (fp32, 1e-5), the partial ones (norms under sequence
// parallelism) after their one reduction over tp.
#include "backend/registry.h"
#include "models/gpt2/gpt2.h"
#include "mpi_test_main.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_plan.h"

#include <gtest/gtest.h>

#include <cmath>
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

struct Case {
  bool sp;
  nn::ActivationCheckpointing ckpt;
};

void check(const Case& k) {
  Backend& be = cpu();
  CommTpGroup g(testing::world());
  SCOPED_TRACE(fmt::format("sp={} ckpt={} tp={}", k.sp, static_cast<int>(k.ckpt), g.size()));
  const GPT2Config c = tiny();
  const int B = 2, T = 8;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 17 + 3) % c.vocab_size, tgt[i] = (i * 5 + 1) % c.vocab_size;
  tgt[4] = -1;
  const Batch batch{upload_i32(tok, {B, T}), upload_i32(tgt, {B, T}), Tensor()};

  GPT2 full(c, be);
  TensorParallelPlan plan(g, k.sp);
  ModelStorage st;
  st.plan = &plan;
  GPT2 part(c, be, st);
  for (Model* m : {static_cast<Model*>(&full), static_cast<Model*>(&part)}) {
    m->init_weights(11);
    m->set_activation_checkpointing(k.ckpt);
    m->set_dropout(false, 0, 0);
  }
  EXPECT_LT(part.flat_size(), g.size() > 1 ? full.flat_size() : full.flat_size() + 1);
  const LossSum want = full.forward(batch, 1.f / 15.f);
  full.backward();
  const LossSum got = part.forward(batch, 1.f / 15.f);
  part.backward();
  EXPECT_EQ(got.targets, want.targets);
  EXPECT_NEAR(got.sum, want.sum, 1e-5 * std::fabs(want.sum));
  ASSERT_EQ(part.params().size(), full.params().size());
  for (size_t i = 0; i < part.params().size(); ++i) {
    const ParamSpec& p = part.params()[i];
    const auto idx = p.tp.global_indices(p.shape);
    const auto wv = download_f32(be, full.param(full.params()[i])), wg = download_f32(be, full.grad(full.params()[i]));
    const auto gv = download_f32(be, part.param(p));
    Tensor grad = part.grad(p);
    if (p.tp_partial_grad) g.all_reduce_sum(be.default_stream(), grad);
    const auto gg = download_f32(be, grad);
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

TEST(TpModel, IndivisibleLayoutsAndDropoutAreOneLineErrors) {
  CommTpGroup g(testing::world());
  if (g.size() == 1) GTEST_SKIP() << "nothing is split on one rank";
  TensorParallelPlan plan(g, false);
  ModelStorage st;
  st.plan = &plan;
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
  c = tiny();
  c.dropout = 0.1f;
  GPT2 m(c, cpu(), st);
  m.init_weights(1);
  m.set_dropout(true, 1, 0);
  const Batch batch{upload_i32(std::vector<int32_t>(16, 1), {2, 8}), upload_i32(std::vector<int32_t>(16, 2), {2, 8}), Tensor()};
  EXPECT_THROW(m.forward(batch, 1.f), Error);
}

}  // namespace
}  // namespace kiln
