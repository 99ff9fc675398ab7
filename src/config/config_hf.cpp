// model.init_from = a Hugging Face folder: its config.json gives the model's shape, as a
// preset does, and explicit keys must agree with it (config_keys.h).
#include "config/config_keys.h"

#include "core/error.h"
#include "models/hf_formats.h"
#include "models/registry.h"

#include <fmt/format.h>

namespace kiln::config_detail {

namespace {

std::string origin(const TrainConfig& c, const Origins& origins, std::string_view key) {
  auto it = origins.find(key);
  return it == origins.end() ? c.source : it->second;
}

}  // namespace

std::optional<ModelOptions> fill_model_from_hf_folder(TrainConfig& c, const Origins& origins) {
  ModelSection& m = c.model;
  if (m.init_from.empty()) return std::nullopt;
  auto origin = [&](const char* key) { return config_detail::origin(c, origins, key); };
  // A wrong path is named here, before a missing model key would be blamed instead.
  const std::filesystem::path from(m.init_from);
  std::error_code ec;
  KILN_CHECK(std::filesystem::exists(from, ec), "{}: key 'model.init_from': {} does not exist",
             origin("model.init_from"), m.init_from);
  KILN_CHECK(!std::filesystem::is_directory(from, ec) || is_hf_folder(from) ||
                 std::filesystem::exists(from / "manifest.json", ec),
             "{}: key 'model.init_from': {} is neither a Hugging Face folder (config.json) nor a "
             "kiln checkpoint (manifest.json)", origin("model.init_from"), m.init_from);
  if (!is_hf_folder(m.init_from)) return std::nullopt;
  const std::string file = (from / "config.json").string();
  KILN_CHECK(m.preset.empty(), "{}: key 'model.preset' ('{}') and model.init_from = {}, a "
             "Hugging Face folder whose config.json gives the shape: remove model.preset",
             origin("model.preset"), m.preset, m.init_from);
  const ModelOptions o = hf_folder_options(m.init_from);
  auto take = [&](const char* key, auto& field, auto value) {
    if (!origins.contains(key)) {
      field = value;
      return;
    }
    KILN_CHECK(field == value, "{}: key '{}' is {}, but model.init_from's {} gives {}",
               origin(key), key, field, file, value);
  };
  take("model.arch", m.arch, o.arch);
  take("model.n_layer", m.n_layer, o.n_layer);
  take("model.n_head", m.n_head, o.n_head);
  take("model.n_embd", m.n_embd, o.n_embd);
  take("model.block_size", m.block_size, o.block_size);
  // model.vocab_size = 0 means "from the data" (docs/config.md): as if unset.
  if (m.vocab_size == 0)
    m.vocab_size = o.vocab_size;
  else
    take("model.vocab_size", m.vocab_size, o.vocab_size);
  return o;
}

namespace {

// The keys of `from` (a folder's config.json values) into `into` (config.model.family or
// family_lists), each that `keys` declares; one set explicitly must equal the folder's,
// but for a training-only key (ModelKey::training_only), where the config's value wins.
// `format(key, value)` writes a value as TOML for the error.
template <class Map, class Format>
void take_keys(const TrainConfig& c, const Origins& origins, const Map& from, Map& into,
               const ModelKeys& keys, Format format) {
  const std::string file = (std::filesystem::path(c.model.init_from) / "config.json").string();
  for (const auto& [name, value] : from) {
    const ModelKey* k = find_model_key(keys, name);
    if (!k) continue;
    const std::string key = "model." + name;
    if (!origins.contains(key)) {
      into[name] = value;
      continue;
    }
    if (k->training_only) continue;
    KILN_CHECK(into.at(name) == value, "{}: key '{}' is {}, but model.init_from's {} gives {}",
               origin(c, origins, key), key, format(*k, into.at(name)), file, format(*k, value));
  }
}

}  // namespace

void take_hf_model_keys(TrainConfig& c, const Origins& origins, const ModelOptions& hf,
                        const ModelKeys& keys) {
  take_keys(c, origins, hf.family, c.model.family, keys, format_model_value);
  take_keys(c, origins, hf.family_lists, c.model.family_lists, keys,
            [](const ModelKey&, const std::vector<int>& v) { return format_model_list(v); });
}

}  // namespace kiln::config_detail
