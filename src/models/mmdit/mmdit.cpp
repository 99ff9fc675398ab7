#include "models/mmdit/mmdit.h"

#include "models/flow_frame.h"
#include "models/mmdit/text_encoder.h"
#include "nn/mmdit_block.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

namespace kiln {

namespace {

nn::MMDiTBlockSpec joint_block_spec(const MMDiTConfig& c, bool last) {
  nn::MMDiTBlockSpec b;
  b.n_embd = c.n_embd;
  b.norm_eps = c.norm_eps;
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_head;
  b.attention.head_dim = c.n_embd / c.n_head;
  b.attention.causal = false;
  b.mlp_hidden = c.ffn_hidden_size;
  b.init_std = 0.02f;
  b.context_pre_only = last;
  return b;
}

}  // namespace

/// The layers, named as SD3's where it has them (mmdit.h lists the names).
struct MMDiTLayers {
  explicit MMDiTLayers(const MMDiTConfig& c)
      : frame(c, c.frequency_dim),
        text(make_text_encoder(c)),
        context_embedder("context_embedder", c.text_width(), c.n_embd, true, 0.02f),
        y_fc1("y_embedder.mlp.0", c.text_width(), c.n_embd, true, 0.02f),
        y_fc2("y_embedder.mlp.2", c.n_embd, c.n_embd, true, 0.02f) {
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l)
      blocks.emplace_back(fmt::format("joint_blocks.{}.", l), joint_block_spec(c, l + 1 == c.n_layer));
  }

  std::vector<PartLayout> parts(const MMDiTConfig& c) {
    std::vector<PartLayout> out(blocks.size() + 2);
    const double C = c.n_embd, N = c.tokens(), Lc = c.caption_tokens, Ct = c.text_width();
    PartLayout& e = out.front();
    e.name = "embeddings";
    e.cost = frame.embeddings_cost() + (text->cost_per_position() + Ct * C) * Lc / N +
             (Ct * C + C * C) / N;
    frame.collect_embeddings(e.params);
    text->collect(e.params);
    context_embedder.collect(e.params);
    y_fc1.collect(e.params);
    y_fc2.collect(e.params);
    for (size_t l = 0; l < blocks.size(); ++l) {
      const double adaln = (blocks[l].context_pre_only() ? 8.0 : 12.0) * C * C / N;
      out[l + 1].name = fmt::format("joint_blocks.{}", l);
      out[l + 1].cost = blocks[l].x_matmul_weights() + blocks[l].c_matmul_weights() * Lc / N + adaln;
      blocks[l].collect(out[l + 1].params);
    }
    PartLayout& f = out.back();
    f.name = "final_layer";
    f.cost = frame.final_cost();
    frame.collect_final(f.params);
    return out;
  }

  FlowFrame frame;
  std::unique_ptr<TextEncoder> text;
  nn::Linear context_embedder, y_fc1, y_fc2;
  std::vector<nn::MMDiTBlock> blocks;
};

/// Host draws, device inputs, saved activations and scratch for one micro_batch B (the
/// frame and the text encoder hold their own).
struct MMDiT::State {
  int B = 0;
  std::vector<float> host_noise, host_t;
  std::vector<int32_t> host_counted, host_captions;  // host_captions [B*Lc] after dropout
  std::vector<int32_t> host_cu_text, host_cu_joint, host_pool;  // upload_captions' values
  Tensor tokens;               // int32 [B,Lc]: the captions, -1 padded
  Tensor cu_text, cu_joint;    // int32 [2B+1]: per sequence its caption (with the image),
                               // then its padding
  Tensor pool_rows;            // int32 [B,1]: the row of enc [B*Lc, C] pooled, -1: none
  Tensor pooled;               // [B,1,Ct]
  Tensor y_hidden, y_act, y_emb, cond, cond_silu;  // [B,C]
  std::vector<Tensor> stream_x;  // [0] embeddings, [1 + l] block l's image output [B,N,C]
  std::vector<Tensor> stream_c;  // [0] context_embedder(enc), [1 + l] block l's [B,Lc,C]
                                 // (none after the last, pre-only block)
  nn::SavedActivations saved;
  Tensor dcond_silu, dcond, dy_act;  // [B,C]
  Tensor dpooled;                    // [B,1,Ct]
  Tensor dres_x;                     // [B,N,C]
  Tensor dres_c;                     // [B,Lc,C]
  Tensor denc;                       // [B,Lc,Ct]
  nn::MMDiTScratch scratch;
  bool have_grad = false;
};

