// GPT-2's registry entry (models/registry.h): its factory, what it supports, its presets
// (OpenAI's four sizes) and its file formats (llm.c, safetensors, Hugging Face folders).
#include "models/gpt2/arch.h"

#include "models/gpt2/formats.h"
#include "models/gpt2/gpt2.h"

namespace kiln {

ModelArch gpt2_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<GPT2>(gpt2_config_of(o), backend, storage);
  };
  a.decodes = true;
  a.stages = true;
  a.tensor_parallel = true;
  a.context_parallel = true;
  a.presets = {
      {"gpt2", 12, 12, 768, 1024, 50257},
      {"gpt2-medium", 24, 16, 1024, 1024, 50257},
      {"gpt2-large", 36, 20, 1280, 1024, 50257},
      {"gpt2-xl", 48, 25, 1600, 1024, 50257},
  };
  a.options_from_json = gpt2_options_from_json;
  a.import_weights = gpt2_import_weights;
  a.export_weights = gpt2_export_weights;
  a.options_from_hf = gpt2_options_from_hf;
  a.hf_config = gpt2_hf_config;
  a.hf_layout = gpt2_hf_layout;
  return a;
}

}  // namespace kiln
