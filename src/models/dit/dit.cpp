#include "models/dit/dit.h"

#include "models/flow_frame.h"
#include "nn/adaln_block.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace kiln {

namespace {

nn::AdaLNBlockSpec dit_block_spec(const DiTConfig& c) {
  nn::AdaLNBlockSpec b;
  b.n_embd = c.n_embd;
  b.norm_eps = c.norm_eps;
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_head;
  b.attention.head_dim = c.n_embd / c.n_head;
  b.attention.causal = false;
  b.mlp_hidden = c.ffn_hidden_size;
  b.init_std = 0.02f;
  return b;
}

}  // namespace

/// The layers, named as facebookresearch/DiT's (dit.h lists the names).
struct DiTLayers {
  explicit DiTLayers(const DiTConfig& c)
      : frame(c, c.frequency_dim),
        y_table("y_embedder.embedding_table.weight", Shape{c.num_classes + 1, c.n_embd},
                nn::Init::normal(0.02f), false) {
    const nn::AdaLNBlockSpec spec = dit_block_spec(c);
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) blocks.emplace_back(fmt::format("blocks.{}.", l), spec);
  }

  std::vector<PartLayout> parts(const DiTConfig& c) {
    std::vector<PartLayout> out(blocks.size() + 2);
    const double C = c.n_embd, T = c.tokens();
    out.front().name = "embeddings";
    out.front().cost = frame.embeddings_cost();
    frame.collect_embeddings(out.front().params);
    out.front().params.push_back(&y_table);
    for (size_t l = 0; l < blocks.size(); ++l) {
      out[l + 1].name = fmt::format("blocks.{}", l);
      out[l + 1].cost = blocks[l].matmul_weights() + 6.0 * C * C / T;
      blocks[l].collect(out[l + 1].params);
    }
    PartLayout& f = out.back();
    f.name = "final_layer";
    f.cost = frame.final_cost();
    frame.collect_final(f.params);
    return out;
  }

  FlowFrame frame;
  nn::Param y_table;
  std::vector<nn::AdaLNBlock> blocks;
};

/// Host draws, device inputs, saved activations and scratch for one micro_batch B (the
/// frame holds its own).
struct DiT::State {
  int B = 0;
  std::vector<float> host_noise, host_t;
  std::vector<int32_t> host_labels, host_conditioning;  // host_conditioning: labels' rows
  Tensor labels;                // int32 [B,1] after label dropout
  Tensor cond, y_emb, cond_silu;  // [B,C] (y_emb [B,1,C])
  std::vector<Tensor> stream;   // [0] embeddings, [1 + l] block l's output, [B,N,C] each
  nn::SavedActivations saved;
  Tensor dcond_silu, dcond;     // [B,C]
  Tensor dresidual;             // [B,N,C]
  nn::AdaLNScratch scratch;
  bool have_grad = false;
};

DiT::DiT(const DiTConfig& config, Backend& backend, const ModelStorage& storage)
    : LayeredModel(backend, storage), config_(config) {
  config_.validate();
  KILN_CHECK(storage.plans.empty(), "dit: {} is not implemented for dit yet",
             storage.plans.empty() ? "" : storage.plans.front()->what());
  layers_ = std::make_unique<DiTLayers>(config_);
  state_ = std::make_unique<State>();
  build(layers_->parts(config_),
        {OpFamily::Patchify, OpFamily::Unpatchify, OpFamily::Embedding, OpFamily::LayerNorm,
         OpFamily::Linear, OpFamily::Attention, OpFamily::Gelu, OpFamily::Silu,
         OpFamily::Modulate, OpFamily::Add, OpFamily::FlowMatching});
}

DiT::~DiT() = default;

BatchShape DiT::batch_shape(int B, int T) const {
  KILN_CHECK(T == config_.tokens(), "dit: train.seq_len ({}) must be {}, the patch count",
             T, config_.tokens());
  BatchShape shape;
  shape.inputs.push_back({.name = "images", .shape = batched(B, image_shape()), .dtype = DType::F32});
  shape.targets = Shape{B};
  shape.target_range = config_.num_classes;
  return shape;
}

Shape DiT::image_shape() const { return layers_->frame.image_shape(); }

