// Llama 3's registry entry (models/registry.h): its factory, what it supports, its presets
// (Meta's published 3.1 and 3.2 sizes) and its Hugging Face folders.
#include "models/llama/arch.h"

#include "models/llama/formats.h"
#include "models/llama/llama.h"

namespace kiln {

ModelArch llama_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<Llama>(llama_config_of(o), backend, storage);
  };
  a.decodes = true;
  a.stages = true;
  a.tensor_parallel = true;
  a.context_parallel = true;
  // Meta's published configs (Hugging Face meta-llama/Llama-3.x config.json): 128K
  // context, rope_theta 500000, "llama3" rope scaling (factor 32 for 3.2, 8 for 3.1).
  a.presets = {
      {.name = "llama3.2-1b", .n_layer = 16, .n_head = 32, .n_embd = 2048, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .n_kv_head = 8, .ffn_hidden_size = 8192,
       .norm_eps = 1e-5, .rope_theta = 500000, .rope_factor = 32, .rope_low_freq_factor = 1,
       .rope_high_freq_factor = 4, .rope_original_max_position = 8192, .tie_embeddings = true},
      {.name = "llama3.2-3b", .n_layer = 28, .n_head = 24, .n_embd = 3072, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .n_kv_head = 8, .ffn_hidden_size = 8192,
       .norm_eps = 1e-5, .rope_theta = 500000, .rope_factor = 32, .rope_low_freq_factor = 1,
       .rope_high_freq_factor = 4, .rope_original_max_position = 8192, .tie_embeddings = true},
      {.name = "llama3.1-8b", .n_layer = 32, .n_head = 32, .n_embd = 4096, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .n_kv_head = 8, .ffn_hidden_size = 14336,
       .norm_eps = 1e-5, .rope_theta = 500000, .rope_factor = 8, .rope_low_freq_factor = 1,
       .rope_high_freq_factor = 4, .rope_original_max_position = 8192},
      {.name = "llama3.1-70b", .n_layer = 80, .n_head = 64, .n_embd = 8192, .block_size = 131072,
       .vocab_size = 128256, .arch = "llama", .n_kv_head = 8, .ffn_hidden_size = 28672,
       .norm_eps = 1e-5, .rope_theta = 500000, .rope_factor = 8, .rope_low_freq_factor = 1,
       .rope_high_freq_factor = 4, .rope_original_max_position = 8192},
  };
  a.options_from_json = llama_options_from_json;
  a.options_from_hf = llama_options_from_hf;
  a.hf_config = llama_hf_config;
  a.hf_layout = llama_hf_layout;
  return a;
}

}  // namespace kiln
