#include "data/input_file.h"

#include "core/error.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace kiln::data {

namespace fs = std::filesystem;

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::None: return "none";
    case Compression::Gzip: return "gzip";
    case Compression::Zstd: return "zstd";
  }
  return "?";
}

struct InputFile::Impl {
  fs::path path;
  Compression compression = Compression::None;
  std::FILE* file = nullptr;  // None and Zstd
  gzFile gz = nullptr;        // Gzip
  // Zstd: the compressed bytes read but not yet decompressed, and whether the last frame
  // ended (ZSTD_decompressStream returned 0) before the file did.
  ZSTD_DCtx* zstd = nullptr;
  std::vector<char> in_buf;
  ZSTD_inBuffer in{nullptr, 0, 0};
  bool frame_done = true;
  int64_t raw_read = 0;

  size_t read_raw(char* dst, size_t n) {
    const size_t got = std::fread(dst, 1, n, file);
    KILN_CHECK(got == n || !std::ferror(file), "{}: read error ({})", path.string(), std::strerror(errno));
    raw_read += static_cast<int64_t>(got);
    return got;
  }

  size_t read_gzip(char* dst, size_t n) {
    const int want = static_cast<int>(std::min<size_t>(n, 1 << 30));
    const int got = gzread(gz, dst, static_cast<unsigned>(want));
    int err = Z_OK;
    const char* msg = gzerror(gz, &err);
    // zlib reports a member cut short as Z_BUF_ERROR ("unexpected end of file").
    KILN_CHECK(err != Z_BUF_ERROR, "{}: truncated gzip stream", path.string());
    KILN_CHECK(got >= 0 && (err == Z_OK || err == Z_STREAM_END), "{}: corrupt gzip stream ({})",
               path.string(), msg);
    return static_cast<size_t>(got);
  }

  size_t read_zstd(char* dst, size_t n) {
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos == 0) {
      if (in.pos == in.size) {
        in.size = read_raw(in_buf.data(), in_buf.size());
        in.pos = 0;
        if (in.size == 0) {
          KILN_CHECK(frame_done, "{}: truncated zstd stream", path.string());
          return 0;
        }
      }
      const size_t r = ZSTD_decompressStream(zstd, &out, &in);
      KILN_CHECK(!ZSTD_isError(r), "{}: corrupt zstd stream ({})", path.string(), ZSTD_getErrorName(r));
      frame_done = r == 0;
    }
    return out.pos;
  }
};

InputFile::InputFile(const fs::path& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.file = std::fopen(path.c_str(), "rb");
  KILN_CHECK(m.file != nullptr, "{}: cannot open for reading ({})", path.string(), std::strerror(errno));
  unsigned char magic[4] = {0, 0, 0, 0};
  const size_t got = std::fread(magic, 1, 4, m.file);
  std::rewind(m.file);
  if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    m.compression = Compression::Gzip;
    std::fclose(m.file);  // zlib opens the file itself
    m.file = nullptr;
    m.gz = gzopen(path.c_str(), "rb");
    KILN_CHECK(m.gz != nullptr, "{}: cannot open the gzip stream", path.string());
    gzbuffer(m.gz, 1 << 17);
  } else if (got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) {
    m.compression = Compression::Zstd;
    m.zstd = ZSTD_createDCtx();
    KILN_CHECK(m.zstd != nullptr, "{}: cannot create a zstd decoder", path.string());
    m.in_buf.resize(ZSTD_DStreamInSize());
    m.in.src = m.in_buf.data();
  }
}

InputFile::~InputFile() {
  if (impl_->gz != nullptr) gzclose(impl_->gz);
  if (impl_->zstd != nullptr) ZSTD_freeDCtx(impl_->zstd);
  if (impl_->file != nullptr) std::fclose(impl_->file);
}

size_t InputFile::read(char* dst, size_t n) {
  if (n == 0) return 0;
  switch (impl_->compression) {
    case Compression::None: return impl_->read_raw(dst, n);
    case Compression::Gzip: return impl_->read_gzip(dst, n);
    case Compression::Zstd: return impl_->read_zstd(dst, n);
  }
  return 0;
}

int64_t InputFile::consumed_bytes() const {
  if (impl_->compression == Compression::Gzip) return static_cast<int64_t>(gzoffset(impl_->gz));
  return impl_->raw_read;
}

Compression InputFile::compression() const { return impl_->compression; }
const fs::path& InputFile::path() const { return impl_->path; }

bool LineReader::next(std::string& line) {
  constexpr size_t kChunk = 1 << 20;
  while (true) {
    const size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos || (eof_ && pos_ < buf_.size())) {
      const size_t end = nl == std::string::npos ? buf_.size() : nl;
      line.assign(buf_, pos_, end - pos_);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      pos_ = nl == std::string::npos ? buf_.size() : nl + 1;
      ++line_number_;
      return true;
    }
    if (eof_) return false;
    buf_.erase(0, pos_);
    pos_ = 0;
    const size_t old = buf_.size();
    buf_.resize(old + kChunk);
    const size_t got = file_.read(buf_.data() + old, kChunk);
    buf_.resize(old + got);
    eof_ = got == 0;
  }
}

}  // namespace kiln::data
