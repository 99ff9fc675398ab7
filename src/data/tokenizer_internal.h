// Internal to kiln_data: the tokenizer.json writer shared by the tokenizer kinds.
#pragma once

#include "data/tokenizer.h"

#include <map>
#include <string>

namespace kiln::data {

/// Writes dir/tokenizer.json = {"kind", "files": {role: file name}, "vocab_size",
/// "eot_id", "hash"} atomically.
void write_tokenizer_json(const std::filesystem::path& dir, const Tokenizer& tok,
                          const std::map<std::string, std::string>& files);

/// hex64 as a std::string.
std::string hash_hex(uint64_t h);

}  // namespace kiln::data
