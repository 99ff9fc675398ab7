// model.init_from = a Hugging Face folder: its config.json gives the model's shape, as a
// preset does, and explicit keys must agree with it (config_keys.h).
#include "config/config_keys.h"

#include "core/error.h"
#include "models/hf_formats.h"
#include "models/registry.h"

#include <fmt/format.h>

namespace kiln::config_detail {

void fill_model_from_hf_folder(TrainConfig& c,
                               const std::map<std::string, std::string, std::less<>>& origins) {
  ModelSection& m = c.model;
  if (m.init_from.empty()) return;
  auto origin = [&](const char* key) {
    auto it = origins.find(key);
    return it == origins.end() ? c.source : it->second;
  };
  // A wrong path is named here, before a missing model key would be blamed instead.
  const std::filesystem::path from(m.init_from);
  std::error_code ec;
  KILN_CHECK(std::filesystem::exists(from, ec), "{}: key 'model.init_from': {} does not exist",
             origin("model.init_from"), m.init_from);
  KILN_CHECK(!std::filesystem::is_directory(from, ec) || is_hf_folder(from) ||
                 std::filesystem::exists(from / "manifest.json", ec),
             "{}: key 'model.init_from': {} is neither a Hugging Face folder (config.json) nor a "
             "kiln checkpoint (manifest.json)", origin("model.init_from"), m.init_from);
  if (!is_hf_folder(m.init_from)) return;
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
  take("model.vocab_size", m.vocab_size, o.vocab_size);
  take("model.n_kv_head", m.n_kv_head, o.n_kv_head);
  take("model.ffn_hidden_size", m.ffn_hidden_size, o.ffn_hidden_size);
  take("model.norm_eps", m.norm_eps, hf_float_value(o.norm_eps));
  take("model.rope_theta", m.rope_theta, o.rope.theta);
  take("model.rope_scaling.factor", m.rope_scaling.factor, o.rope.scale_factor);
  if (o.rope.scale_factor > 0) {
    take("model.rope_scaling.low_freq_factor", m.rope_scaling.low_freq_factor, o.rope.low_freq_factor);
    take("model.rope_scaling.high_freq_factor", m.rope_scaling.high_freq_factor, o.rope.high_freq_factor);
    take("model.rope_scaling.original_max_position", m.rope_scaling.original_max_position,
         o.rope.original_max_positions);
  }
  take("model.tie_embeddings", m.tie_embeddings, o.tie_embeddings);
}

}  // namespace kiln::config_detail
