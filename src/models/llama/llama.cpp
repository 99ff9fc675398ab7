#include "models/llama/llama.h"

#include "core/error.h"
#include "models/llama_layers.h"

#include <vector>

namespace kiln {

Llama::Llama(const LlamaConfig& config, Backend& backend, const ModelStorage& storage)
    : DecoderModel(backend, storage), config_(config) {
  config_.validate();
  layers_ = std::make_unique<LlamaLayers>(config_);
  for (const LayerPlan* plan : storage.plans) plan->apply(layers_->roles());
  cache_ = std::make_unique<LlamaKvCache>();
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
  cache_->begin(backend(), config_, *layers_, dtype(), B, max_len);
}

void Llama::end_decode() { cache_->end(); }

int Llama::decoded_length() const { return cache_->past(); }

void Llama::decode(const Tensor& tokens, const Tensor& logits) {
  const int B = cache_->batch();
  KILN_CHECK(B > 0, "decode() needs begin_decode() first");
  check_shape(logits, Shape{B, config_.padded_vocab_size}, "decode logits");
  Tensor last = backend().empty(Shape{B, config_.n_embd}, dtype(), MemCategory::Temporaries);
  cache_->decode(backend(), *layers_, tokens, last);
  project_logits(logits, last, head_weight());
}

}  // namespace kiln
