// The training configuration: TOML reading, --set overrides, preset (and Hugging Face
// folder: config_hf.cpp) resolution, validation, to_toml()/hash() and the schedule's keys,
// all driven by the key table (config_keys.h / config_keys.cpp).
#include "config/config.h"
#include "config/components.h"
#include "config/config_keys.h"

#include "models/registry.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <sstream>
#include <variant>
#include "core/error.h"

namespace kiln {

namespace config_detail {

std::string toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

std::string format_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
  return s;
}

std::optional<toml::table> parse_value(const std::string& value) {
  try {
    return toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

std::string describe_range(double lo, double hi, bool lo_open, bool hi_open, bool integer) {
  auto num = [&](double v) { return integer ? fmt::format("{}", static_cast<int64_t>(v)) : fmt::format("{}", v); };
  if (hi == kInf) return fmt::format("{} {}", lo_open ? ">" : ">=", num(lo));
  if (lo == -kInf) return fmt::format("{} {}", hi_open ? "<" : "<=", num(hi));
  if (integer && !lo_open && !hi_open) return fmt::format("between {} and {}", num(lo), num(hi));
  return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", num(lo), num(hi), hi_open ? ")" : "]");
}

}  // namespace config_detail

namespace {

using namespace config_detail;

std::string_view type_name(const Ref& r) {
  switch (r.index()) {
    case 0:
    case 1: return "integer";
    case 2: return "float";
    case 3: return "string";
    case 5: return "boolean";
    case 6: return "array of strings";
    default: return "array of integers";
  }
}

std::string_view doc_type_name(const Ref& r) {
  switch (r.index()) {
    case 0:
    case 1: return "int";
    case 2: return "float";
    case 3: return "string";
    case 5: return "bool";
    case 6: return "string array";
    default: return "int array";
  }
}

// Suggestions ----------------------------------------------------------------------

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string_view leaf(std::string_view name) {
  auto dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

// The closest valid name, or "" when nothing is close. A key whose last component is
// a valid key of another section ("train.lr" -> "optim.lr") counts as close too, and so
// does a name that one of them begins ("optimizer" -> "optim").
std::string suggest(std::string_view given_as_typed, const std::vector<std::string>& candidates) {
  // Keys are lower case: "parallel.EP" is "parallel.ep" mistyped.
  std::string lower(given_as_typed);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string_view given = lower;
  std::string best;
  size_t best_score = std::numeric_limits<size_t>::max(), best_full = best_score;
  for (const auto& c : candidates) {
    size_t full = edit_distance(given, c);
    size_t score = std::min(full, edit_distance(leaf(given), leaf(c)) + 2);
    if (c.size() >= 3 && given.size() >= 3 && (given.starts_with(c) || c.starts_with(given)))
      score = std::min<size_t>(score, 1);
    if (score < best_score || (score == best_score && full < best_full)) {
      best = c;
      best_score = score;
      best_full = full;
    }
  }
  size_t limit = std::max<size_t>(2, given.size() / 3);
  return best_score <= limit ? best : std::string();
}

std::string with_suggestion(std::string msg, std::string_view given,
                            const std::vector<std::string>& candidates) {
  std::string s = suggest(given, candidates);
  if (!s.empty()) msg += fmt::format(" (did you mean '{}'?)", s);
  return msg;
}

[[noreturn]] void unknown_key(std::string_view source, std::string_view name) {
  std::vector<std::string> all = family_key_names();
  for (const auto& k : keys()) all.push_back(k.name);
  throw Error(with_suggestion(fmt::format("{}: unknown key '{}'", source, name), name, all));
}

// Values ---------------------------------------------------------------------------



std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", c);
        else
          out += ch;
    }
  }
  return out + "\"";
}

// The value of `r` as TOML.
std::string format_value(const Ref& r) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, double>)
          return format_float(*p);
        else if constexpr (std::is_same_v<T, std::string>)
          return quote(*p);
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return fmt::format("[{}]", fmt::join(*p, ", "));
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::vector<std::string> quoted;
          for (const std::string& v : *p) quoted.push_back(quote(v));
          return fmt::format("[{}]", fmt::join(quoted, ", "));
        }
        else
          return fmt::format("{}", *p);
      },
      r);
}

