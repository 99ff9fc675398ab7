#include "models/dit/dit.h"

#include "core/rng.h"
#include "nn/adaln_block.h"
#include "nn/linear.h"
#include "nn/norm.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace kiln {

namespace {

// Philox streams of the per-sample draws (far from the parameters' streams 0..P-1).
constexpr uint64_t kNoiseStream = uint64_t{0xD17} << 32, kTimeStream = kNoiseStream + 1,
                   kLabelStream = kNoiseStream + 2;
constexpr uint64_t kEvalStreams = 16;  // evaluation: the same streams + 16

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

nn::NormSpec plain_norm(const DiTConfig& c) {
  return nn::NormSpec{nn::NormKind::LayerNorm, c.norm_eps, /*weight=*/false, /*bias=*/false};
}

}  // namespace

/// The layers, named as facebookresearch/DiT's (dit.h lists the names).
struct DiTLayers {
  explicit DiTLayers(const DiTConfig& c)
      : x_embedder("x_embedder.proj", c.patch_dim(), c.n_embd, true, 0.02f),
        pos_embed("pos_embed", Shape{c.tokens(), c.n_embd}, nn::Init::normal(0.02f), false),
        t_fc1("t_embedder.mlp.0", c.frequency_dim, c.n_embd, true, 0.02f),
        t_fc2("t_embedder.mlp.2", c.n_embd, c.n_embd, true, 0.02f),
        y_table("y_embedder.embedding_table.weight", Shape{c.num_classes + 1, c.n_embd},
                nn::Init::normal(0.02f), false),
        final_norm("final_layer.norm_final", c.n_embd, plain_norm(c)),
        final_adaln("final_layer.adaLN_modulation.1", c.n_embd, 2 * c.n_embd, true, 0.f),
        final_linear("final_layer.linear", c.n_embd, c.patch_dim(), true, 0.f) {
    final_adaln.weight.init = nn::Init::zeros();
    final_linear.weight.init = nn::Init::zeros();
    const nn::AdaLNBlockSpec spec = dit_block_spec(c);
    blocks.reserve(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) blocks.emplace_back(fmt::format("blocks.{}.", l), spec);
  }

  std::vector<PartLayout> parts(const DiTConfig& c) {
    std::vector<PartLayout> out(blocks.size() + 2);
    const double C = c.n_embd, T = c.tokens(), D = c.patch_dim();
    out.front().name = "embeddings";
    out.front().cost = D * C + (c.frequency_dim * C + C * C) / T;
    x_embedder.collect(out.front().params);
    out.front().params.push_back(&pos_embed);
    t_fc1.collect(out.front().params);
    t_fc2.collect(out.front().params);
    out.front().params.push_back(&y_table);
    for (size_t l = 0; l < blocks.size(); ++l) {
      out[l + 1].name = fmt::format("blocks.{}", l);
      out[l + 1].cost = blocks[l].matmul_weights() + 6.0 * C * C / T;
      blocks[l].collect(out[l + 1].params);
    }
    PartLayout& f = out.back();
    f.name = "final_layer";
    f.cost = D * C + 2.0 * C * C / T;
    final_adaln.collect(f.params);
    final_linear.collect(f.params);
    return out;
  }

  nn::Linear x_embedder;
  nn::Param pos_embed;
  nn::Linear t_fc1, t_fc2;
  nn::Param y_table;
  std::vector<nn::AdaLNBlock> blocks;
  nn::Norm final_norm;
  nn::Linear final_adaln, final_linear;
};

