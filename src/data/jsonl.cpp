#include "data/jsonl.h"

#include "data/utf8.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kiln::data {

JsonlText jsonl_text(std::string_view line, const std::string& key) {
  JsonlText r;
  const Utf8Check utf8 = utf8_check(line);
  if (utf8.error || utf8.valid_len != line.size()) {
    r.error = fmt::format("invalid UTF-8 at byte {} of the line", utf8.valid_len);
    return r;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    r.error = fmt::format("invalid JSON ({})", e.what());
    return r;
  }
  if (!j.is_object()) {
    r.error = fmt::format("not a JSON object (a {})", j.type_name());
    return r;
  }
  const auto it = j.find(key);
  if (it == j.end()) {
    r.error = fmt::format("no key '{}'", key);
    return r;
  }
  if (!it->is_string()) {
    r.error = fmt::format("'{}' is a {}, not a string", key, it->type_name());
    return r;
  }
  r.text = it->get<std::string>();
  return r;
}

}  // namespace kiln::data