// Stores `node` into the key's field, checking its type. `source` names the file or
// "--set" in errors.
[[noreturn]] void wrong_type(std::string_view source, const Key& key, const Ref& r,
                             const std::string& given) {
  KILN_FAIL("{}: wrong type for key '{}': expected {}, got {}", source, key.name, type_name(r),
            given);
}

void assign(const Key& key, const toml::node& node, TrainConfig& config, std::string_view source) {
  Ref r = key.ref(config);
  switch (r.index()) {
    case 0:
    case 1: {
      if (!node.is_integer()) wrong_type(source, key, r, toml_type_name(node));
      int64_t v = node.as_integer()->get();
      if (auto* ip = std::get_if<int*>(&r)) {
        KILN_CHECK(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(),
                   "{}: key '{}' is out of range, got {}", source, key.name, v);
        **ip = static_cast<int>(v);
      } else {
        *std::get<int64_t*>(r) = v;
      }
      break;
    }
    case 2: {
      double v;
      if (node.is_floating_point())
        v = node.as_floating_point()->get();
      else if (node.is_integer())
        v = static_cast<double>(node.as_integer()->get());
      else
        wrong_type(source, key, r, toml_type_name(node));
      KILN_CHECK(std::isfinite(v), "{}: key '{}' must be finite, got {}", source, key.name, v);
      *std::get<double*>(r) = v;
      break;
    }
    case 3:
      if (!node.is_string()) wrong_type(source, key, r, toml_type_name(node));
      *std::get<std::string*>(r) = node.as_string()->get();
      break;
    case 5:
      if (!node.is_boolean()) wrong_type(source, key, r, toml_type_name(node));
      *std::get<bool*>(r) = node.as_boolean()->get();
      break;
    case 6: {
      if (!node.is_array()) wrong_type(source, key, r, toml_type_name(node));
      std::vector<std::string> values;
      for (const auto& el : *node.as_array()) {
        if (!el.is_string()) wrong_type(source, key, r, "array containing " + toml_type_name(el));
        values.push_back(el.as_string()->get());
      }
      *std::get<std::vector<std::string>*>(r) = std::move(values);
      break;
    }
    default: {
      if (!node.is_array()) wrong_type(source, key, r, toml_type_name(node));
      std::vector<int64_t> values;
      for (const auto& el : *node.as_array()) {
        if (!el.is_integer()) wrong_type(source, key, r, "array containing " + toml_type_name(el));
        values.push_back(el.as_integer()->get());
      }
      *std::get<std::vector<int64_t>*>(r) = std::move(values);
    }
  }
}

// Loading --------------------------------------------------------------------------

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// The keys of `table` named `prefix`.<key>; a sub-table (e.g. [model.rope_scaling] or
// rope_scaling.factor = ..) names prefix.<table>.<key>. A family's [model] key goes to
// `given`, checked once model.arch is known (model_keys.cpp).
void apply_keys(const toml::table& table, const std::string& prefix, TrainConfig& config,
                Origins& origins, GivenModelKeys& given, const std::string& source) {
  for (auto&& [kk, vv] : table) {
    std::string name = prefix + "." + std::string(kk.str());
    const Key* key = find_key(name);
    if (!key && vv.is_table()) {
      apply_keys(*vv.as_table(), name, config, origins, given, source);
      continue;
    }
    if (!key && give_model_key(given, name, vv, source)) continue;
    if (!key) unknown_key(source, name);
    assign(*key, vv, config, source);
    origins[name] = source;
  }
}

void apply_table(const toml::table& root, TrainConfig& config, Origins& origins,
                 GivenModelKeys& given, const std::string& source) {
  std::vector<std::string> sections = section_names();
  for (auto&& [k, v] : root) {
    std::string sec(k.str());
    bool known_section = std::find(sections.begin(), sections.end(), sec) != sections.end();
    if (!v.is_table()) {
      KILN_CHECK(!known_section, "{}: '{}' must be a section ([{}]), got {}", source, sec, sec,
                 toml_type_name(v));
      unknown_key(source, sec);
    }
    if (!known_section)
      throw Error(with_suggestion(fmt::format("{}: unknown section '{}'", source, sec), sec,
                                  sections));
    apply_keys(*v.as_table(), sec, config, origins, given, source);
  }
}

toml::table parse_toml(std::string_view text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    KILN_FAIL("{}:{}:{}: {}", source, e.source().begin.line, e.source().begin.column,
              one_line(std::string(e.description())));
  }
}

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}


