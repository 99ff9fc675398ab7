// GPT-2 inference with a KV cache: the same blocks as GPT2::run_forward, but each
// attention reads the keys and values of earlier positions from a cache instead of
// recomputing them, so generating n tokens costs O(n) block passes, not O(n^2).
#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_state.h"

#include <vector>

namespace kiln {

void GPT2::begin_decode(int B, int max_len) {
  KILN_CHECK(B > 0 && max_len > 0 && max_len <= config_.block_size,
             "begin_decode: {} positions for {} sequences (block_size {})", max_len, B,
             config_.block_size);
  decode_.reset();
  auto d = std::make_unique<DecodeState>();
  d->B = B;
  d->max_len = max_len;
  for (int l = 0; l < config_.n_layer; ++l) {
    d->k_cache.push_back(backend_.empty(Shape{B, max_len, config_.n_embd}, storage_.dtype,
                                        MemCategory::Temporaries));
    d->v_cache.push_back(backend_.empty(Shape{B, max_len, config_.n_embd}, storage_.dtype,
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
  Backend& be = backend_;
  const Stream s = be.default_stream();
  const float eps = config_.layernorm_eps;
  auto tmp = [&](Shape shape) { return be.empty(shape, storage_.dtype, MemCategory::Temporaries); };
  Tensor x = tmp({B, Tq, C}), x2 = tmp({B, Tq, C}), ln = tmp({B, Tq, C}), y = tmp({B, Tq, C});
  Tensor qkv = tmp({B, Tq, 3 * C}), h = tmp({B, Tq, 4 * C}), hg = tmp({B, Tq, 4 * C});
  Tensor mean = be.empty(Shape{B * Tq}, DType::F32, MemCategory::Temporaries);
  Tensor rstd = be.empty(Shape{B * Tq}, DType::F32, MemCategory::Temporaries);

  const Tensor wpe = param(params_[1]);
  const Tensor wpe_from = wpe.view_at(d.past * C, Shape{config_.block_size - d.past, C});
  be.embedding_forward(s, x, tokens, param(params_[0]), wpe_from);
  for (int l = 0; l < config_.n_layer; ++l) {
    const ParamSpec* p = &params_[2 + 12 * static_cast<size_t>(l)];
    be.layernorm_forward(s, ln, mean, rstd, x, param(p[0]), param(p[1]), eps);
    be.linear_forward(s, qkv, ln, param(p[2]), param(p[3]));
    be.attention_decode(s, y, d.k_cache[static_cast<size_t>(l)], d.v_cache[static_cast<size_t>(l)],
                        qkv, d.past, config_.n_head);
    be.linear_forward(s, ln, y, param(p[4]), param(p[5]));
    be.add(s, x2, x, ln);
    be.layernorm_forward(s, ln, mean, rstd, x2, param(p[6]), param(p[7]), eps);
    be.linear_forward(s, h, ln, param(p[8]), param(p[9]));
    be.gelu_forward(s, hg, h);
    be.linear_forward(s, y, hg, param(p[10]), param(p[11]));
    be.add(s, x, x2, y);
  }
  d.past += static_cast<int>(Tq);
  // Final norm and logits for the last position of each sequence only.
  Tensor last = tmp({B, C});
  for (int64_t b = 0; b < B; ++b)
    be.copy(s, last.view_at(b * C, Shape{C}), x.view_at((b * Tq + Tq - 1) * C, Shape{C}));
  const ParamSpec* pf = &params_[params_.size() - 2];
  Tensor lastn = tmp({B, C});
  be.layernorm_forward(s, lastn, mean.view_at(0, Shape{B}), rstd.view_at(0, Shape{B}), last,
                       param(pf[0]), param(pf[1]), eps);
  if (logits.dtype() == storage_.dtype) {
    be.linear_forward(s, logits, lastn, param(params_[0]), Tensor());
  } else {
    Tensor l = tmp({B, Vp});
    be.linear_forward(s, l, lastn, param(params_[0]), Tensor());
    be.copy(s, logits, l);
  }
}

}  // namespace kiln
