#include "models/model_options.h"

#include "core/error.h"

#include <fmt/ranges.h>

namespace kiln {

const ModelKey* find_model_key(const ModelKeys& keys, std::string_view name) {
  for (const ModelKey& k : keys)
    if (k.name == name) return &k;
  return nullptr;
}

namespace {
bool is_list(const ModelKey* key) { return key && key->type == ModelKeyType::IntegerList; }
}  // namespace

double ModelOptions::value(const ModelKeys& keys, std::string_view name) const {
  const ModelKey* key = find_model_key(keys, name);
  KILN_CHECK(key && !is_list(key), "model.{}: not a number key of model.arch '{}'", name, arch);
  const auto it = family.find(name);
  return it == family.end() ? key->default_value : it->second;
}

int ModelOptions::integer(const ModelKeys& keys, std::string_view name) const {
  return static_cast<int>(value(keys, name));
}

bool ModelOptions::flag(const ModelKeys& keys, std::string_view name) const {
  return value(keys, name) != 0.0;
}

const std::string& ModelOptions::choice(const ModelKeys& keys, std::string_view name) const {
  const double v = value(keys, name);
  const ModelKey* key = find_model_key(keys, name);
  KILN_CHECK(key->type == ModelKeyType::Choice && v >= 0 &&
                 v < static_cast<double>(key->choices.size()) && v == static_cast<int>(v),
             "model.{}: {} is not one of its choices", name, v);
  return key->choices[static_cast<size_t>(v)];
}

const std::vector<int>& ModelOptions::integer_list(const ModelKeys& keys,
                                                   std::string_view name) const {
  static const std::vector<int> empty;
  KILN_CHECK(is_list(find_model_key(keys, name)),
             "model.{}: not an integer-list key of model.arch '{}'", name, arch);
  const auto it = family_lists.find(name);
  return it == family_lists.end() ? empty : it->second;
}

void check_family_keys(const ModelOptions& options, const ModelKeys& keys) {
  for (const auto& [name, v] : options.family) {
    const ModelKey* key = find_model_key(keys, name);
    KILN_CHECK(key && !is_list(key), "model.{} ({}): not a key of model.arch '{}'", name, v,
               options.arch);
  }
  for (const auto& [name, v] : options.family_lists)
    KILN_CHECK(is_list(find_model_key(keys, name)),
               "model.{} ([{}]): not an integer-list key of model.arch '{}'", name,
               fmt::join(v, ", "), options.arch);
}

}  // namespace kiln
