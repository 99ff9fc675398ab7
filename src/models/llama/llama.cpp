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

nn::BlockSpec llama_block_spec(const LlamaConfig& c) {
  nn::BlockSpec b;
  b.n_embd = c.n_embd;
  b.norm = rms_spec(c);
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_kv_head;
  b.attention.head_dim = c.head_dim();
  b.attention.causal = true;
  b.attention.rotary = true;
  b.attention.rope = c.rope;
  b.mlp = nn::MlpKind::SwiGLU;
  b.mlp_hidden = c.ffn_hidden_size;
  b.bias = false;
  b.init_std = 0.02f;
  b.residual_init_std = 0.02f / std::sqrt(2.f * static_cast<float>(c.n_layer));
  b.names = {"input_layernorm", "self_attn.qkv_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_up_proj", "mlp.down_proj"};
  return b;
}

}  // namespace

/// The layers, named as Hugging Face's LlamaForCausalLM (llama.h lists the names).
struct LlamaLayers {
  explicit LlamaLayers(const LlamaConfig& c)
      : embedding("model.embed_tokens.weight", "", c.vocab_size, c.padded_vocab_size,
                  /*max_positions=*/0, c.n_embd, 0.02f),
        norm("model.norm", c.n_embd, rms_spec(c)) {
    const nn::BlockSpec spec = llama_block_spec(c);
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l)
      blocks.emplace_back(fmt::format("model.layers.{}.", l), spec);
    if (!c.tie_embeddings) {
      lm_head.emplace("lm_head", c.n_embd, c.padded_vocab_size, /*bias=*/false, 0.02f);
      lm_head->weight.init.zero_rows_from = c.vocab_size;
    }
  }

  /// The parts: embeddings, each block, the head (final norm, lm_head when untied).
  /// Costs: the matmul weights a token meets in the part (the 6N rule's N).
  std::vector<PartLayout> parts(const LlamaConfig& c) {
    std::vector<PartLayout> out(blocks.size() + 2);
    out.front().name = "embeddings";
    out.front().cost = 0.0;
    out.front().resident = c.tie_embeddings;  // also the output projection
    embedding.collect(out.front().params);
    const double C = c.n_embd, HD = c.head_dim();
    for (size_t l = 0; l < blocks.size(); ++l) {
      PartLayout& p = out[l + 1];
      p.name = fmt::format("layers.{}", l);
      p.cost = C * (c.n_head + 2 * c.n_kv_head) * HD + c.n_head * HD * C +
               3.0 * C * c.ffn_hidden_size;
      blocks[l].collect(p.params);
    }
    PartLayout& head = out.back();
    head.name = "head";
    head.cost = static_cast<double>(c.padded_vocab_size) * C;
    head.resident = !c.tie_embeddings;  // lm_head's gradient is made in forward
    norm.collect(head.params);
    if (lm_head) lm_head->collect(head.params);
    return out;
  }

  /// The layers by role, for a LayerPlan.
  LayerRoles roles() {
    return layer_roles("llama", embedding, blocks, norm, lm_head ? &*lm_head : nullptr);
  }

  nn::TokenPositionEmbedding embedding;
  std::vector<nn::TransformerBlock> blocks;
  nn::Norm norm;
  std::optional<nn::Linear> lm_head;
};

/// Saved activations for one (B, T) and the KV caches of decoding.
struct Llama::State {
  int B = 0, T = 0;
  std::vector<Tensor> stream;  // [0] embeddings, [1 + l] block l's output, each [B,T,C]
                               // (the rank's [B*T/tp, C] rows under sequence parallelism)
  nn::SavedActivations saved;  // the blocks' saved tensors under the checkpointing mode
  std::vector<Tensor> head;    // the final norm's saved out [B,T,C] and rstd [B*T]
  nn::HeadScratch head_scratch;
  Tensor dresidual;
  nn::BlockScratch scratch;    // dtmp also holds dL/d(final norm out) from forward
  Tensor tokens, positions;    // the last forward's inputs (views)
  bool have_grad = false;
  // Decoding.
  int dec_B = 0, max_len = 0, past = 0;
  std::vector<Tensor> k_cache, v_cache;  // per layer [B, max_len, NKV HD]
};

Llama::Llama(const LlamaConfig& config, Backend& backend, const ModelStorage& storage)
    : LayeredModel(backend, storage), config_(config) {
  config_.validate();
  layers_ = std::make_unique<LlamaLayers>(config_);
  if (storage.plan) storage.plan->apply(layers_->roles());
  state_ = std::make_unique<State>();
  build(layers_->parts(config_), {Op::Embedding, Op::RMSNorm, Op::Linear, Op::Attention,
                                  Op::Rope, Op::SwiGLU, Op::Add, Op::SoftmaxCrossEntropy});
}

Llama::~Llama() = default;

const Tensor& Llama::head_weight() const {
  return layers_->lm_head ? layers_->lm_head->weight.v() : layers_->embedding.wte.v();
}
const Tensor& Llama::head_grad() const {
  return layers_->lm_head ? layers_->lm_head->weight.g() : layers_->embedding.wte.g();
}
int64_t Llama::head_weight_rows() const {
  return (layers_->lm_head ? layers_->lm_head->weight : layers_->embedding.wte).local_shape()[0];
}
const nn::TpPlacement& Llama::head_placement() const {
  return layers_->lm_head ? layers_->lm_head->placement() : layers_->embedding.placement();
}
Tensor Llama::stream_work() const {
  const State& a = *state_;
  return a.scratch.work ? a.scratch.work.reshape(Shape{a.B, a.T, config_.n_embd}) : Tensor();
}

