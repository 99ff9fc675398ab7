// The only file outside models/gpt2/ that names GPT-2: it registers the architecture.
#include "models/registry.h"

#include "core/error.h"
#include "models/gpt2/gpt2.h"

#include <map>
#include <mutex>

namespace kiln {

namespace {

std::unique_ptr<Model> make_gpt2(const ModelOptions& o, Backend& backend, const ModelStorage& storage) {
  return std::make_unique<GPT2>(gpt2_config_of(o), backend, storage);
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, ModelFactory> factories{{"gpt2", make_gpt2}};
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::unique_ptr<Model> make_model(const ModelOptions& options, Backend& backend,
                                  const ModelStorage& storage) {
  ModelFactory f;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto it = registry().factories.find(options.arch);
    if (it != registry().factories.end()) f = it->second;
  }
  if (!f) {
    std::string known;
    for (const auto& a : model_archs()) known += (known.empty() ? "" : ", ") + a;
    KILN_FAIL("model.arch '{}' is not a known architecture (known: {})", options.arch, known);
  }
  return f(options, backend, storage);
}

void register_model(const std::string& arch, ModelFactory factory) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().factories[arch] = std::move(factory);
}

std::vector<std::string> model_archs() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> out;
  for (const auto& [k, v] : registry().factories) out.push_back(k);
  return out;
}

}  // namespace kiln
