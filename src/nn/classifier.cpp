#include "nn/classifier.h"

#include <algorithm>
#include <vector>

namespace kiln::nn {

int64_t classifier_chunk_rows(int64_t n_rows, int64_t padded_vocab) {
  constexpr int64_t kChunkBytes = 16ll << 20;
  const int64_t rows = std::max<int64_t>(1, kChunkBytes / (padded_vocab * 4));
  return std::max<int64_t>(1, std::min(rows, n_rows));
}

ClassifierLoss classifier_cross_entropy(Backend& be, Stream s, const Tensor& x, const Tensor& wte,
                                        const Tensor& targets, int vocab_size, float grad_scale,
                                        const Tensor& dx, const Tensor& dwte,
                                        const Tensor& logits_chunk, const Tensor& losses_chunk) {
  const int64_t N = x.numel() / x.size(-1);
  const int64_t C = x.size(-1);
  const int64_t Vp = wte.size(0);
  const int64_t R = logits_chunk.size(0);
  const Tensor x2 = x.reshape(Shape{N, C});
  const Tensor t1 = targets.reshape(Shape{N});
  const Tensor dx2 = dx ? dx.reshape(Shape{N, C}) : Tensor();
  ClassifierLoss result;
  std::vector<float> losses(static_cast<size_t>(R));
  std::vector<int32_t> tgt(static_cast<size_t>(R));
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r1 = std::min(N, r0 + R);
    const int64_t rows = r1 - r0;
    const Tensor xs = x2.slice_rows(r0, r1);
    const Tensor ts = t1.slice_rows(r0, r1);
    const Tensor logits = logits_chunk.view_at(0, Shape{rows, Vp});
    const Tensor ls = losses_chunk.view_at(0, Shape{rows});
    be.linear_forward(s, logits, xs, wte, Tensor());
    be.softmax_cross_entropy(s, ls, dx ? logits : Tensor(), logits, ts, vocab_size, -1,
                             grad_scale);
    if (dx) be.linear_backward(s, dx2.slice_rows(r0, r1), dwte, Tensor(), logits, xs, wte);
    be.copy_to_host(s, losses.data(), ls);
    be.copy_to_host(s, tgt.data(), ts);
    for (int64_t i = 0; i < rows; ++i) {
      if (tgt[static_cast<size_t>(i)] == -1) continue;
      result.loss_sum += losses[static_cast<size_t>(i)];
      ++result.n_targets;
    }
  }
  return result;
}

}  // namespace kiln::nn
