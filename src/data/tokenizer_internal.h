// Internal to kiln_data: the tokenizer.json writer and Hugging Face helpers shared by the
// tokenizer kinds.
#pragma once

#include "data/tokenizer.h"

#include <map>
#include <string>

namespace kiln::data {

/// Writes dir/tokenizer.json = {"kind", "files": {role: file name}, "vocab_size",
/// "eot_id", "hash"} atomically.
void write_tokenizer_json(const std::filesystem::path& dir, const Tokenizer& tok,
                          const std::map<std::string, std::string>& files);

/// Hugging Face's tokenizer_config.json: `tokenizer_class` (transformers' class that reads
/// the files), the bos token (null when empty) and the eos token, add_bos_token /
/// add_eos_token false (kiln adds its own separator). Implemented in hf_tokenizer.cpp.
std::string hf_tokenizer_config(const std::string& tokenizer_class, const std::string& bos,
                                const std::string& eos);

/// Creates `dir` and its parents if needed; throws kiln::Error naming it otherwise.
void create_directory_for(const std::filesystem::path& dir);

/// hex64 as a std::string.
std::string hash_hex(uint64_t h);

}  // namespace kiln::data
