// JSONL records (one JSON object per line, https://jsonlines.org) as `kiln prepare` reads
// them: the text of one key of each line, or the reason the line is bad.
#pragma once

#include <string>
#include <string_view>

namespace kiln::data {

/// One line's text, or (error not empty) why the line yields none, in words for a report
/// such as "data.jsonl:17: invalid JSON (...)".
struct JsonlText {
  std::string text;
  std::string error;
};

/// The string value of `key` in the JSON object on `line`. Bad lines (error set): invalid
/// UTF-8 (with the byte offset in the line), invalid JSON (nlohmann's message), not an
/// object, no `key`, or `key` not a string. The text is valid UTF-8 (JSON escapes decoded).
/// Never throws.
JsonlText jsonl_text(std::string_view line, const std::string& key);

}  // namespace kiln::data
