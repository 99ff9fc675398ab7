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

ImageShardWriter::ImageShardWriter(fs::path path, const ImageShape& shape)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp"), shape_(shape) {
  KILN_CHECK(shape.height > 0 && shape.width > 0 && shape.channels > 0,
             "{}: image shape {}x{}x{} is empty", path_.string(), shape.height, shape.width,
             shape.channels);
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
  KILN_CHECK(static_cast<int64_t>(pixels.size()) == shape_.pixels(),
             "{}: an image of {} bytes, the shard's are {}", path_.string(), pixels.size(),
             shape_.pixels());
  uint8_t l[4];
  put_le32(l, label);
  KILN_CHECK(std::fwrite(l, 1, 4, f_) == 4 &&
                 std::fwrite(pixels.data(), 1, pixels.size(), f_) == pixels.size(),
             "{}: write failed", tmp_.string());
  records_crc_ = crc_of(pixels.data(), pixels.size(), crc_of(l, 4, records_crc_));
  ++count_;
}

uint32_t ImageShardWriter::finish() {
  KILN_CHECK(!finished_ && f_, "{}: finish() twice", path_.string());
  std::vector<uint8_t> header(static_cast<size_t>(kShardHeaderBytes), 0);
  const int32_t fields[7] = {kImageShardMagic, kImageShardVersion, static_cast<int32_t>(count_),
                             shape_.height, shape_.width, shape_.channels, 0};
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
      crc_of(header.data(), header.size()), records_crc_, static_cast<z_off_t>(count_ * shape_.record_bytes())));
  fs::rename(tmp_, path_);
  finished_ = true;
  return crc;
}

ImageShardReader::ImageShardReader(const fs::path& path, const ImageShape& shape, int64_t images,
                                   uint32_t crc)
    : path_(path), shape_(shape), count_(images) {
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
  // Records of version 1 carry no caption tokens; a shard that says otherwise would be
  // misread, record by record.
  KILN_CHECK(get_le32(h + 24) == 0, "{}: {} caption tokens per record; this version of kiln "
             "reads image shards without captions", name, get_le32(h + 24));
  // Divided, not multiplied: meta.json's bounds (2^40 images of up to 2^34 bytes) would
  // overflow the product.
  const int64_t body = static_cast<int64_t>(bytes_.size()) - kShardHeaderBytes;
  const int64_t record = shape.record_bytes();
  KILN_CHECK(body % record == 0 && body / record == images,
             "{}: {} bytes where {} images of {}x{}x{} need 1024 + {} x {} (truncated or padded)",
             name, bytes_.size(), images, shape.height, shape.width, shape.channels, images, record);
  const uint32_t c = crc_of(bytes_.data(), bytes_.size());
  KILN_CHECK(c == crc, "{}: crc32 {:08x}, meta.json says {:08x} (the file is corrupt)", name, c, crc);
}

int32_t ImageShardReader::label(int64_t i) const {
  return get_le32(&bytes_[static_cast<size_t>(kShardHeaderBytes + i * shape_.record_bytes())]);
}

std::span<const uint8_t> ImageShardReader::pixels(int64_t i) const {
  return {&bytes_[static_cast<size_t>(kShardHeaderBytes + i * shape_.record_bytes() + 4)],
          static_cast<size_t>(shape_.pixels())};
}

}  // namespace kiln::data
