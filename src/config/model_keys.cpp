// The [model] keys of the families (ModelArch::keys, declared in src/models/<arch>/): given
// keys are kept as written until model.arch is known, then checked against the arch's
// declarations, filled from a Hugging Face folder, the preset or their defaults, and
// written back by to_toml() (config_keys.h).
#include "config/config_keys.h"

#include "config/components.h"
#include "core/error.h"
#include "models/registry.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace kiln::config_detail {
namespace {

std::string_view type_name(ModelKeyType t) {
  switch (t) {
    case ModelKeyType::Integer: return "integer";
    case ModelKeyType::Float: return "float";
    case ModelKeyType::Choice: return "string";
    case ModelKeyType::IntegerList: return "array of integers";
    default: return "boolean";
  }
}

// The declarations of the key called `name` within [model], by architecture.
std::vector<std::pair<std::string, ModelKey>> declarations(std::string_view name) {
  std::vector<std::pair<std::string, ModelKey>> out;
  for (const std::string& arch : model_archs_with_key(name))
    out.emplace_back(arch, *find_model_key(model_arch(arch).keys, name));
  return out;
}

// The keys of `arch`'s family; none when the arch is unknown (make_model names it).
ModelKeys keys_of(const std::string& arch) {
  const std::vector<std::string> known = model_archs();
  if (std::find(known.begin(), known.end(), arch) == known.end()) return {};
  return model_arch(arch).keys;
}

[[noreturn]] void wrong_type(std::string_view source, std::string_view name, ModelKeyType t,
                             const std::string& given) {
  KILN_FAIL("{}: wrong type for key '{}': expected {}, got {}", source, name, type_name(t), given);
}

// The value of `node` for a key of type `t` (bools 0 / 1). Throws kiln::Error naming
// `source` and `name` for another type or a value out of range.
double value_of(const ModelKey& k, const toml::node& node, std::string_view source,
                std::string_view name) {
  switch (k.type) {
    case ModelKeyType::Integer: {
      if (!node.is_integer()) wrong_type(source, name, k.type, toml_type_name(node));
      const int64_t v = node.as_integer()->get();
      KILN_CHECK(v >= INT32_MIN && v <= INT32_MAX, "{}: key '{}' is out of range, got {}", source,
                 name, v);
      return static_cast<double>(v);
    }
    case ModelKeyType::Float: {
      double v;
      if (node.is_floating_point())
        v = node.as_floating_point()->get();
      else if (node.is_integer())
        v = static_cast<double>(node.as_integer()->get());
      else
        wrong_type(source, name, k.type, toml_type_name(node));
      KILN_CHECK(std::isfinite(v), "{}: key '{}' must be finite, got {}", source, name, v);
      return v;
    }
    case ModelKeyType::Choice: {
      if (!node.is_string()) wrong_type(source, name, k.type, toml_type_name(node));
      const std::string& v = node.as_string()->get();
      const auto it = std::find(k.choices.begin(), k.choices.end(), v);
      KILN_CHECK(it != k.choices.end(), "{}: key '{}' must be one of \"{}\", got \"{}\"", source,
                 name, fmt::join(k.choices, "\", \""), v);
      return static_cast<double>(it - k.choices.begin());
    }
    case ModelKeyType::IntegerList:
      KILN_FAIL("{}: key '{}' is a list (not a number)", source, name);  // list_of reads it
    default:
      if (!node.is_boolean()) wrong_type(source, name, k.type, toml_type_name(node));
      return node.as_boolean()->get() ? 1.0 : 0.0;
  }
}

// The value of `node` for an IntegerList key: an array of integers, each an int. Throws
// kiln::Error naming `source` and `name` otherwise.
std::vector<int> list_of(const ModelKey& k, const toml::node& node, std::string_view source,
                         std::string_view name) {
  if (!node.is_array()) wrong_type(source, name, k.type, toml_type_name(node));
  std::vector<int> out;
  for (const toml::node& el : *node.as_array()) {
    if (!el.is_integer()) wrong_type(source, name, k.type, "array containing " + toml_type_name(el));
    const int64_t v = el.as_integer()->get();
    KILN_CHECK(v >= INT32_MIN && v <= INT32_MAX, "{}: key '{}' is out of range, got {}", source,
               name, v);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

// Whether `node` holds the default of the key `k` (a list's: []). False for another type.
bool holds_default(const ModelKey& k, const toml::node& node, std::string_view source,
                   std::string_view name) {
  try {
    if (k.type == ModelKeyType::IntegerList) return list_of(k, node, source, name).empty();
    return value_of(k, node, source, name) == k.default_value;
  } catch (const Error&) {
    return false;  // another type: not that arch's default
  }
}

// A key of other architectures than `arch`: accepted, with no effect, when it holds the
// default one of them declares (what to_toml() of earlier versions wrote for every key);
// else a one-line error naming the archs that have it.
void check_foreign_key(const std::string& name, const GivenModelKey& g, const std::string& arch) {
  const std::string key = "model." + name;
  std::vector<std::string> archs;
  for (const auto& [a, decl] : declarations(name)) {
    archs.push_back(a);
    if (holds_default(decl, g.node(), g.source, key)) return;
  }
  KILN_FAIL("{}: key '{}' is not a key of model.arch '{}' ({} {} it)", g.source, key, arch,
            fmt::join(archs, ", "), archs.size() == 1 ? "has" : "have");
}

// The range check of the key's declaration (ModelKey::lo, hi), naming `source`.
void check_range(const ModelKey& k, double v, const std::string& source) {
  if (k.type == ModelKeyType::IntegerList) return;  // check_list_range
  const bool ok = (k.lo_open ? v > k.lo : v >= k.lo) && (k.hi_open ? v < k.hi : v <= k.hi);
  KILN_CHECK(ok, "{}: key 'model.{}' must be {}, got {}", source, k.name,
             describe_range(k.lo, k.hi, k.lo_open, k.hi_open, k.type == ModelKeyType::Integer),
             format_model_value(k, v));
}

// check_range for each element of an IntegerList key's value.
void check_list_range(const ModelKey& k, const std::vector<int>& list, const std::string& source) {
  for (const int v : list) {
    const bool ok = (k.lo_open ? v > k.lo : v >= k.lo) && (k.hi_open ? v < k.hi : v <= k.hi);
    KILN_CHECK(ok, "{}: key 'model.{}' holds {}: each element must be {}", source, k.name, v,
               describe_range(k.lo, k.hi, k.lo_open, k.hi_open, true));
  }
}

}  // namespace

std::vector<std::string> family_key_names() {
  std::vector<std::string> out;
  for (const std::string& arch : model_archs())
    for (const ModelKey& k : model_arch(arch).keys)
      if (std::find(out.begin(), out.end(), "model." + k.name) == out.end())
        out.push_back("model." + k.name);
  return out;
}

bool give_model_key(GivenModelKeys& given, const std::string& name, const toml::node& node,
                    const std::string& source) {
  if (!name.starts_with("model.") || model_archs_with_key(name.substr(6)).empty()) return false;
  GivenModelKey g{source, std::make_shared<toml::table>()};
  node.visit([&](const auto& n) { g.holder->insert("v", n); });
  given.insert_or_assign(name.substr(6), std::move(g));
  return true;
}

bool give_model_override(GivenModelKeys& given, const std::string& name, const std::string& text) {
  if (!name.starts_with("model.")) return false;
  const auto decls = declarations(name.substr(6));
  if (decls.empty()) return false;
  std::optional<toml::table> t = parse_value(text);
  double v;
  const char* e = text.data() + text.size();
  if (!t && decls.front().second.type == ModelKeyType::Float &&
      std::from_chars(text.data(), e, v).ptr == e && !text.empty())
    t = toml::table{{"v", v}};  // ".5", "5."
  if (!t && decls.front().second.type == ModelKeyType::Choice)
    t = toml::table{{"v", text}};  // a bare string: --set model.moe.scoring=sigmoid
  if (decls.front().second.type == ModelKeyType::IntegerList && !text.starts_with('['))
    t = parse_value("[" + text + "]");  // 0,3 as [0,3]; "" as [] (as other lists' --set)
  if (!t)
    KILN_FAIL("--set: wrong type for key '{}': expected {}, got '{}'", name,
              type_name(decls.front().second.type), text);
  return give_model_key(given, name, *t->get("v"), "--set");
}

void resolve_model_keys(TrainConfig& c, Origins& origins, const GivenModelKeys& given,
                        const ModelOptions* hf, const ModelPreset* preset) {
  const ModelKeys keys = keys_of(c.model.arch);
  auto& family = c.model.family;
  auto& lists = c.model.family_lists;
  family.clear();
  lists.clear();
  for (const auto& [name, g] : given) {
    const ModelKey* k = find_model_key(keys, name);
    if (!k) {
      check_foreign_key(name, g, c.model.arch);
      continue;
    }
    if (k->type == ModelKeyType::IntegerList)
      lists[name] = list_of(*k, g.node(), g.source, "model." + name);
    else
      family[name] = value_of(*k, g.node(), g.source, "model." + name);
    origins["model." + name] = g.source;
  }
  if (hf) take_hf_model_keys(c, origins, *hf, keys);
  if (preset)
    for (const auto& [name, v] : preset->keys)
      if (!origins.contains("model." + name)) family[name] = v;
  for (const ModelKey& k : keys) {
    if (k.type == ModelKeyType::IntegerList)
      lists.try_emplace(k.name);
    else
      family.try_emplace(k.name, k.default_value);
  }
}

void validate_model_keys(const TrainConfig& c, const Origins& origins) {
  auto src = [&](std::string_view name) -> std::string {
    auto it = origins.find(name);
    return it == origins.end() ? c.source : it->second;
  };
  const std::vector<std::string> known = model_archs();
  if (std::find(known.begin(), known.end(), c.model.arch) == known.end()) return;
  const ModelArch arch = model_arch(c.model.arch);
  for (const ModelKey& k : arch.keys) {
    if (k.type == ModelKeyType::IntegerList)
      check_list_range(k, c.model.family_lists.at(k.name), src("model." + k.name));
    else
      check_range(k, c.model.family.at(k.name), src("model." + k.name));
  }
  if (arch.check_options) arch.check_options(model_options_from(c), src);
}

std::string format_model_value(const ModelKey& k, double v) {
  switch (k.type) {
    case ModelKeyType::Integer: return fmt::format("{}", static_cast<int64_t>(v));
    case ModelKeyType::Float: return format_float(v);
    case ModelKeyType::Choice:
      if (v >= 0 && v < static_cast<double>(k.choices.size()))
        return fmt::format("\"{}\"", k.choices[static_cast<size_t>(v)]);
      return fmt::format("{}", v);
    case ModelKeyType::IntegerList: return "[]";  // its only scalar form: the default
    default: return v != 0 ? "true" : "false";
  }
}

std::string format_model_list(const std::vector<int>& list) {
  return fmt::format("[{}]", fmt::join(list, ", "));
}

std::string model_keys_toml(const TrainConfig& c) {
  std::string out;
  for (const ModelKey& k : keys_of(c.model.arch)) {
    if (k.type == ModelKeyType::IntegerList) {
      if (const auto it = c.model.family_lists.find(k.name); it != c.model.family_lists.end())
        out += fmt::format("{} = {}\n", k.name, format_model_list(it->second));
    } else if (const auto it = c.model.family.find(k.name); it != c.model.family.end()) {
      out += fmt::format("{} = {}\n", k.name, format_model_value(k, it->second));
    }
  }
  return out;
}

std::vector<ModelKeyDoc> model_key_docs() {
  std::vector<ModelKeyDoc> out;
  for (const std::string& name : family_key_names()) {
    const auto decls = declarations(name.substr(6));
    ModelKeyDoc d{name, decls.front().second, {}};
    std::vector<std::string> archs, texts;
    for (const auto& [a, k] : decls) {
      archs.push_back(a);
      if (std::find(texts.begin(), texts.end(), k.description) == texts.end())
        texts.push_back(k.description);
    }
    d.description = fmt::format("{} Read by {}.", fmt::join(texts, " "), fmt::join(archs, ", "));
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace kiln::config_detail
