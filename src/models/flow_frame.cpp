#include "models/flow_frame.h"

#include "core/error.h"
#include "core/rng.h"

#include <cmath>

namespace kiln {

namespace {

// Philox streams of the per-sample draws (far from the parameters' streams 0..P-1).
constexpr uint64_t kNoiseStream = uint64_t{0xD17} << 32, kTimeStream = kNoiseStream + 1,
                   kLabelStream = kNoiseStream + 2;
constexpr uint64_t kEvalStreams = 16;  // evaluation: the same streams + 16

nn::NormSpec plain_norm(float eps) {
  return nn::NormSpec{nn::NormKind::LayerNorm, eps, /*weight=*/false, /*bias=*/false};
}

}  // namespace

float draw_flow_sample(uint64_t seed, uint64_t g, bool eval, int64_t pixels, float* noise) {
  const uint64_t streams = eval ? kEvalStreams : 0;
  float z = 0.f;
  fill_normal(&z, 1, seed, kTimeStream + streams, 0.f, 1.f, g);
  fill_normal(noise, pixels, seed, kNoiseStream + streams, 0.f, 1.f,
              g * static_cast<uint64_t>(pixels));
  return 1.f / (1.f + std::exp(-z));
}

bool draw_condition_dropout(uint64_t seed, uint64_t g, float p) {
  return uniform_at(seed, kLabelStream, g) < p;
}

void timestep_frequencies(float t, int F, float* out) {
  const int half = F / 2;
  for (int j = 0; j < half; ++j) {
    const double f = std::exp(-std::log(10000.0) * j / half);
    const double arg = 1000.0 * static_cast<double>(t) * f;
    out[j] = static_cast<float>(std::cos(arg));
    out[half + j] = static_cast<float>(std::sin(arg));
  }
}

FlowFrame::FlowFrame(const VisionShape& c, int frequency_dim)
    : x_embedder("x_embedder.proj", c.patch_dim(), c.n_embd, true, 0.02f),
      pos_embed("pos_embed", Shape{c.patches(), c.n_embd}, nn::Init::normal(0.02f), false),
      t_fc1("t_embedder.mlp.0", frequency_dim, c.n_embd, true, 0.02f),
      t_fc2("t_embedder.mlp.2", c.n_embd, c.n_embd, true, 0.02f),
      final_norm("final_layer.norm_final", c.n_embd, plain_norm(c.norm_eps)),
      final_adaln("final_layer.adaLN_modulation.1", c.n_embd, 2 * c.n_embd, true, 0.f),
      final_linear("final_layer.linear", c.n_embd, c.patch_dim(), true, 0.f),
      C_(c.n_embd),
      D_(c.patch_dim()),
      N_(c.patches()),
      S_(c.image_size),
      Ci_(c.num_channels),
      P_(c.patch_size),
      F_(frequency_dim) {
  final_adaln.weight.init = nn::Init::zeros();
  final_linear.weight.init = nn::Init::zeros();
}

void FlowFrame::collect_embeddings(std::vector<nn::Param*>& out) {
  x_embedder.collect(out);
  out.push_back(&pos_embed);
  t_fc1.collect(out);
  t_fc2.collect(out);
}

void FlowFrame::collect_final(std::vector<nn::Param*>& out) {
  final_adaln.collect(out);
  final_linear.collect(out);
}

double FlowFrame::embeddings_cost() const {
  const double C = static_cast<double>(C_), N = static_cast<double>(N_);
  return static_cast<double>(D_) * C + (F_ * C + C * C) / N;
}

double FlowFrame::final_cost() const {
  const double C = static_cast<double>(C_), N = static_cast<double>(N_);
  return static_cast<double>(D_) * C + 2.0 * C * C / N;
}

int FlowFrame::check_images(const Tensor& x, std::string_view who) const {
  KILN_CHECK(x.ndim() == 4 && x.size(1) == S_ && x.size(2) == S_ && x.size(3) == Ci_ &&
                 x.dtype() == DType::F32,
             "{}: images must be fp32 [B,{},{},{}], got {}", who, S_, S_, Ci_, x.str());
  return static_cast<int>(x.size(0));
}

void FlowFrame::reserve(Backend& be, int B, DType dtype) {
  if (B_ == B && dtype_ == dtype && pred_) return;
  fnorm_.clear();  // free first so the peak is not doubled
  B_ = B;
  dtype_ = dtype;
  const Stream s = be.default_stream();
  auto act = [&](Shape sh) { return be.empty(sh, dtype, MemCategory::Activations); };
  auto f32 = [&](Shape sh) { return be.empty(sh, DType::F32, MemCategory::Activations); };
  noise_ = f32(Shape{B, S_, S_, Ci_});
  t_ = f32(Shape{B});
  xt_ = f32(Shape{B, S_, S_, Ci_});
  target_ = f32(Shape{B, S_, S_, Ci_});
  patches_ = act(Shape{B, N_, D_});
  target_patches_ = f32(Shape{B, N_, D_});
  pos_ids_ = be.empty(Shape{B, N_}, DType::I32, MemCategory::Activations);
  std::vector<int32_t> ids(static_cast<size_t>(B * N_));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % N_);
  be.copy_from_host(s, pos_ids_, ids.data());
  be.synchronize(s);  // ids is a host temporary
  temb_in_ = act(Shape{B, F_});
  t_hidden_ = act(Shape{B, C_});
  t_act_ = act(Shape{B, C_});
  dt_act_ = act(Shape{B, C_});
  for (const nn::SavedSpec& sp : final_norm.saved_specs(B, N_, dtype))
    fnorm_.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  fmod_ = act(Shape{B, 2, C_});
  dfmod_ = act(Shape{B, 2, C_});
  fmodulated_ = act(Shape{B, N_, C_});
  pred_ = act(Shape{B, N_, D_});
  dpred_ = act(Shape{B, N_, D_});
  losses_ = f32(Shape{B});
  counted_ = be.empty(Shape{B}, DType::I32, MemCategory::Activations);
}