/// Host draws, device inputs, saved activations and scratch for one micro_batch B.
struct DiT::State {
  int B = 0;
  std::vector<float> host_noise, host_t, host_freq;  // host_freq [B,F]: temb_in's values
  std::vector<int32_t> host_labels, host_conditioning;  // host_conditioning: labels' rows
  Tensor noise, t, xt, target;  // fp32 [B,H,W,Cin], t [B]
  Tensor patches;               // [B,N,D] model dtype: patchify(xt)
  Tensor target_patches;        // fp32 [B,N,D]: patchify(noise - x0)
  Tensor pos_ids;               // int32 [B,N]
  Tensor temb_in;               // [B,F] the sinusoidal embeddings
  Tensor labels;                // int32 [B,1] after label dropout
  Tensor t_hidden, t_act, cond, y_emb, cond_silu;  // [B,C] (y_emb [B,1,C])
  std::vector<Tensor> stream;   // [0] embeddings, [1 + l] block l's output, [B,N,C] each
  nn::SavedActivations saved;
  std::vector<Tensor> fnorm;    // the final norm's out [B,N,C], mean, rstd [B*N]
  Tensor fmod;                  // [B,2,C]
  Tensor fmodulated;            // [B,N,C]
  Tensor pred, dpred;           // [B,N,D]
  Tensor losses;                // fp32 [B]
  Tensor counted;               // int32 [B]: the labels, -1 where an image is not counted
  Tensor dcond_silu, dcond, dt_act;  // [B,C]
  Tensor dfmod;                 // [B,2,C]
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

Shape DiT::image_shape() const {
  return Shape{config_.image_size, config_.image_size, config_.num_channels};
}

void DiT::set_dropout(bool on, uint64_t seed, uint64_t first_sample) {
  training_draws_ = on;
  seed_ = seed;
  first_sample_ = first_sample;
}

void DiT::timestep_frequencies(float t, int F, float* out) {
  const int half = F / 2;
  for (int j = 0; j < half; ++j) {
    const double f = std::exp(-std::log(10000.0) * j / half);
    const double arg = 1000.0 * static_cast<double>(t) * f;
    out[j] = static_cast<float>(std::cos(arg));
    out[half + j] = static_cast<float>(std::sin(arg));
  }
}

void DiT::reserve(int B) {
  State& a = *state_;
  if (a.B == B && a.saved.mode() == mode_ && !a.stream.empty()) return;
  a.stream.clear();  // free first so the peak is not doubled
  a.fnorm.clear();
  a.B = B;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const DType dt = dtype();
  const int64_t C = config_.n_embd, N = config_.tokens(), D = config_.patch_dim();
  const int64_t S = config_.image_size, Ci = config_.num_channels;
  auto act = [&](Shape sh) { return be.empty(sh, dt, MemCategory::Activations); };
  auto f32 = [&](Shape sh) { return be.empty(sh, DType::F32, MemCategory::Activations); };
  a.noise = f32(Shape{B, S, S, Ci});
  a.t = f32(Shape{B});
  a.xt = f32(Shape{B, S, S, Ci});
  a.target = f32(Shape{B, S, S, Ci});
  a.patches = act(Shape{B, N, D});
  a.target_patches = f32(Shape{B, N, D});
  a.pos_ids = be.empty(Shape{B, N}, DType::I32, MemCategory::Activations);
  std::vector<int32_t> ids(static_cast<size_t>(B * N));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % N);
  be.copy_from_host(s, a.pos_ids, ids.data());
  be.synchronize(s);  // ids is a host temporary
  a.temb_in = act(Shape{B, config_.frequency_dim});
  a.labels = be.empty(Shape{B, 1}, DType::I32, MemCategory::Activations);
  a.t_hidden = act(Shape{B, C});
  a.t_act = act(Shape{B, C});
  a.cond = act(Shape{B, C});
  a.y_emb = act(Shape{B, 1, C});
  a.cond_silu = act(Shape{B, C});
  for (int l = 0; l <= config_.n_layer; ++l) a.stream.push_back(act(Shape{B, N, C}));
  const auto& blocks = layers_->blocks;
  a.saved.reserve(be, blocks.front().saved_specs(B, N, dt), config_.n_layer, mode_);
  for (const nn::SavedSpec& sp : layers_->final_norm.saved_specs(B, N, dt))
    a.fnorm.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  a.fmod = act(Shape{B, 2, C});
  a.fmodulated = act(Shape{B, N, C});
  a.pred = act(Shape{B, N, D});
  a.dpred = act(Shape{B, N, D});
  a.losses = f32(Shape{B});
  a.counted = be.empty(Shape{B}, DType::I32, MemCategory::Activations);
  a.dcond_silu = act(Shape{B, C});
  a.dcond = act(Shape{B, C});
  a.dt_act = act(Shape{B, C});
  a.dfmod = act(Shape{B, 2, C});
  a.dresidual = act(Shape{B, N, C});
  a.scratch = blocks.front().make_scratch(be, B, N, dt);
}

