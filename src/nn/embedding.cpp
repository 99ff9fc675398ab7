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

void TokenPositionEmbedding::forward(Backend& be, Stream s, const Tensor& out,
                                     const Tensor& tokens, const Tensor& positions,
                                     int64_t first_position) const {
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
                                      const Tensor& tokens, const Tensor& positions) const {
  be.embedding_backward(s, wte.g(), learned_positions() ? wpe.g() : Tensor(), dout, tokens,
                        positions);
}

void TokenPositionEmbedding::collect(std::vector<Param*>& out) {
  out.push_back(&wte);
  if (learned_positions()) out.push_back(&wpe);
}

}  // namespace kiln::nn
