#include "data/idx.h"

#include "core/error.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <memory>

namespace kiln::data {

namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

// Reads exactly n bytes; false at end of file before n.
bool read_exact(gzFile f, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n, 1u << 30));
    const int got = gzread(f, p, chunk);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_regular_file(path, ec), "{}: no such file", name);
  // gzopen reads plain files transparently, so one path serves .gz and uncompressed.
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(name.c_str(), "rb"));
  KILN_CHECK(f != nullptr, "{}: cannot open", name);
  uint8_t magic[4];
  KILN_CHECK(read_exact(f.get(), magic, 4), "{}: not an IDX file (shorter than its 4-byte magic)", name);
  KILN_CHECK(magic[0] == 0 && magic[1] == 0,
             "{}: not an IDX file (magic {:02x} {:02x} {:02x} {:02x}; IDX starts 00 00)", name,
             magic[0], magic[1], magic[2], magic[3]);
  KILN_CHECK(magic[2] == 0x08, "{}: IDX element type 0x{:02x}; only unsigned bytes (0x08) are read",
             name, magic[2]);
  KILN_CHECK(magic[3] >= 1 && magic[3] <= 4, "{}: IDX with {} dimensions; 1 to 4 are read", name,
             magic[3]);
  IdxArray a;
  uint64_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t b[4];
    KILN_CHECK(read_exact(f.get(), b, 4), "{}: truncated in its header (dimension {})", name, d);
    const uint64_t n = (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | b[3];
    KILN_CHECK(n > 0, "{}: dimension {} has size 0", name, d);
    total *= n;
    KILN_CHECK(total <= (uint64_t{1} << 32), "{}: more than 4 GiB of elements", name);
    a.dims.push_back(static_cast<int64_t>(n));
  }
  // Grown as the bytes arrive, so that a short file cannot make us allocate what its
  // header promises.
  while (a.data.size() < total) {
    const size_t have = a.data.size(), chunk = static_cast<size_t>(std::min<uint64_t>(total - have, 1u << 24));
    a.data.resize(have + chunk);
    KILN_CHECK(read_exact(f.get(), a.data.data() + have, chunk),
               "{}: truncated: its header promises {} bytes of elements", name, total);
  }
  uint8_t extra;
  KILN_CHECK(gzread(f.get(), &extra, 1) == 0, "{}: bytes after the {} elements its header "
             "promises", name, total);
  int err = 0;
  gzerror(f.get(), &err);
  KILN_CHECK(err == Z_OK || err == Z_STREAM_END, "{}: corrupt gzip stream", name);
  return a;
}

void write_idx(const std::filesystem::path& path, const IdxArray& a) {
  std::ofstream out(path, std::ios::binary);
  KILN_CHECK(out.good(), "{}: cannot create", path.string());
  const uint8_t magic[4] = {0, 0, 0x08, static_cast<uint8_t>(a.dims.size())};
  out.write(reinterpret_cast<const char*>(magic), 4);
  for (int64_t n : a.dims) {
    const uint8_t b[4] = {static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
                          static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
    out.write(reinterpret_cast<const char*>(b), 4);
  }
  out.write(reinterpret_cast<const char*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
  KILN_CHECK(out.good(), "{}: write failed", path.string());
}

std::filesystem::path idx_file(const std::filesystem::path& dir, const std::string& stem) {
  const std::filesystem::path gz = dir / (stem + ".gz");
  return std::filesystem::exists(gz) ? gz : dir / stem;
}

}  // namespace kiln::data