MMDiT::MMDiT(const MMDiTConfig& config, Backend& backend, const ModelStorage& storage)
    : LayeredModel(backend, storage), config_(config) {
  config_.validate();
  KILN_CHECK(storage.plans.empty(), "mmdit: {} is not implemented for mmdit yet",
             storage.plans.empty() ? "" : storage.plans.front()->what());
  layers_ = std::make_unique<MMDiTLayers>(config_);
  state_ = std::make_unique<State>();
  std::vector<OpFamily> ops = {OpFamily::Patchify, OpFamily::Unpatchify, OpFamily::Embedding,
                               OpFamily::LayerNorm, OpFamily::Linear, OpFamily::VarlenAttention,
                               OpFamily::Gelu,      OpFamily::Silu,   OpFamily::Modulate,
                               OpFamily::Add,       OpFamily::FlowMatching};
  if (config_.text_encoder == TextEncoderKind::Llama)
    ops.insert(ops.end(), {OpFamily::RMSNorm, OpFamily::Rope, OpFamily::SwiGLU});
  build(layers_->parts(config_), ops);
}

MMDiT::~MMDiT() = default;

BatchShape MMDiT::batch_shape(int B, int T) const {
  KILN_CHECK(T == config_.tokens(), "mmdit: train.seq_len ({}) must be {}, the patch count",
             T, config_.tokens());
  BatchShape shape;
  shape.inputs.push_back({.name = "images", .shape = batched(B, image_shape()), .dtype = DType::F32});
  shape.inputs.push_back(
      {.name = "tokens", .shape = Shape{B, config_.caption_tokens}, .dtype = DType::I32});
  shape.targets = Shape{B};
  shape.target_range = 1;
  return shape;
}

Shape MMDiT::image_shape() const { return layers_->frame.image_shape(); }

void MMDiT::set_dropout(bool on, uint64_t seed, uint64_t first_sample) {
  training_draws_ = on;
  seed_ = seed;
  first_sample_ = first_sample;
}

void MMDiT::reserve(int B) {
  State& a = *state_;
  Backend& be = backend();
  MMDiTLayers& L = *layers_;
  const DType dt = dtype();
  L.frame.reserve(be, B, dt);
  L.text->reserve(be, B, dt, mode_);
  if (a.B == B && a.saved.mode() == mode_ && !a.stream_x.empty()) return;
  a.stream_x.clear();  // free first so the peak is not doubled
  a.stream_c.clear();
  a.B = B;
  const int64_t C = config_.n_embd, N = config_.tokens(), Lc = config_.caption_tokens;
  const int64_t Ct = config_.text_width();
  auto act = [&](Shape sh) { return be.empty(sh, dt, MemCategory::Activations); };
  auto i32 = [&](Shape sh) { return be.empty(sh, DType::I32, MemCategory::Activations); };
  a.tokens = i32(Shape{B, Lc});
  a.cu_text = i32(Shape{2 * B + 1});
  a.cu_joint = i32(Shape{2 * B + 1});
  a.pool_rows = i32(Shape{B, 1});
  a.pooled = act(Shape{B, 1, Ct});
  for (Tensor* t : {&a.y_hidden, &a.y_act, &a.y_emb, &a.cond, &a.cond_silu, &a.dcond_silu,
                    &a.dcond, &a.dy_act})
    *t = act(Shape{B, C});
  for (int l = 0; l <= config_.n_layer; ++l) a.stream_x.push_back(act(Shape{B, N, C}));
  for (int l = 0; l < config_.n_layer; ++l) a.stream_c.push_back(act(Shape{B, Lc, C}));
  std::vector<std::vector<nn::SavedSpec>> specs;
  for (const nn::MMDiTBlock& b : L.blocks) specs.push_back(b.saved_specs(B, N, Lc, dt));
  a.saved.reserve(be, specs, mode_);
  a.dpooled = act(Shape{B, 1, Ct});
  a.dres_x = act(Shape{B, N, C});
  a.dres_c = act(Shape{B, Lc, C});
  a.denc = act(Shape{B, Lc, Ct});
  a.scratch = L.blocks.front().make_scratch(be, B, N, Lc, dt);
}

