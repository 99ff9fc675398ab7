#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_state.h"

#include "nn/classifier.h"

#include <cmath>
#include <vector>

namespace kiln {

namespace {
// Philox streams of the dropout masks, one per (block, site): far from the parameters'
// streams 0..P-1 (the same seed initialises them).
constexpr uint64_t kDropoutStreams = uint64_t{0xD20} << 32;

// The parts of GPT-2 as the layers hold them: the embeddings (tied: wte is also the
// output projection), each block, the head.
// Costs: the matmul parameters a token meets in the part (the 6N rule's N): none in the
// embedding look-ups, 12 C^2 per block, Vp C in the head's tied projection.
std::vector<PartLayout> gpt2_parts(GPT2Layers& layers, const GPT2Config& c) {
  const auto params = layers.parts();
  const double C = c.n_embd;
  std::vector<PartLayout> out;
  for (size_t k = 0; k < params.size(); ++k) {
    PartLayout p;
    p.params = params[k];
    if (k == 0) {
      p.name = "embeddings";
      p.cost = 0.0;
    } else if (k + 1 == params.size()) {
      p.name = "head";
      p.cost = c.padded_vocab_size * C;
      p.params.push_back(&layers.embedding.wte);  // tied: the output projection
    } else {
      p.name = "h." + std::to_string(k - 1);
      p.cost = 12.0 * C * C;
    }
    out.push_back(std::move(p));
  }
  return out;
}
}  // namespace

std::vector<ParamSpec> gpt2_param_specs(const GPT2Config& config, int64_t part_alignment) {
  GPT2Layers layers(config);
  return lay_out(gpt2_parts(layers, config), part_alignment).params;
}

GPT2::GPT2(const GPT2Config& config, Backend& backend, const ModelStorage& storage)
    : DecoderModel(backend, storage), config_(config) {
  layers_ = std::make_unique<GPT2Layers>(config_);
  for (const LayerPlan* plan : storage.plans) plan->apply(layers_->roles());
  nn::TokenPositionEmbedding& emb = layers_->embedding;
  set_layers(DecoderLayers{&emb, &layers_->blocks, &layers_->ln_f, &emb.wte, &emb.placement(),
                           config_.vocab_size, config_.n_embd});
  build(gpt2_parts(*layers_, config_),
        {OpFamily::Embedding, OpFamily::LayerNorm, OpFamily::Linear, OpFamily::Attention,
         OpFamily::Gelu, OpFamily::Add, OpFamily::SoftmaxCrossEntropy});
}

GPT2::~GPT2() = default;

nlohmann::json GPT2::config_json() const { return gpt2_config_json(config_); }

void GPT2::set_dropout(bool on, uint64_t seed, uint64_t first_sample) {
  dropout_on_ = on && config_.dropout > 0.f;
  dropout_seed_ = seed;
  dropout_first_sample_ = first_sample;
}

DropoutSpec GPT2::dropout_spec(int block, uint64_t site, int64_t T) const {
  DropoutSpec d;
  if (!dropout_on_) return d;
  d.p = config_.dropout;
  d.seed = dropout_seed_;
  d.stream = kDropoutStreams + ((static_cast<uint64_t>(block + 1) << 2) | site);
  const int64_t per_sample =
      site == nn::kAttnProbsSite ? int64_t{config_.n_head} * T * T : T * config_.n_embd;
  d.offset = dropout_first_sample_ * static_cast<uint64_t>(per_sample);
  return d;
}

}  // namespace kiln
