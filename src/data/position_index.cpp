#include "data/position_index.h"

#include "core/error.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <fstream>

namespace kiln::data {

namespace fs = std::filesystem;

namespace {
constexpr uint32_t kVersion = 1;

const char* magic_of(PositionIndexKind kind) {
  return kind == PositionIndexKind::DocumentStarts ? "KILNDOCS" : "KILNLOSS";
}
const char* what_of(PositionIndexKind kind) {
  return kind == PositionIndexKind::DocumentStarts ? "document index" : "loss-span index";
}

uint32_t crc_of(uint32_t crc, const uint64_t* v, size_t n) {
  return static_cast<uint32_t>(
      crc32(crc, reinterpret_cast<const Bytef*>(v), static_cast<uInt>(n * sizeof(uint64_t))));
}
}  // namespace

PositionIndexWriter::PositionIndexWriter(fs::path path, PositionIndexKind kind)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp"), kind_(kind) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  KILN_CHECK(f_ != nullptr, "{}: cannot create ({})", tmp_.string(), std::strerror(errno));
  const char zeros[kPositionIndexHeaderBytes] = {};
  KILN_CHECK(std::fwrite(zeros, 1, sizeof zeros, f_) == sizeof zeros, "{}: write failed", tmp_.string());
}

PositionIndexWriter::~PositionIndexWriter() {
  if (f_ == nullptr) return;
  std::fclose(f_);
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void PositionIndexWriter::add(int64_t position) {
  const bool first_ok = count_ > 0 || position == 0 || kind_ == PositionIndexKind::LossSpans;
  KILN_CHECK(position > last_ && first_ok, "{}: position {} after {} (positions ascend{})", path_.string(), position,
             last_, kind_ == PositionIndexKind::DocumentStarts ? " from 0" : "");
  buf_.push_back(static_cast<uint64_t>(position));
  last_ = position;
  ++count_;
  if (buf_.size() >= (1 << 16)) flush();
}

void PositionIndexWriter::flush() {
  crc_ = crc_of(crc_, buf_.data(), buf_.size());
  KILN_CHECK(std::fwrite(buf_.data(), sizeof(uint64_t), buf_.size(), f_) == buf_.size(),
             "{}: write failed ({})", tmp_.string(), std::strerror(errno));
  buf_.clear();
}

void PositionIndexWriter::finish(int64_t tokens) {
  const bool spans = kind_ == PositionIndexKind::LossSpans;
  KILN_CHECK(spans ? last_ <= tokens : last_ < tokens, "{}: position {} is past the split's {} tokens",
             path_.string(), last_, tokens);
  KILN_CHECK(!spans || count_ % 2 == 0, "{}: an odd number of span bounds ({})", path_.string(), count_);
  flush();
  unsigned char header[kPositionIndexHeaderBytes] = {};
  std::memcpy(header, magic_of(kind_), 8);
  std::memcpy(header + 8, &kVersion, 4);
  std::memcpy(header + 12, &crc_, 4);
  const uint64_t count = static_cast<uint64_t>(count_), total = static_cast<uint64_t>(tokens);
  std::memcpy(header + 16, &count, 8);
  std::memcpy(header + 24, &total, 8);
  const bool ok = std::fseek(f_, 0, SEEK_SET) == 0 && std::fwrite(header, 1, sizeof header, f_) == sizeof header &&
                  std::fflush(f_) == 0;
  const int closed = std::fclose(f_);
  f_ = nullptr;
  if (!ok || closed != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::error_code ec;
    fs::remove(tmp_, ec);
    KILN_FAIL("{}: cannot write the {} ({})", path_.string(), what_of(kind_), why);
  }
}

void scan_position_index(const fs::path& path, PositionIndexKind kind, int64_t tokens, int64_t count,
                         const std::function<void(int64_t)>& on_position) {
  const bool spans = kind == PositionIndexKind::LossSpans;
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: missing or unreadable {}", path.string(), what_of(kind));
  unsigned char header[kPositionIndexHeaderBytes] = {};
  in.read(reinterpret_cast<char*>(header), sizeof header);
  KILN_CHECK(in.gcount() == sizeof header && std::memcmp(header, magic_of(kind), 8) == 0,
             "{}: not a kiln {} (bad magic)", path.string(), what_of(kind));
  uint32_t version = 0, crc = 0;
  uint64_t n = 0, total = 0;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&crc, header + 12, 4);
  std::memcpy(&n, header + 16, 8);
  std::memcpy(&total, header + 24, 8);
  KILN_CHECK(version == kVersion, "{}: {} version {} (expected {})", path.string(), what_of(kind), version, kVersion);
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  KILN_CHECK(!ec && n < (uint64_t{1} << 48) && size == kPositionIndexHeaderBytes + n * sizeof(uint64_t),
             "{}: {} bytes, but the header lists {} positions (truncated or corrupt)", path.string(), size, n);
  KILN_CHECK(count < 0 || n == static_cast<uint64_t>(count), "{}: {} positions, meta.json says {}",
             path.string(), n, count);
  KILN_CHECK(!spans || n % 2 == 0, "{}: an odd number of span bounds ({})", path.string(), n);
  KILN_CHECK(tokens < 0 || total == static_cast<uint64_t>(tokens), "{}: indexes {} tokens, meta.json says {}",
             path.string(), total, tokens);
  std::vector<uint64_t> chunk;
  uint32_t got_crc = 0;
  uint64_t last = 0;
  for (uint64_t i = 0; i < n;) {
    chunk.resize(static_cast<size_t>(std::min<uint64_t>(n - i, 1 << 16)));
    const auto bytes = static_cast<std::streamsize>(chunk.size() * sizeof(uint64_t));
    in.read(reinterpret_cast<char*>(chunk.data()), bytes);
    KILN_CHECK(in.gcount() == bytes, "{}: read error", path.string());
    got_crc = crc_of(got_crc, chunk.data(), chunk.size());
    for (const uint64_t s : chunk) {
      KILN_CHECK(i > 0 || s == 0 || spans, "{}: the first document start is {}, not 0", path.string(), s);
      KILN_CHECK(i == 0 || s > last, "{}: position {} (entry {}) is out of order", path.string(), s, i);
      KILN_CHECK(spans ? s <= total : s < total, "{}: position {} (entry {}) is past the split's {} tokens",
                 path.string(), s, i, total);
      on_position(static_cast<int64_t>(s));
      last = s;
      ++i;
    }
  }
  KILN_CHECK(got_crc == crc, "{}: crc32 mismatch (corrupt {})", path.string(), what_of(kind));
}

std::vector<int64_t> read_position_index(const fs::path& path, PositionIndexKind kind, int64_t tokens,
                                         int64_t count) {
  std::vector<int64_t> positions;
  scan_position_index(path, kind, tokens, count, [&](int64_t s) { positions.push_back(s); });
  return positions;
}

}  // namespace kiln::data
