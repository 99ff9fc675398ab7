// The table of config keys (internal to src/config/config*.cpp): each entry knows its
// name, where its value lives in TrainConfig, its allowed range or choices and its
// description. The reader, the --set parser, to_toml() and config_keys() all walk it, so
// adding a key is one line in config_keys.cpp plus one field in config.h (and a row in
// docs/config.md). The [model] keys of one family are not in it: each family declares
// them (ModelArch::keys, src/models/<arch>/), and model_keys.cpp reads them.
#pragma once

#include "config/config.h"
#include "models/model_options.h"

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <toml++/toml.h>

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

// Which source set each key explicitly (key -> "config.toml" or "--set").
using Origins = std::map<std::string, std::string, std::less<>>;

/// When model.init_from is a Hugging Face model folder: every common [model] shape key not
/// in `origins` takes the value of the folder's config.json; an explicit key that differs
/// is a kiln::Error naming both, as is model.preset (config_hf.cpp). Returns the folder's
/// model options (for take_hf_model_keys), or nullopt when init_from is not one.
std::optional<ModelOptions> fill_model_from_hf_folder(TrainConfig& config, const Origins& origins);
/// The family keys of `hf` (those its config.json gives) into config.model.family, as
/// fill_model_from_hf_folder does for the common ones; `keys` are model.arch's.
void take_hf_model_keys(TrainConfig& config, const Origins& origins, const ModelOptions& hf,
                        const ModelKeys& keys);

// Values as TOML (config.cpp) ---------------------------------------------------------

std::string toml_type_name(const toml::node& node);
/// `v` as a TOML float ("1.0", "1e-05").
std::string format_float(double v);
/// "> 0", ">= 0", "between 0 and 3", "in [0, 1)".
std::string describe_range(double lo, double hi, bool lo_open, bool hi_open, bool integer);
/// `value` parsed as TOML ("v = <value>"); nullopt when it is not valid TOML.
std::optional<toml::table> parse_value(const std::string& value);

// Family [model] keys (model_keys.cpp) -------------------------------------------------

/// A [model] key outside the common table, as given, until model.arch is known.
struct GivenModelKey {
  std::string source;                   // the file or "--set"
  std::shared_ptr<toml::table> holder;  // the value, as "v"
  const toml::node& node() const { return *holder->get("v"); }
};
/// By name within [model] ("n_kv_head", "rope_scaling.factor").
using GivenModelKeys = std::map<std::string, GivenModelKey, std::less<>>;

/// Every family key ("model.<name>") a registered arch declares, once each.
std::vector<std::string> family_key_names();
/// Keeps `node` for `name` ("model.n_kv_head") from `source` when a registered arch
/// declares the key; false (nothing kept) when none does.
bool give_model_key(GivenModelKeys& given, const std::string& name, const toml::node& node,
                    const std::string& source);
/// As give_model_key for --set name=text (text as TOML, of the declared type). Throws
/// kiln::Error when the text is no value of that type.
bool give_model_override(GivenModelKeys& given, const std::string& name, const std::string& text);
/// Once model.arch is known: config.model.family (and family_lists, its IntegerList keys)
/// = every key the arch declares, from
/// `given` (type-checked; origins recorded), else the Hugging Face folder `hf`, else the
/// preset, else its default. A given key only other archs declare is a kiln::Error unless
/// it holds one of their defaults (an earlier version's to_toml() wrote them all).
void resolve_model_keys(TrainConfig& config, Origins& origins, const GivenModelKeys& given,
                        const ModelOptions* hf, const ModelPreset* preset);
/// The ranges of the arch's keys and its cross-key checks (ModelArch::check_options),
/// each error naming the key's source.
void validate_model_keys(const TrainConfig& config, const Origins& origins);
/// A family key's value as TOML (an IntegerList's: its default, "[]").
std::string format_model_value(const ModelKey& key, double value);
/// An IntegerList key's value as TOML ("[0, 3]").
std::string format_model_list(const std::vector<int>& list);
/// The arch's keys as to_toml() lines ("rope_scaling.factor = 8.0"), in declaration order.
std::string model_keys_toml(const TrainConfig& config);

/// One family key for config_keys(): its full name, its declaration (the first arch's)
/// and a description saying which archs read it.
struct ModelKeyDoc {
  std::string name;
  ModelKey key;
  std::string description;
};
std::vector<ModelKeyDoc> model_key_docs();

}  // namespace kiln::config_detail
