// Philox-4x32-10 against Random123's known answers, kiln's counter/key convention, and
// fill_normal's determinism (thread count, split) and moments.
#include "core/dtype.h"
#include "core/rng.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kiln {
namespace {

// Random123 tests/kat_vectors, the three "philox4x32 10" lines
// (columns: counter[4], key[2], expected output[4]):
//   philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
//   philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
//   philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
struct Kat {
  PhiloxCounter ctr;
  PhiloxKey key;
  PhiloxCounter want;
};
const Kat kKats[] = {
    {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
     {0x00000000u, 0x00000000u},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(Philox, KnownAnswers) {
  for (const Kat& k : kKats) {
    const PhiloxCounter got = philox4x32_10(k.ctr, k.key);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got[i], k.want[i]) << "counter " << std::hex << k.ctr[0] << " word " << i;
  }
}

// An independent Philox-4x32-10 (key bumped before rounds 2..10, as in Random123),
// cross-checked on the known answers and then compared on random inputs.
PhiloxCounter philox_ref(PhiloxCounter c, PhiloxKey k) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t a = uint64_t{0xD2511F53u} * c[0];
    const uint64_t b = uint64_t{0xCD9E8D57u} * c[2];
    PhiloxCounter n;
    n[0] = static_cast<uint32_t>(b >> 32) ^ c[1] ^ k[0];
    n[1] = static_cast<uint32_t>(b);
    n[2] = static_cast<uint32_t>(a >> 32) ^ c[3] ^ k[1];
    n[3] = static_cast<uint32_t>(a);
    c = n;
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c;
}

TEST(Philox, MatchesIndependentImplementation) {
  for (const Kat& k : kKats) ASSERT_EQ(philox_ref(k.ctr, k.key), k.want);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 10000; ++i) {
    PhiloxCounter c;
    PhiloxKey k;
    for (auto& x : c) x = static_cast<uint32_t>(rng());
    for (auto& x : k) x = static_cast<uint32_t>(rng());
    ASSERT_EQ(philox4x32_10(c, k), philox_ref(c, k)) << "iteration " << i;
  }
}

TEST(Philox, CounterAndKeyConvention) {
  // counter = {block lo, block hi, stream lo, stream hi}; key = {seed lo, seed hi}.
  const uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull,
                 block = 0x1122334455667788ull;
  const PhiloxCounter want = philox_ref({0x55667788u, 0x11223344u, 0x76543210u, 0xfedcba98u},
                                        {0x89abcdefu, 0x01234567u});
  EXPECT_EQ(philox_block(seed, stream, block), want);
  EXPECT_EQ(philox_block(0, 0, 0), kKats[0].want);
  EXPECT_EQ(philox_block(~0ull, ~0ull, ~0ull), kKats[1].want);
}

