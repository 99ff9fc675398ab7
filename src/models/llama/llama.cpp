#include "models/llama/llama.h"

#include "models/llama/layers.h"

#include <vector>

namespace kiln {

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
  set_layers(DecoderLayers{&layers_->embedding, &layers_->blocks, &layers_->norm,
                           &layers_->head_weight(), &head_placement(), config_.vocab_size,
                           config_.n_embd, llama_balance_spec(config_)});
  std::vector<OpFamily> ops = {OpFamily::Embedding, OpFamily::RMSNorm,   OpFamily::Linear,
                               OpFamily::Attention, OpFamily::Rope,      OpFamily::SwiGLU,
                               OpFamily::Add,       OpFamily::SoftmaxCrossEntropy};
  if (config_.moe.enabled()) ops.push_back(OpFamily::MoE);
  build(layers_->parts(config_), ops);
}

Llama::~Llama() = default;

const Tensor& Llama::head_weight() const { return layers_->head_weight().v(); }
const nn::TpPlacement& Llama::head_placement() const { return layers_->head_placement(); }

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
