// Backend::copy_stochastic_round on every backend: each result is one of the two bf16
// neighbours of the input, the mean over many seeds equals the input (unbiased), the
// same (seed, stream) replays the same bits, NaN and Inf survive; the elements of a part of
// a larger tensor placed there (GlobalIndices: a run, strided rows) draw the bits of their
// global indices.
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
      be->copy_stochastic_round(be->default_stream(), dst, src, 77, static_cast<uint64_t>(s),
                                GlobalIndices{});
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
    be->copy_stochastic_round(be->default_stream(), dst, src, 77, 0, GlobalIndices{});
    be->copy_to_host(be->default_stream(), out.data(), dst);
    EXPECT_EQ(out, first) << be->name() << ": not replayable";
    std::printf("%s: worst |mean - x| = %.3f of a bf16 spacing over %d draws\n", be->name().c_str(),
                worst, draws);
  }
}

// A [12, 10] tensor rounded whole, then parts of it rounded alone, placed by GlobalIndices:
// a contiguous run from element 37, and the columns [3, 8) of rows 2..9 (a row-parallel
// shard; its first row cut at column 5, as a ZeRO piece cuts one). Each part's bits are
// the whole tensor's at its elements.
TEST(StochasticRound, PartsDrawTheBitsOfTheirGlobalIndices) {
  for (auto& be : available_backends()) {
    const int64_t rows = 12, cols = 10, n = rows * cols;
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = 1.f + static_cast<float>(i) * 0x1p-12f;
    Tensor src = be->empty(Shape{n}, DType::F32, MemCategory::Temporaries);
    Tensor dst = be->empty(Shape{n}, DType::BF16, MemCategory::Temporaries);
    be->copy_from_host(be->default_stream(), src, x.data());
    be->copy_stochastic_round(be->default_stream(), dst, src, 5, 9, GlobalIndices{});
    std::vector<uint16_t> whole(n);
    be->copy_to_host(be->default_stream(), whole.data(), dst);
    auto check = [&](const std::vector<int64_t>& global, const GlobalIndices& at, const char* what) {
      const auto m = static_cast<int64_t>(global.size());
      std::vector<float> part(global.size());
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(at.at(i), global[static_cast<size_t>(i)]) << what;
        part[static_cast<size_t>(i)] = x[static_cast<size_t>(global[static_cast<size_t>(i)])];
      }
      Tensor ps = be->empty(Shape{m}, DType::F32, MemCategory::Temporaries);
      Tensor pd = be->empty(Shape{m}, DType::BF16, MemCategory::Temporaries);
      be->copy_from_host(be->default_stream(), ps, part.data());
      be->copy_stochastic_round(be->default_stream(), pd, ps, 5, 9, at);
      std::vector<uint16_t> got(static_cast<size_t>(m));
      be->copy_to_host(be->default_stream(), got.data(), pd);
      for (int64_t i = 0; i < m; ++i)
        EXPECT_EQ(got[static_cast<size_t>(i)], whole[static_cast<size_t>(global[static_cast<size_t>(i)])])
            << be->name() << " " << what << " element " << i;
    };
    std::vector<int64_t> run, shard, cut;
    for (int64_t g = 37; g < 90; ++g) run.push_back(g);
    for (int64_t r = 2; r < rows; ++r)
      for (int64_t c = 3; c < 8; ++c) shard.push_back(r * cols + c);
    for (int64_t g = 2 * cols + 5; g < 2 * cols + 8; ++g) cut.push_back(g);
    check(run, GlobalIndices{37, 0, 0}, "run");
    check(shard, GlobalIndices{2 * cols + 3, 5, cols}, "rows");
    check(cut, GlobalIndices{2 * cols + 5, 0, 0}, "cut row");
  }
}

}  // namespace
}  // namespace kiln