void MMDiT::upload_captions(std::span<const int32_t> captions) {
  State& a = *state_;
  const int B = a.B;
  const int64_t Lc = config_.caption_tokens, T = config_.tokens() + Lc;
  KILN_CHECK(captions.size() == static_cast<size_t>(B * Lc),
             "mmdit: {} captions need {} token slots, got {}", B, B * Lc, captions.size());
  // Host buffers of the State, so the copies need not be waited for here.
  a.host_captions.assign(captions.begin(), captions.end());
  a.host_cu_text.assign(1, 0);
  a.host_cu_joint.assign(1, 0);
  a.host_pool.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = captions.data() + b * Lc;
    int64_t n = 0;
    while (n < Lc && row[n] >= 0) ++n;
    for (int64_t i = 0; i < Lc; ++i) {
      KILN_CHECK(i < n ? row[i] < config_.vocab_size : row[i] == -1,
                 "mmdit: caption {} has {} at slot {} (ids in [0, {}) first, then -1)", b,
                 row[i], i, config_.vocab_size);
    }
    a.host_cu_text.push_back(static_cast<int32_t>(b * Lc + n));
    a.host_cu_text.push_back(static_cast<int32_t>((b + 1) * Lc));
    a.host_cu_joint.push_back(static_cast<int32_t>(b * T + config_.tokens() + n));
    a.host_cu_joint.push_back(static_cast<int32_t>((b + 1) * T));
    a.host_pool[static_cast<size_t>(b)] = n > 0 ? static_cast<int32_t>(b * Lc + n - 1) : -1;
  }
  Backend& be = backend();
  const Stream s = be.default_stream();
  be.copy_from_host(s, a.tokens, a.host_captions.data());
  be.copy_from_host(s, a.cu_text, a.host_cu_text.data());
  be.copy_from_host(s, a.cu_joint, a.host_cu_joint.data());
  be.copy_from_host(s, a.pool_rows, a.host_pool.data());
}

void MMDiT::run_forward() {
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int B = a.B;
  const int64_t Lc = config_.caption_tokens, Ct = config_.text_width();
  MMDiTLayers& L = *layers_;
  hooks().before_forward(0);
  L.text->forward(be, s, a.tokens, a.cu_text);
  const Tensor& enc = L.text->output();
  L.context_embedder.forward(be, s, a.stream_c[0], enc);
  be.embedding_forward(s, a.pooled, a.pool_rows, Tensor(), enc.reshape(Shape{B * Lc, Ct}),
                       Tensor());
  L.y_fc1.forward(be, s, a.y_hidden, a.pooled.reshape(Shape{B, Ct}));
  be.silu_forward(s, a.y_act, a.y_hidden);
  L.y_fc2.forward(be, s, a.y_emb, a.y_act);
  L.frame.embed_forward(be, s, a.stream_x[0], a.cond, a.scratch.common.tmp);
  be.add(s, a.cond, a.cond, a.y_emb);
  be.silu_forward(s, a.cond_silu, a.cond);
  hooks().after_forward(0);
  const int n = config_.n_layer;
  for (int l = 0; l < n; ++l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_forward(l + 1);
    const nn::MMDiTPass p{be,         s,           a.saved.block(l),       a.scratch,
                          a.cond_silu, a.dcond_silu, a.cu_joint, a.saved.rerun_block(),
                          a.saved.recompute_cheap()};
    L.blocks[i].forward(p, a.stream_x[i], a.stream_c[i], a.stream_x[i + 1],
                        l + 1 < n ? a.stream_c[i + 1] : Tensor());
    hooks().after_forward(l + 1);
  }
  hooks().before_forward(n + 1);
  L.frame.final_forward(be, s, a.stream_x.back(), a.cond_silu);
}

