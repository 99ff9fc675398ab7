// Rotary position embedding (Su et al. 2021) on the q and k heads of a packed qkv buffer,
// in place, in the "rotate half" layout of Hugging Face's Llama (see Backend::rope_forward).
// The angle is the fp32 product pos * inv_freq[i], as transformers computes it; cos and
// sin in fp32. Backward is the same rotation by the negated angle (the transpose).
#include "backend/cpu/kernels.h"

#include <cmath>
#include <vector>

namespace kiln::cpu {

template <class T>
void rope(T* qkv, const int32_t* positions, const float* inv_freq, int64_t B, int64_t T_,
          int64_t NH, int64_t NKV, int64_t HD, float sign) {
  const int64_t W = (NH + 2 * NKV) * HD, half = HD / 2, heads = NH + NKV;
  bool bad = false;
#pragma omp parallel reduction(|| : bad)
  {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const int64_t pos = positions ? positions[bt] : bt % T_;
      if (pos < 0) {
        bad = true;
        continue;
      }
      for (int64_t i = 0; i < half; ++i) {
        const float a = static_cast<float>(pos) * inv_freq[i];
        c[static_cast<size_t>(i)] = std::cos(a);
        s[static_cast<size_t>(i)] = sign * std::sin(a);
      }
      T* row = qkv + bt * W;
      for (int64_t h = 0; h < heads; ++h) {  // q heads, then k heads: contiguous
        T* x = row + h * HD;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = load(x[i]), x2 = load(x[i + half]);
          x[i] = store<T>(x1 * c[static_cast<size_t>(i)] - x2 * s[static_cast<size_t>(i)]);
          x[i + half] = store<T>(x2 * c[static_cast<size_t>(i)] + x1 * s[static_cast<size_t>(i)]);
        }
      }
    }
  }
  KILN_CHECK(!bad, "rope: a position is negative");
}

#define INST_T(T)                                                                            \
  template void rope<T>(T*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, \
                        int64_t, float);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu
