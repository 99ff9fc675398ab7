// Diffusion transformer (DiT, Peebles & Xie 2023) trained as a rectified flow (Liu et al.
// 2023; Lipman et al. 2023's flow matching; Esser et al. 2024's logit-normal times), its
// draws, embeddings, final layer and loss those of models/flow_frame.h:
//
//   x [B,N,C] = x_embedder(patchify(xt)) + pos_embed          (xt at the sample's t, noise)
//   c [B,C]   = t_embedder(t) + y_embedder(y)   t_embedder = Linear, SiLU, Linear on the
//               sinusoidal embedding of 1000 t (DiT's TimestepEmbedder, F = 256: cos half,
//               then sin half, frequencies 10000^(-i/(F/2)))
//               y = the label, or the null class K with probability class_dropout (training)
//   x_{l+1}   = adaLN-Zero block_l(x_l, c)        (nn/adaln_block.h)
//   pred      = final_layer(x_L, c) [B,N,D];  loss = mean over pixels of (pred - v)^2 per
//               image; the mean over images
// Times, noise and label dropout of sample b of a micro-batch are drawn at global sample
// index first_sample + b (set_dropout), so every layout (dp, micro_batch, accumulation)
// draws alike.
// Evaluation (set_dropout off) draws from streams of its own: the same noise for a
// validation sample at every evaluation, no label dropout.
//
// Parameters (facebookresearch/DiT's names; pos_embed is learned here, not fixed sin-cos):
//   x_embedder.proj.{weight [C, D], bias [C]}, pos_embed [N, C],
//   t_embedder.mlp.0.{weight [C, F], bias}, t_embedder.mlp.2.{weight [C, C], bias},
//   y_embedder.embedding_table.weight [K + 1, C],
//   blocks.{l}.attn.qkv, attn.proj, mlp.fc1, mlp.fc2, adaLN_modulation.1 (weight, bias),
//   final_layer.adaLN_modulation.1.{weight [2C, C], bias}, final_layer.linear.{weight [D, C], bias}
// Initialisation: matrices, pos_embed and the label table N(0, 0.02^2), biases 0; every
// adaLN_modulation and final_layer.linear zero (adaLN-Zero). Parts: 0 the embeddings, 1 + l
// block l, L + 1 the final layer. No tensor parallelism yet.
#pragma once

#include "models/dit/config.h"
#include "models/layered_model.h"

#include <memory>

namespace kiln {

struct DiTLayers;

class DiT final : public LayeredModel, public FlowModel {
 public:
  DiT(const DiTConfig& config, Backend& backend, const ModelStorage& storage = {});
  ~DiT() override;

  const DiTConfig& config() const { return config_; }

  std::string arch() const override { return "dit"; }
  std::string describe() const override { return config_.str(); }
  nlohmann::json config_json() const override { return dit_config_json(config_); }
  /// Input "images" fp32 [B, image_size, image_size, num_channels] in [-1, 1], targets the
  /// labels int32 [B] (T must be block_size, the patch count).
  BatchShape batch_shape(int B, int T) const override;
  /// The flow-matching loss of the batch's images (x0) under its targets (labels; -1: not
  /// counted) at the times and noise of its global samples (set_dropout).
  LossSum forward(const Batch& batch, float grad_scale) override;
  void backward() override;
  /// forward() at given draws (the golden test's): x0 fp32 [B,H,W,C] on the device; host
  /// labels [B] (-1: not counted), the labels the model is conditioned on [B] (-1: the
  /// null class), noise [B*H*W*C] and times t [B]; `loss` as Batch::loss (the sums are
  /// added there, {} returned) or empty (the sums returned).
  LossSum flow_loss(const Tensor& x0, std::span<const int32_t> labels,
                    std::span<const int32_t> conditioning, std::span<const float> noise,
                    std::span<const float> t, float grad_scale, const Tensor& loss = {});
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override { mode_ = mode; }
  /// on: training draws (label dropout); off: evaluation draws. (seed, global sample
  /// index first_sample + b) key every draw of sample b.
  void set_dropout(bool on, uint64_t seed, uint64_t first_sample) override;
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int64_t num_parameters() const override { return config_.num_parameters(); }

  // FlowModel: class-conditional (conditioning.labels; -1 the null class)
  FlowModel* flow_model() override { return this; }
  int num_classes() const override { return config_.num_classes; }
  /// [image_size, image_size, num_channels].
  Shape image_shape() const override;
  void predict_velocity(const Tensor& xt, std::span<const float> t,
                        const FlowConditioning& conditioning, const Tensor& velocity) override;

 private:
  struct State;
  void reserve(int B);
  /// Everything from the frame's inputs and State's labels to the prediction.
  void run_forward();
  /// Uploads the labels the model is conditioned on (-1: the null class).
  void upload_labels(std::span<const int32_t> labels);

  DiTConfig config_;
  std::unique_ptr<DiTLayers> layers_;
  std::unique_ptr<State> state_;
  LossAccumulator loss_;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  bool training_draws_ = false;
  uint64_t seed_ = 0, first_sample_ = 0;
};

}  // namespace kiln
