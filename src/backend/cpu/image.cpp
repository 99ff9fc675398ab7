// Image layout ops: patchify (images to rows of flattened patches) and its inverse,
// unpatchify. One pass each, parallel over (image, patch row); each output element is
// written once.
#include "backend/cpu/element.h"
#include "backend/cpu/kernels.h"

namespace kiln::cpu {

template <class T>
void patchify(T* out, const float* images, int64_t B, int64_t H, int64_t W, int64_t C, int64_t P,
              int64_t T_rows) {
  const int64_t ph = H / P, pw = W / P, D = C * P * P;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t py = 0; py < ph; ++py)
      for (int64_t px = 0; px < pw; ++px) {
        T* row = out + (b * T_rows + py * pw + px) * D;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t dy = 0; dy < P; ++dy)
            for (int64_t dx = 0; dx < P; ++dx)
              row[(c * P + dy) * P + dx] =
                  store<T>(images[((b * H + py * P + dy) * W + px * P + dx) * C + c]);
      }
}

template <class T>
void unpatchify(float* images, const T* patches, int64_t B, int64_t H, int64_t W, int64_t C,
                int64_t P, int64_t T_rows) {
  const int64_t ph = H / P, pw = W / P, D = C * P * P;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t py = 0; py < ph; ++py)
      for (int64_t px = 0; px < pw; ++px) {
        const T* row = patches + (b * T_rows + py * pw + px) * D;
        for (int64_t dy = 0; dy < P; ++dy)
          for (int64_t dx = 0; dx < P; ++dx) {
            float* pixel = images + ((b * H + py * P + dy) * W + px * P + dx) * C;
            for (int64_t c = 0; c < C; ++c) pixel[c] = load(row[(c * P + dy) * P + dx]);
          }
      }
}

#define INST_T(T)                                                                           \
  template void patchify<T>(T*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                            int64_t);                                                         \
  template void unpatchify<T>(float*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                              int64_t);
KILN_CPU_FOR_EACH_T(INST_T)

}  // namespace kiln::cpu
