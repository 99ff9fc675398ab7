#include "models/vit/vit.h"

#include "nn/block.h"
#include "nn/classifier.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace kiln {

namespace {

nn::NormSpec layer_norm(const ViTConfig& c) {
  return nn::NormSpec{nn::NormKind::LayerNorm, c.norm_eps, /*weight=*/true, /*bias=*/true};
}

nn::BlockSpec vit_block_spec(const ViTConfig& c) {
  nn::BlockSpec b;
  b.n_embd = c.n_embd;
  b.norm = layer_norm(c);
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_head;
  b.attention.head_dim = c.n_embd / c.n_head;
  b.attention.causal = false;  // an encoder: every patch sees every patch
  b.mlp = nn::MlpKind::GeluTanh;
  b.mlp_hidden = c.ffn_hidden_size;
  b.bias = true;
  b.init_std = 0.02f;
  b.residual_init_std = 0.02f / std::sqrt(2.f * static_cast<float>(c.n_layer));
  b.names = {"norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"};
  return b;
}

}  // namespace

/// The layers, named as timm's VisionTransformer (vit.h lists the names).
struct ViTLayers {
  explicit ViTLayers(const ViTConfig& c)
      : patch_embed("patch_embed.proj", c.patch_dim(), c.n_embd, /*bias=*/true, 0.02f),
        pos_embed("pos_embed", Shape{c.tokens(), c.n_embd}, nn::Init::normal(0.02f),
                  /*decay=*/false),
        norm("norm", c.n_embd, layer_norm(c)),
        head("head.weight", Shape{c.num_classes, c.n_embd}, nn::Init::normal(0.02f),
             /*decay=*/true) {
    const nn::BlockSpec spec = vit_block_spec(c);
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) blocks.emplace_back(fmt::format("blocks.{}.", l), spec);
  }

  /// The parts: embeddings, each block, the head. Costs: the matmul weights a position
  /// meets in the part (the 6N rule's N).
  std::vector<PartLayout> parts(const ViTConfig& c) {
    std::vector<PartLayout> out(blocks.size() + 2);
    const double C = c.n_embd;
    out.front().name = "embeddings";
    out.front().cost = c.patch_dim() * C;
    patch_embed.collect(out.front().params);
    out.front().params.push_back(&pos_embed);
    for (size_t l = 0; l < blocks.size(); ++l) {
      out[l + 1].name = fmt::format("blocks.{}", l);
      out[l + 1].cost = 4.0 * C * C + 2.0 * C * c.ffn_hidden_size;
      blocks[l].collect(out[l + 1].params);
    }
    PartLayout& h = out.back();
    h.name = "head";
    h.cost = static_cast<double>(c.num_classes) * C / c.tokens();
    h.resident = true;  // head.weight's gradient is made in forward
    norm.collect(h.params);
    h.params.push_back(&head);
    return out;
  }

  nn::Linear patch_embed;
  nn::Param pos_embed;
  std::vector<nn::TransformerBlock> blocks;
  nn::Norm norm;
  nn::Param head;
};

/// Saved activations and scratch for one micro_batch B.
struct ViT::State {
  int B = 0;
  Tensor patches;              // [B,T,D] model dtype; row T-1 (the class token) stays 0
  Tensor pos_ids;              // int32 [B,T]: t (the rows of pos_embed)
  std::vector<Tensor> stream;  // [0] embeddings, [1 + l] block l's output, [B,T,C] each
  nn::SavedActivations saved;
  Tensor cls;                  // [B,1,C] the class token's output of the last block
  std::vector<Tensor> head;    // the final norm's saved out [B,1,C], mean, rstd [B]
  nn::HeadScratch head_scratch;
  Tensor dhead;                // [B,1,C] dL/d(norm out), made in forward
  Tensor dcls;                 // [B,1,C] dL/d cls
  Tensor logits;               // fp32 [B,K] (evaluation)
  Tensor dresidual;            // [B,T,C]
  nn::BlockScratch scratch;
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
  if (a.B == B && a.saved.mode() == mode_ && !a.stream.empty()) return;
  a.stream.clear();  // free first so the peak is not doubled
  a.head.clear();
  a.B = B;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const DType dt = dtype();
  const int64_t C = config_.n_embd, T = config_.tokens();
  auto act = [&](Shape sh) { return be.empty(sh, dt, MemCategory::Activations); };
  a.patches = act(Shape{B, T, config_.patch_dim()});
  be.fill(s, a.patches, 0.f);
  a.pos_ids = be.empty(Shape{B, T}, DType::I32, MemCategory::Activations);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % T);
  be.copy_from_host(s, a.pos_ids, ids.data());
  be.synchronize(s);  // ids is a host temporary
  for (int l = 0; l <= config_.n_layer; ++l) a.stream.push_back(act(Shape{B, T, C}));
  const auto& blocks = layers_->blocks;
  a.saved.reserve(be, blocks.front().saved_specs(B, T, dt), config_.n_layer, mode_);
  a.cls = act(Shape{B, 1, C});
  for (const nn::SavedSpec& sp : layers_->norm.saved_specs(B, 1, dt))
    a.head.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  a.head_scratch = nn::make_head_scratch(be, nn::TpPlacement{}, B, C, config_.num_classes, dt,
                                         storage().classifier_chunk_mb);
  a.dhead = act(Shape{B, 1, C});
  a.dcls = act(Shape{B, 1, C});
  a.logits = be.empty(Shape{B, config_.num_classes}, DType::F32, MemCategory::Activations);
  a.dresidual = act(Shape{B, T, C});
  a.scratch = blocks.front().make_scratch(be, B, T, dt);
}

