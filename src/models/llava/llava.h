// LLaVA (Liu et al. 2023; LLaVA-1.5, Liu et al. 2024): a vision-language model on the layer
// library. A ViT trunk reads the image, a 2-layer MLP projects its patch features to the
// decoder's width, and a Llama decoder reads them as tokens among the text's:
//
//   feats [B, N, Cv]  = vision trunk(images [B,H,W,Cin]) at block feature_layer (no class
//                       token, no final norm; models/patch_encoder.h)
//   img   [B, N, C]   = linear_2(GELU(linear_1(feats)))    (GELU: the tanh approximation;
//                       LLaVA's projector uses the exact erf, 3e-4 apart at most)
//   x0    [B, T, C]   = [embed(text[:a]); img; embed(text[a:])]   per sample, a = image_at
//   logits, loss      = the Llama decoder on x0 (rotary positions 0..T-1, causal)
//
// T = N + Lt, Lt the text slots ("tokens" [B, Lt]). A text-only sample (image_at -1) puts
// its image tokens after all its text, where no target sees them (causal attention: they
// change no loss and get no gradient). The loss is the mean over the global batch's
// targets (the answer tokens: the data sets the others to -1), as a language model's.
//
// Parameters, named as Hugging Face's LlavaForConditionalGeneration (its pre-4.52 layout)
// where the layout is the same:
//   vision_tower.{patch_embed.proj.*, pos_embed [N, Cv], blocks.{l}.*}   (timm's ViT names)
//   multi_modal_projector.linear_1.{weight [C, Cv], bias [C]}
//   multi_modal_projector.linear_2.{weight [C, C], bias [C]}
//   language_model.{model.embed_tokens.weight, model.layers.{l}.*, model.norm.weight,
//                   lm_head.weight}                                     (llama.h)
// A kiln ViT's trunk and a kiln Llama load under these prefixes (the ViT's class-token
// row of pos_embed and its head aside). Initialisation: each part as its own model's; the
// projector's matrices N(0, 0.02^2), biases 0.
//
// Parts: 0 the vision tower, the projector and the token embedding (the decoder's
// embeddings: DecoderModel::embed_forward), 1 + l decoder block l, n_layer + 1 the head.
// Data parallel and ZeRO 0-3, activation checkpointing (the vision blocks' too), bf16;
// no tensor, context or pipeline parallelism yet, no dropout. Decoding (kiln sample
// --image): the decoder's KV cache (LlamaKvCache), after a prefill of the prompt with the
// image spliced in (prefill_image).
#pragma once

#include "models/decoder_model.h"
#include "models/llava/config.h"

#include <memory>

namespace kiln {

struct LlavaLayers;
class LlamaKvCache;

class Llava final : public DecoderModel, public VisionLanguageModel {
 public:
  Llava(const LlavaConfig& config, Backend& backend, const ModelStorage& storage = {});
  ~Llava() override;

  const LlavaConfig& config() const { return config_; }

  std::string arch() const override { return "llava"; }
  std::string describe() const override { return config_.str(); }
  nlohmann::json config_json() const override { return llava_config_json(config_); }
  /// "language_model": the decoder's (llama_part_options, with its head).
  std::optional<ModelOptions> part_options(std::string_view prefix) const override {
    if (prefix != "language_model") return std::nullopt;
    return llama_part_options(config_.text, /*has_head=*/true);
  }
  /// Inputs "images" fp32 [B,H,W,Cin] (pixels in [-1, 1]), "tokens" int32 [B, T - N]
  /// (the text, padded) and "image_at" int32 [B] (the text tokens before the image; -1:
  /// none); targets int32 [B,T] over the whole sequence (-1 ignored). Throws kiln::Error
  /// when T leaves no text slot.
  BatchShape batch_shape(int B, int T) const override;
  void set_activation_checkpointing(nn::ActivationCheckpointing mode) override;
  /// No pipeline stages yet (part 0 keeps one micro-batch's image activations).
  std::optional<Shape> stage_activation_shape(int, int) const override { return std::nullopt; }
  void set_dropout(bool, uint64_t, uint64_t) override {}  // no dropout
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int64_t num_parameters() const override { return config_.num_parameters(); }
  // LanguageModel (DecoderModel): KV-cache decoding of the decoder; text only, or after
  // prefill_image.
  int vocab_size() const override { return config_.text.vocab_size; }
  int padded_vocab_size() const override { return config_.text.padded_vocab_size; }
  int max_positions() const override { return config_.text.block_size; }
  void begin_decode(int B, int max_len) override;
  void decode(const Tensor& tokens, const Tensor& logits) override;
  void end_decode() override;
  int decoded_length() const override;

  // VisionLanguageModel
  VisionLanguageModel* vision_language_model() override { return this; }
  Shape image_shape() const override;
  int image_tokens() const override { return config_.image_tokens(); }
  void prefill_image(const Tensor& images, const Tensor& tokens, int image_at,
                     const Tensor& logits) override;

 protected:
  /// The vision tower, the projector and the text's embedding, spliced (above).
  void embed_forward(const Batch& batch, const Tensor& positions, const Tensor& out) override;
  void embed_backward(const Batch& batch, const Tensor& positions, const Tensor& dout) override;

 private:
  struct State;
  /// (Re)allocates the part-0 activations for B samples of Lt text slots.
  void reserve(int B, int64_t Lt);
  /// The image tokens [B,N,C] of images fp32 [B,H,W,Cin] into the state's `image` (B as
  /// reserved): the vision tower, then the projector.
  void encode_images(const Tensor& images);
  /// out [B, N + Lt, C] of the state's text [B,Lt,C] and image [B,N,C], each sample's image
  /// after its first image_at[b] text rows.
  void splice(const Tensor& out);

  LlavaConfig config_;
  std::unique_ptr<LlavaLayers> layers_;
  std::unique_ptr<State> state_;
  std::unique_ptr<LlamaKvCache> cache_;  // decoding
  nn::ActivationCheckpointing mode_ = nn::ActivationCheckpointing::None;
  bool vision_trains_ = false, projector_trains_ = false;  // some parameter of them trains
};

}  // namespace kiln
