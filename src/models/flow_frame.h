// What a diffusion transformer trained as a rectified flow has around its blocks, shared
// by the class-conditional DiT (models/dit) and the text-conditioned MMDiT (models/mmdit):
// the per-sample draws, the patch and timestep embeddings, the final layer and the loss
// (Peebles & Xie 2023's DiT; Liu et al. 2023's rectified flow; Esser et al. 2024's
// logit-normal times):
//
//   t ~ sigmoid(N(0, 1)),  noise ~ N(0, I)   per sample, from Philox by global sample index
//   xt        = (1 - t) x0 + t noise        target v = noise - x0   (Backend::rectified_flow_inputs)
//   x [B,N,C] = x_embedder(patchify(xt)) + pos_embed        the image stream's first input
//   temb [B,C] = t_embedder.mlp.2(silu(t_embedder.mlp.0(emb(1000 t))))   emb: timestep_frequencies
//   (the model adds its conditioning's embedding to temb: c, and takes silu(c) for its blocks)
//   shift, scale = final_layer.adaLN_modulation.1(silu(c)) [B,2,C]
//   pred      = final_layer.linear(modulate(norm(x_L), shift, scale)) [B,N,D]
//   loss      = mean over pixels of (pred - patchify(v))^2, per image
//
// Parameters (facebookresearch/DiT's names): x_embedder.proj.{weight [C, D], bias [C]},
// pos_embed [N, C] (learned, not fixed sin-cos), t_embedder.mlp.0.{weight [C, F], bias},
// t_embedder.mlp.2.{weight [C, C], bias}, final_layer.adaLN_modulation.1.{weight [2C, C],
// bias}, final_layer.linear.{weight [D, C], bias}. Initialisation: matrices and pos_embed
// N(0, 0.02^2), biases 0; final_layer's adaLN_modulation and linear zero (adaLN-Zero).
#pragma once

#include "backend/backend.h"
#include "models/vision_config.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "nn/param.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kiln {

/// One sample's draws: its time t in (0, 1) and its noise [pixels], from (seed, global
/// sample index g) alone; `eval` draws from the evaluation streams (the same noise for a
/// validation sample at every evaluation).
float draw_flow_sample(uint64_t seed, uint64_t g, bool eval, int64_t pixels, float* noise);
/// Whether sample g's conditioning is dropped to the null one (classifier-free guidance's
/// training dropout, Ho & Salimans 2022) with probability p.
bool draw_condition_dropout(uint64_t seed, uint64_t g, float p);

/// The sinusoidal timestep embedding (DiT's TimestepEmbedder.timestep_embedding) of
/// 1000 t: out[j] = cos(1000 t f_j), out[F/2 + j] = sin(1000 t f_j), f_j = 10000^(-j/(F/2)).
void timestep_frequencies(float t, int F, float* out);

class FlowFrame {
 public:
  /// The layers of an image of `shape` (image_size, num_channels, patch_size, n_embd) and
  /// a timestep embedding frequency_dim wide.
  FlowFrame(const VisionShape& shape, int frequency_dim);

  /// x_embedder, pos_embed, t_embedder (the embeddings part), and the final layer's.
  void collect_embeddings(std::vector<nn::Param*>& out);
  void collect_final(std::vector<nn::Param*>& out);
  /// Matmul weights per image position, for part balancing: the embeddings' (the
  /// timestep MLP's spread over the N positions) and the final layer's.
  double embeddings_cost() const;
  double final_cost() const;

  /// One image: [image_size, image_size, num_channels].
  Shape image_shape() const { return Shape{S_, S_, Ci_}; }
  /// The batch size of images fp32 [B, image_size, image_size, num_channels]; throws
  /// kiln::Error "<who>: images must be fp32 [B,S,S,C], got ..." for another shape or dtype.
  int check_images(const Tensor& images, std::string_view who) const;

  /// Allocates the buffers of a micro_batch of B images in `dtype` (again only when B or
  /// dtype changes).
  void reserve(Backend& be, int B, DType dtype);
  /// Training or evaluation inputs: xt and the target from x0 fp32 [B,H,W,C] on the device,
  /// host noise [B*H*W*C] and times t [B]; also the loss's counted flags (host int32 [B],
  /// -1: not counted) and the timestep embeddings' input.
  void set_flow_inputs(Backend& be, const Tensor& x0, std::span<const float> noise,
                       std::span<const float> t, std::span<const int32_t> counted);
  /// Sampling inputs: xt fp32 [B,H,W,C] and times t [B].
  void set_noisy_inputs(Backend& be, const Tensor& xt, std::span<const float> t);

  /// x [B,N,C] = x_embedder(patchify(xt)) + pos_embed; temb [B,C] the timestep's
  /// embedding (the model adds its own conditioning to it). `tmp` [B,N,C] scratch.
  void embed_forward(Backend& be, Stream s, const Tensor& x, const Tensor& temb,
                     const Tensor& tmp);
  /// pred [B,N,D] from the last block's output x_L [B,N,C] and silu(c) [B,C].
  void final_forward(Backend& be, Stream s, const Tensor& x_last, const Tensor& cond_silu);
  /// The per-image losses of pred against the target into `acc` (Batch::loss's fp64
  /// accumulator, the counted images only) and, with grad_scale > 0, dpred.
  void loss(Backend& be, Stream s, const Tensor& acc, float grad_scale);
  /// The velocity fp32 [B,H,W,C] of pred.
  void velocity(Backend& be, Stream s, const Tensor& out);

  /// From dpred: dres [B,N,C] = dL/dx_L and dcond_silu [B,C] = the final layer's share
  /// of dL/dsilu(c) (both overwritten; the blocks add theirs). `dm` [B,N,C] scratch.
  void final_backward(Backend& be, Stream s, const Tensor& dres, const Tensor& dcond_silu,
                      const Tensor& x_last, const Tensor& cond_silu, const Tensor& dm);
  /// The embeddings' parameter gradients from dL/dx [B,N,C] and dL/dtemb [B,C].
  void embed_backward(Backend& be, Stream s, const Tensor& dx, const Tensor& dtemb);

  int tokens() const { return N_; }

  nn::Linear x_embedder;
  nn::Param pos_embed;
  nn::Linear t_fc1, t_fc2;
  nn::Norm final_norm;
  nn::Linear final_adaln, final_linear;

 private:
  /// The timestep embeddings' input [B,F] of times t [B].
  void upload_times(Backend& be, std::span<const float> t);
  int64_t C_, D_, N_;
  int S_, Ci_, P_, F_;
  int B_ = 0;
  DType dtype_ = DType::F32;
  std::vector<float> host_freq_;  // [B,F]: temb_in's values
  Tensor noise_, t_, xt_, target_;  // fp32 [B,H,W,Cin], t [B]
  Tensor patches_;                  // [B,N,D] model dtype: patchify(xt)
  Tensor target_patches_;           // fp32 [B,N,D]: patchify(noise - x0)
  Tensor pos_ids_;                  // int32 [B,N]
  Tensor temb_in_;                  // [B,F] the sinusoidal embeddings
  Tensor t_hidden_, t_act_, dt_act_;  // [B,C]
  std::vector<Tensor> fnorm_;       // the final norm's out [B,N,C], mean, rstd [B*N]
  Tensor fmod_, dfmod_;             // [B,2,C]
  Tensor fmodulated_;               // [B,N,C]
  Tensor pred_, dpred_;             // [B,N,D]
  Tensor losses_;                   // fp32 [B]
  Tensor counted_;                  // int32 [B]: -1 where an image is not counted
};

}  // namespace kiln