void ViT::run_forward(const Tensor& images) {
  const int S = config_.image_size;
  KILN_CHECK(images.ndim() == 4 && images.size(1) == S && images.size(2) == S &&
                 images.size(3) == config_.num_channels && images.dtype() == DType::F32,
             "vit: images must be fp32 [B,{},{},{}], got {}", S, S, config_.num_channels,
             images.str());
  const int B = static_cast<int>(images.size(0));
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int64_t C = config_.n_embd, T = config_.tokens();
  hooks().before_forward(0);
  be.patchify(s, a.patches, images, config_.patch_size);
  layers_->patch_embed.forward(be, s, a.stream[0], a.patches);
  const Tensor pos = a.scratch.tmp.view_at(0, Shape{B, T, C});
  be.embedding_forward(s, pos, a.pos_ids, Tensor(), layers_->pos_embed.v(), Tensor());
  be.add(s, a.stream[0], a.stream[0], pos);
  hooks().after_forward(0);
  for (int l = 0; l < config_.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_forward(l + 1);
    const nn::BlockPass p{be, s, a.saved.block(l), a.scratch, {}, {}, {},
                          a.saved.rerun_block(), a.saved.recompute_cheap(), Tensor()};
    layers_->blocks[i].forward(p, a.stream[i], a.stream[i + 1]);
    hooks().after_forward(l + 1);
  }
  hooks().before_forward(config_.n_layer + 1);
  last_positions(a.cls.reshape(Shape{B, C}), a.stream.back());
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
  const Tensor x = a.head[nn::Norm::kOut].reshape(Shape{a.B, config_.n_embd});
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
    std::vector<float> logits(static_cast<size_t>(a.B) * K);
    std::vector<int32_t> y(static_cast<size_t>(a.B));
    be.copy_to_host(s, logits.data(), a.logits);
    be.copy_to_host(s, y.data(), labels);
    be.synchronize(s);
    out.correct = 0;
    for (int b = 0; b < a.B; ++b) {
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
  for (int64_t b = 0; b < a.B; ++b)
    be.copy(s, a.dresidual.view_at((b * T + T - 1) * C, Shape{C}), a.dcls.view_at(b * C, Shape{C}));
  hooks().after_backward(last);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_backward(l + 1);
    const nn::BlockPass p{be, s, a.saved.block(l), a.scratch, {}, {}, {},
                          a.saved.rerun_block(), a.saved.recompute_cheap(), Tensor()};
    layers_->blocks[i].backward(p, a.dresidual, a.stream[i], a.stream[i + 1]);
    hooks().after_backward(l + 1);
  }
  hooks().before_backward(0);
  if (layers_->pos_embed.trainable)
    be.embedding_backward(s, layers_->pos_embed.g(), Tensor(), a.dresidual, a.pos_ids, Tensor());
  layers_->patch_embed.backward(be, s, Tensor(), a.dresidual, a.patches);  // no image gradient
  hooks().after_backward(0);
}

void ViT::classify(const Tensor& images, const Tensor& logits) {
  check_shape(logits, Shape{images.size(0), config_.num_classes}, "vit forward_logits logits");
  run_forward(images);
  project_logits(logits, state_->head[nn::Norm::kOut].reshape(Shape{state_->B, config_.n_embd}),
                 layers_->head.v());
  hooks().after_forward(config_.n_layer + 1);
}

}  // namespace kiln