LossSum MMDiT::forward(const Batch& batch, float grad_scale) {
  const Tensor& counted = batch.targets;
  const Tensor& x0 = batch.require("images", arch());
  const Tensor& captions = batch.require("tokens", arch());
  const int B = layers_->frame.check_images(x0, arch());
  KILN_CHECK(counted.ndim() == 1 && counted.size(0) == B && counted.dtype() == DType::I32 &&
                 captions.shape() == (Shape{B, config_.caption_tokens}) &&
                 captions.dtype() == DType::I32,
             "mmdit: needs int32 targets [B] and captions [B,{}] beside images {}, got {} and {}",
             config_.caption_tokens, x0.str(), counted.str(), captions.str());
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  a.host_counted.resize(static_cast<size_t>(B));
  std::vector<int32_t> conditioning(static_cast<size_t>(captions.numel()));
  be.copy_to_host(s, a.host_counted.data(), counted);
  be.copy_to_host(s, conditioning.data(), captions);
  be.synchronize(s);
  // The draws of global sample g = first_sample + b: time, noise, caption dropout.
  const int64_t pixels = x0.numel() / B, Lc = config_.caption_tokens;
  a.host_t.resize(static_cast<size_t>(B));
  a.host_noise.resize(static_cast<size_t>(x0.numel()));
  for (int b = 0; b < B; ++b) {
    const uint64_t g = first_sample_ + static_cast<uint64_t>(b);
    a.host_t[b] = draw_flow_sample(seed_, g, !training_draws_, pixels,
                                   a.host_noise.data() + static_cast<size_t>(b) * pixels);
    if (training_draws_ && draw_condition_dropout(seed_, g, config_.caption_dropout))
      std::fill_n(conditioning.begin() + b * Lc, Lc, -1);
  }
  return flow_loss(x0, a.host_counted, conditioning, a.host_noise, a.host_t, grad_scale,
                   batch.loss);
}

LossSum MMDiT::flow_loss(const Tensor& x0, std::span<const int32_t> counted,
                         std::span<const int32_t> captions, std::span<const float> noise,
                         std::span<const float> t, float grad_scale, const Tensor& loss) {
  const int B = static_cast<int>(x0.size(0));
  KILN_CHECK(counted.size() == static_cast<size_t>(B) && t.size() == counted.size() &&
                 noise.size() == static_cast<size_t>(x0.numel()),
             "mmdit: flow_loss of {} images needs {} flags, times and {} noise values", B, B,
             x0.numel());
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const bool with_grad = grad_scale > 0.f;
  for (int b = 0; b < B; ++b)
    KILN_CHECK(counted[b] == 0 || (counted[b] == -1 && !with_grad),
               "mmdit: sample {} has target {} (0: counted, -1: not, and only without "
               "gradients)", b, counted[b]);
  layers_->frame.set_flow_inputs(be, x0, noise, t, counted);
  upload_captions(captions);
  run_forward();
  Batch sums;  // where the loss goes: `loss`, or the model's own accumulator
  sums.loss = loss;
  layers_->frame.loss(be, be.default_stream(), loss_.target(be, sums), grad_scale);
  const LossSum out = loss_.result(be, sums);
  hooks().after_forward(config_.n_layer + 1);
  a.have_grad = with_grad;
  return out;
}

