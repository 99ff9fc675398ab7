// The table of config keys (internal to src/config/config*.cpp): each entry knows its
// name, where its value lives in TrainConfig, its allowed range or choices and its
// description. The reader, the --set parser, to_toml() and config_keys() all walk it, so
// adding a key is one line in config_keys.cpp plus one field in config.h (and a row in
// docs/config.md).
#pragma once

#include "config/config.h"

#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kiln::config_detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Where a key's value lives in a TrainConfig.
using Ref = std::variant<int*, int64_t*, double*, std::string*, std::vector<int64_t>*, bool*,
                         std::vector<std::string>*>;

struct Key {
  std::string name;               // "section.key" or "section.table.key"
  Ref (*ref)(TrainConfig&) = nullptr;  // the field
  std::string description;
  double lo = -kInf, hi = kInf;   // allowed range for numbers
  bool lo_open = false, hi_open = false;
  std::vector<std::string> choices;  // allowed strings (empty = any)

  std::string_view section() const { return std::string_view(name).substr(0, name.find('.')); }
  /// The name within its section ("key" or "table.key", as to_toml() writes it).
  std::string_view in_section() const { return std::string_view(name).substr(name.find('.') + 1); }
};

inline Ref field(const Key& key, const TrainConfig& config) {
  return key.ref(const_cast<TrainConfig&>(config));
}

inline bool is_int(const Ref& r) { return r.index() <= 1; }

/// Every key, in to_toml() order.
const std::vector<Key>& keys();
/// The key named "section.key", or nullptr.
const Key* find_key(std::string_view name);
/// The sections, in table order.
std::vector<std::string> section_names();

/// When model.init_from is a Hugging Face model folder: every [model] shape key not in
/// `origins` (the keys set explicitly: key -> "config.toml" or "--set") takes the value of
/// the folder's config.json; an explicit key that differs is a kiln::Error naming both,
/// as is model.preset (config_hf.cpp).
void fill_model_from_hf_folder(TrainConfig& config,
                               const std::map<std::string, std::string, std::less<>>& origins);

}  // namespace kiln::config_detail