// "a, b,c" as the TOML array of its unquoted, trimmed strings; "" is [].
toml::array comma_list(const std::string& value) {
  toml::array values;
  for (size_t at = 0; !value.empty() && at <= value.size();) {
    const size_t comma = std::min(value.find(',', at), value.size());
    values.push_back(trim(value.substr(at, comma - at)));
    at = comma + 1;
  }
  return values;
}

// The --set value text of `key` (named `name`) into config: as the key's type reads it
// (numbers, a bare or quoted string, true / false, a list as [..] or a,b,c), else a
// one-line type error naming the key.
void assign_override_value(const Key& key, const std::string& name, const std::string& value,
                           TrainConfig& config) {
  const std::string source = "--set";
  Ref r = key.ref(config);
  auto cannot_parse = [&]() {
    KILN_FAIL("--set: wrong type for key '{}': expected {}, got '{}'", name, type_name(r), value);
  };
  auto from_toml = [&](const std::string& text) {
    auto t = parse_value(text);
    if (!t) cannot_parse();
    assign(key, *t->get("v"), config, source);
  };

  const char* b = value.data();
  const char* e = value.data() + value.size();
  switch (r.index()) {
    case 0:
    case 1: {
      int64_t v;
      auto [p, ec] = std::from_chars(b, e, v);
      if (!value.empty() && ec == std::errc() && p == e)
        assign(key, toml::value<int64_t>(v), config, source);
      else
        from_toml(value);  // 0x10, 1_000, or a float/string: a precise type error
      break;
    }
    case 2: {
      double v;
      auto [p, ec] = std::from_chars(b, e, v);
      if (!value.empty() && ec == std::errc() && p == e && std::isfinite(v))
        assign(key, toml::value<double>(v), config, source);
      else
        from_toml(value);
      break;
    }
    case 3:
      if (!value.empty() && (value.front() == '"' || value.front() == '\''))
        from_toml(value);  // a quoted TOML string
      else
        assign(key, toml::value<std::string>(value), config, source);
      break;
    case 5:
      from_toml(value);  // true / false
      break;
    case 6:
      if (!value.empty() && value.front() == '[') {
        from_toml(value);
      } else if (!value.empty() && (value.front() == '"' || value.front() == '\'')) {
        from_toml("[" + value + "]");  // quoted TOML strings: "a", 'b'
      } else {
        assign(key, comma_list(value), config, source);
      }
      break;
    default:
      from_toml(value.empty() || value.front() != '[' ? "[" + value + "]" : value);
  }
}

void apply_override(const std::string& override_text, TrainConfig& config, Origins& origins,
                    GivenModelKeys& given) {
  const std::string source = "--set";
  auto eq = override_text.find('=');
  KILN_CHECK(eq != std::string::npos && !trim(override_text.substr(0, eq)).empty(),
             "--set '{}': expected section.key=value", override_text);
  std::string name = trim(override_text.substr(0, eq));
  std::string value = trim(override_text.substr(eq + 1));
  const Key* key = find_key(name);
  if (!key && give_model_override(given, name, value)) return;
  if (!key) unknown_key(source, name);
  assign_override_value(*key, name, value, config);
  origins[name] = source;
}

// A preset fills the keys of its own architecture only: model.arch set explicitly to
// another one is a one-line error naming both keys' sources and the arch's own presets.
void check_preset_arch(const TrainConfig& c, const ModelPreset& p, const Origins& origins) {
  const auto arch_origin = origins.find("model.arch");
  if (arch_origin == origins.end() || c.model.arch == p.arch) return;
  std::vector<std::string_view> own;
  for (const ModelPreset& q : model_presets())
    if (q.arch == c.model.arch) own.push_back(q.name);
  KILN_FAIL("{}: key 'model.preset' ('{}') is a {} preset, but model.arch is '{}' ({}); {} "
            "presets: {}", origins.at("model.preset"), p.name, p.arch, c.model.arch,
            arch_origin->second, c.model.arch,
            own.empty() ? std::string("none") : fmt::format("{}", fmt::join(own, ", ")));
}

