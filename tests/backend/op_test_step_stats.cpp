// The ops that keep a training step's statistics on the device: sum_squares (the
// gradient norm's square, accumulated), accumulate_loss, cross_entropy_shard_combine (the
// vocab-parallel loss), clip_coefficient, and adamw_step's device-side scale (a
// non-finite one skips the update). Double-precision references, awkward sizes.
#include "core/error.h"
#include "op_harness.h"

#include <cmath>

namespace kiln::test {
namespace {

class StepStatsTest : public OpTest {
 protected:
  Tensor f64(const std::vector<double>& v) {
    Tensor t = be().empty(Shape{static_cast<int64_t>(v.size())}, DType::F64, MemCategory::Activations);
    be().copy_from_host(st(), t, v.data());
    return t;
  }
  std::vector<double> down64(const Tensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    be().copy_to_host(st(), v.data(), t);
    return v;
  }
};

TEST_P(StepStatsTest, SumSquaresAccumulates) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{13}, int64_t{1025},
                    int64_t{100003}, int64_t{(1 << 20) + 5}}) {
    const std::vector<float> f = randn(n, 2.f, 0.3f);
    double want = 0;
    for (float x : f) want += static_cast<double>(x) * x;
    const Tensor x = upload(f, {n});
    Tensor acc = f64({0.0});
    be().sum_squares(st(), acc, x);
    const double got = down64(acc)[0];
    const double rel = std::fabs(got - want) / want;
    record_error("sum_squares", rel, std::fabs(got - want));
    // Documented as a double-precision reduction.
    EXPECT_LE(rel, 1e-9) << "sum_squares n=" << n << ": got " << got << ", want " << want;
    // Accumulates, and the same input gives the same bits.
    be().sum_squares(st(), acc, x);
    EXPECT_EQ(down64(acc)[0], got + got) << "n=" << n;
  }
  Tensor acc = f64({0.5});
  be().sum_squares(st(), acc, upload({-3.f}, {1}));
  EXPECT_EQ(down64(acc)[0], 9.5);
  be().sum_squares(st(), acc, upload(std::vector<float>(77, 0.f), {7, 11}));
  EXPECT_EQ(down64(acc)[0], 9.5);
  be().sum_squares(st(), acc, upload({INFINITY, 1.f}, {2}));
  EXPECT_EQ(down64(acc)[0], INFINITY);
  EXPECT_THROW(be().sum_squares(st(), poisoned({1}), upload({1.f}, {1})), Error);  // acc not fp64
}

TEST_P(StepStatsTest, AccumulateLoss) {
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{83}, int64_t{1000}, int64_t{4097},
                    int64_t{65539}}) {
    const std::vector<float> losses = randu(n, 0.f, 11.f);
    std::vector<int32_t> tgt(static_cast<size_t>(n));
    double want = 0.0;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      tgt[i] = (i % 5 == 3) ? -1 : randint(0, 50000);
      if (tgt[i] == -1) continue;
      want += losses[i];
      ++count;
    }
    Tensor acc = f64({1.25, 2.0});
    be().accumulate_loss(st(), acc, upload(losses, {n}), upload_i32(tgt, {n}));
    const std::vector<double> got = down64(acc);
    EXPECT_NEAR(got[0], 1.25 + want, 1e-12 * (1.25 + want)) << "n=" << n;
    EXPECT_EQ(got[1], 2.0 + static_cast<double>(count)) << "n=" << n;
  }
  // Every target ignored: nothing added.
  Tensor acc = f64({0.0, 0.0});
  be().accumulate_loss(st(), acc, upload({5.f, 6.f}, {2}), upload_i32({-1, -1}, {2}));
  EXPECT_EQ(down64(acc), (std::vector<double>{0.0, 0.0}));
  EXPECT_THROW(be().accumulate_loss(st(), f64({0.0}), upload({5.f}, {1}), upload_i32({0}, {1})), Error);
}