void DiT::set_dropout(bool on, uint64_t seed, uint64_t first_sample) {
  training_draws_ = on;
  seed_ = seed;
  first_sample_ = first_sample;
}

void DiT::reserve(int B) {
  State& a = *state_;
  Backend& be = backend();
  layers_->frame.reserve(be, B, dtype());
  if (a.B == B && a.saved.mode() == mode_ && !a.stream.empty()) return;
  a.stream.clear();  // free first so the peak is not doubled
  a.B = B;
  const DType dt = dtype();
  const int64_t C = config_.n_embd, N = config_.tokens();
  auto act = [&](Shape sh) { return be.empty(sh, dt, MemCategory::Activations); };
  a.labels = be.empty(Shape{B, 1}, DType::I32, MemCategory::Activations);
  a.cond = act(Shape{B, C});
  a.y_emb = act(Shape{B, 1, C});
  a.cond_silu = act(Shape{B, C});
  for (int l = 0; l <= config_.n_layer; ++l) a.stream.push_back(act(Shape{B, N, C}));
  const auto& blocks = layers_->blocks;
  a.saved.reserve(be, blocks.front().saved_specs(B, N, dt), config_.n_layer, mode_);
  a.dcond_silu = act(Shape{B, C});
  a.dcond = act(Shape{B, C});
  a.dresidual = act(Shape{B, N, C});
  a.scratch = blocks.front().make_scratch(be, B, N, dt);
}

void DiT::upload_labels(std::span<const int32_t> labels) {
  State& a = *state_;
  // A host buffer of the State, so the copy need not be waited for here.
  a.host_conditioning.assign(labels.begin(), labels.end());
  for (int32_t& v : a.host_conditioning) {
    KILN_CHECK(v >= -1 && v < config_.num_classes, "dit: label {} is outside [0, {})", v,
               config_.num_classes);
    if (v < 0) v = config_.num_classes;  // the null class
  }
  backend().copy_from_host(backend().default_stream(), a.labels, a.host_conditioning.data());
}

void DiT::run_forward() {
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int B = a.B;
  const int64_t C = config_.n_embd;
  DiTLayers& L = *layers_;
  hooks().before_forward(0);
  L.frame.embed_forward(be, s, a.stream[0], a.cond, a.scratch.tmp);
  be.embedding_forward(s, a.y_emb, a.labels, Tensor(), L.y_table.v(), Tensor());
  be.add(s, a.cond, a.cond, a.y_emb.reshape(Shape{B, C}));
  be.silu_forward(s, a.cond_silu, a.cond);
  hooks().after_forward(0);
  for (int l = 0; l < config_.n_layer; ++l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_forward(l + 1);
    const nn::AdaLNPass p{be, s, a.saved.block(l), a.scratch, a.cond_silu, a.dcond_silu,
                          a.saved.rerun_block(), a.saved.recompute_cheap()};
    L.blocks[i].forward(p, a.stream[i], a.stream[i + 1]);
    hooks().after_forward(l + 1);
  }
  hooks().before_forward(config_.n_layer + 1);
  L.frame.final_forward(be, s, a.stream.back(), a.cond_silu);
}

LossSum DiT::forward(const Batch& batch, float grad_scale) {
  const Tensor& labels = batch.targets;
  const Tensor& x0 = batch.require("images", arch());
  KILN_CHECK(labels.ndim() == 1 && labels.size(0) == x0.size(0) && labels.dtype() == DType::I32,
             "dit: needs images [B,H,W,C] and int32 labels [B], got {} and {}", x0.str(),
             labels.str());
  const int B = layers_->frame.check_images(x0, arch());
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  // The draws of global sample g = first_sample + b: time, noise, label dropout.
  const int64_t pixels = x0.numel() / B;
  a.host_t.resize(static_cast<size_t>(B));
  a.host_noise.resize(static_cast<size_t>(x0.numel()));
  a.host_labels.resize(static_cast<size_t>(B));
  be.copy_to_host(s, a.host_labels.data(), labels);
  be.synchronize(s);
  std::vector<int32_t> conditioning = a.host_labels;
  for (int b = 0; b < B; ++b) {
    const uint64_t g = first_sample_ + static_cast<uint64_t>(b);
    a.host_t[b] = draw_flow_sample(seed_, g, !training_draws_, pixels,
                                   a.host_noise.data() + static_cast<size_t>(b) * pixels);
    if (training_draws_ && draw_condition_dropout(seed_, g, config_.class_dropout))
      conditioning[static_cast<size_t>(b)] = -1;
  }
  return flow_loss(x0, a.host_labels, conditioning, a.host_noise, a.host_t, grad_scale,
                   batch.loss);
}

