#include "data/image_shard.h"

#include "core/error.h"
#include "data/shard.h"

#include <zlib.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {
void put_le32(uint8_t* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  p[0] = static_cast<uint8_t>(u), p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16), p[3] = static_cast<uint8_t>(u >> 24);
}
// zlib's crc32 of n bytes, in chunks that fit its uInt.
uint32_t crc_of(const uint8_t* p, size_t n, uLong crc = crc32(0L, Z_NULL, 0)) {
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}
int32_t get_le32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                              (uint32_t{p[3]} << 24));
}
}  // namespace

ImageShardWriter::ImageShardWriter(fs::path path, const ImageShape& shape, int caption_tokens)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp"), shape_(shape),
      caption_tokens_(caption_tokens) {
  KILN_CHECK(shape.height > 0 && shape.width > 0 && shape.channels > 0,
             "{}: image shape {}x{}x{} is empty", path_.string(), shape.height, shape.width,
             shape.channels);
  KILN_CHECK(caption_tokens >= 0, "{}: {} caption tokens per record", path_.string(),
             caption_tokens);
  f_ = std::fopen(tmp_.c_str(), "wb");
  KILN_CHECK(f_ != nullptr, "{}: cannot create", tmp_.string());
  std::vector<uint8_t> header(static_cast<size_t>(kShardHeaderBytes), 0);  // filled by finish()
  KILN_CHECK(std::fwrite(header.data(), 1, header.size(), f_) == header.size(), "{}: write failed",
             tmp_.string());
}