// Fills the preset's values (for keys not given explicitly), the family keys of the
// resolved model.arch (model_keys.cpp) and the derived defaults.
void resolve(TrainConfig& c, Origins& origins, const GivenModelKeys& given) {
  const std::optional<ModelOptions> hf = fill_model_from_hf_folder(c, origins);
  const std::optional<ModelPreset> p = find_model_preset(c.model.preset);
  if (p) {
    check_preset_arch(c, *p, origins);
    auto fill = [&](const char* name, int& field, int value) {
      if (!origins.contains(name)) field = value;
    };
    fill("model.n_layer", c.model.n_layer, p->n_layer);
    fill("model.n_head", c.model.n_head, p->n_head);
    fill("model.n_embd", c.model.n_embd, p->n_embd);
    fill("model.block_size", c.model.block_size, p->block_size);
    fill("model.vocab_size", c.model.vocab_size, p->vocab_size);
    if (!origins.contains("model.arch")) c.model.arch = std::string(p->arch);
  }
  resolve_model_keys(c, origins, given, hf ? &*hf : nullptr, p ? &*p : nullptr);
  if (c.train.seq_len == 0) c.train.seq_len = c.model.block_size;
}

std::string describe_key_range(const Key& k, bool integer) {
  return describe_range(k.lo, k.hi, k.lo_open, k.hi_open, integer);
}

void validate(const TrainConfig& c, const Origins& origins) {
  auto src = [&](std::string_view name) -> std::string {
    auto it = origins.find(name);
    return it == origins.end() ? c.source : it->second;
  };
  // Per-key ranges and choices.
  for (const Key& k : keys()) {
    Ref r = field(k, c);
    if (auto* s = std::get_if<std::string*>(&r); s && !k.choices.empty()) {
      if (std::find(k.choices.begin(), k.choices.end(), **s) == k.choices.end()) {
        std::vector<std::string> shown;
        for (const auto& ch : k.choices) shown.push_back(quote(ch));
        KILN_FAIL("{}: key '{}' must be one of {}, got {}", src(k.name), k.name,
                  fmt::join(shown, ", "), quote(**s));
      }
    }
    if (r.index() <= 2) {
      double v = std::visit(
          [](auto* p) -> double {
            if constexpr (std::is_arithmetic_v<std::remove_pointer_t<decltype(p)>>)
              return static_cast<double>(*p);
            else
              return 0.0;
          },
          r);
      bool ok = (k.lo_open ? v > k.lo : v >= k.lo) && (k.hi_open ? v < k.hi : v <= k.hi);
      KILN_CHECK(ok, "{}: key '{}' must be {}, got {}", src(k.name), k.name,
                 describe_key_range(k, is_int(r)), format_value(r));
    }
  }
  // Keys that relate to each other.
  if (c.model.n_head > 0 && c.model.n_embd > 0)
    KILN_CHECK(c.model.n_embd % c.model.n_head == 0,
               "{}: key 'model.n_embd' ({}) must be divisible by model.n_head ({})",
               src("model.n_embd"), c.model.n_embd, c.model.n_head);
  validate_model_keys(c, origins);
  check_layout_supported(c, src);
  if (c.model.block_size > 0)
    KILN_CHECK(c.train.seq_len <= c.model.block_size,
               "{}: key 'train.seq_len' ({}) must not exceed model.block_size ({})",
               src("train.seq_len"), c.train.seq_len, c.model.block_size);
  // Where seq_len came from: its own key, else model.block_size's. Only for a family that
  // takes context parallelism (TrainStep names the others).
  const std::vector<std::string> cp_archs = model_archs_with(&ModelArch::context_parallel);
  if (c.parallel.cp > 1 && std::ranges::find(cp_archs, c.model.arch) != cp_archs.end()) {
    const bool own = origins.contains("train.seq_len");
    KILN_CHECK(c.train.seq_len % (2 * c.parallel.cp) == 0,
               "{}: train.seq_len = {}{} is not a multiple of 2 x parallel.cp = {} (context "
               "parallelism cuts each sequence into 2 x cp equal chunks)",
               src(own ? "train.seq_len" : "model.block_size"), c.train.seq_len,
               own ? "" : " (model.block_size's)", 2 * c.parallel.cp);
  }
  if (c.train.global_batch > 0)
    KILN_CHECK(c.train.global_batch % c.train.micro_batch == 0,
               "{}: key 'train.global_batch' ({}) must be a multiple of train.micro_batch ({})",
               src("train.global_batch"), c.train.global_batch, c.train.micro_batch);
  KILN_CHECK(c.schedule.min_lr <= c.optim.lr,
             "{}: key 'schedule.min_lr' ({}) must not exceed optim.lr ({})", src("schedule.min_lr"),
             c.schedule.min_lr, c.optim.lr);
  KILN_CHECK(c.train.grad_dtype == "fp32" || c.train.grad_dtype == c.train.dtype,
             "{}: key 'train.grad_dtype' must be fp32 or train.dtype ({}), got {}",
             src("train.grad_dtype"), c.train.dtype, c.train.grad_dtype);
  const LoraSection& lora = c.train.lora;
  KILN_CHECK(lora.dtype == "fp32" || lora.dtype == c.train.dtype,
             "{}: key 'train.lora.dtype' must be fp32 or train.dtype ({}), got {}",
             src("train.lora.dtype"), c.train.dtype, lora.dtype);
  KILN_CHECK(c.train.grad_dtype == "fp32" || lora.rank == 0 || lora.dtype != "fp32",
             "{}: train.grad_dtype = {} with train.lora.dtype = fp32: fp32 adapters keep fp32 "
             "gradients (set train.grad_dtype = fp32, or train.lora.dtype = {})",
             src("train.grad_dtype"), c.train.grad_dtype, c.train.dtype);
  const auto& ps = c.profile.steps;
  KILN_CHECK(ps.empty() || (ps.size() == 2 && ps[0] >= 0 && ps[0] < ps[1]),
             "{}: key 'profile.steps' must be [] or [a, b] with 0 <= a < b, got [{}]",
             src("profile.steps"), fmt::join(ps, ", "));
}

