#include "models/mmdit/llama_text_encoder.h"

namespace kiln {

LlamaTextEncoder::LlamaTextEncoder(const MMDiTConfig& c)
    : config_(c.text_llama), Lc_(c.caption_tokens), layers_(c.text_llama, "text_encoder.") {}

void LlamaTextEncoder::collect(std::vector<nn::Param*>& out) {
  const size_t first = out.size();
  layers_.embedding.collect(out);
  for (auto& b : layers_.blocks) b.collect(out);
  layers_.norm.collect(out);
  for (size_t i = first; i < out.size(); ++i) out[i]->trainable = false;
}

double LlamaTextEncoder::cost_per_position() const {
  double w = 0;
  for (int l = 0; l < config_.n_layer; ++l) w += config_.block_matmul_weights(l);
  return w / 3.0;  // forward only
}

void LlamaTextEncoder::reserve(Backend& be, int B, DType dtype, nn::ActivationCheckpointing) {
  if (B_ == B && dtype_ == dtype && !norm_.empty()) return;
  norm_.clear();  // free first so the peak is not doubled
  B_ = B;
  dtype_ = dtype;
  const Shape stream{B, Lc_, config_.n_embd};
  for (Tensor& x : x_) x = be.empty(stream, dtype, MemCategory::Activations);
  for (const nn::SavedSpec& sp : layers_.norm.saved_specs(B, Lc_, dtype))
    norm_.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  const nn::TransformerBlock& first = layers_.blocks.front();
  saved_.reserve(be, first.saved_specs(B, Lc_, dtype), config_.n_layer,
                 nn::ActivationCheckpointing::Full);
  scratch_ = first.make_scratch(be, B, Lc_, dtype);
}

void LlamaTextEncoder::forward(Backend& be, Stream s, const Tensor& tokens,
                               const Tensor& cu_seqlens) {
  layers_.embedding.forward(be, s, x_[0], tokens);
  for (int l = 0; l < config_.n_layer; ++l) {
    const nn::BlockPass p{be,    s, saved_.block(l), scratch_, {},      {},
                          {},    false, false,       Tensor(), cu_seqlens, {}};
    layers_.blocks[static_cast<size_t>(l)].forward(p, x_[l % 2], x_[(l + 1) % 2]);
  }
  layers_.norm.forward(be, s, norm_, x_[config_.n_layer % 2]);
}

}  // namespace kiln
