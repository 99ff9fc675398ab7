#include "nn/param.h"

#include "core/rng.h"

#include <algorithm>

namespace kiln::nn {

std::vector<float> init_values(const Param& p, uint64_t seed, uint64_t stream, int64_t begin,
                               int64_t end) {
  KILN_CHECK(0 <= begin && begin <= end && end <= p.shape.numel(),
             "init_values: range [{}, {}) outside {} of {}", begin, end, p.shape.str(), p.name);
  std::vector<float> host(static_cast<size_t>(end - begin), 0.f);
  switch (p.init.kind) {
    case Init::Kind::Zeros: break;
    case Init::Kind::Ones: std::fill(host.begin(), host.end(), 1.f); break;
    case Init::Kind::Normal:
      fill_normal(host.data(), end - begin, seed, stream, 0.f, p.init.std,
                  static_cast<uint64_t>(begin));
      break;
  }
  if (p.init.zero_rows_from >= 0) {
    const int64_t row = p.shape.numel() / p.shape[0];
    const int64_t z = std::max(begin, p.init.zero_rows_from * row);
    for (int64_t i = z; i < end; ++i) host[static_cast<size_t>(i - begin)] = 0.f;
  }
  return host;
}

}  // namespace kiln::nn
