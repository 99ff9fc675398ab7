#include "models/llama/layers.h"

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

}  // namespace kiln
