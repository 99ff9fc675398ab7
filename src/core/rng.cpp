#include "core/rng.h"

#include <cmath>

namespace kiln {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void round(PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}
}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    round(c, k);
  }
  return c;
}

PhiloxCounter philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                        static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

float uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return u32_to_uniform(philox_block(seed, stream, index / 4)[index % 4]);
}

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, float mean, float std,
                 uint64_t start) {
  if (n <= 0) return;
  const uint64_t first_block = start / 4;
  const uint64_t last_block = (start + static_cast<uint64_t>(n) - 1) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t bi = 0; bi <= static_cast<int64_t>(last_block - first_block); ++bi) {
    const uint64_t block = first_block + static_cast<uint64_t>(bi);
    const PhiloxCounter r = philox_block(seed, stream, block);
    float z[4];
    for (int p = 0; p < 2; ++p) {
      // u1 in (0, 1] so that log(u1) is finite.
      const double u1 = (static_cast<double>(r[2 * p] >> 8) + 1.0) * 0x1p-24;
      const double u2 = static_cast<double>(r[2 * p + 1] >> 8) * 0x1p-24;
      const double radius = std::sqrt(-2.0 * std::log(u1));
      z[2 * p] = static_cast<float>(radius * std::cos(2.0 * M_PI * u2));
      z[2 * p + 1] = static_cast<float>(radius * std::sin(2.0 * M_PI * u2));
    }
    for (int j = 0; j < 4; ++j) {
      const uint64_t idx = block * 4 + static_cast<uint64_t>(j);
      if (idx < start || idx >= start + static_cast<uint64_t>(n)) continue;
      out[idx - start] = mean + std * z[j];
    }
  }
}

uint32_t Philox::next_u32() {
  const uint64_t i = offset_++;
  return philox_block(seed_, stream_, i / 4)[i % 4];
}

}  // namespace kiln
