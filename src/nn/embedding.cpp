#include "nn/embedding.h"

namespace kiln::nn {

TokenPositionEmbedding::TokenPositionEmbedding(const std::string& token_name,
                                               const std::string& position_name, int64_t vocab,
                                               int64_t padded_vocab, int64_t max_positions,
                                               int64_t C, float init_std)
    : wte(token_name, Shape{padded_vocab, C}, Init::normal(init_std), true),
      wpe(position_name, Shape{max_positions, C}, Init::normal(init_std), true) {
  wte.init.zero_rows_from = vocab;
}

void TokenPositionEmbedding::forward(Backend& be, Stream s, const Tensor& out,
                                     const Tensor& tokens, int64_t first_position) const {
  const Tensor& w = wpe.v();
  const int64_t C = w.size(1), rows = w.size(0) - first_position;
  KILN_CHECK(first_position >= 0 && rows >= tokens.size(-1),
             "embedding: positions {}..{} exceed the {} of {}", first_position,
             first_position + tokens.size(-1) - 1, w.size(0), wpe.name);
  be.embedding_forward(s, out, tokens, wte.v(),
                       first_position == 0 ? w : w.view_at(first_position * C, Shape{rows, C}));
}

void TokenPositionEmbedding::backward(Backend& be, Stream s, const Tensor& dout,
                                      const Tensor& tokens) const {
  be.embedding_backward(s, wte.g(), wpe.g(), dout, tokens);
}

void TokenPositionEmbedding::collect(std::vector<Param*>& out) {
  out.push_back(&wte);
  out.push_back(&wpe);
}

}  // namespace kiln::nn