void MMDiT::backward() {
  State& a = *state_;
  KILN_CHECK(a.have_grad, "mmdit: backward() needs a preceding forward() with grad_scale > 0");
  a.have_grad = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int B = a.B, n = config_.n_layer;
  const int64_t Lc = config_.caption_tokens, Ct = config_.text_width();
  MMDiTLayers& L = *layers_;
  hooks().before_backward(n + 1);
  L.frame.final_backward(be, s, a.dres_x, a.dcond_silu, a.stream_x.back(), a.cond_silu,
                         a.scratch.common.dtmp.view_at(0, a.dres_x.shape()));
  be.fill(s, a.dres_c, 0.f);  // the last block's context outputs are not used
  hooks().after_backward(n + 1);
  for (int l = n - 1; l >= 0; --l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_backward(l + 1);
    const nn::MMDiTPass p{be,         s,           a.saved.block(l),       a.scratch,
                          a.cond_silu, a.dcond_silu, a.cu_joint, a.saved.rerun_block(),
                          a.saved.recompute_cheap()};
    L.blocks[i].backward(p, a.dres_x, a.dres_c, a.stream_x[i], a.stream_c[i], a.stream_x[i + 1],
                         l + 1 < n ? a.stream_c[i + 1] : Tensor());
    hooks().after_backward(l + 1);
  }
  hooks().before_backward(0);
  // c = temb + y_fc2(silu(y_fc1(pooled)));  cond_silu = silu(c)
  be.silu_backward(s, a.dcond, a.dcond_silu, a.cond);
  L.y_fc2.backward(be, s, a.dy_act, a.dcond, a.y_act);
  be.silu_backward(s, a.dy_act, a.dy_act, a.y_hidden);
  L.y_fc1.backward(be, s, a.dpooled.reshape(Shape{B, Ct}), a.dy_act,
                   a.pooled.reshape(Shape{B, Ct}));
  // enc feeds the context stream and, at the pooled rows, y.
  const Tensor& enc = L.text->output();
  L.context_embedder.backward(be, s, a.denc, a.dres_c, enc);
  be.embedding_backward(s, a.denc.reshape(Shape{B * Lc, Ct}), Tensor(), a.dpooled, a.pool_rows,
                        Tensor());
  L.text->backward(be, s, a.denc, a.tokens, a.cu_text);
  L.frame.embed_backward(be, s, a.dres_x, a.dcond);
  hooks().after_backward(0);
}

void MMDiT::predict_velocity(const Tensor& xt, std::span<const float> t,
                             const FlowConditioning& conditioning, const Tensor& velocity) {
  const int B = layers_->frame.check_images(xt, arch());
  const auto& captions = conditioning.captions;
  KILN_CHECK(t.size() == static_cast<size_t>(B) && captions.size() == static_cast<size_t>(B),
             "mmdit: {} images need {} times and captions (got {} and {})", B, B, t.size(),
             captions.size());
  check_shape(velocity, xt.shape(), "mmdit predict_velocity velocity");
  const int64_t Lc = config_.caption_tokens;
  std::vector<int32_t> slots(static_cast<size_t>(B * Lc), -1);
  for (int b = 0; b < B; ++b) {
    const auto& cap = captions[static_cast<size_t>(b)];
    KILN_CHECK(static_cast<int64_t>(cap.size()) <= Lc,
               "mmdit: caption {} has {} tokens, more than the model's {} (model.caption_tokens)",
               b, cap.size(), Lc);
    std::copy(cap.begin(), cap.end(), slots.begin() + b * Lc);
  }
  reserve(B);
  Backend& be = backend();
  layers_->frame.set_noisy_inputs(be, xt, t);
  upload_captions(slots);
  run_forward();
  layers_->frame.velocity(be, be.default_stream(), velocity);
  hooks().after_forward(config_.n_layer + 1);
}

}  // namespace kiln
