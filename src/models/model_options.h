// The [model] options a model is built from (the config file's [model] section, a
// checkpoint's state "model", a Hugging Face config.json), and the presets that fill them.
#pragma once

#include "backend/backend.h"

#include <string>
#include <string_view>

namespace kiln {

/// The [model] keys every architecture reads (docs/config.md); each factory checks the
/// ones it needs and ignores none silently.
struct ModelOptions {
  std::string arch = "gpt2";
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int block_size = 0;  // maximum sequence length
  int vocab_size = 0;  // real vocabulary; the model pads it as it likes
  float dropout = 0.f;
  // Rotary / grouped-query / SwiGLU architectures (llama); GPT-2 rejects n_kv_head, ffn_hidden_size
  // and rope scaling other than its own.
  int n_kv_head = 0;        // key/value heads; 0 = n_head
  int ffn_hidden_size = 0;  // MLP hidden width; 0 = the architecture's default
  float norm_eps = 1e-5f;   // RMSNorm epsilon (GPT-2: its LayerNorm eps is fixed, 1e-5)
  RopeSpec rope;            // theta, Llama 3.1 rescaling (scale_factor 0: none)
  bool tie_embeddings = false;  // output head = token embedding (GPT-2 ignores it: always tied)
  // Vision transformers (vit): square images, patches, classes.
  int image_size = 0;
  int num_channels = 0;
  int patch_size = 0;
  int num_classes = 0;
  float class_dropout = 0.1f;  // dit: probability a training label becomes the null class
};

/// One model preset's shape (model.preset): the [model] keys it sets. Fields after
/// vocab_size are 0 / false where the preset does not set them (the key's default stays).
/// Each family lists its own (ModelArch::presets, e.g. models/llama/arch.cpp).
struct ModelPreset {
  std::string_view name;
  int n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  std::string_view arch = "gpt2";
  int n_kv_head = 0, ffn_hidden_size = 0;
  double norm_eps = 0, rope_theta = 0;
  double rope_factor = 0, rope_low_freq_factor = 0, rope_high_freq_factor = 0,
         rope_original_max_position = 0;
  bool tie_embeddings = false;
};

}  // namespace kiln
