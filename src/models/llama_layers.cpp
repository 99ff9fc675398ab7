#include "models/llama_layers.h"

#include "core/error.h"
#include "models/decoder_model.h"

#include <fmt/format.h>

#include <cmath>

namespace kiln {

namespace {

nn::NormSpec rms_spec(const LlamaConfig& c) {
  return nn::NormSpec{nn::NormKind::RMSNorm, c.norm_eps, /*weight=*/true, /*bias=*/false};
}

}  // namespace

nn::BlockSpec llama_block_spec(const LlamaConfig& c, int l) {
  nn::BlockSpec b;
  b.n_embd = c.n_embd;
  b.norm = rms_spec(c);
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_kv_head;
  b.attention.head_dim = c.head_dim();
  b.attention.causal = true;
  b.attention.rotary = true;
  b.attention.rope = c.rope;
  b.attention.qk_norm = c.qk_norm;
  b.attention.qk_norm_eps = c.norm_eps;
  b.mlp = nn::MlpKind::SwiGLU;
  b.mlp_hidden = c.ffn_hidden_size;
  b.bias = false;
  b.init_std = 0.02f;
  b.residual_init_std = 0.02f / std::sqrt(2.f * static_cast<float>(c.n_layer));
  b.names = {"input_layernorm", "self_attn.qkv_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_up_proj", "mlp.down_proj",
             "self_attn.q_norm", "self_attn.k_norm", "mlp"};
  if (!c.is_moe_block(l)) return b;
  b.moe.num_experts = c.moe.num_experts;
  b.moe.top_k = c.moe.top_k;
  b.moe.expert_hidden = c.moe.ffn_hidden_size;
  b.moe.shared_hidden = int64_t{c.moe.shared_experts} * c.moe.ffn_hidden_size;
  b.moe.scoring = c.moe.scoring == "sigmoid" ? MoeScoring::Sigmoid : MoeScoring::Softmax;
  b.moe.norm_topk_prob = c.moe.norm_topk_prob;
  b.moe.round_robin = c.moe.routing == "round_robin";
  b.moe.capacity_factor = c.moe.capacity_factor;
  return b;
}

MoeBalanceSpec llama_balance_spec(const LlamaConfig& c) {
  MoeBalanceSpec b;
  b.aux_coef = static_cast<float>(c.moe.aux_loss_coef);
  b.aux_type = c.moe.aux_loss_type == "hf" ? MoeBalanceSpec::AuxType::Hf
                                           : MoeBalanceSpec::AuxType::PerLayer;
  b.z_coef = static_cast<float>(c.moe.z_loss_coef);
  b.global = c.moe.aux_loss_scope == "global";
  b.expert_bias = c.moe.expert_bias;
  b.bias_update_rate = static_cast<float>(c.moe.bias_update_rate);
  return b;
}

LlamaLayers::LlamaLayers(const LlamaConfig& c, const std::string& prefix)
    : embedding(prefix + "model.embed_tokens.weight", "", c.vocab_size, c.padded_vocab_size,
                /*max_positions=*/0, c.n_embd, 0.02f),
      norm(prefix + "model.norm", c.n_embd, rms_spec(c)) {
  blocks.reserve(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l)
    blocks.emplace_back(fmt::format("{}model.layers.{}.", prefix, l), llama_block_spec(c, l));
  if (!c.tie_embeddings) {
    lm_head.emplace(prefix + "lm_head", c.n_embd, c.padded_vocab_size, /*bias=*/false, 0.02f);
    lm_head->weight.init.zero_rows_from = c.vocab_size;
  }
}

std::vector<PartLayout> LlamaLayers::parts(const LlamaConfig& c) {
  std::vector<PartLayout> out(blocks.size() + 2);
  out.front().name = "embeddings";
  out.front().cost = 0.0;
  embedding.collect(out.front().params);
  const double C = c.n_embd;
  for (size_t l = 0; l < blocks.size(); ++l) {
    PartLayout& p = out[l + 1];
    p.name = fmt::format("layers.{}", l);
    p.cost = c.block_matmul_weights(static_cast<int>(l));
    blocks[l].collect(p.params);
  }
  PartLayout& head = out.back();
  head.name = "head";
  head.cost = static_cast<double>(c.padded_vocab_size) * C;
  head.resident = !c.tie_embeddings;  // lm_head's gradient is made in forward
  norm.collect(head.params);
  if (lm_head) lm_head->collect(head.params);
  else head.params.push_back(&embedding.wte);  // tied: the output projection
  return out;
}

LayerRoles LlamaLayers::roles() {
  return layer_roles("llama", kDecoderParallelTables, embedding, blocks, norm,
                     lm_head ? &*lm_head : nullptr);
}

void LlamaKvCache::begin(Backend& be, const LlamaConfig& c, const LlamaLayers& layers,
                         DType dtype, int B, int max_len) {
  KILN_CHECK(B > 0 && max_len > 0 && max_len <= c.block_size,
             "begin_decode: {} positions for {} sequences (block_size {})", max_len, B,
             c.block_size);
  KILN_CHECK(!layers.head_placement().active() && !layers.embedding.placement().active(),
             "llama: decoding a tensor-parallel model is not supported yet");
  end();
  B_ = B;
  max_len_ = max_len;
  const int64_t kv = int64_t{c.n_kv_head} * c.head_dim();
  for (int l = 0; l < c.n_layer; ++l) {
    k_.push_back(be.empty(Shape{B, max_len, kv}, dtype, MemCategory::Temporaries));
    v_.push_back(be.empty(Shape{B, max_len, kv}, dtype, MemCategory::Temporaries));
  }
}

void LlamaKvCache::end() {
  k_.clear();
  v_.clear();
  B_ = max_len_ = past_ = 0;
}

void LlamaKvCache::run(Backend& be, const LlamaLayers& layers, const Tensor& x, const Tensor& out) {
  KILN_CHECK(B_ > 0, "decode() needs begin_decode() first");
  KILN_CHECK(x.ndim() == 3 && x.size(0) == B_, "decode: inputs {} must be [{}, Tq, C]", x.str(), B_);
  const int64_t B = B_, Tq = x.size(1), C = x.size(2);
  KILN_CHECK(past_ + Tq <= max_len_, "decode: {} positions exceed the cache of {}", past_ + Tq,
             max_len_);
  check_shape(out, Shape{B, C}, "decode out");
  const Stream s = be.default_stream();
  // The rotary angles of the new positions: past .. past + Tq - 1.
  std::vector<int32_t> pos_h(static_cast<size_t>(B * Tq));
  for (size_t i = 0; i < pos_h.size(); ++i)
    pos_h[i] = static_cast<int32_t>(past_ + static_cast<int64_t>(i) % Tq);
  Tensor positions = be.empty(Shape{B, Tq}, DType::I32, MemCategory::Temporaries);
  be.copy_from_host(s, positions, pos_h.data());
  const auto w = layers.blocks.front().make_decode_scratch(be, B, Tq, x.dtype());
  for (size_t l = 0; l < layers.blocks.size(); ++l)
    layers.blocks[l].decode(be, s, x, w, k_[l], v_[l], past_, positions);
  past_ += static_cast<int>(Tq);
  // The final norm of each sequence's last position only.
  Tensor last = be.empty(Shape{B, C}, x.dtype(), MemCategory::Temporaries);
  for (int64_t b = 0; b < B; ++b)
    be.copy(s, last.view_at(b * C, Shape{C}), x.view_at((b * Tq + Tq - 1) * C, Shape{C}));
  layers.norm.forward_into(be, s, out, w.mean.view_at(0, Shape{B}), w.rstd.view_at(0, Shape{B}),
                           last);
  be.synchronize(s);  // pos_h is read by the copy
}

void LlamaKvCache::decode(Backend& be, const LlamaLayers& layers, const Tensor& tokens,
                          const Tensor& out) {
  KILN_CHECK(B_ > 0, "decode() needs begin_decode() first");
  KILN_CHECK(tokens.ndim() == 2 && tokens.size(0) == B_, "decode: tokens {} must be [{}, Tq]",
             tokens.str(), B_);
  Tensor x = be.empty(Shape{B_, tokens.size(1), out.size(1)}, out.dtype(), MemCategory::Temporaries);
  layers.embedding.forward(be, be.default_stream(), x, tokens);
  run(be, layers, x, out);
}

}  // namespace kiln
