// The diffusion transformer's registry entry (models/registry.h): a flow model that reads
// images and generates them; no presets or file formats of its own.
#include "models/dit/arch.h"

#include "models/dit/dit.h"

namespace kiln {

ModelArch dit_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<DiT>(dit_config_of(o), backend, storage);
  };
  a.takes_images = true;
  a.generates_images = true;
  a.keys = dit_keys();
  a.options_from_json = dit_options_from_json;
  return a;
}

}  // namespace kiln