void FlowFrame::set_flow_inputs(Backend& be, const Tensor& x0, std::span<const float> noise,
                                std::span<const float> t, std::span<const int32_t> counted) {
  const Stream s = be.default_stream();
  be.copy_from_host(s, counted_, counted.data());
  be.copy_from_host(s, noise_, noise.data());
  be.copy_from_host(s, t_, t.data());
  be.rectified_flow_inputs(s, xt_, target_, x0, noise_, t_);
  be.patchify(s, target_patches_, target_, P_);
  upload_times(be, t);
}

void FlowFrame::set_noisy_inputs(Backend& be, const Tensor& xt, std::span<const float> t) {
  be.copy(be.default_stream(), xt_, xt);
  upload_times(be, t);
}

void FlowFrame::upload_times(Backend& be, std::span<const float> t) {
  // A host buffer of the frame's, so the copy need not be waited for here.
  host_freq_.resize(static_cast<size_t>(B_) * F_);
  for (int b = 0; b < B_; ++b)
    timestep_frequencies(t[b], F_, host_freq_.data() + static_cast<size_t>(b) * F_);
  upload_f32(be, temb_in_, host_freq_.data());
}

void FlowFrame::embed_forward(Backend& be, Stream s, const Tensor& x, const Tensor& temb,
                              const Tensor& tmp) {
  be.patchify(s, patches_, xt_, P_);
  x_embedder.forward(be, s, x, patches_);
  const Tensor pos = tmp.view_at(0, x.shape());
  be.embedding_forward(s, pos, pos_ids_, Tensor(), pos_embed.v(), Tensor());
  be.add(s, x, x, pos);
  t_fc1.forward(be, s, t_hidden_, temb_in_);
  be.silu_forward(s, t_act_, t_hidden_);
  t_fc2.forward(be, s, temb, t_act_);
}

void FlowFrame::final_forward(Backend& be, Stream s, const Tensor& x_last,
                              const Tensor& cond_silu) {
  final_adaln.forward(be, s, fmod_.reshape(Shape{B_, 2 * C_}), cond_silu);
  final_norm.forward(be, s, fnorm_, x_last);
  be.modulate(s, fmodulated_, fnorm_[nn::Norm::kOut], fmod_, 1, 0, 1.f);
  final_linear.forward(be, s, pred_, fmodulated_);
}

void FlowFrame::loss(Backend& be, Stream s, const Tensor& acc, float grad_scale) {
  be.mse_loss(s, losses_, grad_scale > 0.f ? dpred_ : Tensor(), pred_, target_patches_,
              grad_scale);
  be.accumulate_loss(s, acc, losses_, counted_);
}

void FlowFrame::velocity(Backend& be, Stream s, const Tensor& out) {
  be.unpatchify(s, out, pred_, P_);
}

void FlowFrame::final_backward(Backend& be, Stream s, const Tensor& dres,
                               const Tensor& dcond_silu, const Tensor& x_last,
                               const Tensor& cond_silu, const Tensor& dm) {
  final_linear.backward(be, s, dm, dpred_, fmodulated_);
  be.modulate_backward(s, dm, dfmod_, dm, fnorm_[nn::Norm::kOut], fmod_, 1, 0, 1.f);
  be.fill(s, dres, 0.f);
  final_norm.backward(be, s, fnorm_, dres, dm, x_last);
  final_adaln.backward(be, s, dcond_silu, dfmod_.reshape(Shape{B_, 2 * C_}), cond_silu);
}

void FlowFrame::embed_backward(Backend& be, Stream s, const Tensor& dx, const Tensor& dtemb) {
  t_fc2.backward(be, s, dt_act_, dtemb, t_act_);
  be.silu_backward(s, dt_act_, dt_act_, t_hidden_);
  t_fc1.backward(be, s, Tensor(), dt_act_, temb_in_);
  if (pos_embed.trainable)
    be.embedding_backward(s, pos_embed.g(), Tensor(), dx, pos_ids_, Tensor());
  x_embedder.backward(be, s, Tensor(), dx, patches_);  // no image gradient
}

}  // namespace kiln
