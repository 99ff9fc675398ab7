// Vision transformer (Dosovitskiy et al. 2021) classifier on the layer library (its
// trunk: models/patch_encoder.h).
//
//   patches [B, N, D]  = patchify(images [B,H,W,Cin])          D = Cin P^2 (Backend::patchify)
//   x0 [B, T, C]       = patch_embed(patches | 0) + pos_embed  T = N + 1
//   x_{l+1}            = block_l(x_l)   pre-LN, bidirectional multi-head attention, GELU MLP
//   logits [B, K]      = head(norm(x_L[:, T-1, :]))            the class token's output
//   loss               = cross-entropy(logits, labels)
// The class token is the last position: its input row is all zeros, so its embedding is
// patch_embed.bias + pos_embed[T-1], a learned vector (timm's cls_token + pos_embed[0]
// under another parameterisation; attention is bidirectional, so the position of the
// row does not matter). GELU is the tanh approximation (as GPT-2's); the head has no
// bias (it is fused with the chunked cross-entropy, nn/classifier.h).
//
// Parameters (timm's names where the layout is the same):
//   patch_embed.proj.weight      [C, D]  (a [C, Cin, P, P] convolution weight, flattened)
//   patch_embed.proj.bias        [C]
//   pos_embed                    [T, C]  (row T-1: the class token's)
//   blocks.{l}.norm1.{weight,bias}, blocks.{l}.attn.qkv.{weight,bias} [3C, C],
//   blocks.{l}.attn.proj.{weight,bias} [C, C], blocks.{l}.norm2.{weight,bias},
//   blocks.{l}.mlp.fc1.{weight,bias} [H, C], blocks.{l}.mlp.fc2.{weight,bias} [C, H]
//   norm.{weight,bias}           [C]
//   head.weight                  [K, C]
// Initialisation: matrices and pos_embed N(0, 0.02^2), the two residual projections
// N(0, (0.02 / sqrt(2 L))^2), biases 0, norm gains 1. Parts: 0 the embeddings, 1 + l
// block l, L + 1 the head (norm and head.weight; resident: its loss gradient is made in
// forward). No dropout; no tensor parallelism yet.
#pragma once

#include "models/layered_model.h"
#include "models/vit/config.h"

#include <memory>

namespace kiln {

struct ViTLayers;

class ViT final : public LayeredModel, public ImageClassifier {
 public:
  ViT(const ViTConfig& config, Backend& backend, const ModelStorage& storage = {});
  ~ViT() override;

  const ViTConfig& config() const { return config_; }

  std::string arch() const override { return "vit"; }
  std::string describe() const override { return config_.str(); }
  nlohmann::json config_json() const override { return vit_config_json(config_); }
  /// Input "images" fp32 [B, image_size, image_size, num_channels], targets the labels
  /// int32 [B] (T must be block_size, the patches and the class token).
  BatchShape batch_shape(int B, int T) const override;
  /// The batch's images and targets (labels; -1 ignored). Without gradient (grad_scale
  /// 0) it also counts the images whose top class is the label (LossSum::correct).
  LossSum forward(const Batch& batch, float grad_scale) override;
  void backward() override;
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override { mode_ = mode; }
  void set_dropout(bool, uint64_t, uint64_t) override {}  // no dropout
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int64_t num_parameters() const override { return config_.num_parameters(); }

  // ImageClassifier
  ImageClassifier* image_classifier() override { return this; }
  int num_classes() const override { return config_.num_classes; }
  /// [image_size, image_size, num_channels].
  Shape image_shape() const override;
  /// Class logits fp32 [B, K] of images [B,H,W,Cin] (inference).
  void classify(const Tensor& images, const Tensor& logits) override;

 private:
  struct State;
  void reserve(int B);
  /// Patches, embeddings and blocks; leaves norm(class token rows) in the head's saved out.
  void run_forward(const Tensor& images);

  ViTConfig config_;
  std::unique_ptr<ViTLayers> layers_;
  std::unique_ptr<State> state_;
  LossAccumulator loss_;
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
};

}  // namespace kiln
