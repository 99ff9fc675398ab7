// An image shard, opened as meta.json would describe it: the shape and count taken from
// the input's own header when they are within meta.json's bounds (else 28x28x1 and 1),
// the crc32 the input's own (so records are reached) or a wrong one (by the input's last
// byte); then every label and pixel span is read.
#include "core/error.h"
#include "data/image_shard.h"
#include "fuzz_util.h"

#include <zlib.h>

#include <cstdint>

namespace {
int64_t le32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                              uint32_t{p[3]} << 24);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = kiln::fuzz::write_scratch("train_000000.imgshard", data, size);
  kiln::data::ImageShape shape{28, 28, 1};
  int64_t images = 1;
  if (size >= 24) {
    const int64_t n = le32(data + 8), h = le32(data + 12), w = le32(data + 16), c = le32(data + 20);
    if (h >= 1 && h <= (1 << 16) && w >= 1 && w <= (1 << 16) && c >= 1 && c <= 4)
      shape = {static_cast<int>(h), static_cast<int>(w), static_cast<int>(c)};
    if (n >= 1) images = n;
  }
  uint32_t crc = static_cast<uint32_t>(crc32(0L, data, static_cast<uInt>(size)));
  if (size > 0 && (data[size - 1] & 1)) crc ^= 1u;
  try {
    const kiln::data::ImageShardReader r(path, shape, images, crc);
    int64_t sum = 0;
    for (int64_t i = 0; i < r.images(); ++i) {
      sum += r.label(i);
      for (uint8_t p : r.pixels(i)) sum += p;
    }
    (void)sum;
  } catch (const kiln::Error&) {
  }
  return 0;
}
