#include "models/vit/vit.h"

#include "models/patch_encoder.h"
#include "nn/classifier.h"
#include "nn/norm.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace kiln {

/// The layers, named as timm's VisionTransformer (vit.h lists the names).
struct ViTLayers {
  explicit ViTLayers(const ViTConfig& c)
      : encoder(c, c.tokens(), ""),
        norm("norm", c.n_embd,
             nn::NormSpec{nn::NormKind::LayerNorm, c.norm_eps, /*weight=*/true, /*bias=*/true}),
        head("head.weight", Shape{c.num_classes, c.n_embd}, nn::Init::normal(0.02f),
             /*decay=*/true) {}

  /// The parts: embeddings, each block (the encoder's), the head.
  std::vector<PartLayout> parts(const ViTConfig& c) {
    std::vector<PartLayout> out;
    encoder.add_parts(out);
    PartLayout& h = out.emplace_back();
    h.name = "head";
    h.cost = static_cast<double>(c.num_classes) * c.n_embd / c.tokens();
    h.resident = true;  // head.weight's gradient is made in forward
    norm.collect(h.params);
    h.params.push_back(&head);
    return out;
  }

  PatchEncoder encoder;
  nn::Norm norm;
  nn::Param head;
};

/// Saved activations and scratch for one micro_batch B.
struct ViT::State {
  PatchActivations enc;        // the encoder's (its stream: [B,T,C] per block)
  Tensor cls;                  // [B,1,C] the class token's output of the last block
  std::vector<Tensor> head;    // the final norm's saved out [B,1,C], mean, rstd [B]
  nn::HeadScratch head_scratch;
  Tensor dhead;                // [B,1,C] dL/d(norm out), made in forward
  Tensor dcls;                 // [B,1,C] dL/d cls
  Tensor logits;               // fp32 [B,K] (evaluation)
  Tensor dresidual;            // [B,T,C]
  bool have_grad = false;
};

ViT::ViT(const ViTConfig& config, Backend& backend, const ModelStorage& storage)
    : LayeredModel(backend, storage), config_(config) {
  config_.validate();
  KILN_CHECK(storage.plans.empty(), "vit: {} is not implemented for vit yet",
             storage.plans.empty() ? "" : storage.plans.front()->what());
  layers_ = std::make_unique<ViTLayers>(config_);
  state_ = std::make_unique<State>();
  build(layers_->parts(config_),
        {OpFamily::Patchify, OpFamily::Embedding, OpFamily::LayerNorm, OpFamily::Linear,
         OpFamily::Attention, OpFamily::Gelu, OpFamily::Add, OpFamily::SoftmaxCrossEntropy});
}

ViT::~ViT() = default;

BatchShape ViT::batch_shape(int B, int T) const {
  KILN_CHECK(T == config_.tokens(), "vit: train.seq_len ({}) must be {}: {} patches and the "
             "class token", T, config_.tokens(), config_.patches());
  BatchShape shape;
  shape.inputs.push_back({.name = "images", .shape = batched(B, image_shape()), .dtype = DType::F32});
  shape.targets = Shape{B};
  shape.target_range = config_.num_classes;
  return shape;
}

Shape ViT::image_shape() const {
  return Shape{config_.image_size, config_.image_size, config_.num_channels};
}

void ViT::reserve(int B) {
  State& a = *state_;
  const bool same = a.enc.B == B && a.enc.saved.mode() == mode_ && !a.enc.stream.empty();
  if (same) return;
  a.head.clear();  // free first so the peak is not doubled
  Backend& be = backend();
  const DType dt = dtype();
  const int64_t C = config_.n_embd, T = config_.tokens();
  layers_->encoder.reserve(be, a.enc, B, dt, mode_);
  auto act = [&](Shape sh) { return be.empty(sh, dt, MemCategory::Activations); };
  a.cls = act(Shape{B, 1, C});
  for (const nn::SavedSpec& sp : layers_->norm.saved_specs(B, 1, dt))
    a.head.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  a.head_scratch = nn::make_head_scratch(be, nn::TpPlacement{}, B, C, config_.num_classes, dt,
                                         storage().classifier_chunk_mb);
  a.dhead = act(Shape{B, 1, C});
  a.dcls = act(Shape{B, 1, C});
  a.logits = be.empty(Shape{B, config_.num_classes}, DType::F32, MemCategory::Activations);
  a.dresidual = act(Shape{B, T, C});
}

