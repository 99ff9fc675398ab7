#include "data/packing.h"

#include "core/error.h"

namespace kiln::data {

Packing parse_packing(const std::string& name, const std::string& where) {
  if (name == "none") return Packing::None;
  if (name == "document") return Packing::Document;
  throw Error(fmt::format("{}: data.packing = \"{}\": expected \"none\" or \"document\"", where, name));
}

int64_t packed_input_bytes(int64_t B, int64_t T) { return (B * T + B * T + 1) * 4; }

void pack_documents(std::span<const std::vector<int32_t>> starts, int64_t T, int32_t* positions,
                    int32_t* cu_seqlens) {
  const auto B = static_cast<int64_t>(starts.size());
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& row = starts[static_cast<size_t>(b)];
    KILN_CHECK(!row.empty() && row.front() == 0, "packing: sample {} has no document start at 0", b);
    for (size_t d = 0; d < row.size(); ++d) {
      const int64_t begin = row[d], end = d + 1 < row.size() ? row[d + 1] : T;
      KILN_CHECK(begin < end && end <= T, "packing: sample {}: document starts are not ascending "
                 "inside [0, {})", b, T);
      cu_seqlens[n++] = static_cast<int32_t>(b * T + begin);
      for (int64_t t = begin; t < end; ++t) positions[b * T + t] = static_cast<int32_t>(t - begin);
    }
  }
  while (n <= B * T) cu_seqlens[n++] = static_cast<int32_t>(B * T);
}

}  // namespace kiln::data
