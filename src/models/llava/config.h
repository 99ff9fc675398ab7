// LLaVA (Liu et al. 2023, "Visual Instruction Tuning"; LLaVA-1.5: Liu et al. 2024,
// "Improved Baselines with Visual Instruction Tuning") hyper-parameters, parameter count
// and training FLOPs: a ViT trunk (models/patch_encoder.h) over the image, a 2-layer
// MLP projector with GELU, and a Llama decoder (models/llama_config.h) reading the image's
// N patch features as N tokens among the text's.
//
// [model] keys: the common ones and Llama's are the decoder's (n_layer, n_head, n_embd,
// block_size, vocab_size, n_kv_head, ...); the vision tower's are vision.n_layer,
// vision.n_head, vision.n_embd, vision.ffn_hidden_size, vision.patch_size,
// vision.norm_eps and vision.feature_layer, with image_size and num_channels (0: the
// data set's). A sequence is T = block_size positions: the N image tokens and T - N text
// slots.
#pragma once

#include "models/llama_config.h"
#include "models/model_options.h"
#include "models/vision_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kiln {

struct LlavaConfig {
  LlamaConfig text;     // the decoder
  VisionShape vision;   // the vision tower (num_classes unused: 0)
  /// The vision block whose output the projector reads, from the end: -1 the last, -2
  /// the penultimate (LLaVA-1.5's vision_feature_layer), -(n_layer + 1) the embeddings;
  /// the blocks after it do not run.
  int feature_layer = -1;

  /// N, the image's tokens in the decoder's sequence: its patches.
  int image_tokens() const { return vision.patches(); }
  /// The vision blocks that run: vision.n_layer + 1 + feature_layer.
  int vision_blocks() const { return vision.n_layer + 1 + feature_layer; }
  /// Text slots of a sequence of T positions: T - N.
  int text_tokens(int T) const { return T - image_tokens(); }
  /// Throws kiln::Error naming the [model] key of an impossible shape.
  void validate() const;
  /// Every parameter: the decoder's (Llama's count), the vision tower's (patch
  /// projection D Cv + Cv, positions N Cv, per block 12 Cv^2 + 13 Cv with a 4 Cv MLP, in
  /// general 4 Cv^2 + 2 Cv H + 9 Cv + H) and the projector's (Cv C + C + C^2 + C).
  int64_t num_parameters() const;
  /// Training FLOPs per sequence position at length T (MFU): the decoder's
  /// (LlamaConfig::flops_per_token), plus, spread over the T positions of the image's
  /// sequence, the vision tower's N positions (6 (D Cv + Lv (4 Cv^2 + 2 Cv H)) + 12 Lv N
  /// Cv each, Lv the blocks that run) and the projector's (6 (Cv C + C^2) each). Frozen
  /// parts count 6N as the trained ones.
  double flops_per_token(int T) const;
  std::string str() const;
};

/// LLaVA's [model] keys (ModelArch::keys): Llama's and the vision ones above.
const ModelKeys& llava_keys();
/// ModelArch::check_options: Llama's checks, and vision.feature_layer within the vision
/// blocks.
void llava_check_options(const ModelOptions& options, const KeySource& source);
/// The LLaVA of the [model] keys, validated. Throws kiln::Error naming the key for an
/// impossible shape, a block_size that leaves no text slot after the image's tokens,
/// dropout > 0, or a mixture-of-experts decoder (not yet).
LlavaConfig llava_config_of(const ModelOptions& options);
/// Hyper-parameters as stored in a checkpoint's state ("model" object: Llama's, and
/// "vision"), and back.
nlohmann::json llava_config_json(const LlavaConfig& c);
ModelOptions llava_options_from_json(const nlohmann::json& j);

}  // namespace kiln
