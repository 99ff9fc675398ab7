// meta.json: the description `prepare` writes beside a dataset's shards (see
// docs/formats.md for the exact schema).
#pragma once

#include "data/shard.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln::data {

struct ShardInfo {
  std::string file;    // file name relative to the dataset directory
  int64_t tokens = 0;  // tokens in the shard
};

/// A split's position index (position_index.h): absent (file empty) when the split has
/// none.
struct IndexFileInfo {
  std::string file;   // file name relative to the dataset directory
  int64_t count = 0;  // positions it lists (document starts: the documents)
};
struct SplitInfo {
  int64_t tokens = 0;  // sum of the shards' tokens
  std::vector<ShardInfo> shards;
  IndexFileInfo doc_index;   // document starts; absent in data sets prepared before kiln wrote one
  IndexFileInfo loss_index;  // loss spans (chat data); absent: every target is in the loss
};

struct DatasetMeta {
  std::string tokenizer_kind;  // "byte", "sentencepiece" or "gpt2"
  std::string tokenizer_hash;  // Tokenizer::hash()
  int vocab_size = 0;          // number of token ids
  int eot_id = 0;              // end-of-text id (precedes every document)
  ShardFormat format = ShardFormat::U16;  // the shards' layout (meta.json's shard_version)
  TokenDType dtype() const { return shard_dtype(format); }  // token_dtype
  int64_t documents = 0;       // documents in all splits together
  std::map<std::string, SplitInfo> splits;  // "train", "val" (val absent when empty)
};

/// Writes dir/meta.json atomically (temp file + rename). Throws kiln::Error naming the file.
void write_dataset_meta(const std::filesystem::path& dir, const DatasetMeta& meta);
/// Reads and validates dir/meta.json. Throws kiln::Error naming the file when it is missing,
/// malformed, has a wrong format version, or inconsistent counts.
DatasetMeta read_dataset_meta(const std::filesystem::path& dir);

}  // namespace kiln::data
