// Token shards: a 1024-byte header of 256 little-endian int32, then the tokens.
//
//   [0] magic, [1] version, [2] number of tokens, [3..255] = 0; then the tokens,
//   little-endian, 2 or 4 bytes each. File size = 1024 + count * width.
//
// Three layouts (ShardFormat), all read by ShardReader:
//   magic 20240520, version 1, uint16: llm.c's GPT-2 shards (karpathy/llm.c,
//     dev/data/data_common.py write_datafile, model_desc "gpt-2"; the only layout llm.c's
//     C loader llmc/dataloader.h reads). kiln writes it whenever the vocabulary fits.
//   magic 20240520, version 2, uint32: kiln's own, for vocabularies over 65,535 ids.
//   magic 20240801, version 7, uint32: llm.c's Llama 3 shards (write_datafile with
//     model_desc "llama-3", read by its train_llama3.py), written on request.
#pragma once

#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

namespace kiln::data {

inline constexpr int32_t kShardMagic = 20240520;     // versions 1 and 2
inline constexpr int32_t kShardMagicLlama3 = 20240801;  // version 7
inline constexpr int kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

enum class TokenDType : uint8_t { U16, U32 };

/// Bytes per token: 2 or 4.
constexpr int token_width(TokenDType t) { return t == TokenDType::U16 ? 2 : 4; }
/// "uint16" / "uint32".
const char* token_dtype_name(TokenDType t);
/// Parses "uint16" / "uint32"; throws kiln::Error otherwise.
TokenDType parse_token_dtype(const std::string& name);
/// uint16 when vocab_size <= 65535, else uint32.
constexpr TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65535 ? TokenDType::U16 : TokenDType::U32;
}

/// A shard layout: magic, version and token width (see the top of this file).
enum class ShardFormat : uint8_t {
  U16,        // magic 20240520, version 1, uint16
  KilnU32,    // magic 20240520, version 2, uint32
  Llama3U32,  // magic 20240801, version 7, uint32
};
constexpr TokenDType shard_dtype(ShardFormat f) { return f == ShardFormat::U16 ? TokenDType::U16 : TokenDType::U32; }
constexpr int32_t shard_magic(ShardFormat f) { return f == ShardFormat::Llama3U32 ? kShardMagicLlama3 : kShardMagic; }
constexpr int32_t shard_version(ShardFormat f) {
  return f == ShardFormat::U16 ? 1 : f == ShardFormat::KilnU32 ? 2 : 7;
}
/// The format of header version 1, 2 or 7; throws kiln::Error (naming `what`) otherwise.
ShardFormat shard_format_of_version(int64_t version, const std::string& what);
/// `kiln prepare --shard-format` for a vocabulary of `vocab_size` ids:
///   "kiln"     uint16 v1 when the ids fit, else kiln's uint32 v2 (the default);
///   "llmc"     uint16 v1 when the ids fit, else llm.c's uint32 v7 (what llm.c writes);
///   "llmc-u32" llm.c's uint32 v7 always (llm.c's model_desc "llama-3").
/// Throws kiln::Error for any other name.
ShardFormat choose_shard_format(const std::string& name, int64_t vocab_size);

/// Streams tokens into a shard. Data goes to `<path>.tmp`; finish() writes the header and
/// renames it to `path`, so a partial shard is never visible under its final name. The
/// destructor removes the temporary file when finish() was not reached.
class ShardWriter {
 public:
  /// Throws kiln::Error naming the file when it cannot be created.
  ShardWriter(std::filesystem::path path, ShardFormat format);
  /// uint16 -> ShardFormat::U16, uint32 -> ShardFormat::KilnU32.
  ShardWriter(std::filesystem::path path, TokenDType dtype)
      : ShardWriter(std::move(path), dtype == TokenDType::U16 ? ShardFormat::U16 : ShardFormat::KilnU32) {}
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
  ShardFormat format_;
  TokenDType dtype_;
  std::FILE* f_ = nullptr;
  int64_t count_ = 0;
  std::string buf_;
};

/// Writes a whole shard at once (via ShardWriter).
void write_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, TokenDType dtype);
void write_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, ShardFormat format);

/// A read-only memory-mapped shard. Validates on open: file at least 1024 bytes, magic
/// 20240520 with version 1 or 2 or magic 20240801 with version 7, count >= 0 and file size == 1024 + count * width; every failure throws
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
  ShardFormat format() const { return format_; }
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
  ShardFormat format_ = ShardFormat::U16;
};

}  // namespace kiln::data
