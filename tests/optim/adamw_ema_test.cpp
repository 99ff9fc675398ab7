// AdamW's moving average of the weights (AdamWConfig::ema_decay): over a few steps on a
// tiny parameter set it equals the closed form of the recurrence,
//   ema_t = d^t w_0 + (1 - d) sum_{k=1..t} d^(t-k) w_k,
// w_k the fp32 weights after step k (the masters under mixed precision), computed in
// double; it is kept per segment (a ZeRO shard's ranges), as OptimizerState, only when
// asked for, and follows sync_master_from_params / reset_ema.
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace kiln {
namespace {

struct Tiny {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::vector<ParamSpec> params;
  Tensor param, grad;
  explicit Tiny(DType dtype) {
    ParamSpec w{"w", Shape{3, 5}};
    w.weight_decay = true;
    ParamSpec b{"b", Shape{7}};
    b.offset = 15;
    params = {w, b};
    param = be->empty(Shape{22}, dtype, MemCategory::Parameters);
    grad = be->empty(Shape{22}, DType::F32, MemCategory::Gradients);
    std::mt19937 rng(3);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<float> host(22);
    for (float& x : host) x = n(rng);
    upload_f32(*be, param, host.data());
  }
  void random_grads(int step) {
    std::mt19937 rng(100 + step);
    std::normal_distribution<float> n(0.f, 0.1f);
    std::vector<float> host(22);
    for (float& x : host) x = n(rng);
    upload_f32(*be, grad, host.data());
  }
};

AdamWConfig with_ema(float decay) {
  AdamWConfig c;
  c.lr = 0.05f;
  c.ema_decay = decay;
  return c;
}

// The fp32 weights of segment i: its master, or the parameter itself.
std::vector<double> weights(Backend& be, const AdamW& opt, size_t i) {
  const Tensor m = opt.master(i);
  const std::vector<float> f = download_f32(be, m ? m : opt.segments()[i].param);
  return {f.begin(), f.end()};
}

void expect_closed_form(DType dtype, std::vector<AdamWSegment> (*segments)(const Tiny&)) {
  const float d = 0.9f;
  Tiny t(dtype);
  AdamW opt(*t.be, segments(t), with_ema(d));
  opt.sync_master_from_params();  // as TrainStep::init_weights, after the init
  const size_t S = opt.segments().size();
  // The trajectory w_0, w_1, ... per segment, and the closed form over it.
  std::vector<std::vector<std::vector<double>>> w(S);
  for (size_t i = 0; i < S; ++i) w[i].push_back(weights(*t.be, opt, i));
  for (int step = 1; step <= 5; ++step) {
    t.random_grads(step);
    opt.step(0.05f);
    for (size_t i = 0; i < S; ++i) {
      w[i].push_back(weights(*t.be, opt, i));
      const std::vector<float> got = download_f32(*t.be, opt.ema(i));
      ASSERT_EQ(got.size(), w[i][0].size());
      const double dd = d;  // the decay as the op receives it (a float)
      for (size_t e = 0; e < got.size(); ++e) {
        double want = std::pow(dd, step) * w[i][0][e];
        for (int k = 1; k <= step; ++k) want += (1.0 - dd) * std::pow(dd, step - k) * w[i][k][e];
        EXPECT_NEAR(got[e], want, 1e-6 * (1.0 + std::fabs(want)))
            << dtype_name(dtype) << " segment " << i << " element " << e << " step " << step;
      }
    }
  }
  // The average lags the weights: after 5 steps it differs from them.
  const std::vector<float> last = download_f32(*t.be, opt.ema(0));
  EXPECT_NE(last[0], static_cast<float>(w[0].back()[0]));
}

std::vector<AdamWSegment> whole(const Tiny& t) { return whole_segments(t.params, t.param, t.grad); }

// Two shards' worth of ranges, as ZeRO gives one rank: w's elements [4, 15) and b's [0, 3).
std::vector<AdamWSegment> shard(const Tiny& t) {
  return {{t.params[0], 4, 15, t.param.view_at(4, Shape{11}), t.grad.view_at(4, Shape{11})},
          {t.params[1], 0, 3, t.param.view_at(15, Shape{3}), t.grad.view_at(15, Shape{3})}};
}

TEST(AdamWEma, Fp32ParametersFollowTheClosedForm) { expect_closed_form(DType::F32, whole); }
TEST(AdamWEma, Bf16ParametersAverageTheMasterWeights) { expect_closed_form(DType::BF16, whole); }
TEST(AdamWEma, ShardedSegmentsKeepTheirOwnRanges) { expect_closed_form(DType::F32, shard); }

TEST(AdamWEma, KeptOnlyWhenAskedForAsOptimizerState) {
  Tiny t(DType::F32);
  const auto state = [&] { return t.be->allocator().stats().current_of(MemCategory::OptimizerState); };
  const int64_t before = state();
  {
    AdamW off(*t.be, t.params, t.param, t.grad, with_ema(0.f));
    EXPECT_FALSE(off.ema(0));
    EXPECT_EQ(state() - before, 2 * 22 * 4);  // m and v
  }
  {
    AdamW opt(*t.be, shard(t), with_ema(0.99f));
    EXPECT_EQ(state() - before, 3 * 14 * 4);  // m, v and the average of the 11 + 3 elements
    ASSERT_TRUE(opt.ema(1));
    EXPECT_EQ(opt.ema(0).numel(), 11);
    EXPECT_EQ(opt.ema(1).numel(), 3);
  }
  EXPECT_THROW(AdamW(*t.be, t.params, t.param, t.grad, with_ema(1.f)), Error);
  EXPECT_THROW(AdamW(*t.be, t.params, t.param, t.grad, with_ema(-0.5f)), Error);
}

TEST(AdamWEma, StartsFromTheWeightsAndResets) {
  Tiny t(DType::BF16);
  AdamW opt(*t.be, t.params, t.param, t.grad, with_ema(0.9f));
  // At construction: the weights of then (here the random values above).
  EXPECT_EQ(download_f32(*t.be, opt.ema(1)), download_f32(*t.be, opt.master(1)));
  // New weights (an init, a load without masters): sync_master_from_params restarts it.
  std::vector<float> ones(22, 1.f);
  upload_f32(*t.be, t.param, ones.data());
  opt.sync_master_from_params();
  EXPECT_EQ(download_f32(*t.be, opt.ema(0)), std::vector<float>(15, 1.f));
  t.random_grads(1);
  opt.step(0.05f);
  EXPECT_NE(download_f32(*t.be, opt.ema(0)), std::vector<float>(15, 1.f));
  opt.reset_ema();
  EXPECT_EQ(download_f32(*t.be, opt.ema(0)), download_f32(*t.be, opt.master(0)));
}

}  // namespace
}  // namespace kiln
