// Backend::copy_stochastic_round on every backend: each result is one of the two bf16
// neighbours of the input, the mean over many seeds equals the input (unbiased), the
// same (seed, stream) replays the same bits, NaN and Inf survive.
#include "backend/registry.h"
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kiln {
namespace {

TEST(StochasticRound, UnbiasedBetweenNeighboursAndReplayable) {
  for (auto& be : available_backends()) {
    const int64_t n = 1001;  // not a multiple of 4
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    x[0] = NAN, x[1] = INFINITY, x[2] = -INFINITY, x[3] = 0.f, x[4] = 1.f;
    Tensor src = be->empty(Shape{n}, DType::F32, MemCategory::Temporaries);
    Tensor dst = be->empty(Shape{n}, DType::BF16, MemCategory::Temporaries);
    be->copy_from_host(be->default_stream(), src, x.data());
    std::vector<double> sum(n, 0.0);
    std::vector<uint16_t> out(n), first(n);
    const int draws = 400;
    for (int s = 0; s < draws; ++s) {
      be->copy_stochastic_round(be->default_stream(), dst, src, 77, static_cast<uint64_t>(s));
      be->copy_to_host(be->default_stream(), out.data(), dst);
      if (s == 0) first = out;
      for (int64_t i = 0; i < n; ++i) {
        const float y = bf16_to_f32(out[i]);
        if (i < 3) {
          EXPECT_EQ(out[i], f32_to_bf16(x[i])) << be->name() << " special " << i;
          continue;
        }
        // One of the two neighbours: truncation or the next value away from zero.
        const float lo = bf16_to_f32(static_cast<uint16_t>(f32_bits(x[i]) >> 16));
        const float hi = bf16_to_f32(static_cast<uint16_t>((f32_bits(x[i]) >> 16) + 1));
        ASSERT_TRUE(y == lo || y == hi) << be->name() << " element " << i << ": " << x[i] << " -> " << y;
        sum[i] += y;
      }
    }
    double worst = 0;
    for (int64_t i = 3; i < n; ++i) {
      const float lo = bf16_to_f32(static_cast<uint16_t>(f32_bits(x[i]) >> 16));
      const float hi = bf16_to_f32(static_cast<uint16_t>((f32_bits(x[i]) >> 16) + 1));
      const double spacing = std::abs(static_cast<double>(hi) - lo);
      if (spacing == 0) continue;
      // The mean of `draws` Bernoulli steps: standard error spacing / (2 sqrt(draws)).
      worst = std::max(worst, std::abs(sum[i] / draws - x[i]) / spacing);
    }
    EXPECT_LT(worst, 0.15) << be->name() << ": biased stochastic rounding";
    be->copy_stochastic_round(be->default_stream(), dst, src, 77, 0);
    be->copy_to_host(be->default_stream(), out.data(), dst);
    EXPECT_EQ(out, first) << be->name() << ": not replayable";
    std::printf("%s: worst |mean - x| = %.3f of a bf16 spacing over %d draws\n", be->name().c_str(),
                worst, draws);
  }
}

}  // namespace
}  // namespace kiln