// The vocab-parallel combination against the whole row's log-sum-exp in double.
TEST_P(StepStatsTest, CrossEntropyShardCombine) {
  struct Cfg { int N, V, tp; };
  for (const Cfg& c : {Cfg{1, 3, 1}, Cfg{7, 37, 2}, Cfg{6, 5, 4}, Cfg{83, 1000, 3}}) {
    const int Vl = (c.V + c.tp - 1) / c.tp;  // the last shard may be short or empty
    const std::vector<float> logits = randn(int64_t{c.N} * c.V, 3.f);
    std::vector<int32_t> tgt(c.N);
    for (int n = 0; n < c.N; ++n) tgt[n] = n % 4 == 1 ? -1 : randint(0, c.V - 1);
    // Each rank's statistics (max, sum of exp, target logit), as cross_entropy_shard_stats.
    std::vector<float> stats(static_cast<size_t>(c.tp) * c.N * 3);
    double want_sum = 0.0;
    int64_t want_count = 0;
    std::vector<double> want_lse(c.N);
    for (int n = 0; n < c.N; ++n) {
      const float* row = &logits[static_cast<size_t>(n) * c.V];
      double m = -INFINITY, s = 0.0;
      for (int v = 0; v < c.V; ++v) m = std::max(m, double(row[v]));
      for (int v = 0; v < c.V; ++v) s += std::exp(double(row[v]) - m);
      want_lse[n] = m + std::log(s);
      if (tgt[n] != -1) want_sum += want_lse[n] - row[tgt[n]], ++want_count;
      for (int q = 0; q < c.tp; ++q) {
        const int b = q * Vl, e = std::min(c.V, b + Vl);
        float mq = -INFINITY, sq = 0.f, xq = 0.f;
        for (int v = b; v < e; ++v) mq = std::max(mq, row[v]);
        for (int v = b; v < e; ++v) sq += std::exp(row[v] - mq);
        if (tgt[n] >= b && tgt[n] < e) xq = row[tgt[n]];
        float* o = &stats[(static_cast<size_t>(q) * c.N + n) * 3];
        o[0] = mq, o[1] = sq, o[2] = xq;
      }
    }
    const std::string what = sizes({{"N", c.N}, {"V", c.V}, {"tp", c.tp}});
    Tensor lse = poisoned({c.N}), acc = f64({0.5, 1.0});
    be().cross_entropy_shard_combine(st(), lse, acc, upload(stats, {int64_t{c.tp} * c.N, 3}),
                                     upload_i32(tgt, {c.N}));
    const std::vector<float> got_lse = download(lse);
    for (int n = 0; n < c.N; ++n)
      EXPECT_NEAR(got_lse[n], want_lse[n], 1e-5 * std::max(1.0, std::fabs(want_lse[n])))
          << what << " row " << n;
    const std::vector<double> got = down64(acc);
    EXPECT_NEAR(got[0], 0.5 + want_sum, 1e-5 * (0.5 + want_sum)) << what;
    EXPECT_EQ(got[1], 1.0 + static_cast<double>(want_count)) << what;
  }
  // A backend that computed nothing (stats all zero) still gives a finite loss: S floors at 1.
  Tensor lse = poisoned({2}), acc = f64({0.0, 0.0});
  be().cross_entropy_shard_combine(st(), lse, acc, upload(std::vector<float>(12, 0.f), {4, 3}),
                                   upload_i32({0, 1}, {2}));
  EXPECT_EQ(download(lse), (std::vector<float>{0.f, 0.f}));
  EXPECT_EQ(down64(acc), (std::vector<double>{0.0, 2.0}));
  EXPECT_THROW(be().cross_entropy_shard_combine(st(), poisoned({2}), f64({0.0, 0.0}), poisoned({3, 3}),
                                                upload_i32({0, 1}, {2})), Error);  // 3 rows: not tp * 2
}

// clip_coefficient = min(1, max_norm / (norm + 1e-6)) / loss_scale, norm = sqrt(sumsq) /
// loss_scale (torch.nn.utils.clip_grad_norm_), NaN when the norm or the check is not finite.
TEST_P(StepStatsTest, ClipCoefficient) {
  struct Cfg { double sumsq, check, max_norm; float scale; };
  for (const Cfg& c : {Cfg{4.0, 1.0, 1.0, 1.f}, Cfg{0.25, 3.0, 1.0, 1.f}, Cfg{1e6, 0.0, 0.5, 1.f},
                       Cfg{1e6, 0.0, 0.0, 1.f}, Cfg{9e8, 1.0, 1.0, 1024.f}, Cfg{0.0, 1.0, 1.0, 1.f},
                       Cfg{2.0, 1.0, -1.0, 65536.f}}) {
    const double norm = std::sqrt(c.sumsq) / c.scale;
    const float clip = c.max_norm <= 0 ? 1.f : static_cast<float>(std::min(1.0, c.max_norm / (norm + 1e-6)));
    const float want = clip / c.scale;
    Tensor coef = poisoned({1});
    be().clip_coefficient(st(), coef, f64({c.sumsq}), f64({c.check}), c.max_norm, c.scale);
    EXPECT_FLOAT_EQ(download(coef)[0], want) << "sumsq " << c.sumsq << " max_norm " << c.max_norm;
    Tensor unchecked = poisoned({1});
    be().clip_coefficient(st(), unchecked, f64({c.sumsq}), Tensor(), c.max_norm, c.scale);
    EXPECT_EQ(download(unchecked)[0], download(coef)[0]);
  }
  for (const auto& [sumsq, check] : std::vector<std::pair<double, double>>{
           {INFINITY, 1.0}, {NAN, 1.0}, {1.0, NAN}, {1.0, -INFINITY}}) {
    Tensor coef = upload({1.f}, {1});
    be().clip_coefficient(st(), coef, f64({sumsq}), f64({check}), 1.0, 1.f);
    EXPECT_TRUE(std::isnan(download(coef)[0])) << "sumsq " << sumsq << " check " << check;
  }
}

// adamw_step's scale: equal to the same factor in hp.grad_scale; not finite: no change.
TEST_P(StepStatsTest, AdamWDeviceScale) {
  for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{4097}}) {
    const std::vector<float> p = randn(n), g = randn(n, 0.1f), m = randn(n, 1e-2f),
                             v = randu(n, 0.f, 1e-3f);
    AdamWParams hp;
    hp.lr = 0.01f;
    hp.weight_decay = 0.1f;
    hp.step = 3;
    hp.grad_scale = 0.5f;
    const float c = 0.37f;
    auto run = [&](const Tensor& scale, float grad_scale) {
      Tensor tp = upload(p, {n}, MemCategory::Parameters), tm = upload(m, {n}), tv = upload(v, {n});
      AdamWParams h = hp;
      h.grad_scale = grad_scale;
      be().adamw_step(st(), tp, upload(g, {n}, MemCategory::Gradients), tm, tv, scale, h);
      return std::vector<std::vector<float>>{download(tp), download(tm), download(tv)};
    };
    const auto want = run(Tensor(), hp.grad_scale * c);
    EXPECT_EQ(run(upload({c}, {1}), hp.grad_scale), want) << "n=" << n;
    for (float bad : {NAN, INFINITY}) {
      const auto skipped = run(upload({bad}, {1}), hp.grad_scale);
      EXPECT_EQ(skipped, (std::vector<std::vector<float>>{p, m, v})) << "n=" << n << " scale " << bad;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StepStatsTest, ::testing::ValuesIn(backend_names()), param_name);

}  // namespace
}  // namespace kiln::test