void DiT::upload_conditioning(std::span<const float> t, std::span<const int32_t> labels) {
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int F = config_.frequency_dim;
  // Host buffers of the State, so the copies need not be waited for here.
  a.host_freq.resize(static_cast<size_t>(a.B) * F);
  for (int b = 0; b < a.B; ++b)
    timestep_frequencies(t[b], F, a.host_freq.data() + static_cast<size_t>(b) * F);
  upload_f32(be, a.temb_in, a.host_freq.data());
  a.host_conditioning.assign(labels.begin(), labels.end());
  for (int32_t& v : a.host_conditioning) {
    KILN_CHECK(v >= -1 && v < config_.num_classes, "dit: label {} is outside [0, {})", v,
               config_.num_classes);
    if (v < 0) v = config_.num_classes;  // the null class
  }
  be.copy_from_host(s, a.labels, a.host_conditioning.data());
}

void DiT::run_forward() {
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int B = a.B;
  const int64_t C = config_.n_embd, N = config_.tokens();
  DiTLayers& L = *layers_;
  hooks().before_forward(0);
  be.patchify(s, a.patches, a.xt, config_.patch_size);
  L.x_embedder.forward(be, s, a.stream[0], a.patches);
  const Tensor pos = a.scratch.tmp.view_at(0, Shape{B, N, C});
  be.embedding_forward(s, pos, a.pos_ids, Tensor(), L.pos_embed.v(), Tensor());
  be.add(s, a.stream[0], a.stream[0], pos);
  L.t_fc1.forward(be, s, a.t_hidden, a.temb_in);
  be.silu_forward(s, a.t_act, a.t_hidden);
  L.t_fc2.forward(be, s, a.cond, a.t_act);
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
  L.final_adaln.forward(be, s, a.fmod.reshape(Shape{B, 2 * C}), a.cond_silu);
  L.final_norm.forward(be, s, a.fnorm, a.stream.back());
  be.modulate(s, a.fmodulated, a.fnorm[nn::Norm::kOut], a.fmod, 1, 0, 1.f);
  L.final_linear.forward(be, s, a.pred, a.fmodulated);
}

