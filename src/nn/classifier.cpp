#include "nn/classifier.h"

#include "core/error.h"
#include "core/op_region.h"

#include <algorithm>
#include <cmath>

namespace kiln::nn {

int64_t classifier_chunk_rows(int64_t n_rows, int64_t padded_vocab, double chunk_mb) {
  KILN_CHECK(chunk_mb > 0.0 && std::isfinite(chunk_mb),
             "train.classifier_chunk_mb = {}: expected a positive number of MiB", chunk_mb);
  const auto chunk_bytes = static_cast<int64_t>(std::min(chunk_mb, 1e9) * 1048576.0);
  const int64_t rows = std::max<int64_t>(1, chunk_bytes / (padded_vocab * 4));
  return std::max<int64_t>(1, std::min(rows, n_rows));
}

void classifier_cross_entropy(Backend& be, Stream s, const Tensor& x, const Tensor& wte,
                              const Tensor& targets, int vocab_size, float grad_scale,
                              const Tensor& dx, const Tensor& dwte, const Tensor& logits_chunk,
                              const Tensor& losses_chunk, const Tensor& loss) {
  const int64_t N = x.numel() / x.size(-1);
  const int64_t C = x.size(-1);
  const int64_t Vp = wte.size(0);
  const int64_t R = logits_chunk.size(0);
  const Tensor x2 = x.reshape(Shape{N, C});
  const Tensor t1 = targets.reshape(Shape{N});
  const Tensor dx2 = dx ? dx.reshape(Shape{N, C}) : Tensor();
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
    be.accumulate_loss(s, loss, ls, ts);
  }
}

void vocab_parallel_cross_entropy(Backend& be, Stream s, const TpPlacement& placement,
                                  const Tensor& x, const Tensor& wte, const Tensor& targets,
                                  int vocab_size, float grad_scale, const Tensor& dx,
                                  const Tensor& dwte, const Tensor& logits_chunk,
                                  const Tensor& losses_chunk, const VocabParallelScratch& scratch,
                                  const Tensor& loss) {
  TpGroup& g = *placement.group;
  const int tp = g.size();
  const int64_t C = x.size(-1), Vl = wte.size(0), R = logits_chunk.size(0);
  const int64_t begin = g.rank() * Vl;
  const int valid = static_cast<int>(std::clamp<int64_t>(vocab_size - begin, 0, Vl));
  const bool sp = placement.sequence_parallel;
  const int64_t N = targets.numel();
  const Tensor x2 = sp ? scratch.x_full.reshape(Shape{N, C}) : x.reshape(Shape{N, C});
  if (sp) tp_forward(TpComm::GatherFromSp, g, be, s, x2, x.reshape(Shape{N / tp, C}));
  const Tensor dx2 = !dx ? Tensor() : sp ? scratch.dx_full.reshape(Shape{N, C}) : dx.reshape(Shape{N, C});
  const Tensor t1 = targets.reshape(Shape{N});
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(N, r0 + R) - r0;
    const Tensor xs = x2.slice_rows(r0, r0 + rows), ts = t1.slice_rows(r0, r0 + rows);
    const Tensor logits = logits_chunk.view_at(0, Shape{rows, Vl});
    const Tensor mine = scratch.stats.view_at(0, Shape{rows, 3});
    const Tensor every = scratch.stats.view_at(R * 3, Shape{tp * rows, 3});
    const Tensor lse = losses_chunk.view_at(0, Shape{rows});
    be.linear_forward(s, logits, xs, wte, Tensor());
    be.cross_entropy_shard_stats(s, mine, logits, ts, begin, valid);
    g.all_gather_rows(s, every, mine);
    be.cross_entropy_shard_combine(s, lse, loss, every, ts);
    if (!dx) continue;
    be.cross_entropy_shard_backward(s, logits, logits, ts, lse, begin, valid, -1, grad_scale);
    be.linear_backward(s, dx2.slice_rows(r0, r0 + rows), dwte, Tensor(), logits, xs, wte);
  }
  if (!dx) return;
  if (sp) {
    tp_backward(TpComm::GatherFromSp, g, be, s, dx.reshape(Shape{N / tp, C}), dx2);  // reduce_scatter
  } else {
    tp_backward(TpComm::CopyToTp, g, be, s, dx2, dx2);  // all_reduce
  }
}

HeadScratch make_head_scratch(Backend& be, const TpPlacement& placement, int64_t N, int64_t C,
                              int64_t Vl, DType dtype, double chunk_mb) {
  auto act = [&](Shape s, DType d) { return be.empty(s, d, MemCategory::Activations); };
  const int64_t R = classifier_chunk_rows(N, Vl, chunk_mb);
  HeadScratch h{act({R, Vl}, dtype), act({R}, DType::F32), {}};
  if (placement.active()) {
    h.vocab.stats = act({(placement.group->size() + 1) * R, 3}, DType::F32);
    if (placement.sequence_parallel) h.vocab.x_full = act({N, C}, dtype), h.vocab.dx_full = act({N, C}, dtype);
  }
  return h;
}

void head_cross_entropy(Backend& be, Stream s, const TpPlacement& placement, const Tensor& x,
                        const Tensor& weight, const Tensor& targets, int vocab_size,
                        float grad_scale, const Tensor& dx, const Tensor& dweight,
                        const HeadScratch& scratch, const Tensor& loss) {
  const OpRegion region("classifier");
  if (!placement.active()) {
    classifier_cross_entropy(be, s, x, weight, targets, vocab_size, grad_scale, dx, dweight,
                             scratch.logits_chunk, scratch.losses_chunk, loss);
  } else {
    vocab_parallel_cross_entropy(be, s, placement, x, weight, targets, vocab_size, grad_scale, dx,
                                 dweight, scratch.logits_chunk, scratch.losses_chunk,
                                 scratch.vocab, loss);
  }
}

}  // namespace kiln::nn
