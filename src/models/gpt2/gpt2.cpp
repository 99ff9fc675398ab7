#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_state.h"

#include "nn/classifier.h"

#include <cmath>
#include <vector>

namespace kiln {

namespace {
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
      p.resident = true;
      p.cost = 0.0;
    } else if (k + 1 == params.size()) {
      p.name = "head";
      p.cost = c.padded_vocab_size * C;
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
  std::vector<ParamSpec> specs;
  lay_out(gpt2_parts(layers, config), part_alignment, &specs, nullptr);
  return specs;
}

GPT2::GPT2(const GPT2Config& config, Backend& backend, const ModelStorage& storage)
    : LayeredModel(backend, storage), config_(config) {
  layers_ = std::make_unique<GPT2Layers>(config_);
  if (storage.plan) storage.plan->apply(layers_->roles());
  build(gpt2_parts(*layers_, config_), {Op::Embedding, Op::LayerNorm, Op::Linear, Op::Attention, Op::Gelu,
                               Op::Add, Op::SoftmaxCrossEntropy});
}

GPT2::~GPT2() = default;

nlohmann::json GPT2::config_json() const { return gpt2_config_json(config_); }

void GPT2::set_activation_checkpointing(nn::ActivationCheckpointing mode) { checkpointing_ = mode; }

void GPT2::set_dropout(bool on, uint64_t seed, uint64_t call_index) {
  dropout_on_ = on && config_.dropout > 0.f;
  dropout_seed_ = seed;
  dropout_call_ = call_index;
}

void GPT2::reserve(int B, int T) {
  if (acts_ && acts_->B == B && acts_->T == T && acts_->saved.mode() == checkpointing_) return;
  acts_.reset();  // free first so the peak is not doubled
  auto a = std::make_unique<Activations>();
  a->B = B;
  a->T = T;
  const int64_t C = config_.n_embd, N = static_cast<int64_t>(B) * T;
  const DType dt = dtype();
  const auto& blocks = layers_->blocks;
  // The residual stream: [B,T,C], or this rank's rows under sequence parallelism.
  const Shape stream = blocks.front().residual_shape(B, T);
  const auto [rb, rt] = blocks.front().residual_bt(B, T);
  // Activations in the model dtype; statistics (LayerNorm mean/rstd, lse, losses) fp32.
  auto act = [&](Shape s) { return backend().empty(s, dt, MemCategory::Activations); };
  for (int l = 0; l <= config_.n_layer; ++l) a->stream.push_back(act(stream));
  a->saved.reserve(backend(), blocks.front().saved_specs(B, T, dt), config_.n_layer, checkpointing_);
  for (const nn::SavedSpec& s : layers_->ln_f.saved_specs(rb, rt, dt))
    a->head.push_back(backend().empty(s.shape, s.dtype, MemCategory::Activations));
  const nn::TokenPositionEmbedding& emb = layers_->embedding;
  a->head_scratch = nn::make_head_scratch(backend(), emb.placement(), N, C, emb.wte.local_shape()[0], dt);
  a->dresidual = act(stream);
  a->scratch = blocks.front().make_scratch(backend(), B, T, dt);
  acts_ = std::move(a);
}

DropoutSpec GPT2::dropout_spec(int block, uint64_t site) const {
  DropoutSpec d;
  if (!dropout_on_) return d;
  d.p = config_.dropout;
  d.seed = dropout_seed_;
  d.stream = ((dropout_call_ * static_cast<uint64_t>(config_.n_layer + 1) +
               static_cast<uint64_t>(block + 1)) << 2) | site;
  return d;
}

DropoutSpec GPT2::embedding_dropout() const {
  return nn::rows_dropout(dropout_spec(-1, nn::kEmbeddingSite), layers_->embedding.placement(),
                          acts_->stream[0].numel());
}

nn::BlockPass GPT2::block_pass(int l) const {
  const Activations& a = *acts_;
  return nn::BlockPass{backend(),
                       backend().default_stream(),
                       a.saved.block(l),
                       a.scratch,
                       dropout_spec(l, nn::kAttnProbsSite),
                       dropout_spec(l, nn::kAttnResidSite),
                       dropout_spec(l, nn::kMlpResidSite),
                       a.saved.rerun_block(),
                       a.saved.recompute_cheap(),
                       Tensor()};  // positions 0..T-1 (learned positions, no rotary)
}

void GPT2::run_forward(const Tensor& tokens, int B, int T) {
  KILN_CHECK(T <= config_.block_size, "sequence length {} exceeds block_size {}", T,
             config_.block_size);
  reserve(B, T);
  Activations& a = *acts_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  hooks().before_forward(0);
  const Tensor work = a.scratch.work ? a.scratch.work.reshape(Shape{B, T, config_.n_embd}) : Tensor();
  layers_->embedding.forward(be, s, a.stream[0], tokens, Tensor(), 0, work);
  if (dropout_on_) be.dropout_forward(s, a.stream[0], a.stream[0], embedding_dropout());
  hooks().after_forward(0);
  for (int l = 0; l < config_.n_layer; ++l) {
    hooks().before_forward(l + 1);
    const auto i = static_cast<size_t>(l);
    layers_->blocks[i].forward(block_pass(l), a.stream[i], a.stream[i + 1]);
    hooks().after_forward(l + 1);
  }
  hooks().before_forward(config_.n_layer + 1);
  layers_->ln_f.forward(be, s, a.head, a.stream.back());
}

LossSum GPT2::forward(const Batch& batch, float grad_scale) {
  const Tensor& tokens = batch.tokens;
  const Tensor& targets = batch.targets;
  KILN_CHECK(tokens.ndim() == 2 && targets.shape() == tokens.shape(),
             "forward: tokens {} and targets {} must both be [B,T]", tokens.str(), targets.str());
  KILN_CHECK(!batch.positions, "GPT-2: explicit positions are not supported yet (0..T-1 only)");
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  run_forward(tokens, B, T);
  Activations& a = *acts_;
  const bool with_grad = grad_scale > 0.f;
  const nn::Param& wte = layers_->embedding.wte;
  // The tied output projection: its logits' gradient lands in wte's gradient here, and
  // dL/d(ln_f output) in scratch.dtmp for backward(). Vocab-parallel when wte is split.
  const Tensor& x = a.head[nn::Norm::kOut];
  const Tensor dx = with_grad ? a.scratch.dtmp.view_at(0, x.shape()) : Tensor();
  const Tensor dwte = with_grad ? wte.g() : Tensor();
  const auto r = nn::head_cross_entropy(backend(), backend().default_stream(),
                                        layers_->embedding.placement(), x, wte.v(), targets,
                                        config_.vocab_size, grad_scale, dx, dwte, a.head_scratch);
  hooks().after_forward(config_.n_layer + 1);
  a.tokens = tokens;
  a.targets = targets;
  a.have_grad = with_grad;
  return {r.loss_sum, r.n_targets};
}

void GPT2::backward() {
  KILN_CHECK(acts_ && acts_->have_grad, "backward() needs a preceding forward() with grad_scale > 0");
  Activations& a = *acts_;
  a.have_grad = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  // Final LayerNorm: dresidual = LN_f'(dlnf), dlnf was left in scratch.dtmp by forward().
  hooks().before_backward(config_.n_layer + 1);
  be.fill(s, a.dresidual, 0.f);
  layers_->ln_f.backward(be, s, a.head, a.dresidual, a.scratch.dtmp.view_at(0, a.dresidual.shape()),
                         a.stream.back());
  hooks().after_backward(config_.n_layer + 1);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    hooks().before_backward(l + 1);
    const auto i = static_cast<size_t>(l);
    layers_->blocks[i].backward(block_pass(l), a.dresidual, a.stream[i], a.stream[i + 1]);
    hooks().after_backward(l + 1);
  }
  hooks().before_backward(0);
  if (dropout_on_) be.dropout_backward(s, a.dresidual, a.dresidual, embedding_dropout());
  const Tensor work =
      a.scratch.work ? a.scratch.work.reshape(Shape{a.B, a.T, config_.n_embd}) : Tensor();
  layers_->embedding.backward(be, s, a.dresidual, a.tokens, Tensor(), work);
  hooks().after_backward(0);
}

void GPT2::forward_logits(const Tensor& tokens, const Tensor& logits) {
  KILN_CHECK(tokens.ndim() == 2, "forward_logits: tokens must be [B,T], got {}", tokens.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  check_shape(logits, Shape{B, T, config_.padded_vocab_size}, "forward_logits logits");
  KILN_CHECK(!layers_->embedding.placement().active(),
             "GPT-2: logits of a tensor-parallel model are not supported yet");
  run_forward(tokens, B, T);
  project_logits(logits, acts_->head[nn::Norm::kOut], layers_->embedding.wte.v());
  hooks().after_forward(config_.n_layer + 1);
}

}  // namespace kiln
