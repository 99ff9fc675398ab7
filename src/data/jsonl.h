// JSONL records (one JSON object per line, https://jsonlines.org) as `kiln prepare` reads
// them: the text of one key of each line, or the reason the line is bad.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace kiln::data {

/// The JSON value on one line, or (error not empty) why there is none: invalid UTF-8
/// (with the byte offset in the line) or invalid JSON (nlohmann's message).
struct JsonLine {
  nlohmann::json value;
  std::string error;
};
/// Parses `line`. Never throws.
JsonLine parse_json_line(std::string_view line);

/// One line's text, or (error not empty) why the line yields none, in words for a report
/// such as "data.jsonl:17: invalid JSON (...)".
struct JsonlText {
  std::string text;
  std::string error;
};

/// The string value of `key` in the JSON object on `line`. Bad lines (error set):
/// parse_json_line's, not an object, no `key`, or `key` not a string. The text is valid UTF-8 (JSON escapes decoded).
/// Never throws.
JsonlText jsonl_text(std::string_view line, const std::string& key);

}  // namespace kiln::data
