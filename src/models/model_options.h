// The [model] options a model is built from (the config file's [model] section, a
// checkpoint's state "model", a Hugging Face config.json), the keys a family declares
// beyond the common ones, and the presets that fill them.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// The type of a family's [model] key (ModelKey). A Choice is a string among the key's
/// `choices`, held as its index (a double like the others) and written as the string. An
/// IntegerList is a list of ints (TOML array, JSON array), held in
/// ModelOptions::family_lists; its default is the empty list and its range (lo..hi)
/// applies to each element.
enum class ModelKeyType { Integer, Float, Bool, Choice, IntegerList };

/// One [model] key a family declares beyond the common ones (ModelArch::keys, stated in
/// its own folder): its name within [model] ("n_kv_head", "rope_scaling.factor"), its
/// type, default, allowed range (numbers: lo..hi, open or closed ends) and description
/// (docs/config.md). The config checks a given value against it; ModelOptions::value
/// falls back to its default.
struct ModelKey {
  std::string name = {};
  ModelKeyType type = ModelKeyType::Integer;
  double default_value = 0.0;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  std::string description = {};
  std::vector<std::string> choices = {};  // a Choice's strings (default_value: an index)
  /// A training hyper-parameter (e.g. a balancing loss's coefficient): it changes the loss
  /// or an update rule, never a tensor nor what the model computes from given weights. A
  /// resume may change it (Trainer::check_same_run), and a value set in the config wins
  /// over a model.init_from folder's.
  bool training_only = false;
};
using ModelKeys = std::vector<ModelKey>;

/// The declaration of `name` in `keys`, or nullptr.
const ModelKey* find_model_key(const ModelKeys& keys, std::string_view name);

/// The [model] options of a model: the keys every architecture reads as fields, and the
/// values of its family's keys (ModelArch::keys) by name. Each factory checks the ones it
/// needs and ignores none silently (make_model refuses a family key the arch does not
/// declare).
struct ModelOptions {
  std::string arch = "gpt2";
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int block_size = 0;  // maximum sequence length
  int vocab_size = 0;  // real vocabulary; the model pads it as it likes
  float dropout = 0.f;
  /// The family's keys by name within [model] ("n_kv_head", "rope_scaling.factor"); bools
  /// are 0 / 1. A key absent here has its declared default (value()).
  std::map<std::string, double, std::less<>> family;
  /// The family's IntegerList keys by name (ModelKeyType::IntegerList: "moe.dense_layers");
  /// a key absent here is the empty list.
  std::map<std::string, std::vector<int>, std::less<>> family_lists;

  /// The value of the family key `name` that `keys` declares: the one in `family`, else its
  /// default. Throws kiln::Error when `keys` does not declare `name`.
  double value(const ModelKeys& keys, std::string_view name) const;
  /// value() of an Integer key, as an int.
  int integer(const ModelKeys& keys, std::string_view name) const;
  /// value() of a Bool key (non-zero: true).
  bool flag(const ModelKeys& keys, std::string_view name) const;
  /// value() of a Choice key, as its string.
  const std::string& choice(const ModelKeys& keys, std::string_view name) const;
  /// The IntegerList key `name` that `keys` declares: the one in family_lists, else [].
  /// Throws kiln::Error when `keys` does not declare `name` as an IntegerList.
  const std::vector<int>& integer_list(const ModelKeys& keys, std::string_view name) const;
};

/// Where the [model] key `name` ("model.n_kv_head") came from (a file, "--set"), for
/// errors (ModelArch::check_options).
using KeySource = std::function<std::string(std::string_view name)>;

/// Throws kiln::Error naming the first key of options.family (or family_lists) that `keys`
/// does not declare (as a list, for family_lists):
/// "model.n_kv_head: not a key of model.arch 'gpt2'".
void check_family_keys(const ModelOptions& options, const ModelKeys& keys);

/// One model preset's shape (model.preset): the [model] keys it sets. The common keys
/// first; then `keys`, the family keys it sets by name (bools 0 / 1; the others keep their
/// defaults). Each family lists its own (ModelArch::presets, e.g. models/llama/arch.cpp).
struct ModelPreset {
  std::string_view name;
  int n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  std::string_view arch = "gpt2";
  std::map<std::string, double, std::less<>> keys = {};
};

}  // namespace kiln
