#include "data/shard.h"

#include <algorithm>

#include "core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

static_assert(std::endian::native == std::endian::little, "kiln shards assume a little-endian host");

namespace kiln::data {

namespace fs = std::filesystem;

const char* token_dtype_name(TokenDType t) { return t == TokenDType::U16 ? "uint16" : "uint32"; }

TokenDType parse_token_dtype(const std::string& name) {
  if (name == "uint16") return TokenDType::U16;
  if (name == "uint32") return TokenDType::U32;
  KILN_FAIL("unknown token dtype '{}' (expected uint16 or uint32)", name);
}

ShardFormat shard_format_of_version(int64_t version, const std::string& what) {
  if (version == 1) return ShardFormat::U16;
  if (version == 2) return ShardFormat::KilnU32;
  if (version == 7) return ShardFormat::Llama3U32;
  KILN_FAIL("{}: unsupported shard version {} (expected 1 = uint16, 2 = kiln uint32 or 7 = llm.c uint32)", what,
            version);
}

ShardFormat choose_shard_format(const std::string& name, int64_t vocab_size) {
  const bool fits = token_dtype_for_vocab(vocab_size) == TokenDType::U16;
  if (name == "kiln") return fits ? ShardFormat::U16 : ShardFormat::KilnU32;
  if (name == "llmc") return fits ? ShardFormat::U16 : ShardFormat::Llama3U32;
  if (name == "llmc-u32") return ShardFormat::Llama3U32;
  KILN_FAIL("unknown shard format '{}' (expected kiln, llmc or llmc-u32)", name);
}

ShardWriter::ShardWriter(fs::path path, ShardFormat format)
    : path_(std::move(path)), format_(format), dtype_(shard_dtype(format)) {
  tmp_ = path_;
  tmp_ += ".tmp";
  f_ = std::fopen(tmp_.c_str(), "wb");
  KILN_CHECK(f_ != nullptr, "cannot create shard {}: {}", tmp_.string(), std::strerror(errno));
  const std::string zeros(kShardHeaderBytes, '\0');  // header placeholder
  if (std::fwrite(zeros.data(), 1, zeros.size(), f_) != zeros.size()) {
    std::fclose(f_);
    f_ = nullptr;
    std::remove(tmp_.c_str());
    KILN_FAIL("cannot write shard {}", tmp_.string());
  }
}

ShardWriter::~ShardWriter() {
  if (f_ != nullptr) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void ShardWriter::write(std::span<const int32_t> tokens) {
  KILN_CHECK(f_ != nullptr, "shard {} already finished", path_.string());
  const int w = token_width(dtype_);
  const int64_t max_id = dtype_ == TokenDType::U16 ? 65535 : INT32_MAX;
  buf_.resize(tokens.size() * w);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    KILN_CHECK(t >= 0 && t <= max_id, "shard {}: token {} does not fit {}", path_.string(), t,
               token_dtype_name(dtype_));
    if (w == 2) {
      const uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(&buf_[i * 2], &v, 2);
    } else {
      const uint32_t v = static_cast<uint32_t>(t);
      std::memcpy(&buf_[i * 4], &v, 4);
    }
  }
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) {
    KILN_FAIL("cannot write shard {} (disk full?)", tmp_.string());
  }
  count_ += static_cast<int64_t>(tokens.size());
}

void ShardWriter::finish() {
  KILN_CHECK(f_ != nullptr, "shard {} already finished", path_.string());
  KILN_CHECK(count_ <= INT32_MAX, "shard {}: {} tokens exceed the int32 header count",
             path_.string(), count_);
  int32_t header[kShardHeaderInts] = {};
  header[0] = shard_magic(format_);
  header[1] = shard_version(format_);
  header[2] = static_cast<int32_t>(count_);
  bool ok = std::fseek(f_, 0, SEEK_SET) == 0 &&
            std::fwrite(header, 4, kShardHeaderInts, f_) == static_cast<size_t>(kShardHeaderInts) &&
            std::fflush(f_) == 0;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  if (ok) ok = std::rename(tmp_.c_str(), path_.c_str()) == 0;
  if (!ok) {
    std::remove(tmp_.c_str());
    KILN_FAIL("cannot finish shard {}: {}", path_.string(), std::strerror(errno));
  }
}

