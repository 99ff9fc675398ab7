// Position indexes of a token split: lists of positions in the split's token stream,
// files beside the shards (docs/formats.md). Two kinds:
//   document starts (`<split>_docs.idx`, magic "KILNDOCS"): where each document starts (at
//     its separator token); the first start is 0 even when the split begins inside a
//     document (val, whose cut may fall anywhere), and every start is below the split's
//     tokens. `kiln prepare` writes it for every split; packing reads it.
//   loss spans (`<split>_loss.idx`, magic "KILNLOSS"): the positions whose tokens are in
//     the loss as [begin, end) pairs, begin0 end0 begin1 end1 ..., so an even count, every
//     position at most the split's tokens. Chat data (chat.h) has one; targets outside the
//     spans are ignored.
//
// File layout, little-endian:
//   bytes 0..7    magic
//   bytes 8..11   uint32 version = 1
//   bytes 12..15  uint32 crc32 (zlib's) of the positions' bytes
//   bytes 16..23  uint64 count: positions listed
//   bytes 24..31  uint64 tokens: the split's tokens
//   bytes 32..    count uint64 positions, strictly ascending
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

namespace kiln::data {

inline constexpr int64_t kPositionIndexHeaderBytes = 32;

enum class PositionIndexKind : uint8_t { DocumentStarts, LossSpans };

/// Streams positions into an index. Data goes to `<path>.tmp`; finish() writes the header
/// and renames it, so a partial index is never visible under its final name; the
/// destructor removes the temporary file when finish() was not reached.
class PositionIndexWriter {
 public:
  /// Throws kiln::Error naming the file when it cannot be created.
  PositionIndexWriter(std::filesystem::path path, PositionIndexKind kind);
  ~PositionIndexWriter();
  PositionIndexWriter(const PositionIndexWriter&) = delete;
  PositionIndexWriter& operator=(const PositionIndexWriter&) = delete;
  /// Appends a position. Throws kiln::Error unless it is above the last one (document
  /// starts: 0 first).
  void add(int64_t position);
  int64_t count() const { return count_; }
  /// Writes the header (`tokens`: the split's size) and renames. Throws kiln::Error naming
  /// the file on I/O failure or positions the kind does not allow (see the top).
  void finish(int64_t tokens);

 private:
  void flush();
  std::filesystem::path path_, tmp_;
  PositionIndexKind kind_;
  std::FILE* f_ = nullptr;
  std::vector<uint64_t> buf_;
  int64_t count_ = 0, last_ = -1;
  uint32_t crc_ = 0;
};

/// Calls on_position for each position of the index at `path` in order, checking as it
/// goes: magic of `kind`, version, size, `count` positions and `tokens` tokens (either
/// check skipped when negative), order and bounds; the crc32 at the end, so a corrupt
/// index throws after some calls. Memory: one chunk, whatever the count. Throws
/// kiln::Error naming the file and what is wrong.
void scan_position_index(const std::filesystem::path& path, PositionIndexKind kind, int64_t tokens, int64_t count,
                         const std::function<void(int64_t)>& on_position);
/// All positions of the index at `path` (scan_position_index's checks).
std::vector<int64_t> read_position_index(const std::filesystem::path& path, PositionIndexKind kind, int64_t tokens,
                                         int64_t count);

}  // namespace kiln::data
