// The registry: the built-in families, one line each (each states its entry in its own
// folder, models/<arch>/arch.cpp), and whatever tests and extensions register.
#include "models/registry.h"

#include "core/error.h"
#include "models/dit/arch.h"
#include "models/gpt2/arch.h"
#include "models/llama/arch.h"
#include "models/llava/arch.h"
#include "models/mmdit/arch.h"
#include "models/vit/arch.h"

#include <mutex>

namespace kiln {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ModelArch> archs{
      {"gpt2", gpt2_arch()},
      {"llama", llama_arch()},
      {"vit", vit_arch()},
      {"dit", dit_arch()},
      {"llava", llava_arch()},
      {"mmdit", mmdit_arch()},
  };
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
  const ModelArch a = entry_of(options.arch);
  check_family_keys(options, a.keys);
  return a.make(options, backend, storage);
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

std::vector<std::string> model_archs_with(bool ModelArch::*flag) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [k, v] : registry().archs)
    if (v.*flag) out.push_back(k);
  return out;
}

std::vector<std::string> model_archs_with_key(std::string_view name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [k, v] : registry().archs)
    if (find_model_key(v.keys, name)) out.push_back(k);
  return out;
}

std::vector<ModelPreset> model_presets() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<ModelPreset> out;
  for (const auto& [k, v] : registry().archs) out.insert(out.end(), v.presets.begin(), v.presets.end());
  return out;
}

std::optional<ModelPreset> find_model_preset(std::string_view name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  for (const auto& [k, v] : registry().archs)
    for (const ModelPreset& p : v.presets)
      if (p.name == name) return p;
  return std::nullopt;
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
  KILN_CHECK(a.export_weights, "export: --format {}: model.arch '{}' has no file formats of its "
             "own to export to{}", format, arch,
             a.hf_layout ? " (it exports as a Hugging Face folder: --format hf)" : "");
  a.export_weights(config, read, format, out);
}

}  // namespace kiln
