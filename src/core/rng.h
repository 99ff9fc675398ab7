// Counter-based random numbers: Philox-4x32-10.
//
// Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3" (SC 2011),
// the same generator as Random123, cuRAND and PyTorch's CUDA generator. A draw is a pure
// function of (key, counter), so element i of a stream is the same whatever the thread
// count, backend or rank count, and a dropout mask can be replayed instead of stored.
//
// kiln's convention: key = the 64-bit seed; counter = {block lo, block hi, stream lo,
// stream hi}, where `stream` names an independent sequence (a parameter, a layer's
// dropout, the sampler) and block = element_index / 4.
#pragma once

#include <array>
#include <cstdint>

namespace kiln {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

/// Ten rounds of Philox-4x32 on one counter block.
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

/// The 4 uint32 of block `block` of stream `stream` under `seed`.
PhiloxCounter philox_block(uint64_t seed, uint64_t stream, uint64_t block);

/// uint32 -> float uniform in [0, 1) with 24 bits of precision.
inline float u32_to_uniform(uint32_t x) { return static_cast<float>(x >> 8) * 0x1p-24f; }

/// Uniform [0, 1) value of element `index` of stream `stream`.
float uniform_at(uint64_t seed, uint64_t stream, uint64_t index);

/// out[i] = mean + std * N(0,1) for element (start + i) of the stream, by Box-Muller on
/// pairs of uniforms. Deterministic per element; parallel over blocks.
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, float mean, float std,
                 uint64_t start = 0);

/// A sequential generator over one stream (e.g. the sampler's). Its whole state is
/// (seed, stream, offset), so saving it in a checkpoint gives exact resume.
class Philox {
 public:
  Philox(uint64_t seed = 0, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  uint32_t next_u32();
  float next_uniform() { return u32_to_uniform(next_u32()); }
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t offset_ = 0;  // number of uint32 drawn so far
};

}  // namespace kiln