LossSum DiT::forward(const Batch& batch, float grad_scale) {
  const Tensor& labels = batch.targets;
  const Tensor& x0 = batch.require("images", arch());
  KILN_CHECK(labels.ndim() == 1 && labels.size(0) == x0.size(0) && labels.dtype() == DType::I32,
             "dit: needs images [B,H,W,C] and int32 labels [B], got {} and {}", x0.str(),
             labels.str());
  const int S = config_.image_size;
  KILN_CHECK(x0.ndim() == 4 && x0.size(1) == S && x0.size(2) == S &&
                 x0.size(3) == config_.num_channels && x0.dtype() == DType::F32,
             "dit: images must be fp32 [B,{},{},{}], got {}", S, S, config_.num_channels, x0.str());
  const int B = static_cast<int>(x0.size(0));
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  const Stream s = be.default_stream();
  // The draws of global sample g = first_sample + b: time, noise, label dropout.
  const uint64_t streams = training_draws_ ? 0 : kEvalStreams;
  const int64_t pixels = x0.numel() / B;
  a.host_t.resize(static_cast<size_t>(B));
  a.host_noise.resize(static_cast<size_t>(x0.numel()));
  a.host_labels.resize(static_cast<size_t>(B));
  be.copy_to_host(s, a.host_labels.data(), labels);
  be.synchronize(s);
  std::vector<int32_t> conditioning = a.host_labels;
  for (int b = 0; b < B; ++b) {
    const uint64_t g = first_sample_ + static_cast<uint64_t>(b);
    float z = 0.f;
    fill_normal(&z, 1, seed_, kTimeStream + streams, 0.f, 1.f, g);
    a.host_t[b] = 1.f / (1.f + std::exp(-z));
    fill_normal(a.host_noise.data() + static_cast<size_t>(b) * pixels, pixels, seed_,
                kNoiseStream + streams, 0.f, 1.f, g * static_cast<uint64_t>(pixels));
    if (training_draws_ && uniform_at(seed_, kLabelStream, g) < config_.class_dropout)
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
  be.copy_from_host(s, a.counted, labels.data());
  be.copy_from_host(s, a.noise, noise.data());
  be.copy_from_host(s, a.t, t.data());
  be.rectified_flow_inputs(s, a.xt, a.target, x0, a.noise, a.t);
  be.patchify(s, a.target_patches, a.target, config_.patch_size);
  upload_conditioning(t, conditioning);
  run_forward();
  be.mse_loss(s, a.losses, with_grad ? a.dpred : Tensor(), a.pred, a.target_patches, grad_scale);
  Batch sums;  // where the loss goes: `loss`, or the model's own accumulator
  sums.loss = loss;
  be.accumulate_loss(s, loss_.target(be, sums), a.losses, a.counted);
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
  const Tensor dm = a.scratch.dtmp.view_at(0, a.fmodulated.shape());
  L.final_linear.backward(be, s, dm, a.dpred, a.fmodulated);
  be.modulate_backward(s, dm, a.dfmod, dm, a.fnorm[nn::Norm::kOut], a.fmod, 1, 0, 1.f);
  be.fill(s, a.dresidual, 0.f);
  L.final_norm.backward(be, s, a.fnorm, a.dresidual, dm, a.stream.back());
  L.final_adaln.backward(be, s, a.dcond_silu, a.dfmod.reshape(Shape{B, 2 * C}), a.cond_silu);
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
  L.t_fc2.backward(be, s, a.dt_act, a.dcond, a.t_act);
  be.silu_backward(s, a.dt_act, a.dt_act, a.t_hidden);
  L.t_fc1.backward(be, s, Tensor(), a.dt_act, a.temb_in);
  if (L.pos_embed.trainable)
    be.embedding_backward(s, L.pos_embed.g(), Tensor(), a.dresidual, a.pos_ids, Tensor());
  L.x_embedder.backward(be, s, Tensor(), a.dresidual, a.patches);  // no image gradient
  hooks().after_backward(0);
}

void DiT::predict_velocity(const Tensor& xt, std::span<const float> t,
                           const FlowConditioning& conditioning, const Tensor& velocity) {
  const std::span<const int32_t> labels = conditioning.labels;
  const int S = config_.image_size;
  KILN_CHECK(xt.ndim() == 4 && xt.size(1) == S && xt.size(2) == S &&
                 xt.size(3) == config_.num_channels && xt.dtype() == DType::F32,
             "dit: images must be fp32 [B,{},{},{}], got {}", S, S, config_.num_channels, xt.str());
  const int B = static_cast<int>(xt.size(0));
  KILN_CHECK(t.size() == static_cast<size_t>(B) && labels.size() == static_cast<size_t>(B),
             "dit: {} images need {} times and labels (got {} and {})", B, B, t.size(),
             labels.size());
  check_shape(velocity, xt.shape(), "dit predict_velocity velocity");
  reserve(B);
  State& a = *state_;
  Backend& be = backend();
  be.copy(be.default_stream(), a.xt, xt);
  upload_conditioning(t, labels);
  run_forward();
  be.unpatchify(be.default_stream(), velocity, a.pred, config_.patch_size);
  hooks().after_forward(config_.n_layer + 1);
}

}  // namespace kiln