TrainConfig load(std::string_view text, const std::vector<std::string>& overrides,
                 const std::string& name) {
  TrainConfig config;
  config.source = name;
  Origins origins;
  GivenModelKeys given;
  apply_table(parse_toml(text, name), config, origins, given, name);
  for (const auto& o : overrides) apply_override(o, config, origins, given);
  resolve(config, origins, given);
  validate(config, origins);
  return config;
}

}  // namespace

// Public API -----------------------------------------------------------------------

std::span<const ConfigKeyInfo> config_keys() {
  struct Store {
    std::vector<ModelKeyDoc> family;  // the families' [model] keys
    std::vector<std::string> types, defaults;
    std::vector<ConfigKeyInfo> infos;
  };
  static const Store store = [] {
    Store s;
    const TrainConfig defaults;
    s.family = model_key_docs();
    const std::vector<ModelKeyDoc>& family = s.family;
    for (const ModelKeyDoc& d : family) {
      s.types.emplace_back(d.key.type == ModelKeyType::Integer  ? "int"
                           : d.key.type == ModelKeyType::Float  ? "float"
                           : d.key.type == ModelKeyType::Choice ? "string"
                           : d.key.type == ModelKeyType::IntegerList ? "int array"
                                                                : "bool");
      s.defaults.push_back(format_model_value(d.key, d.key.default_value));
    }
    for (const Key& k : keys()) s.defaults.push_back(format_value(field(k, defaults)));
    const size_t n = family.size();
    for (size_t i = 0; i < keys().size(); ++i) {
      const Key& k = keys()[i];
      if (k.section() != "model" && s.infos.size() == i)  // after the common [model] keys
        for (size_t j = 0; j < n; ++j)
          s.infos.push_back({family[j].name, s.types[j], s.defaults[j], family[j].description});
      s.infos.push_back({k.name, doc_type_name(field(k, defaults)), s.defaults[n + i], k.description});
    }
    return s;
  }();
  return store.infos;
}

TrainConfig load_config_string(std::string_view text, const std::vector<std::string>& overrides,
                               const std::string& name_for_errors) {
  return load(text, overrides, name_for_errors);
}

TrainConfig load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: cannot open the config file", path);
  std::stringstream ss;
  ss << in.rdbuf();
  KILN_CHECK(!in.bad(), "{}: cannot read the config file", path);
  return load(ss.str(), overrides, path);
}

int TrainConfig::grad_accum_steps(int dp_size) const {
  KILN_CHECK(dp_size >= 1, "{}: data-parallel size must be >= 1, got {}", source, dp_size);
  if (train.global_batch == 0) return 1;
  int64_t per_step = int64_t{train.micro_batch} * dp_size;
  KILN_CHECK(per_step > 0 && train.global_batch % per_step == 0,
             "{}: key 'train.global_batch' ({}) must be a multiple of train.micro_batch ({}) * "
             "data-parallel size ({}) = {}",
             source, train.global_batch, train.micro_batch, dp_size, per_step);
  return static_cast<int>(train.global_batch / per_step);
}

