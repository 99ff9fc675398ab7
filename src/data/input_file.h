// Reading `kiln prepare`'s inputs: plain, gzip or zstd files, streamed in bytes or lines.
//
// The compression is recognised by the file's first bytes, not its name: gzip's magic
// 1f 8b (RFC 1952; several concatenated members are read as one stream, as gzip -d does),
// zstd's 28 b5 2f fd (RFC 8878; several concatenated frames likewise); anything else is
// read as it is. Decompression streams: memory is a few buffers, whatever the file size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace kiln::data {

enum class Compression : uint8_t { None, Gzip, Zstd };

/// "none", "gzip", "zstd".
const char* compression_name(Compression c);

/// An input file, decompressed on the fly. Not copyable.
class InputFile {
 public:
  /// Opens `path`. Throws kiln::Error naming it when it cannot be opened.
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Reads up to `n` decompressed bytes into `dst`: the number read, 0 only at the end.
  /// Throws kiln::Error naming the file on a read error, a corrupt stream, or a stream
  /// that ends inside a gzip member or zstd frame ("truncated").
  size_t read(char* dst, size_t n);
  /// Bytes of the file (compressed, as on disk) consumed so far: progress against
  /// file_size(path), for an ETA.
  int64_t consumed_bytes() const;
  Compression compression() const;
  const std::filesystem::path& path() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The lines of an InputFile. A line is the text up to '\n' (the '\n' and a '\r' before it
/// removed); the last line needs no '\n'. Lines are numbered from 1.
class LineReader {
 public:
  explicit LineReader(const std::filesystem::path& path) : file_(path) {}
  /// The next line into `line`: false at the end of the file.
  bool next(std::string& line);
  /// The number of the line `next` returned last (0 before the first).
  int64_t line_number() const { return line_number_; }
  const InputFile& file() const { return file_; }

 private:
  InputFile file_;
  std::string buf_;
  size_t pos_ = 0;  // start of the unread text in buf_
  bool eof_ = false;
  int64_t line_number_ = 0;
};

}  // namespace kiln::data
