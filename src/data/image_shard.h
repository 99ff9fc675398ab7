// Image shards: labelled images, fixed-size records after a 1024-byte header of 256
// little-endian int32 (the token shards' header layout, data/shard.h):
//
//   [0] magic 20261201, [1] version 1, [2] images, [3] height, [4] width, [5] channels,
//   [6] caption tokens per record L (0: none), [7..255] = 0;
//   then `images` records: int32 label (little-endian), then height * width * channels
//   uint8 pixels, row-major [H, W, C]; with L > 0 (image-text pairs, data/llava.h) then the
//   caption: int32 n (its tokens, <= L), int32 image_at (where the image's tokens go among
//   them, -1 for a text-only record), L int32 token ids and L uint8 loss flags (1: the
//   token is a target the loss learns; both zero past n). All integers little-endian.
//   File size = 1024 + images * record_bytes(shape, L).
//
// meta.json lists each shard with its image count and crc32 (zlib's), which the reader
// checks when it opens the shard (docs/formats.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

namespace kiln::data {

inline constexpr int32_t kImageShardMagic = 20261201;
inline constexpr int32_t kImageShardVersion = 1;

struct ImageShape {
  int height = 0, width = 0, channels = 1;
  int64_t pixels() const { return int64_t{height} * width * channels; }
  /// Bytes of one record: the int32 label and the pixels.
  int64_t record_bytes() const { return 4 + pixels(); }
  bool operator==(const ImageShape&) const = default;
};

/// A record's caption: token ids, a loss flag per id, and where the image's tokens go (the
/// number of ids before them; -1: none).
struct CaptionTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> in_loss;
  int64_t image_at = -1;
};

/// Bytes of one record of images of `shape` with `caption_tokens` caption slots.
inline int64_t record_bytes(const ImageShape& shape, int caption_tokens) {
  return shape.record_bytes() + (caption_tokens > 0 ? 8 + 5 * int64_t{caption_tokens} : 0);
}

/// Streams records into `<path>.tmp`; finish() writes the header, fsyncs and renames it to
/// `path`. The destructor removes the temporary file when finish() was not reached.
class ImageShardWriter {
 public:
  /// Records of `caption_tokens` caption slots each (0: none). Throws kiln::Error naming
  /// the file when it cannot be created, the shape is empty or caption_tokens < 0.
  ImageShardWriter(std::filesystem::path path, const ImageShape& shape, int caption_tokens = 0);
  ~ImageShardWriter();
  ImageShardWriter(const ImageShardWriter&) = delete;
  ImageShardWriter& operator=(const ImageShardWriter&) = delete;

  /// Appends one image: `pixels` holds shape.pixels() bytes. Throws kiln::Error on a
  /// wrong size or a failed write (file named).
  void write(int32_t label, std::span<const uint8_t> pixels);
  /// Appends one image and its caption (a shard of caption slots): at most caption_tokens
  /// ids, a flag each, image_at in [-1, ids]. Throws kiln::Error on a caption that does
  /// not fit or a failed write (file named).
  void write(int32_t label, std::span<const uint8_t> pixels, const CaptionTokens& caption);
  int64_t images() const { return count_; }
  /// Completes the shard; returns the crc32 of the whole file.
  uint32_t finish();

 private:
  void write_image(int32_t label, std::span<const uint8_t> pixels);  // label and pixels

  std::filesystem::path path_, tmp_;
  ImageShape shape_;
  int caption_tokens_ = 0;
  std::FILE* f_ = nullptr;
  int64_t count_ = 0;
  uint32_t records_crc_ = 0;  // crc32 of the records so far
  bool finished_ = false;
};

/// One shard read whole into memory and verified.
class ImageShardReader {
 public:
  /// Throws kiln::Error naming the file when it is missing, shorter or longer than its
  /// header says, has another magic or version, a shape other than `shape`, a count other
  /// than `images`, caption slots other than `caption_tokens`, or a crc32 other than
  /// `crc32`.
  ImageShardReader(const std::filesystem::path& path, const ImageShape& shape, int64_t images,
                   uint32_t crc32, int caption_tokens = 0);
  int64_t images() const { return count_; }
  const std::filesystem::path& path() const { return path_; }
  int32_t label(int64_t i) const;
  /// The pixels of image i, shape.pixels() bytes.
  std::span<const uint8_t> pixels(int64_t i) const;
  /// The caption of image i (a shard of caption slots). Throws kiln::Error naming the
  /// file and record when it is malformed (n > L, image_at outside [-1, n], a flag other
  /// than 0 or 1): the crc32 holds, so the writer was at fault.
  CaptionTokens caption(int64_t i) const;

 private:
  std::filesystem::path path_;
  ImageShape shape_;
  int caption_tokens_ = 0;
  int64_t count_ = 0;
  std::vector<uint8_t> bytes_;  // the whole file
  const uint8_t* record(int64_t i) const;  // the start of record i
};

}  // namespace kiln::data