ImageShardWriter::~ImageShardWriter() {
  if (f_) std::fclose(f_);
  if (!finished_) {
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void ImageShardWriter::write(int32_t label, std::span<const uint8_t> pixels) {
  KILN_CHECK(caption_tokens_ == 0, "{}: a record without its caption in a shard of {} caption "
             "tokens per record", path_.string(), caption_tokens_);
  write_image(label, pixels);
  ++count_;
}

void ImageShardWriter::write(int32_t label, std::span<const uint8_t> pixels,
                             const CaptionTokens& caption) {
  const auto n = static_cast<int64_t>(caption.ids.size());
  KILN_CHECK(caption_tokens_ > 0 && n <= caption_tokens_ &&
                 caption.in_loss.size() == caption.ids.size() && caption.image_at >= -1 &&
                 caption.image_at <= n,
             "{}: a caption of {} tokens ({} flags, image at {}) in a shard of {} caption "
             "tokens per record", path_.string(), n, caption.in_loss.size(), caption.image_at,
             caption_tokens_);
  write_image(label, pixels);
  const auto L = static_cast<size_t>(caption_tokens_);
  std::vector<uint8_t> block(8 + 5 * L, 0);
  put_le32(&block[0], static_cast<int32_t>(n));
  put_le32(&block[4], static_cast<int32_t>(caption.image_at));
  for (size_t k = 0; k < caption.ids.size(); ++k) {
    put_le32(&block[8 + 4 * k], caption.ids[k]);
    block[8 + 4 * L + k] = caption.in_loss[k] ? 1 : 0;
  }
  KILN_CHECK(std::fwrite(block.data(), 1, block.size(), f_) == block.size(), "{}: write failed",
             tmp_.string());
  records_crc_ = crc_of(block.data(), block.size(), records_crc_);
  ++count_;
}

void ImageShardWriter::write_image(int32_t label, std::span<const uint8_t> pixels) {
  KILN_CHECK(static_cast<int64_t>(pixels.size()) == shape_.pixels(),
             "{}: an image of {} bytes, the shard's are {}", path_.string(), pixels.size(),
             shape_.pixels());
  uint8_t l[4];
  put_le32(l, label);
  KILN_CHECK(std::fwrite(l, 1, 4, f_) == 4 &&
                 std::fwrite(pixels.data(), 1, pixels.size(), f_) == pixels.size(),
             "{}: write failed", tmp_.string());
  records_crc_ = crc_of(pixels.data(), pixels.size(), crc_of(l, 4, records_crc_));
}

uint32_t ImageShardWriter::finish() {
  KILN_CHECK(!finished_ && f_, "{}: finish() twice", path_.string());
  std::vector<uint8_t> header(static_cast<size_t>(kShardHeaderBytes), 0);
  const int32_t fields[7] = {kImageShardMagic, kImageShardVersion, static_cast<int32_t>(count_),
                             shape_.height, shape_.width, shape_.channels, caption_tokens_};
  for (int i = 0; i < 7; ++i) put_le32(&header[static_cast<size_t>(4 * i)], fields[i]);
  KILN_CHECK(count_ <= INT32_MAX, "{}: more than 2^31 images in one shard", path_.string());
  KILN_CHECK(std::fseek(f_, 0, SEEK_SET) == 0 &&
                 std::fwrite(header.data(), 1, header.size(), f_) == header.size() &&
                 std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0,
             "{}: write failed", tmp_.string());
  std::fclose(f_);
  f_ = nullptr;
  // The file's checksum: the header's, combined with the records' (summed as written).
  const uint32_t crc = static_cast<uint32_t>(crc32_combine(
      crc_of(header.data(), header.size()), records_crc_,
      static_cast<z_off_t>(count_ * record_bytes(shape_, caption_tokens_))));
  fs::rename(tmp_, path_);
  finished_ = true;
  return crc;
}

ImageShardReader::ImageShardReader(const fs::path& path, const ImageShape& shape, int64_t images,
                                   uint32_t crc, int caption_tokens)
    : path_(path), shape_(shape), caption_tokens_(caption_tokens), count_(images) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: missing (listed in meta.json)", name);
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  KILN_CHECK(static_cast<int64_t>(bytes_.size()) >= kShardHeaderBytes,
             "{}: truncated ({} bytes, shorter than the 1024-byte header)", name, bytes_.size());
  const uint8_t* h = bytes_.data();
  KILN_CHECK(get_le32(h) == kImageShardMagic && get_le32(h + 4) == kImageShardVersion,
             "{}: not a kiln image shard (magic {}, version {}; expected {}, {})", name, get_le32(h),
             get_le32(h + 4), kImageShardMagic, kImageShardVersion);
  const ImageShape got{get_le32(h + 12), get_le32(h + 16), get_le32(h + 20)};
  KILN_CHECK(got == shape, "{}: images of {}x{}x{}, meta.json says {}x{}x{}", name, got.height,
             got.width, got.channels, shape.height, shape.width, shape.channels);
  KILN_CHECK(get_le32(h + 8) == images, "{}: holds {} images, meta.json says {}", name,
             get_le32(h + 8), images);
  // A shard of other caption slots would be misread, record by record.
  KILN_CHECK(get_le32(h + 24) == caption_tokens, "{}: {} caption tokens per record, meta.json "
             "says {}", name, get_le32(h + 24), caption_tokens);
  // Divided, not multiplied: meta.json's bounds (2^40 images of up to 2^34 bytes) would
  // overflow the product.
  const int64_t body = static_cast<int64_t>(bytes_.size()) - kShardHeaderBytes;
  const int64_t record = record_bytes(shape, caption_tokens);
  KILN_CHECK(body % record == 0 && body / record == images,
             "{}: {} bytes where {} images of {}x{}x{} need 1024 + {} x {} (truncated or padded)",
             name, bytes_.size(), images, shape.height, shape.width, shape.channels, images, record);
  const uint32_t c = crc_of(bytes_.data(), bytes_.size());
  KILN_CHECK(c == crc, "{}: crc32 {:08x}, meta.json says {:08x} (the file is corrupt)", name, c, crc);
}

const uint8_t* ImageShardReader::record(int64_t i) const {
  KILN_CHECK(i >= 0 && i < count_, "{}: no image {} of {}", path_.string(), i, count_);
  return &bytes_[static_cast<size_t>(kShardHeaderBytes + i * record_bytes(shape_, caption_tokens_))];
}

int32_t ImageShardReader::label(int64_t i) const { return get_le32(record(i)); }

std::span<const uint8_t> ImageShardReader::pixels(int64_t i) const {
  return {record(i) + 4, static_cast<size_t>(shape_.pixels())};
}

CaptionTokens ImageShardReader::caption(int64_t i) const {
  KILN_CHECK(caption_tokens_ > 0, "{}: a shard without captions", path_.string());
  const uint8_t* c = record(i) + shape_.record_bytes();
  const auto L = static_cast<int64_t>(caption_tokens_);
  const int64_t n = get_le32(c);
  CaptionTokens out;
  out.image_at = get_le32(c + 4);
  KILN_CHECK(n >= 0 && n <= L && out.image_at >= -1 && out.image_at <= n,
             "{}: record {}: a caption of {} tokens with the image at {} (slots {})",
             path_.string(), i, n, out.image_at, L);
  for (int64_t k = 0; k < n; ++k) {
    out.ids.push_back(get_le32(c + 8 + 4 * k));
    const uint8_t flag = c[8 + 4 * L + k];
    KILN_CHECK(flag <= 1, "{}: record {}: loss flag {} (0 or 1)", path_.string(), i, int{flag});
    out.in_loss.push_back(flag);
  }
  return out;
}

}  // namespace kiln::data
