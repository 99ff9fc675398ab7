// The only file outside models/<arch>/ that names GPT-2, Llama, ViT or DiT: it registers the
// built-in architectures.
#include "models/registry.h"

#include "core/error.h"
#include "models/gpt2/formats.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/formats.h"
#include "models/llama/llama.h"
#include "models/vit/vit.h"
#include "models/dit/dit.h"

#include <mutex>

namespace kiln {

namespace {

ModelArch gpt2_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<GPT2>(gpt2_config_of(o), backend, storage);
  };
  a.options_from_json = gpt2_options_from_json;
  a.import_weights = gpt2_import_weights;
  a.export_weights = gpt2_export_weights;
  a.options_from_hf = gpt2_options_from_hf;
  a.hf_config = gpt2_hf_config;
  a.hf_layout = gpt2_hf_layout;
  return a;
}

ModelArch llama_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<Llama>(llama_config_of(o), backend, storage);
  };
  a.options_from_json = llama_options_from_json;
  a.options_from_hf = llama_options_from_hf;
  a.hf_config = llama_hf_config;
  a.hf_layout = llama_hf_layout;
  return a;
}

ModelArch vit_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<ViT>(vit_config_of(o), backend, storage);
  };
  a.takes_images = true;
  a.tensor_parallel = false;
  a.context_parallel = false;
  a.options_from_json = vit_options_from_json;
  return a;
}

ModelArch dit_arch() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
    return std::make_unique<DiT>(dit_config_of(o), backend, storage);
  };
  a.takes_images = true;
  a.generates_images = true;
  a.tensor_parallel = false;
  a.context_parallel = false;
  a.options_from_json = dit_options_from_json;
  return a;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, ModelArch> archs{
      {"gpt2", gpt2_arch()}, {"llama", llama_arch()}, {"vit", vit_arch()},
      {"dit", dit_arch()}};
};
Registry& registry() {
  static Registry r;
  return r;
}

// A copy of `arch`'s entry. Throws kiln::Error listing the known architectures.
ModelArch entry_of(const std::string& arch) {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto it = registry().archs.find(arch);
    if (it != registry().archs.end()) return it->second;
  }
  std::string known;
  for (const auto& a : model_archs()) known += (known.empty() ? "" : ", ") + a;
  KILN_FAIL("model.arch '{}' is not a known architecture (known: {})", arch, known);
}

}  // namespace

std::unique_ptr<Model> make_model(const ModelOptions& options, Backend& backend,
                                  const ModelStorage& storage) {
  return entry_of(options.arch).make(options, backend, storage);
}

void register_model(const std::string& arch, ModelFactory factory) {
  ModelArch a;
  a.make = std::move(factory);
  register_arch(arch, std::move(a));
}

void register_arch(const std::string& arch, ModelArch entry) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().archs[arch] = std::move(entry);
}

ModelArch model_arch(const std::string& arch) { return entry_of(arch); }

std::vector<std::string> model_archs() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [k, v] : registry().archs) out.push_back(k);
  return out;
}

ModelOptions model_options_from_json(const std::string& arch, const nlohmann::json& config) {
  const ModelArch a = entry_of(arch);
  KILN_CHECK(a.options_from_json, "model.arch '{}' cannot read its config from a checkpoint", arch);
  ModelOptions o = a.options_from_json(config);
  o.arch = arch;
  return o;
}

HostWeights import_model_weights(const std::filesystem::path& file, const ModelOptions& expect) {
  const ModelArch a = entry_of(expect.arch);
  KILN_CHECK(a.import_weights, "{}: model.arch '{}' has no file formats of its own to read (only "
             "kiln checkpoints)", file.string(), expect.arch);
  return a.import_weights(file, expect);
}

void export_model_weights(const std::string& arch, const nlohmann::json& config,
                          const TensorSource& read, const std::string& format,
                          const std::filesystem::path& out) {
  const ModelArch a = entry_of(arch);
  KILN_CHECK(a.export_weights, "export: model.arch '{}' has no file formats to export to", arch);
  a.export_weights(config, read, format, out);
}

}  // namespace kiln