std::string TrainConfig::to_toml() const {
  std::string out = "# kiln training config, fully resolved\n";
  std::string_view section;
  for (const Key& k : keys()) {
    if (k.section() != section) {
      if (section == "model") out += model_keys_toml(*this);  // the family's keys
      section = k.section();
      out += fmt::format("\n[{}]\n", section);
    }
    out += fmt::format("{} = {}\n", k.in_section(), format_value(field(k, *this)));
  }
  return out;
}

std::string TrainConfig::hash() const {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char ch : to_toml()) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

void TrainConfig::validate_for_training() const {
  KILN_CHECK(!data.dir.empty() || !data.blend.empty(), "{}: key 'data.dir' (or data.blend) is required for training",
             source);
  KILN_CHECK(data.dir.empty() || data.blend.empty(),
             "{}: data.dir and data.blend are both set; a run reads one data set or one blend", source);
  auto need = [&](const char* name, int64_t v) {
    KILN_CHECK(v > 0, "{}: key '{}' is required for training (set it or model.preset)", source,
               name);
  };
  need("model.n_layer", model.n_layer);
  need("model.n_head", model.n_head);
  need("model.n_embd", model.n_embd);
  need("model.block_size", model.block_size);
  KILN_CHECK(train.steps > 0, "{}: key 'train.steps' must be > 0 for training", source);
  KILN_CHECK(train.fp8 == "none" || train.dtype != "fp16", "{}: train.fp8 = \"{}\" with "
             "train.dtype = \"fp16\": fp8 runs with bf16 or fp32 (docs/fp8.md)", source, train.fp8);
  KILN_CHECK(train.fp8 != "none" || train.fp8_layers.empty(), "{}: train.fp8_layers is set but "
             "train.fp8 = \"none\"", source);
  const LoraSection lora_defaults;
  KILN_CHECK(train.lora.rank > 0 ||
                 (train.lora.alpha == lora_defaults.alpha && !train.lora.rslora &&
                  train.lora.dropout == lora_defaults.dropout &&
                  train.lora.targets == lora_defaults.targets && train.lora.init_from.empty() &&
                  train.lora.dtype == lora_defaults.dtype),
             "{}: train.lora keys are set but train.lora.rank = 0 (LoRA off): set the rank",
             source);
  KILN_CHECK(train.lora.rank == 0 || train.freeze.empty(), "{}: train.freeze with train.lora: "
             "LoRA freezes every parameter but the adapters itself", source);
  const TrainSection defaults;
  KILN_CHECK(train.fp8 == "delayed" ||
                 (train.fp8_amax_history_len == defaults.fp8_amax_history_len &&
                  train.fp8_amax_compute_algo == defaults.fp8_amax_compute_algo),
             "{}: train.fp8_amax_history_len / fp8_amax_compute_algo are set but train.fp8 = "
             "\"{}\": they belong to delayed scaling (train.fp8 = \"delayed\")", source, train.fp8);
}

bool TrainConfig::operator==(const TrainConfig& o) const {
  return model == o.model && data == o.data && train == o.train && backend == o.backend &&
         optim == o.optim && schedule == o.schedule && eval == o.eval && sample == o.sample &&
         checkpoint == o.checkpoint && run == o.run && log == o.log && parallel == o.parallel &&
         profile == o.profile;
}

LrSchedule lr_schedule_of(const TrainConfig& c) {
  LrSchedule s;
  s.kind = parse_lr_schedule_kind(c.schedule.kind);
  s.lr = c.optim.lr;
  s.min_lr = c.schedule.min_lr;
  // A short run of a longer config (--set train.steps=50) warms up over the whole run
  // (kiln train warns: Trainer::print_start_up).
  s.warmup_steps = c.train.steps > 0 ? std::min(c.schedule.warmup_steps, c.train.steps)
                                     : c.schedule.warmup_steps;
  s.total_steps = c.train.steps;
  s.decay_fraction = c.schedule.decay_fraction;
  return s;
}

double learning_rate(const TrainConfig& c, int64_t step) { return learning_rate(lr_schedule_of(c), step); }

}  // namespace kiln
