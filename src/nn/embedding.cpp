#include "nn/embedding.h"

namespace kiln::nn {

TokenPositionEmbedding::TokenPositionEmbedding(const std::string& token_name,
                                               const std::string& position_name, int64_t vocab,
                                               int64_t padded_vocab, int64_t max_positions,
                                               int64_t C, float init_std)
    : wte(token_name, Shape{padded_vocab, C}, Init::normal(init_std), true) {
  wte.init.zero_rows_from = vocab;
  if (max_positions > 0)
    wpe = Param(position_name, Shape{max_positions, C}, Init::normal(init_std), true);
}

void TokenPositionEmbedding::shard(const TpPlacement& placement) {
  KILN_CHECK(placement.style == TpStyle::Vocab || placement.style == TpStyle::Replicated,
             "{}: an embedding is vocab-parallel or replicated, not {}", wte.name,
             tp_style_name(placement.style));
  placement_ = placement;
  if (!placement.active()) return;
  wte.slice = ParamSlice{0, {}, placement.group->size(), placement.group->rank()};
  wte.slice.check(wte.shape, wte.name);
}

Tensor TokenPositionEmbedding::local_tokens(Backend& be, Stream s, const Tensor& tokens) const {
  const int64_t rows = wte.local_shape()[0];
  Tensor local = be.empty(tokens.shape(), DType::I32, MemCategory::Temporaries);
  be.shard_ids(s, local, tokens, placement_.group->rank() * rows, rows);
  return local;
}

void TokenPositionEmbedding::forward(Backend& be, Stream s, const Tensor& out,
                                     const Tensor& tokens, const Tensor& positions,
                                     int64_t first_position, const Tensor& work) const {
  if (placement_.active()) {
    KILN_CHECK(first_position == 0, "{}: vocab-parallel decoding is not supported", wte.name);
    TpGroup& g = *placement_.group;
    const Tensor local = local_tokens(be, s, tokens);
    const Tensor pos_table = learned_positions() && g.rank() == 0 ? wpe.v() : Tensor();
    if (!placement_.sequence_parallel) {
      be.embedding_forward(s, out, local, positions, wte.v(), pos_table);
      return tp_forward(TpComm::ReduceFromTp, g, be, s, out, out);
    }
    be.embedding_forward(s, work, local, positions, wte.v(), pos_table);
    return tp_forward(TpComm::ReduceScatterToSp, g, be, s, out, work);
  }
  if (!learned_positions() || positions) {
    KILN_CHECK(first_position == 0, "embedding: explicit positions and a first position {}",
               first_position);
    be.embedding_forward(s, out, tokens, positions, wte.v(),
                         learned_positions() ? wpe.v() : Tensor());
    return;
  }
  const Tensor& w = wpe.v();
  const int64_t C = w.size(1), rows = w.size(0) - first_position;
  KILN_CHECK(first_position >= 0 && rows >= tokens.size(-1),
             "embedding: positions {}..{} exceed the {} of {}", first_position,
             first_position + tokens.size(-1) - 1, w.size(0), wpe.name);
  be.embedding_forward(s, out, tokens, Tensor(), wte.v(),
                       first_position == 0 ? w : w.view_at(first_position * C, Shape{rows, C}));
}

void TokenPositionEmbedding::backward(Backend& be, Stream s, const Tensor& dout,
                                      const Tensor& tokens, const Tensor& positions,
                                      const Tensor& work) const {
  const Tensor dwpe = learned_positions() ? wpe.trainable_grad() : Tensor();
  if (!wte.trainable && !dwpe) return;  // frozen: no scatter (the same on every tp rank)
  const Tensor dwte = wte.trainable ? wte.g() : frozen_table_grad(be, s, dwpe);
  if (!placement_.active()) return be.embedding_backward(s, dwte, dwpe, dout, tokens, positions);
  const Tensor local = local_tokens(be, s, tokens);
  if (!placement_.sequence_parallel) {  // reduce_from_tp's backward: identity
    return be.embedding_backward(s, dwte, dwpe, dout, local, positions);
  }
  tp_backward(TpComm::ReduceScatterToSp, *placement_.group, be, s, work, dout);  // all_gather
  be.embedding_backward(s, dwte, dwpe, work, local, positions);
}

Tensor TokenPositionEmbedding::frozen_table_grad(Backend& be, Stream s, const Tensor& dwpe) const {
  // The backend scatters both tables in one op: a frozen wte beside a trainable wpe
  // takes a zeroed scratch of wte's size, written and never read.
  Tensor scratch = be.empty(wte.local_shape(), dwpe.dtype(), MemCategory::Temporaries);
  be.fill(s, scratch, 0.f);
  return scratch;
}

void TokenPositionEmbedding::collect(std::vector<Param*>& out) {
  out.push_back(&wte);
  if (learned_positions()) out.push_back(&wpe);
}

}  // namespace kiln::nn
