// Token shards in llm.c's layout (karpathy/llm.c, dev/data/data_common.py write_datafile):
//
//   header: 256 little-endian int32
//     [0] = 20240520 (magic)
//     [1] = version: 1 = tokens are uint16, 2 = tokens are uint32
//     [2] = number of tokens
//     [3..255] = 0
//   then the tokens, little-endian, 2 or 4 bytes each. File size = 1024 + count * width.
//
// kiln uses version 1 when vocab_size <= 65535 and version 2 otherwise.
#pragma once

#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>

namespace kiln::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

enum class TokenDType : uint8_t { U16, U32 };

/// Bytes per token: 2 or 4.
constexpr int token_width(TokenDType t) { return t == TokenDType::U16 ? 2 : 4; }
/// "uint16" / "uint32".
const char* token_dtype_name(TokenDType t);
/// Parses "uint16" / "uint32"; throws kiln::Error otherwise.
TokenDType parse_token_dtype(const std::string& name);
/// The shard version of a dtype (1 or 2).
constexpr int32_t shard_version(TokenDType t) { return t == TokenDType::U16 ? 1 : 2; }
/// uint16 when vocab_size <= 65535, else uint32.
constexpr TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65535 ? TokenDType::U16 : TokenDType::U32;
}

/// Streams tokens into a shard. Data goes to `<path>.tmp`; finish() writes the header and
/// renames it to `path`, so a partial shard is never visible under its final name. The
/// destructor removes the temporary file when finish() was not reached.
class ShardWriter {
 public:
  /// Throws kiln::Error naming the file when it cannot be created.
  ShardWriter(std::filesystem::path path, TokenDType dtype);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends tokens. Throws kiln::Error if a token does not fit the dtype (< 0 or too
  /// large) or the write fails (file named).
  void write(std::span<const int32_t> tokens);
  /// Tokens written so far.
  int64_t count() const { return count_; }
  /// Writes the header, closes and renames to the final path. Throws kiln::Error on I/O
  /// failure (the temporary file is removed).
  void finish();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_, tmp_;
  TokenDType dtype_;
  std::FILE* f_ = nullptr;
  int64_t count_ = 0;
  std::string buf_;
};

/// Writes a whole shard at once (via ShardWriter).
void write_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, TokenDType dtype);

/// A read-only memory-mapped shard. Validates on open: file at least 1024 bytes, magic,
/// version 1 or 2, count >= 0 and file size == 1024 + count * width; every failure throws
/// kiln::Error naming the file. Movable, not copyable.
class ShardReader {
 public:
  ShardReader() = default;
  explicit ShardReader(const std::filesystem::path& path);
  ~ShardReader();
  ShardReader(ShardReader&& o) noexcept;
  ShardReader& operator=(ShardReader&& o) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  int64_t size() const { return count_; }
  TokenDType dtype() const { return dtype_; }
  const std::filesystem::path& path() const { return path_; }
  /// Token i (0 <= i < size(), unchecked).
  int32_t operator[](int64_t i) const {
    return dtype_ == TokenDType::U16 ? static_cast<int32_t>(static_cast<const uint16_t*>(tokens_)[i])
                                     : static_cast<int32_t>(static_cast<const uint32_t*>(tokens_)[i]);
  }
  /// Copies tokens [start, start + n) to out as int32, checking each (as unsigned, for
  /// every width) against `vocab_size`. Throws kiln::Error when the range is outside the
  /// shard, or for the first token >= vocab_size, naming the file, the token and its
  /// position in the shard: "<file>: token 4294967295 at position 17 is >= vocab_size 257".
  void read(int64_t start, int64_t n, int32_t* out, int64_t vocab_size = INT32_MAX) const;

 private:
  void close();
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  int64_t count_ = 0;
  TokenDType dtype_ = TokenDType::U16;
};

}  // namespace kiln::data
