// Image-text pairs in LLaVA's format (Liu et al. 2023, "Visual Instruction Tuning": the
// files of its data releases, e.g. llava_instruct_150k.json), as `kiln prepare` will read
// them for a vision-language model (docs/data.md):
//
//   {"id": "000000033471", "image": "coco/train2017/000000033471.png",
//    "conversations": [{"from": "human", "value": "<image>\nWhat are the colors of the bus?"},
//                      {"from": "gpt", "value": "The bus is white and red."}, ...]}
//
// A file is a JSON array of such records (LLaVA's own files) or JSONL (one per line).
// "image" is a path relative to the image folder; a record without it is text only. The
// turns alternate "human" and "gpt", the human first, and at least one "gpt" turn gives
// the loss something to learn; a record with an image holds exactly one "<image>" (where
// the image's tokens go), in a human turn, and one without holds none. Other keys are
// ignored. The turns become chat messages: human -> "user", gpt -> "assistant".
#pragma once

#include "data/chat.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::data {

/// Where the image's tokens go in a record's text.
inline constexpr const char* kImageToken = "<image>";

/// One record, or (error not empty) why it is bad, in words for a report such as
/// "pairs.json[17] (id 000000033471): ...".
struct LlavaRecord {
  std::string id;     // its "id" as text (a number's digits); "" when absent
  std::string image;  // its "image" path, relative to the image folder; "" for text only
  std::vector<ChatMessage> messages;  // its turns in order, as chat messages
  std::string error;
};

/// Checks and converts one record (the rules above): not an object, an "id" or "image"
/// that is not a string (or a number, for the id), an empty "image", no "conversations"
/// list, a turn that is not {"from": string, "value": string}, a "from" other than human
/// or gpt, turns that do not alternate from a human one, no gpt turn, and the "<image>"
/// count (one, in a human turn, with an image; none without). Never throws.
LlavaRecord parse_llava_record(const nlohmann::json& record);

/// A record of a file and where it is: "FILE[INDEX]" for a JSON array (0-based, as
/// Python indexes LLaVA's lists), "FILE:LINE" for JSONL (1-based).
struct LlavaEntry {
  std::string where;
  LlavaRecord record;
};

/// Every record of a LLaVA pair file, bad ones with their error (the caller reports or
/// skips them). A file whose first non-blank byte is '[' is one JSON array; otherwise JSONL,
/// where a blank line is skipped and a line that is not JSON is a bad record. Throws
/// kiln::Error naming the file when it cannot be read, an array file is not valid JSON,
/// or it holds no record.
std::vector<LlavaEntry> read_llava_file(const std::filesystem::path& path);

}  // namespace kiln::data