void write_shard(const fs::path& path, std::span<const int32_t> tokens, ShardFormat format) {
  ShardWriter w(path, format);
  w.write(tokens);
  w.finish();
}

void write_shard(const fs::path& path, std::span<const int32_t> tokens, TokenDType dtype) {
  ShardWriter w(path, dtype);
  w.write(tokens);
  w.finish();
}

ShardReader::ShardReader(const fs::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  KILN_CHECK(fd >= 0, "cannot open shard {}: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    KILN_FAIL("cannot stat shard {}", path.string());
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    KILN_FAIL("shard {}: {} bytes, shorter than the 1024-byte header (truncated?)", path.string(),
              file_bytes);
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  KILN_CHECK(m != MAP_FAILED, "cannot mmap shard {}: {}", path.string(), std::strerror(errno));
  map_ = m;
  map_bytes_ = static_cast<size_t>(file_bytes);
  const auto* h = static_cast<const int32_t*>(m);
  const int32_t magic = h[0], version = h[1];
  if (magic != kShardMagic && magic != kShardMagicLlama3) {
    close();
    KILN_FAIL("shard {}: bad magic {} (expected {} or {}; not an llm.c/kiln token shard)", path.string(), magic,
              kShardMagic, kShardMagicLlama3);
  }
  if ((magic == kShardMagic) != (version == 1 || version == 2) || (magic == kShardMagicLlama3) != (version == 7)) {
    close();
    KILN_FAIL("shard {}: unsupported version {} for magic {} (expected 1 = uint16 or 2 = uint32 with {}, 7 = "
              "uint32 with {})", path.string(), version, magic, kShardMagic, kShardMagicLlama3);
  }
  format_ = shard_format_of_version(version, path.string());
  dtype_ = shard_dtype(format_);
  count_ = h[2];
  const int64_t expected = kShardHeaderBytes + count_ * token_width(dtype_);
  if (count_ < 0 || expected != file_bytes) {
    const int64_t c = count_;
    close();
    KILN_FAIL("shard {}: header says {} tokens ({} bytes) but the file has {} bytes (truncated or corrupt)",
              path.string(), c, expected, file_bytes);
  }
  tokens_ = static_cast<const char*>(m) + kShardHeaderBytes;
  ::madvise(m, map_bytes_, MADV_RANDOM);
}

void ShardReader::close() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

ShardReader::~ShardReader() { close(); }

ShardReader::ShardReader(ShardReader&& o) noexcept { *this = std::move(o); }

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
    dtype_ = o.dtype_;
    format_ = o.format_;
  }
  return *this;
}

namespace {
// Copies n tokens, widened without sign, stopping at the first >= limit: its index, or n.
template <class T>
int64_t copy_checked(const T* p, int64_t n, int32_t* out, uint64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(p[i]) >= limit) return i;
    out[i] = static_cast<int32_t>(p[i]);
  }
  return n;
}
}  // namespace

void ShardReader::read(int64_t start, int64_t n, int32_t* out, int64_t vocab_size) const {
  KILN_CHECK(start >= 0 && n >= 0 && start + n <= count_, "shard {}: read [{}, {}) outside its {} tokens",
             path_.string(), start, start + n, count_);
  const auto limit = static_cast<uint64_t>(std::clamp<int64_t>(vocab_size, 0, int64_t{INT32_MAX} + 1));
  int64_t bad;
  uint64_t id = 0;
  if (dtype_ == TokenDType::U16) {
    const auto* p = static_cast<const uint16_t*>(tokens_) + start;
    bad = copy_checked(p, n, out, limit);
    if (bad < n) id = p[bad];
  } else {
    const auto* p = static_cast<const uint32_t*>(tokens_) + start;
    bad = copy_checked(p, n, out, limit);
    if (bad < n) id = p[bad];
  }
  KILN_CHECK(bad == n, "{}: token {} at position {} is >= vocab_size {} (a shard of another "
             "vocabulary?)", path_.string(), id, start + bad, vocab_size);
}

}  // namespace kiln::data
