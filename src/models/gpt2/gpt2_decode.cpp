// GPT-2 inference with a KV cache: the same blocks as the training forward (DecoderModel), but each
// attention reads the keys and values of earlier positions from a cache instead of
// recomputing them, so generating n tokens costs O(n) block passes, not O(n^2).
#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_state.h"

#include <vector>

namespace kiln {

void GPT2::begin_decode(int B, int max_len) {
  KILN_CHECK(B > 0 && max_len > 0 && max_len <= config_.block_size,
             "begin_decode: {} positions for {} sequences (block_size {})", max_len, B,
             config_.block_size);
  KILN_CHECK(!layers_->embedding.placement().active(),
             "GPT-2: decoding a tensor-parallel model is not supported yet");
  decode_.reset();
  auto d = std::make_unique<DecodeState>();
  d->B = B;
  d->max_len = max_len;
  for (int l = 0; l < config_.n_layer; ++l) {
    d->k_cache.push_back(backend().empty(Shape{B, max_len, config_.n_embd}, dtype(),
                                        MemCategory::Temporaries));
    d->v_cache.push_back(backend().empty(Shape{B, max_len, config_.n_embd}, dtype(),
                                        MemCategory::Temporaries));
  }
  decode_ = std::move(d);
}

void GPT2::end_decode() { decode_.reset(); }

int GPT2::decoded_length() const { return decode_ ? decode_->past : 0; }

void GPT2::decode(const Tensor& tokens, const Tensor& logits) {
  KILN_CHECK(decode_ != nullptr, "decode() needs begin_decode() first");
  DecodeState& d = *decode_;
  KILN_CHECK(tokens.ndim() == 2 && tokens.size(0) == d.B, "decode: tokens {} must be [{}, Tq]",
             tokens.str(), d.B);
  const int64_t B = d.B, Tq = tokens.size(1), C = config_.n_embd;
  const int64_t Vp = config_.padded_vocab_size;
  KILN_CHECK(d.past + Tq <= d.max_len, "decode: {} positions exceed the cache of {}",
             d.past + Tq, d.max_len);
  check_shape(logits, Shape{B, Vp}, "decode logits");
  Backend& be = backend();
  const Stream s = be.default_stream();
  const auto& blocks = layers_->blocks;
  Tensor x = be.empty(Shape{B, Tq, C}, dtype(), MemCategory::Temporaries);
  const auto w = blocks.front().make_decode_scratch(be, B, Tq, dtype());
  layers_->embedding.forward(be, s, x, tokens, Tensor(), d.past);
  for (int l = 0; l < config_.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    blocks[i].decode(be, s, x, w, d.k_cache[i], d.v_cache[i], d.past);
  }
  d.past += static_cast<int>(Tq);
  // Final norm and logits for the last position of each sequence only.
  auto tmp = [&](Shape shape) { return be.empty(shape, dtype(), MemCategory::Temporaries); };
  Tensor last = tmp({B, C}), lastn = tmp({B, C});
  last_positions(last, x);
  layers_->ln_f.forward_into(be, s, lastn, w.mean.view_at(0, Shape{B}), w.rstd.view_at(0, Shape{B}),
                             last);
  project_logits(logits, lastn, layers_->embedding.wte.v());
}

}  // namespace kiln
