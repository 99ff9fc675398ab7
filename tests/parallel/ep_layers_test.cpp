// The mixture-of-experts layer under expert parallelism (nn/expert_parallel.h, nn/moe.h)
// against the layer without it, on every rank of the job (run under mpirun with 2 and 4
// ranks; alone it is a world of one, where nothing is split). Rank r holds its own tokens
// and E / ep experts; each rank also runs the whole layer on every rank's tokens, so that
// it knows the single process's output, input gradient and weight gradients: its output
// and input gradient must be those of its own tokens, the router's gradient (replicated)
// that of its own tokens, and its experts' gradients the sum over every rank's tokens
// (fp32, 1e-5 relative). Cases cover experts and ranks that receive no token, token
// dropping, shared experts, top-1 and a re-run forward (full checkpointing).
#include "mpi_test_main.h"
#include "nn/moe.h"
#include "parallel/expert_parallel.h"
#include "world_test_util.h"

#include <gtest/gtest.h>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <vector>

namespace kiln {
namespace {

using testing::randn;

Backend& be() { return *testing::cpu_backend(); }

Tensor upload(const std::vector<float>& v, const Shape& shape) {
  Tensor t = be().empty(shape, DType::F32, MemCategory::Activations);
  upload_f32(be(), t, v.data());
  return t;
}

Tensor zeros(const Shape& shape) {
  Tensor t = be().empty(shape, DType::F32, MemCategory::Activations);
  be().fill(be().default_stream(), t, 0.f);
  return t;
}

std::vector<float> pick(const std::vector<float>& global, const std::vector<int64_t>& idx) {
  std::vector<float> out;
  for (int64_t i : idx) out.push_back(global[static_cast<size_t>(i)]);
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << what << " element " << i;
}

struct EpCase {
  int64_t E, k, N, F, Fs;
  double capacity_factor;
  bool rerun;
};

// One MoE layer, its parameters (global values from fixed seeds, the rank's slice) and
// buffers.
struct Layer {
  std::unique_ptr<nn::MoeMlp> moe;
  std::vector<nn::Param*> params;
  std::vector<Tensor> saved;
  nn::MoeScratch scratch;
};

std::unique_ptr<Layer> make_layer(const EpCase& c, int64_t C, nn::EpGroup* ep) {
  auto l = std::make_unique<Layer>();
  const nn::MoeSpec spec{.num_experts = c.E, .top_k = static_cast<int>(c.k), .expert_hidden = c.F,
                         .shared_hidden = c.Fs, .capacity_factor = c.capacity_factor};
  l->moe = std::make_unique<nn::MoeMlp>("mlp", C, spec, 0.5f, 0.5f);
  if (ep) l->moe->set_expert_parallel(*ep);
  l->moe->collect(l->params);
  for (size_t i = 0; i < l->params.size(); ++i) {
    nn::Param* p = l->params[i];
    const auto global = randn(static_cast<size_t>(p->shape.numel()), 300 + static_cast<uint32_t>(i));
    p->value = upload(pick(global, p->slice.global_indices(p->shape)), p->local_shape());
    p->grad = zeros(p->local_shape());
  }
  for (const auto& sp : l->moe->saved_specs(1, c.N, DType::F32))
    l->saved.push_back(be().empty(sp.shape, sp.dtype, MemCategory::Activations));
  l->scratch = l->moe->make_scratch(be(), 1, c.N, DType::F32);
  return l;
}

// Forward (twice when re-running: a recompute before backward) and backward of one layer
// on x, dy [1, N, C]; returns y and dx.
std::pair<std::vector<float>, std::vector<float>> run(Layer& l, const EpCase& c, int64_t C,
                                                      const std::vector<float>& x,
                                                      const std::vector<float>& dy) {
  const Stream s = be().default_stream();
  const Shape shape{1, c.N, C};
  const Tensor xt = upload(x, shape), yt = zeros(shape), dyt = upload(dy, shape), dxt = zeros(shape);
  l.moe->forward(be(), s, l.saved, yt, xt, l.scratch, nn::MoeBalancePass{}, false);
  const std::vector<float> y = download_f32(be(), yt);
  if (c.rerun) l.moe->forward(be(), s, l.saved, yt, xt, l.scratch, nn::MoeBalancePass{}, true);
  l.moe->backward(be(), s, l.saved, dxt, dyt, xt, l.scratch, nn::MoeBalancePass{});
  return {y, download_f32(be(), dxt)};
}

void check(const EpCase& c) {
  CommEpGroup group(testing::world());
  const int n = group.size(), r = group.rank();
  if (c.E % n != 0) GTEST_SKIP() << c.E << " experts over " << n << " ranks";
  const int64_t C = 12;
  SCOPED_TRACE(fmt::format("E={} k={} N={} Fs={} capacity={} rerun={} ep={}", c.E, c.k, c.N,
                           c.Fs, c.capacity_factor, c.rerun, n));
  // The single process, on every rank's tokens: outputs and gradients of rank r's, and
  // the experts' gradients summed over all ranks'.
  std::vector<float> y_ref, dx_ref, router_ref;
  std::vector<std::vector<float>> expert_ref;  // gate_up, down: summed over the ranks
  for (int q = 0; q < n; ++q) {
    auto whole = make_layer(c, C, nullptr);
    const auto x = randn(static_cast<size_t>(c.N * C), 100 + q);
    const auto dy = randn(static_cast<size_t>(c.N * C), 200 + q);
    auto [y, dx] = run(*whole, c, C, x, dy);
    const std::vector<float> dg = download_f32(be(), whole->moe->gate_up.grad);
    const std::vector<float> dd = download_f32(be(), whole->moe->down.grad);
    if (q == 0) expert_ref = {std::vector<float>(dg.size()), std::vector<float>(dd.size())};
    for (size_t i = 0; i < dg.size(); ++i) expert_ref[0][i] += dg[i];
    for (size_t i = 0; i < dd.size(); ++i) expert_ref[1][i] += dd[i];
    if (q == r) {
      y_ref = y, dx_ref = dx;
      router_ref = download_f32(be(), whole->moe->router.grad);
    }
  }
  auto split = make_layer(c, C, &group);
  EXPECT_EQ(split->moe->expert_parallel(), n > 1);
  auto [y, dx] = run(*split, c, C, randn(static_cast<size_t>(c.N * C), 100 + r),
                     randn(static_cast<size_t>(c.N * C), 200 + r));
  expect_close(y, y_ref, "output");
  expect_close(dx, dx_ref, "input gradient");
  expect_close(download_f32(be(), split->moe->router.grad), router_ref, "router gradient");
  const nn::Param* experts[] = {&split->moe->gate_up, &split->moe->down};
  for (int i = 0; i < 2; ++i) {
    const nn::Param& p = *experts[i];
    EXPECT_EQ(p.local_shape()[0], c.E / n) << p.name;
    expect_close(download_f32(be(), p.grad), pick(expert_ref[static_cast<size_t>(i)],
                                                  p.slice.global_indices(p.shape)),
                 "gradient of " + p.name);
  }
}

TEST(EpMoe, TopTwo) { check({8, 2, 12, 6, 0, 0.0, false}); }
// Three tokens, one choice each, over eight experts: most experts, and some ranks, get
// none.
TEST(EpMoe, EmptyExpertsAndRanks) { check({8, 1, 3, 5, 0, 0.0, false}); }
TEST(EpMoe, TokenDropping) { check({4, 2, 16, 6, 0, 0.5, false}); }
TEST(EpMoe, SharedExpertsRerun) { check({4, 2, 10, 6, 7, 0.0, true}); }

TEST(EpMoe, ExpertsMustDivide) {
  CommEpGroup group(testing::world());
  if (group.size() == 1) GTEST_SKIP() << "nothing splits over one rank";
  nn::MoeMlp moe("mlp", 8, nn::MoeSpec{.num_experts = 2 * group.size() + 1, .top_k = 1,
                                       .expert_hidden = 4}, 0.5f, 0.5f);
  EXPECT_THROW(moe.set_expert_parallel(group), Error);
}

}  // namespace
}  // namespace kiln
