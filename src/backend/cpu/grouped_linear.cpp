// The grouped linear of a mixture of experts: each expert's rows of the permuted
// tokens through its own [O, I] weight, a oneDNN GEMM per expert (Debian's oneDNN 2.6 has
// no grouped matmul) through linear.cpp's kernels, which parallelise inside the GEMM.
//
// oneDNN primitives are created and cached per problem shape (gemm.h), and an expert's
// row count changes from step to step: each expert's rows run as pieces whose sizes are
// powers of two (backend/grouped_pieces.h), so that one projection creates at most
// log2(M) + 1 primitives over a whole run instead of one per row count seen. The pieces
// of dweight accumulate (+=) in piece order; rows are independent otherwise.
#include "backend/cpu/kernels.h"

#include "backend/grouped_pieces.h"
#include "backend/op_checks.h"

namespace kiln::cpu {

template <class T>
void grouped_linear_forward(Gemm& gemm, T* out, const T* inp, const T* weight,
                            const int32_t* offsets, int64_t M, int64_t I, int64_t O, int64_t E) {
  checks::grouped_linear_offsets(offsets, M, E, "grouped_linear_forward");
  for_each_grouped_piece(offsets, E, [&](int64_t e, int64_t r, int64_t m) {
    linear_forward(gemm, out + r * O, inp + r * I, weight + e * O * I, (const T*)nullptr, m, I,
                   O);
  });
}

template <class T, class G>
void grouped_linear_backward(Gemm& gemm, T* dinp, G* dweight, const T* dout, const T* inp,
                             const T* weight, const int32_t* offsets, int64_t M, int64_t I,
                             int64_t O, int64_t E) {
  checks::grouped_linear_offsets(offsets, M, E, "grouped_linear_backward");
  for_each_grouped_piece(offsets, E, [&](int64_t e, int64_t r, int64_t m) {
    linear_backward(gemm, dinp ? dinp + r * I : nullptr, dweight ? dweight + e * O * I : nullptr,
                    (G*)nullptr, dout + r * O, inp + r * I, weight + e * O * I, m, I, O);
  });
}

#define INST_T(T)                                                                            \
  template void grouped_linear_forward<T>(Gemm&, T*, const T*, const T*, const int32_t*,     \
                                          int64_t, int64_t, int64_t, int64_t);
#define INST_TG(T, G)                                                                        \
  template void grouped_linear_backward<T, G>(Gemm&, T*, G*, const T*, const T*, const T*,   \
                                              const int32_t*, int64_t, int64_t, int64_t,     \
                                              int64_t);
KILN_CPU_FOR_EACH_T(INST_T)
KILN_CPU_FOR_EACH_TG(INST_TG)

}  // namespace kiln::cpu
