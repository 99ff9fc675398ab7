#include "data/jsonl.h"

#include "data/utf8.h"

#include <fmt/format.h>

namespace kiln::data {

namespace {
// "an array", "a number", "null": a JSON value's type as a noun.
std::string type_noun(const nlohmann::json& j) {
  const std::string t = j.type_name();
  if (j.is_null()) return t;
  return (t.find_first_of("aeiou") == 0 ? "an " : "a ") + t;
}
}  // namespace

JsonLine parse_json_line(std::string_view line) {
  JsonLine r;
  const Utf8Check utf8 = utf8_check(line);
  if (utf8.error || utf8.valid_len != line.size()) {
    r.error = fmt::format("invalid UTF-8 at byte {} of the line", utf8.valid_len);
    return r;
  }
  try {
    r.value = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    r.error = fmt::format("invalid JSON ({})", e.what());
  }
  return r;
}

JsonlText jsonl_text(std::string_view line, const std::string& key) {
  JsonlText r;
  JsonLine parsed = parse_json_line(line);
  if (!parsed.error.empty()) {
    r.error = std::move(parsed.error);
    return r;
  }
  const nlohmann::json& j = parsed.value;
  if (!j.is_object()) {
    r.error = fmt::format("not a JSON object but {}", type_noun(j));
    return r;
  }
  const auto it = j.find(key);
  if (it == j.end()) {
    r.error = fmt::format("no key '{}'", key);
    return r;
  }
  if (!it->is_string()) {
    r.error = fmt::format("'{}' is {}, not a string", key, type_noun(*it));
    return r;
  }
  r.text = it->get<std::string>();
  return r;
}

}  // namespace kiln::data
