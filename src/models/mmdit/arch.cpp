// The text-to-image diffusion transformer's registry entry (models/registry.h): a flow
// model that reads image-text pairs (images and their captions) and generates images
// from text; no presets or file formats of its own.
#include "models/mmdit/arch.h"

#include "models/mmdit/mmdit.h"

namespace kiln {

ModelArch mmdit_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<MMDiT>(mmdit_config_of(o), backend, storage);
  };
  a.takes_images = true;
  a.takes_text = true;
  a.generates_images = true;
  a.keys = mmdit_keys();
  a.options_from_json = mmdit_options_from_json;
  return a;
}

}  // namespace kiln
