// Image inputs: IDX files (plain and gzip) read back exactly and every malformed one a
// one-line error naming the file; image shards written, read back and verified (size,
// header, crc32).
#include "core/error.h"
#include "data/idx.h"
#include "data/image_shard.h"
#include "support/error_of.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>

namespace kiln::data {
namespace {

namespace fs = std::filesystem;
using kiln::testing::error_of;

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "kiln_test_images";
  fs::create_directories(d);
  return d / name;
}

IdxArray random_images(int n, int h, int w, uint32_t seed) {
  IdxArray a;
  a.dims = {n, h, w};
  std::mt19937 rng(seed);
  a.data.resize(static_cast<size_t>(n) * h * w);
  for (auto& b : a.data) b = static_cast<uint8_t>(rng());
  return a;
}

std::vector<uint8_t> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void put_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(Idx, ReadsPlainAndGzipExactly) {
  const IdxArray a = random_images(7, 5, 3, 1);
  const fs::path plain = scratch("a-idx3-ubyte");
  write_idx(plain, a);
  const IdxArray b = read_idx(plain);
  EXPECT_EQ(b.dims, a.dims);
  EXPECT_EQ(b.data, a.data);
  const fs::path gz = scratch("a-idx3-ubyte.gz");
  const auto bytes = file_bytes(plain);
  gzFile f = gzopen(gz.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
  const IdxArray c = read_idx(gz);
  EXPECT_EQ(c.dims, a.dims);
  EXPECT_EQ(c.data, a.data);
  IdxArray labels;
  labels.dims = {4};
  labels.data = {0, 9, 3, 3};
  write_idx(scratch("l-idx1-ubyte"), labels);
  EXPECT_EQ(read_idx(scratch("l-idx1-ubyte")).data, labels.data);
}

TEST(Idx, MalformedFilesAreOneLineErrorsNamingThem) {
  const fs::path p = scratch("bad-idx3-ubyte");
  write_idx(p, random_images(3, 4, 4, 2));
  const auto good = file_bytes(p);
  auto expect = [&](std::vector<uint8_t> bytes, const std::string& what) {
    put_bytes(p, bytes);
    const std::string e = error_of([&] { read_idx(p); });
    EXPECT_NE(e.find(p.string()), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  expect({good.begin(), good.end() - 1}, "truncated");
  expect({good.begin(), good.begin() + 9}, "truncated in its header");
  auto extra = good;
  extra.push_back(0);
  expect(extra, "bytes after");
  auto magic = good;
  magic[0] = 0x1f;
  expect(magic, "not an IDX file");
  auto type = good;
  type[2] = 0x0d;  // float
  expect(type, "element type 0x0d");
  auto dims = good;
  dims[3] = 0;
  expect(dims, "0 dimensions");
  auto zero = good;
  zero[4] = zero[5] = zero[6] = zero[7] = 0;
  expect(zero, "size 0");
  expect({}, "shorter than its 4-byte magic");
  EXPECT_NE(error_of([] { read_idx("/nonexistent/x-idx1-ubyte"); }).find("no such file"), std::string::npos);
}

TEST(ImageShard, WritesReadsAndVerifies) {
  const ImageShape shape{3, 2, 1};
  const fs::path p = scratch("train_000000.imgshard");
  uint32_t crc = 0;
  {
    ImageShardWriter w(p, shape);
    for (int i = 0; i < 5; ++i) {
      std::vector<uint8_t> px(6);
      for (int k = 0; k < 6; ++k) px[static_cast<size_t>(k)] = static_cast<uint8_t>(10 * i + k);
      w.write(i % 3, px);
    }
    EXPECT_NE(error_of([&] { w.write(0, std::vector<uint8_t>(5)); }).find("5 bytes"), std::string::npos);
    crc = w.finish();
  }
  EXPECT_EQ(fs::file_size(p), 1024u + 5u * 10u);
  const ImageShardReader r(p, shape, 5, crc);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.label(i), i % 3);
    EXPECT_EQ(r.pixels(i)[5], 10 * i + 5);
  }
  EXPECT_NE(error_of([&] { ImageShardReader(p, shape, 4, crc); }).find("holds 5 images, meta.json says 4"), std::string::npos);
  EXPECT_NE(error_of([&] { ImageShardReader(p, ImageShape{2, 3, 1}, 5, crc); }).find("images of 3x2x1"), std::string::npos);
  auto bytes = file_bytes(p);
  bytes[1030] ^= 1;
  put_bytes(p, bytes);
  EXPECT_NE(error_of([&] { ImageShardReader(p, shape, 5, crc); }).find("crc32"), std::string::npos);
  bytes.pop_back();
  put_bytes(p, bytes);
  EXPECT_NE(error_of([&] { ImageShardReader(p, shape, 5, crc); }).find("truncated or padded"), std::string::npos);
  EXPECT_NE(error_of([&] { ImageShardReader(scratch("none.imgshard"), shape, 5, crc); }).find("missing"), std::string::npos);
  {  // an unfinished writer leaves nothing under either name
    ImageShardWriter w(scratch("gone.imgshard"), shape);
    w.write(1, std::vector<uint8_t>(6));
  }
  EXPECT_FALSE(fs::exists(scratch("gone.imgshard")));
  EXPECT_FALSE(fs::exists(scratch("gone.imgshard.tmp")));
}

}  // namespace
}  // namespace kiln::data