void ViT::run_forward(const Tensor& images) {
  KILN_CHECK(images.ndim() == 4, "vit: images must be fp32 [B,H,W,C], got {}", images.str());
  const int B = static_cast<int>(images.size(0));
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  layers_->encoder.forward(be, s, a.enc, images, config_.n_layer, &hooks());
  hooks().before_forward(config_.n_layer + 1);
  last_positions(a.cls.reshape(Shape{B, config_.n_embd}), a.enc.stream.back());
  layers_->norm.forward(be, s, a.head, a.cls);
}

LossSum ViT::forward(const Batch& batch, float grad_scale) {
  const Tensor& labels = batch.targets;
  const Tensor& images = batch.require("images", arch());
  KILN_CHECK(labels.ndim() == 1 && labels.size(0) == images.size(0) && labels.dtype() == DType::I32,
             "vit: needs images [B,H,W,C] and int32 labels [B], got {} and {}", images.str(),
             labels.str());
  run_forward(images);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const bool with_grad = grad_scale > 0.f;
  const Tensor x = a.head[nn::Norm::kOut].reshape(Shape{a.enc.B, config_.n_embd});
  const nn::Param& head = layers_->head;
  nn::head_cross_entropy(be, s, nn::TpPlacement{}, x, head.v(), labels, config_.num_classes,
                         grad_scale, with_grad ? a.dhead.reshape(x.shape()) : Tensor(),
                         with_grad ? head.trainable_grad() : Tensor(), a.head_scratch,
                         loss_.target(be, batch));
  LossSum out = loss_.result(be, batch);
  if (!with_grad) {
    // Top-1 accuracy: the first largest logit of each image against its label.
    project_logits(a.logits, x, head.v());
    const int K = config_.num_classes;
    std::vector<float> logits(static_cast<size_t>(a.enc.B) * K);
    std::vector<int32_t> y(static_cast<size_t>(a.enc.B));
    be.copy_to_host(s, logits.data(), a.logits);
    be.copy_to_host(s, y.data(), labels);
    be.synchronize(s);
    out.correct = 0;
    for (int b = 0; b < a.enc.B; ++b) {
      if (y[b] < 0) continue;
      const float* row = logits.data() + static_cast<size_t>(b) * K;
      int best = 0;
      for (int k = 1; k < K; ++k)
        if (row[k] > row[best]) best = k;
      out.correct += best == y[b] ? 1 : 0;
    }
  }
  hooks().after_forward(config_.n_layer + 1);
  a.have_grad = with_grad;
  return out;
}

void ViT::backward() {
  State& a = *state_;
  KILN_CHECK(a.have_grad, "vit: backward() needs a preceding forward() with grad_scale > 0");
  a.have_grad = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int64_t C = config_.n_embd, T = config_.tokens();
  const int last = config_.n_layer + 1;
  hooks().before_backward(last);
  be.fill(s, a.dcls, 0.f);
  layers_->norm.backward(be, s, a.head, a.dcls, a.dhead, a.cls);
  // Only the class token's row of the last block's output reaches the loss.
  be.fill(s, a.dresidual, 0.f);
  for (int64_t b = 0; b < a.enc.B; ++b)
    be.copy(s, a.dresidual.view_at((b * T + T - 1) * C, Shape{C}), a.dcls.view_at(b * C, Shape{C}));
  hooks().after_backward(last);
  layers_->encoder.backward(be, s, a.enc, a.dresidual, config_.n_layer, &hooks());
}

void ViT::classify(const Tensor& images, const Tensor& logits) {
  check_shape(logits, Shape{images.size(0), config_.num_classes}, "vit forward_logits logits");
  run_forward(images);
  project_logits(logits, state_->head[nn::Norm::kOut].reshape(Shape{state_->enc.B, config_.n_embd}),
                 layers_->head.v());
  hooks().after_forward(config_.n_layer + 1);
}

}  // namespace kiln
