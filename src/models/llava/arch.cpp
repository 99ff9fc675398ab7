// LLaVA's registry entry (models/registry.h): a vision-language model that reads images
// and text (an image-text pair data set) and decodes text; no presets or file formats of
// its own yet.
#include "models/llava/arch.h"

#include "models/llava/llava.h"

namespace kiln {

ModelArch llava_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<Llava>(llava_config_of(o), backend, storage);
  };
  a.takes_images = true;
  a.takes_text = true;
  a.decodes = true;
  a.keys = llava_keys();
  a.check_options = llava_check_options;
  a.options_from_json = llava_options_from_json;
  return a;
}

}  // namespace kiln