LossSum DiT::flow_loss(const Tensor& x0, std::span<const int32_t> labels,
                       std::span<const int32_t> conditioning, std::span<const float> noise,
                       std::span<const float> t, float grad_scale, const Tensor& loss) {
  const int B = static_cast<int>(x0.size(0));
  KILN_CHECK(labels.size() == static_cast<size_t>(B) && conditioning.size() == labels.size() &&
                 t.size() == labels.size() && noise.size() == static_cast<size_t>(x0.numel()),
             "dit: flow_loss of {} images needs {} labels, times and {} noise values", B, B,
             x0.numel());
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const bool with_grad = grad_scale > 0.f;
  for (int b = 0; b < B; ++b)
    KILN_CHECK(!(with_grad && labels[b] < 0), "dit: a training image has no label (sample {})", b);
  layers_->frame.set_flow_inputs(be, x0, noise, t, labels);
  upload_labels(conditioning);
  run_forward();
  Batch sums;  // where the loss goes: `loss`, or the model's own accumulator
  sums.loss = loss;
  layers_->frame.loss(be, s, loss_.target(be, sums), grad_scale);
  const LossSum out = loss_.result(be, sums);
  hooks().after_forward(config_.n_layer + 1);
  a.have_grad = with_grad;
  return out;
}

void DiT::backward() {
  State& a = *state_;
  KILN_CHECK(a.have_grad, "dit: backward() needs a preceding forward() with grad_scale > 0");
  a.have_grad = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int B = a.B;
  const int64_t C = config_.n_embd;
  DiTLayers& L = *layers_;
  const int last = config_.n_layer + 1;
  hooks().before_backward(last);
  L.frame.final_backward(be, s, a.dresidual, a.dcond_silu, a.stream.back(), a.cond_silu,
                         a.scratch.dtmp.view_at(0, a.dresidual.shape()));
  hooks().after_backward(last);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_backward(l + 1);
    const nn::AdaLNPass p{be, s, a.saved.block(l), a.scratch, a.cond_silu, a.dcond_silu,
                          a.saved.rerun_block(), a.saved.recompute_cheap()};
    L.blocks[i].backward(p, a.dresidual, a.stream[i], a.stream[i + 1]);
    hooks().after_backward(l + 1);
  }
  hooks().before_backward(0);
  // c = t_fc2(silu(t_fc1(freq))) + y_table[y];  cond_silu = silu(c)
  be.silu_backward(s, a.dcond, a.dcond_silu, a.cond);
  if (L.y_table.trainable)
    be.embedding_backward(s, L.y_table.g(), Tensor(), a.dcond.reshape(Shape{B, 1, C}), a.labels,
                          Tensor());
  L.frame.embed_backward(be, s, a.dresidual, a.dcond);
  hooks().after_backward(0);
}

void DiT::predict_velocity(const Tensor& xt, std::span<const float> t,
                           const FlowConditioning& conditioning, const Tensor& velocity) {
  const std::span<const int32_t> labels = conditioning.labels;
  const int B = layers_->frame.check_images(xt, arch());
  KILN_CHECK(t.size() == static_cast<size_t>(B) && labels.size() == static_cast<size_t>(B),
             "dit: {} images need {} times and labels (got {} and {})", B, B, t.size(),
             labels.size());
  check_shape(velocity, xt.shape(), "dit predict_velocity velocity");
  reserve(B);
  Backend& be = backend();
  layers_->frame.set_noisy_inputs(be, xt, t);
  upload_labels(labels);
  run_forward();
  layers_->frame.velocity(be, be.default_stream(), velocity);
  hooks().after_forward(config_.n_layer + 1);
}

}  // namespace kiln