TEST(Philox, UniformAndSequential) {
  const uint64_t seed = 42, stream = 7;
  Philox gen(seed, stream);
  EXPECT_EQ(gen.seed(), seed);
  EXPECT_EQ(gen.stream(), stream);
  std::vector<uint32_t> seq;
  for (uint64_t i = 0; i < 37; ++i) {
    const uint32_t x = gen.next_u32();
    seq.push_back(x);
    EXPECT_EQ(x, philox_block(seed, stream, i / 4)[i % 4]) << i;
    const float u = uniform_at(seed, stream, i);
    EXPECT_EQ(u, u32_to_uniform(x)) << i;
    EXPECT_GE(u, 0.f);
    EXPECT_LT(u, 1.f);
  }
  EXPECT_EQ(gen.offset(), 37u);
  gen.set_offset(5);
  EXPECT_EQ(gen.next_u32(), seq[5]);
  EXPECT_EQ(gen.offset(), 6u);
  EXPECT_EQ(u32_to_uniform(0u), 0.f);
  EXPECT_EQ(u32_to_uniform(0xffffffffu), 1.f - 0x1p-24f);
  EXPECT_EQ(u32_to_uniform(0x80000000u), 0.5f);
  // A different stream or seed is a different sequence.
  EXPECT_NE(philox_block(seed, stream + 1, 0), philox_block(seed, stream, 0));
  EXPECT_NE(philox_block(seed + 1, stream, 0), philox_block(seed, stream, 0));
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(FillNormal, DeterministicAcrossThreadsAndSplits) {
  const int64_t n = 100003;  // not a multiple of 4
  const uint64_t seed = std::random_device{}(), stream = 3;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int saved = omp_get_max_threads();

  omp_set_num_threads(1);
  std::vector<float> a(n, NAN);
  fill_normal(a.data(), n, seed, stream, 0.f, 1.f);
  omp_set_num_threads(2);
  std::vector<float> b(n, NAN);
  fill_normal(b.data(), n, seed, stream, 0.f, 1.f);
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(a, b)) << "fill_normal depends on the thread count";

  std::vector<float> c(n, NAN);
  fill_normal(c.data(), n, seed, stream, 0.f, 1.f);
  EXPECT_TRUE(bitwise_equal(a, c)) << "fill_normal is not deterministic";

  // Split at offsets that are and are not multiples of 4: same elements.
  for (int64_t cut : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{4097},
                      n / 2, n - 1}) {
    std::vector<float> s(n, NAN);
    fill_normal(s.data(), cut, seed, stream, 0.f, 1.f, 0);
    fill_normal(s.data() + cut, n - cut, seed, stream, 0.f, 1.f, static_cast<uint64_t>(cut));
    EXPECT_TRUE(bitwise_equal(a, s)) << "split at " << cut;
  }
  // Three pieces, middle one tiny and unaligned.
  {
    std::vector<float> s(n, NAN);
    fill_normal(s.data(), 6, seed, stream, 0.f, 1.f, 0);
    fill_normal(s.data() + 6, 1, seed, stream, 0.f, 1.f, 6);
    fill_normal(s.data() + 7, n - 7, seed, stream, 0.f, 1.f, 7);
    EXPECT_TRUE(bitwise_equal(a, s));
  }
  // Writes nothing outside [out, out + n).
  {
    std::vector<float> s(16, -7.f);
    fill_normal(s.data() + 3, 5, seed, stream, 0.f, 1.f, 2);
    for (int i : {0, 1, 2, 8, 9, 15}) EXPECT_EQ(s[i], -7.f) << i;
    for (int i = 3; i < 8; ++i) EXPECT_EQ(f32_bits(s[i]) , f32_bits(a[i - 1])) << i;
  }
  // Another stream differs.
  std::vector<float> d(n);
  fill_normal(d.data(), n, seed, stream + 1, 0.f, 1.f);
  EXPECT_FALSE(bitwise_equal(a, d));
}

TEST(FillNormal, Moments) {
  const int64_t n = 1 << 20;
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<float> z(n, NAN);
  fill_normal(z.data(), n, seed, 11, 0.f, 1.f);
  double s = 0, s2 = 0, s4 = 0;
  int64_t within1 = 0;
  for (float x : z) {
    ASSERT_TRUE(std::isfinite(x));
    s += x;
    s2 += double(x) * x;
    s4 += double(x) * x * x * x;
    within1 += std::fabs(x) < 1.f;
  }
  const double mean = s / n, var = s2 / n - mean * mean, kurt = s4 / n;
  // 5-sigma bounds: sd(mean) = 1/sqrt(n) ~ 1e-3; sd(var) = sqrt(2/n) ~ 1.4e-3.
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(std::sqrt(var), 1.0, 5e-3);
  EXPECT_NEAR(kurt, 3.0, 0.05);  // Gaussian fourth moment
  EXPECT_NEAR(double(within1) / n, 0.682689, 3e-3);

  // mean + std * z.
  std::vector<float> y(n);
  fill_normal(y.data(), n, seed, 11, 2.5f, 0.02f);
  for (int64_t i = 0; i < n; i += 997) EXPECT_NEAR(y[i], 2.5f + 0.02f * z[i], 1e-6f) << i;
}

}  // namespace
}  // namespace kiln
