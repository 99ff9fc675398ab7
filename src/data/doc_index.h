// Document index of a token split: where each document starts in the split's token stream
// (`<split>_docs.idx` beside the shards; docs/formats.md). Packing with document masks
// reads it; `kiln prepare` writes it.
//
// File layout, little-endian:
//   bytes 0..7    magic "KILNDOCS"
//   bytes 8..11   uint32 version = 1
//   bytes 12..15  uint32 crc32 (zlib's) of the starts' bytes
//   bytes 16..23  uint64 count: documents listed
//   bytes 24..31  uint64 tokens: the split's tokens; every start is below it
//   bytes 32..    count uint64 starts, strictly ascending, the first one 0
// A document starts at its separator token (eot, see prepare.h). The first start is 0 even
// when the split begins inside a document (val, whose cut may fall anywhere): that tail
// then counts as a document.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

namespace kiln::data {

inline constexpr int64_t kDocIndexHeaderBytes = 32;

/// Streams document starts into an index. Data goes to `<path>.tmp`; finish() writes the
/// header and renames it, so a partial index is never visible under its final name; the
/// destructor removes the temporary file when finish() was not reached.
class DocIndexWriter {
 public:
  /// Throws kiln::Error naming the file when it cannot be created.
  explicit DocIndexWriter(std::filesystem::path path);
  ~DocIndexWriter();
  DocIndexWriter(const DocIndexWriter&) = delete;
  DocIndexWriter& operator=(const DocIndexWriter&) = delete;
  /// Appends a start. Throws kiln::Error unless it is above the last one (0 first).
  void add(int64_t start);
  int64_t count() const { return count_; }
  /// Writes the header (`tokens`: the split's size, above every start) and renames.
  /// Throws kiln::Error naming the file on I/O failure or a start >= tokens.
  void finish(int64_t tokens);

 private:
  void flush();
  std::filesystem::path path_, tmp_;
  std::FILE* f_ = nullptr;
  std::vector<uint64_t> buf_;
  int64_t count_ = 0, last_ = -1;
  uint32_t crc_ = 0;
};

/// Calls on_start for each start of the index at `path` in order, checking as it goes
/// (read_doc_index's checks; the crc32 at the end, so a corrupt index throws after some
/// calls). Memory: one chunk of starts, whatever the count.
void scan_doc_index(const std::filesystem::path& path, int64_t tokens, int64_t count,
                    const std::function<void(int64_t)>& on_start);
/// The starts of the index at `path`, checked: magic, version, size, crc32, ascending from
/// 0, below `tokens`, and `count` of them (either check skipped when negative). Throws
/// kiln::Error naming the file and what is wrong.
std::vector<int64_t> read_doc_index(const std::filesystem::path& path, int64_t tokens, int64_t count);

}  // namespace kiln::data
