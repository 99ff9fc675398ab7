#include "models/llama/llama.h"

#include "nn/block.h"
#include "nn/classifier.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <vector>

namespace kiln {

namespace {

nn::NormSpec rms_spec(const LlamaConfig& c) {
  return nn::NormSpec{nn::NormKind::RMSNorm, c.norm_eps, /*weight=*/true, /*bias=*/false};
}

// Block l's spec: a MoE block (c.is_moe_block(l)) holds a MoeMlp named "mlp".
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

}  // namespace

/// The layers, named as Hugging Face's LlamaForCausalLM (llama.h lists the names).
struct LlamaLayers {
  explicit LlamaLayers(const LlamaConfig& c)
      : embedding("model.embed_tokens.weight", "", c.vocab_size, c.padded_vocab_size,
                  /*max_positions=*/0, c.n_embd, 0.02f),
        norm("model.norm", c.n_embd, rms_spec(c)) {
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l)
      blocks.emplace_back(fmt::format("model.layers.{}.", l), llama_block_spec(c, l));
    if (!c.tie_embeddings) {
      lm_head.emplace("lm_head", c.n_embd, c.padded_vocab_size, /*bias=*/false, 0.02f);
      lm_head->weight.init.zero_rows_from = c.vocab_size;
    }
  }

  /// The parts: embeddings, each block, the head (final norm, lm_head when untied).
  /// Costs: the matmul weights a token meets in the part (the 6N rule's N; a MoE block's
  /// active ones, LlamaConfig::block_matmul_weights).
  std::vector<PartLayout> parts(const LlamaConfig& c) {
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

  /// The layers by role and Llama's plans (the decoders': models/decoder_model.h), for a
  /// LayerPlan.
  LayerRoles roles() {
    return layer_roles("llama", kDecoderParallelTables, embedding, blocks, norm,
                       lm_head ? &*lm_head : nullptr);
  }

  nn::TokenPositionEmbedding embedding;
  std::vector<nn::TransformerBlock> blocks;
  nn::Norm norm;
  std::optional<nn::Linear> lm_head;
};

/// The KV caches of decoding.
struct Llama::State {
  int dec_B = 0, max_len = 0, past = 0;
  std::vector<Tensor> k_cache, v_cache;  // per layer [B, max_len, NKV HD]
};

Llama::Llama(const LlamaConfig& config, Backend& backend, const ModelStorage& storage)
    : DecoderModel(backend, storage), config_(config) {
  config_.validate();
  layers_ = std::make_unique<LlamaLayers>(config_);
  for (const LayerPlan* plan : storage.plans) plan->apply(layers_->roles());
  state_ = std::make_unique<State>();
  nn::Param& head = layers_->lm_head ? layers_->lm_head->weight : layers_->embedding.wte;
  set_layers(DecoderLayers{&layers_->embedding, &layers_->blocks, &layers_->norm, &head,
                           &head_placement(), config_.vocab_size, config_.n_embd,
                           llama_balance_spec(config_)});
  std::vector<OpFamily> ops = {OpFamily::Embedding, OpFamily::RMSNorm,   OpFamily::Linear,
                               OpFamily::Attention, OpFamily::Rope,      OpFamily::SwiGLU,
                               OpFamily::Add,       OpFamily::SoftmaxCrossEntropy};
  if (config_.moe.enabled()) ops.push_back(OpFamily::MoE);
  build(layers_->parts(config_), ops);
}

Llama::~Llama() = default;

const Tensor& Llama::head_weight() const {
  return layers_->lm_head ? layers_->lm_head->weight.v() : layers_->embedding.wte.v();
}
const nn::TpPlacement& Llama::head_placement() const {
  return layers_->lm_head ? layers_->lm_head->placement() : layers_->embedding.placement();
}

// ---- KV-cache decoding (Pope et al. 2022: prefill, then one position at a time) ----------

void Llama::begin_decode(int B, int max_len) {
  KILN_CHECK(B > 0 && max_len > 0 && max_len <= config_.block_size,
             "begin_decode: {} positions for {} sequences (block_size {})", max_len, B,
             config_.block_size);
  KILN_CHECK(!head_placement().active() && !layers_->embedding.placement().active(),
             "llama: decoding a tensor-parallel model is not supported yet");
  end_decode();
  State& d = *state_;
  d.dec_B = B;
  d.max_len = max_len;
  const int64_t kv = int64_t{config_.n_kv_head} * config_.head_dim();
  for (int l = 0; l < config_.n_layer; ++l) {
    d.k_cache.push_back(backend().empty(Shape{B, max_len, kv}, dtype(), MemCategory::Temporaries));
    d.v_cache.push_back(backend().empty(Shape{B, max_len, kv}, dtype(), MemCategory::Temporaries));
  }
}

void Llama::end_decode() {
  State& d = *state_;
  d.k_cache.clear();
  d.v_cache.clear();
  d.dec_B = d.max_len = d.past = 0;
}

int Llama::decoded_length() const { return state_->past; }

void Llama::decode(const Tensor& tokens, const Tensor& logits) {
  State& d = *state_;
  KILN_CHECK(!d.k_cache.empty(), "decode() needs begin_decode() first");
  KILN_CHECK(tokens.ndim() == 2 && tokens.size(0) == d.dec_B, "decode: tokens {} must be [{}, Tq]",
             tokens.str(), d.dec_B);
  const int64_t B = d.dec_B, Tq = tokens.size(1), C = config_.n_embd;
  KILN_CHECK(d.past + Tq <= d.max_len, "decode: {} positions exceed the cache of {}", d.past + Tq,
             d.max_len);
  check_shape(logits, Shape{B, config_.padded_vocab_size}, "decode logits");
  Backend& be = backend();
  const Stream s = be.default_stream();
  // The rotary angles of the new tokens: positions past .. past + Tq - 1.
  std::vector<int32_t> pos_h(static_cast<size_t>(B * Tq));
  for (size_t i = 0; i < pos_h.size(); ++i)
    pos_h[i] = static_cast<int32_t>(d.past + static_cast<int64_t>(i) % Tq);
  Tensor positions = be.empty(Shape{B, Tq}, DType::I32, MemCategory::Temporaries);
  be.copy_from_host(s, positions, pos_h.data());
  auto tmp = [&](Shape shape) { return be.empty(shape, dtype(), MemCategory::Temporaries); };
  Tensor x = tmp({B, Tq, C});
  const auto& blocks = layers_->blocks;
  const auto w = blocks.front().make_decode_scratch(be, B, Tq, dtype());
  layers_->embedding.forward(be, s, x, tokens);
  for (size_t l = 0; l < blocks.size(); ++l)
    blocks[l].decode(be, s, x, w, d.k_cache[l], d.v_cache[l], d.past, positions);
  d.past += static_cast<int>(Tq);
  // The final norm and the logits of each sequence's last position only.
  Tensor last = tmp({B, C}), lastn = tmp({B, C});
  last_positions(last, x);
  layers_->norm.forward_into(be, s, lastn, w.mean.view_at(0, Shape{B}),
                             w.rstd.view_at(0, Shape{B}), last);
  project_logits(logits, lastn, head_weight());
  be.synchronize(s);  // pos_h is read by the copy
}

}  // namespace kiln
