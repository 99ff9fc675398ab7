// The vision transformer's registry entry (models/registry.h): an image classifier that
// reads images; no presets or file formats of its own.
#include "models/vit/arch.h"

#include "models/vit/vit.h"

namespace kiln {

ModelArch vit_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<ViT>(vit_config_of(o), backend, storage);
  };
  a.takes_images = true;
  a.classifies_images = true;
  a.keys = vision_keys();
  a.options_from_json = vit_options_from_json;
  return a;
}

}  // namespace kiln
