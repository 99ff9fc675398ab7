#include "data/image_resize.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace kiln::data {

namespace {

// One output pixel's inputs: the first, and a normalised weight each.
struct Taps {
  int64_t first = 0;
  std::vector<double> w;
};

// The taps of each of `out` output pixels over `in` input pixels (the header's kernel).
std::vector<Taps> taps(int64_t in, int64_t out) {
  const double s = static_cast<double>(in) / static_cast<double>(out);
  const double f = std::max(s, 1.0);
  std::vector<Taps> all(static_cast<size_t>(out));
  for (int64_t x = 0; x < out; ++x) {
    const double c = (static_cast<double>(x) + 0.5) * s;
    const auto lo = std::max<int64_t>(0, static_cast<int64_t>(std::floor(c - f)));
    const auto hi = std::min<int64_t>(in, static_cast<int64_t>(std::ceil(c + f)));
    Taps& t = all[static_cast<size_t>(x)];
    t.first = lo;
    double sum = 0.0;
    for (int64_t j = lo; j < hi; ++j) {
      const double w = std::max(0.0, 1.0 - std::abs(static_cast<double>(j) + 0.5 - c) / f);
      t.w.push_back(w);
      sum += w;
    }
    for (double& w : t.w) w /= sum;
  }
  return all;
}

uint8_t rounded(double v) { return static_cast<uint8_t>(std::clamp(std::floor(v + 0.5), 0.0, 255.0)); }

}  // namespace

std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& pixels, const ImageShape& from,
                                     int height, int width) {
  KILN_CHECK(height > 0 && width > 0 && from.pixels() > 0, "resize: {}x{} to {}x{}",
             from.height, from.width, height, width);
  KILN_CHECK(static_cast<int64_t>(pixels.size()) == from.pixels(), "resize: {} bytes for a "
             "{}x{}x{} image", pixels.size(), from.height, from.width, from.channels);
  const int64_t C = from.channels, H = from.height, W = from.width;
  if (H == height && W == width) return pixels;
  // Rows: [H, W, C] -> [H, width, C].
  const std::vector<Taps> tx = taps(W, width);
  std::vector<uint8_t> wide(static_cast<size_t>(H * width * C));
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < C; ++c) {
        const Taps& t = tx[static_cast<size_t>(x)];
        double v = 0.0;
        for (size_t k = 0; k < t.w.size(); ++k)
          v += t.w[k] * pixels[static_cast<size_t>((y * W + t.first + static_cast<int64_t>(k)) * C + c)];
        wide[static_cast<size_t>((y * width + x) * C + c)] = rounded(v);
      }
  // Columns: [H, width, C] -> [height, width, C].
  const std::vector<Taps> ty = taps(H, height);
  std::vector<uint8_t> out(static_cast<size_t>(int64_t{height} * width * C));
  for (int64_t y = 0; y < height; ++y) {
    const Taps& t = ty[static_cast<size_t>(y)];
    for (int64_t i = 0; i < width * C; ++i) {
      double v = 0.0;
      for (size_t k = 0; k < t.w.size(); ++k)
        v += t.w[k] * wide[static_cast<size_t>((t.first + static_cast<int64_t>(k)) * width * C + i)];
      out[static_cast<size_t>(y * width * C + i)] = rounded(v);
    }
  }
  return out;
}

}  // namespace kiln::data
