#include "backend/cpu/attention_windows.h"

#include "core/error.h"

#include <algorithm>

namespace kiln::cpu {

void check_cu_seqlens(const int32_t* cu, int64_t count, int64_t total, const char* op) {
  KILN_CHECK(count >= 2 && cu[0] == 0 && cu[count - 1] == total,
             "{}: cu_seqlens must run from 0 to the {} tokens, got {} .. {}", op, total,
             count > 0 ? cu[0] : -1, count > 0 ? cu[count - 1] : -1);
  for (int64_t d = 1; d < count; ++d)
    KILN_CHECK(cu[d] >= cu[d - 1], "{}: cu_seqlens decreases at entry {} ({} after {})", op, d,
               cu[d], cu[d - 1]);
}

KeyWindows key_windows(int64_t B, int64_t nq, int64_t nk, bool causal, const DocumentRows* docs) {
  KeyWindows w;
  w.lo.assign(static_cast<size_t>(B * nq), 0);
  w.hi.assign(static_cast<size_t>(B * nq), static_cast<int32_t>(nk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < nq; ++i) {
      const auto at = static_cast<size_t>(b * nq + i);
      int64_t lo = 0, hi = causal ? i + 1 : nk;
      if (docs) {
        // The document holding query i: [cu[d], cu[d+1]) with cu[d] <= g < cu[d+1], cut at
        // the sequence's bounds; in key rows, counted from the tile's first key.
        const int64_t row = b * docs->S, g = row + docs->q_pos + i;
        const int32_t* end = docs->cu + docs->count;
        const int32_t* next = std::upper_bound(docs->cu, end, static_cast<int32_t>(g));
        const int64_t first = std::max<int64_t>(next[-1], row);
        const int64_t last = next == end ? row + docs->S : std::min<int64_t>(*next, row + docs->S);
        lo = std::max(lo, first - row - docs->k_pos);
        hi = std::min(hi, last - row - docs->k_pos);
      }
      w.lo[at] = static_cast<int32_t>(std::clamp<int64_t>(lo, 0, nk));
      w.hi[at] = static_cast<int32_t>(std::clamp<int64_t>(hi, 0, nk));
    }
  return w;
}

}  // namespace kiln::cpu
