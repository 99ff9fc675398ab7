// A text-conditioned diffusion transformer with joint attention (MMDiT: Esser et al. 2024,
// "Scaling Rectified Flow Transformers for High-Resolution Image Synthesis"; Stable
// Diffusion 3) trained as a rectified flow, its draws, patch and timestep embeddings,
// final layer and loss those of models/flow_frame.h (the DiT's):
//
//   enc [B,Lc,Ct]  = text_encoder(caption)          (models/mmdit/text_encoder.h: trained
//                    with the model, Ct = C, or a frozen Llama's, Ct = text.n_embd)
//   ctx_0 [B,Lc,C] = context_embedder(enc)          SD3's linear from the text features
//   pooled [B,Ct]  = enc at the caption's last token (its end-of-text); 0 for the empty caption
//   c [B,C]        = t_embedder(t) + y_embedder(pooled)   y_embedder = Linear, SiLU, Linear
//                    (SD3's VectorEmbedder of the pooled text)
//   x_0 [B,N,C]    = x_embedder(patchify(xt)) + pos_embed
//   x_{l+1}, ctx_{l+1} = joint_block_l(x_l, ctx_l, c)   (nn/mmdit_block.h; the last block's
//                    context stream pre-only)
//   pred           = final_layer(x_L, c) [B,N,D];  loss = mean over pixels of (pred - v)^2
//                    per image; the mean over the counted images
// A sequence is the image's N tokens then the caption's Lc slots; the slots after a
// caption are padding that no other token sees (a document of its own in the text
// encoder's and the joint blocks' attention), so a caption's result does not depend on
// Lc. While training, a caption becomes the empty one (no tokens: pooled 0, no context
// token seen) with probability caption_dropout, drawn by global sample index as the time
// and noise are (set_dropout).
//
// Parameters: the frame's (x_embedder.proj, pos_embed, t_embedder.mlp.{0,2},
// final_layer.{adaLN_modulation.1, linear}), the text encoder's (text_encoder.*),
// context_embedder.{weight [C, Ct], bias}, y_embedder.mlp.0.{weight [C, Ct], bias},
// y_embedder.mlp.2.{weight [C, C], bias}, joint_blocks.{l}.{x_block, context_block}.*
// (SD3's names). Initialisation: matrices N(0, 0.02^2), biases 0, adaLN-Zero's zeros.
// Parts: 0 the embeddings (image, time, text encoder, context and pooled-text embedders),
// 1 + l joint block l, L + 1 the final layer. Data parallel and ZeRO; no tensor,
// context or pipeline parallelism.
#pragma once

#include "models/layered_model.h"
#include "models/mmdit/config.h"

#include <memory>

namespace kiln {

struct MMDiTLayers;

class MMDiT final : public LayeredModel, public FlowModel {
 public:
  MMDiT(const MMDiTConfig& config, Backend& backend, const ModelStorage& storage = {});
  ~MMDiT() override;

  const MMDiTConfig& config() const { return config_; }

  std::string arch() const override { return "mmdit"; }
  std::string describe() const override { return config_.str(); }
  nlohmann::json config_json() const override { return mmdit_config_json(config_); }
  /// "text_encoder" of a Llama text encoder: its options (llama_part_options, no head).
  std::optional<ModelOptions> part_options(std::string_view prefix) const override {
    if (prefix != "text_encoder" || config_.text_encoder != TextEncoderKind::Llama)
      return std::nullopt;
    return llama_part_options(config_.text_llama, /*has_head=*/false);
  }
  /// Inputs "images" fp32 [B, image_size, image_size, num_channels] in [-1, 1] and
  /// "tokens" int32 [B, caption_tokens] (each caption's ids, then -1); targets int32 [B]
  /// (0: counted, -1: not). T must be block_size, the patch count.
  BatchShape batch_shape(int B, int T) const override;
  /// The flow-matching loss of the batch's images (x0) under their captions at the times,
  /// noise and caption dropout of its global samples (set_dropout).
  LossSum forward(const Batch& batch, float grad_scale) override;
  void backward() override;
  /// forward() at given draws (the golden test's): x0 fp32 [B,H,W,C] on the device; host
  /// counted flags [B] (0, or -1: not counted), the captions the model is conditioned on
  /// (host int32 [B * caption_tokens]: each row its ids, then -1; a row of -1 is the empty
  /// caption), noise [B*H*W*C] and times t [B]; `loss` as Batch::loss (the sums are added
  /// there, {} returned) or empty (the sums returned). Throws kiln::Error naming the
  /// sample of a caption with an id outside the vocabulary or after its padding.
  LossSum flow_loss(const Tensor& x0, std::span<const int32_t> counted,
                    std::span<const int32_t> captions, std::span<const float> noise,
                    std::span<const float> t, float grad_scale, const Tensor& loss = {});
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override { mode_ = mode; }
  /// on: training draws (caption dropout); off: evaluation draws. (seed, global sample
  /// index first_sample + b) key every draw of sample b.
  void set_dropout(bool on, uint64_t seed, uint64_t first_sample) override;
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int64_t num_parameters() const override { return config_.num_parameters(); }

  // FlowModel: text-conditioned (conditioning.captions; an empty one the null caption)
  FlowModel* flow_model() override { return this; }
  int num_classes() const override { return 0; }
  int caption_tokens() const override { return config_.caption_tokens; }
  /// [image_size, image_size, num_channels].
  Shape image_shape() const override;
  void predict_velocity(const Tensor& xt, std::span<const float> t,
                        const FlowConditioning& conditioning, const Tensor& velocity) override;

 private:
  struct State;
  void reserve(int B);
  /// Checks and uploads captions (host [B * caption_tokens], -1 padded): the tokens, the
  /// documents of the text encoder and the joint blocks, the pooled rows.
  void upload_captions(std::span<const int32_t> captions);
  /// Everything from the frame's inputs and State's captions to the prediction.
  void run_forward();

  MMDiTConfig config_;
  std::unique_ptr<MMDiTLayers> layers_;
  std::unique_ptr<State> state_;
  LossAccumulator loss_;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  bool training_draws_ = false;
  uint64_t seed_ = 0, first_sample_ = 0;
};

}  // namespace kiln