void Llama::reserve(int B, int T) {
  State& a = *state_;
  if (a.B == B && a.T == T && a.saved.mode() == mode_ && !a.stream.empty()) return;
  a.stream.clear();  // free first so the peak is not doubled
  a.head.clear();
  a.B = B, a.T = T;
  Backend& be = backend();
  const DType dt = dtype();
  const int64_t C = config_.n_embd;
  auto act = [&](Shape s) { return be.empty(s, dt, MemCategory::Activations); };
  const auto& blocks = layers_->blocks;
  const Shape stream = blocks.front().residual_shape(B, T);
  const auto [rb, rt] = blocks.front().residual_bt(B, T);
  for (int l = 0; l <= config_.n_layer; ++l) a.stream.push_back(act(stream));
  a.saved.reserve(be, blocks.front().saved_specs(B, T, dt), config_.n_layer, mode_);
  for (const nn::SavedSpec& sp : layers_->norm.saved_specs(rb, rt, dt))
    a.head.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  a.head_scratch = nn::make_head_scratch(be, head_placement(), int64_t{B} * T, C,
                                         head_weight_rows(), dt);
  a.dresidual = act(stream);
  a.scratch = blocks.front().make_scratch(be, B, T, dt);
}

void Llama::run_forward(const Tensor& tokens, const Tensor& positions) {
  KILN_CHECK(tokens.ndim() == 2, "llama: tokens must be [B,T], got {}", tokens.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  KILN_CHECK(T <= config_.block_size, "llama: sequence length {} exceeds block_size {}", T,
             config_.block_size);
  reserve(B, T);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  hooks().before_forward(0);
  layers_->embedding.forward(be, s, a.stream[0], tokens, Tensor(), 0, stream_work());
  hooks().after_forward(0);
  for (int l = 0; l < config_.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_forward(l + 1);
    const nn::BlockPass p{be, s, a.saved.block(l), a.scratch, {}, {}, {},
                          a.saved.rerun_block(), a.saved.recompute_cheap(), positions};
    layers_->blocks[i].forward(p, a.stream[i], a.stream[i + 1]);
    hooks().after_forward(l + 1);
  }
  hooks().before_forward(config_.n_layer + 1);
  layers_->norm.forward(be, s, a.head, a.stream.back());
}

LossSum Llama::forward(const Batch& batch, float grad_scale) {
  KILN_CHECK(batch.targets.shape() == batch.tokens.shape(),
             "llama: tokens {} and targets {} must both be [B,T]", batch.tokens.str(),
             batch.targets.str());
  run_forward(batch.tokens, batch.positions);
  State& a = *state_;
  const bool with_grad = grad_scale > 0.f;
  // The output projection: its gradient lands in lm_head's (or the tied embedding's)
  // here, dL/d(final norm out) in scratch.dtmp for backward().
  const Tensor& x = a.head[nn::Norm::kOut];
  const auto r = nn::head_cross_entropy(
      backend(), backend().default_stream(), head_placement(), x, head_weight(), batch.targets,
      config_.vocab_size, grad_scale, with_grad ? a.scratch.dtmp.view_at(0, x.shape()) : Tensor(),
      with_grad ? head_grad() : Tensor(), a.head_scratch);
  hooks().after_forward(config_.n_layer + 1);
  a.tokens = batch.tokens;
  a.positions = batch.positions;
  a.have_grad = with_grad;
  return {r.loss_sum, r.n_targets};
}

void Llama::backward() {
  State& a = *state_;
  KILN_CHECK(a.have_grad, "llama: backward() needs a preceding forward() with grad_scale > 0");
  a.have_grad = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int last = config_.n_layer + 1;
  hooks().before_backward(last);
  be.fill(s, a.dresidual, 0.f);
  layers_->norm.backward(be, s, a.head, a.dresidual, a.scratch.dtmp.view_at(0, a.dresidual.shape()),
                         a.stream.back());
  hooks().after_backward(last);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_backward(l + 1);
    const nn::BlockPass p{be, s, a.saved.block(l), a.scratch, {}, {}, {},
                          a.saved.rerun_block(), a.saved.recompute_cheap(), a.positions};
    layers_->blocks[i].backward(p, a.dresidual, a.stream[i], a.stream[i + 1]);
    hooks().after_backward(l + 1);
  }
  hooks().before_backward(0);
  layers_->embedding.backward(be, s, a.dresidual, a.tokens, Tensor(), stream_work());
  hooks().after_backward(0);
}

void Llama::forward_logits(const Tensor& tokens, const Tensor& logits) {
  KILN_CHECK(tokens.ndim() == 2, "forward_logits: tokens must be [B,T], got {}", tokens.str());
  check_shape(logits, Shape{tokens.size(0), tokens.size(1), config_.padded_vocab_size},
              "forward_logits logits");
  KILN_CHECK(!head_placement().active() && !layers_->embedding.placement().active(),
             "llama: logits of a tensor-parallel model are not supported yet");
  run_forward(tokens, Tensor());
  project_logits(logits, state_->head[nn::Norm::kOut], head_weight());
  hooks().after_forward(config_.n_layer + 1);
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
