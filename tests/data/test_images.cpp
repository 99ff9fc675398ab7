// Image inputs: IDX files (plain and gzip) read back exactly and every malformed one a
// one-line error naming the file; image shards written, read back and verified (size,
// header, crc32).
#include "core/error.h"
#include "data/idx.h"
#include "data/image_dataset.h"
#include "data/image_folder.h"
#include "data/image_shard.h"
#include "data/meta.h"
#include "support/error_of.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
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

TEST(ImageShard, CaptionedRecordsRoundTrip) {
  // Image-text pairs (data/llava.h): each record's caption in L = 4 slots, short ones
  // padded, a text-only record's image at -1.
  const ImageShape shape{2, 2, 1};
  const fs::path p = scratch("pairs_000000.imgshard");
  const std::vector<CaptionTokens> captions = {
      {{7, 8, 9, 300000}, {0, 1, 1, 1}, 1}, {{5}, {1}, -1}, {{}, {}, 0}};
  uint32_t crc = 0;
  {
    ImageShardWriter w(p, shape, 4);
    for (size_t i = 0; i < captions.size(); ++i)
      w.write(-1, std::vector<uint8_t>(4, static_cast<uint8_t>(i + 1)), captions[i]);
    EXPECT_NE(error_of([&] { w.write(-1, std::vector<uint8_t>(4)); }).find("without its caption"),
              std::string::npos);
    const CaptionTokens long_one{{1, 2, 3, 4, 5}, {0, 0, 0, 0, 1}, -1};
    EXPECT_NE(error_of([&] { w.write(-1, std::vector<uint8_t>(4), long_one); })
                  .find("a caption of 5 tokens"), std::string::npos);
    const CaptionTokens far_image{{1}, {1}, 2};
    EXPECT_NE(error_of([&] { w.write(-1, std::vector<uint8_t>(4), far_image); })
                  .find("image at 2"), std::string::npos);
    crc = w.finish();
  }
  EXPECT_EQ(fs::file_size(p), 1024u + 3u * (4u + 4u + 8u + 5u * 4u));
  const ImageShardReader r(p, shape, 3, crc, 4);
  for (size_t i = 0; i < captions.size(); ++i) {
    const CaptionTokens c = r.caption(static_cast<int64_t>(i));
    EXPECT_EQ(c.ids, captions[i].ids) << i;
    EXPECT_EQ(c.in_loss, captions[i].in_loss) << i;
    EXPECT_EQ(c.image_at, captions[i].image_at) << i;
    EXPECT_EQ(r.pixels(static_cast<int64_t>(i))[3], i + 1);
    EXPECT_EQ(r.label(static_cast<int64_t>(i)), -1);
  }
  EXPECT_NE(error_of([&] { ImageShardReader(p, shape, 3, crc, 5); })
                .find("4 caption tokens per record, meta.json says 5"), std::string::npos);
  EXPECT_NE(error_of([&] { ImageShardReader(p, shape, 3, crc); })
                .find("4 caption tokens per record, meta.json says 0"), std::string::npos);
  EXPECT_NE(error_of([&] { r.caption(3); }).find("no image 3 of 3"), std::string::npos);
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
  {  // a header announcing caption tokens (a later version's records) is refused
    auto captioned = bytes;
    captioned[24] = 3;
    put_bytes(p, captioned);
    EXPECT_NE(error_of([&] { ImageShardReader(p, shape, 5, crc); }).find("3 caption tokens per record"),
              std::string::npos);
  }
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

// A small MNIST-like directory: n train and m t10k images of 4x3, label i % 7, pixel
// values that identify the image (its index in the low byte of pixel 0, 1).
fs::path idx_dir(const std::string& name, int n, int m) {
  const fs::path d = scratch(name);
  fs::remove_all(d);
  fs::create_directories(d);
  for (const auto& [prefix, count] : {std::pair<std::string, int>{"train", n}, {"t10k", m}}) {
    if (count == 0) continue;
    IdxArray im, lb;
    im.dims = {count, 4, 3};
    lb.dims = {count};
    for (int i = 0; i < count; ++i) {
      for (int k = 0; k < 12; ++k) im.data.push_back(static_cast<uint8_t>(k == 0 ? i & 255 : k == 1 ? i >> 8 : 7 * k + (prefix == "t10k")));
      lb.data.push_back(static_cast<uint8_t>(i % 7));
    }
    write_idx(d / (prefix + "-images-idx3-ubyte"), im);
    write_idx(d / (prefix + "-labels-idx1-ubyte"), lb);
  }
  return d;
}

TEST(ImageDataset, PreparesIdxAndLoadsEveryImageOncePerEpochAcrossRanks) {
  const fs::path in = idx_dir("idx_in", 50, 10), out = scratch("idx_out");
  fs::remove_all(out);
  const ImageDatasetMeta m = prepare_images({"idx", in, out, 16});
  EXPECT_EQ(m.shape, (ImageShape{4, 3, 1}));
  EXPECT_EQ(m.classes, 7);
  ASSERT_EQ(m.splits.at("train").size(), 4u);  // 16 + 16 + 16 + 2
  EXPECT_EQ(m.images("train"), 50);
  EXPECT_EQ(m.images("val"), 10);
  EXPECT_TRUE(is_image_dataset(out));
  const ImageDatasetMeta back = read_image_meta(out);
  EXPECT_EQ(back.images("train"), 50);
  EXPECT_EQ(back.splits.at("train")[3].crc32, m.splits.at("train")[3].crc32);
  EXPECT_NE(error_of([&] { prepare_images({"idx", in, out, 16}); }).find("already holds"), std::string::npos);

  // One process with micro-batch 4, and 2 ranks of 2: the same global batches, each image
  // once per epoch (50 = 12 batches of 4 + 2 that open the next epoch), matching its label.
  ImageLoader one(out, "train", 3, true);
  std::vector<ImageLoader> ranks;
  for (int r = 0; r < 2; ++r) ranks.emplace_back(out, "train", 3, true);
  std::vector<int> seen(50, 0);
  for (int step = 0; step < 12; ++step) {
    std::vector<uint8_t> px(4 * 12), px_r(2 * 12);
    std::vector<int32_t> lb(4), lb_r(2);
    one.next_batch(px.data(), lb.data(), 4);
    for (int b = 0; b < 4; ++b) {
      const int id = px[static_cast<size_t>(b * 12)] | (px[static_cast<size_t>(b * 12 + 1)] << 8);
      ASSERT_LT(id, 50);
      ++seen[static_cast<size_t>(id)];
      EXPECT_EQ(lb[static_cast<size_t>(b)], id % 7);
      EXPECT_EQ(px[static_cast<size_t>(b * 12 + 5)], 35);
    }
    for (int r = 0; r < 2; ++r) {
      ranks[static_cast<size_t>(r)].next_batch(px_r.data(), lb_r.data(), 2, r, 2);
      EXPECT_TRUE(std::equal(px_r.begin(), px_r.end(), px.begin() + r * 24));
      EXPECT_EQ(lb_r[0], lb[static_cast<size_t>(2 * r)]);
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 48);  // 2 left for the epoch's tail
  // Resume: a loader set to the saved position continues identically.
  const LoaderState s = one.state();
  ImageLoader resumed(out, "train", 3, true);
  resumed.set_state(s);
  std::vector<uint8_t> a(4 * 12), b(4 * 12);
  std::vector<int32_t> la(4), lb2(4);
  one.next_batch(a.data(), la.data(), 4);
  resumed.next_batch(b.data(), lb2.data(), 4);
  EXPECT_EQ(a, b);
  EXPECT_EQ(one.state().epoch, 1);
  // The val split is the t10k files.
  ImageLoader val(out, "val", 0, false);
  EXPECT_EQ(val.samples_per_epoch(), 10);
  val.next_batch(a.data(), la.data(), 1);
  EXPECT_EQ(a[5], 36);
}

TEST(ImageDataset, ClassNamesOfIdxFilesAreStoredWhenGiven) {
  const fs::path in = idx_dir("idx_names_in", 14, 3), out = scratch("idx_names_out");
  fs::remove_all(out);
  const std::vector<std::string> names{"a", "b", "c", "d", "e", "f", "g"};
  PrepareImagesOptions o{"idx", in, out, 16, names};
  EXPECT_EQ(prepare_images(o).class_names, names);
  EXPECT_EQ(read_image_meta(out).class_names, names);
  // A count that is not the labels' is refused, and nothing is left behind.
  fs::remove_all(out);
  o.class_names.pop_back();
  EXPECT_NE(error_of([&] { prepare_images(o); }).find("--class-names gives 6 names"), std::string::npos);
  EXPECT_FALSE(fs::exists(out / "meta.json"));
}

TEST(ImageDataset, BadInputsAreOneLineErrorsNamingTheFile) {
  const fs::path out = scratch("idx_bad_out");
  fs::remove_all(out);
  {  // labels missing
    const fs::path in = idx_dir("idx_nolabels", 8, 0);
    fs::remove(in / "train-labels-idx1-ubyte");
    EXPECT_NE(error_of([&] { prepare_images({"idx", in, out, 16}); }).find("no train-labels-idx1-ubyte"), std::string::npos);
    EXPECT_FALSE(fs::exists(out));  // nothing left behind
  }
  {  // counts differ
    const fs::path in = idx_dir("idx_counts", 8, 0);
    IdxArray lb;
    lb.dims = {7};
    lb.data.assign(7, 1);
    write_idx(in / "train-labels-idx1-ubyte", lb);
    EXPECT_NE(error_of([&] { prepare_images({"idx", in, out, 16}); }).find("holds 8 images but"), std::string::npos);
  }
  {  // a val split of another size; its train shards are removed again
    const fs::path in = idx_dir("idx_shape", 8, 3);
    IdxArray im;
    im.dims = {3, 5, 5};
    im.data.assign(75, 0);
    write_idx(in / "t10k-images-idx3-ubyte", im);
    EXPECT_NE(error_of([&] { prepare_images({"idx", in, out, 4}); }).find("the train split's are 4x3"), std::string::npos);
    EXPECT_FALSE(fs::exists(out));
  }
  // A corrupt shard, and a token dataset's loader pointed at images.
  const fs::path in = idx_dir("idx_ok", 8, 0);
  prepare_images({"idx", in, out, 16});
  auto bytes = file_bytes(out / "train_000000.imgshard");
  bytes[1024 + 6] ^= 0x40;
  put_bytes(out / "train_000000.imgshard", bytes);
  const std::string e = error_of([&] { ImageLoader(out, "train", 0, false); });
  EXPECT_NE(e.find("train_000000.imgshard: crc32"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { ImageLoader(out, "val", 0, false); }).find("no 'val' split"), std::string::npos);
  EXPECT_NE(error_of([&] { read_dataset_meta(out); }).find("an image dataset"), std::string::npos);
  std::ofstream(out / "meta.json") << R"({"format": "kiln-token-shards"})";
  EXPECT_NE(error_of([&] { read_image_meta(out); }).find("not an image dataset"), std::string::npos);
  EXPECT_FALSE(is_image_dataset(out));
}

// An image folder: train/ and val/ with classes "boot" and "coat", 3x2 RGB PNGs whose
// first pixel says which file they are.
TEST(ImageDataset, PreparesAnImageFolderOfPngs) {
  const fs::path in = scratch("folder_in"), out = scratch("folder_out");
  fs::remove_all(in);
  fs::remove_all(out);
  const ImageShape shape{3, 2, 3};
  int id = 0;
  for (const char* split : {"train", "val"}) {
    for (const char* cls : {"coat", "boot"}) {  // created out of order: labels sort by name
      fs::create_directories(in / split / cls);
      for (int k = 0; k < (split[0] == 't' ? 3 : 1); ++k, ++id) {
        std::vector<uint8_t> px(static_cast<size_t>(shape.pixels()), 9);
        px[0] = static_cast<uint8_t>(id);
        write_png(in / split / cls / ("img" + std::to_string(k) + ".png"), shape, px);
      }
    }
  }
  std::ofstream(in / "train" / "coat" / "notes.txt") << "ignored";
  const ImageDatasetMeta m = prepare_images({"imagefolder", in, out, 4});
  EXPECT_EQ(m.shape, shape);
  EXPECT_EQ(m.classes, 2);
  EXPECT_EQ(m.class_names, (std::vector<std::string>{"boot", "coat"}));
  EXPECT_EQ(m.images("train"), 6);
  EXPECT_EQ(m.images("val"), 2);
  EXPECT_EQ(read_image_meta(out).class_names, m.class_names);
  ImageLoader train(out, "train", 0, false);
  std::vector<uint8_t> px(static_cast<size_t>(6 * shape.pixels()));
  std::vector<int32_t> labels(6);
  train.next_batch(px.data(), labels.data(), 6);
  // boot (label 0) first: files 3, 4, 5 were written for "boot", then coat's 0, 1, 2.
  EXPECT_EQ(labels, (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(px[0], 3);
  EXPECT_EQ(px[static_cast<size_t>(3 * shape.pixels())], 0);
  EXPECT_EQ(px[1], 9);
  // A PNG of another size, and a file that is not a PNG: errors naming the file.
  fs::remove_all(out);
  write_png(in / "val" / "boot" / "big.png", ImageShape{4, 2, 3}, std::vector<uint8_t>(24, 1));
  std::string e = error_of([&] { prepare_images({"imagefolder", in, out, 4}); });
  EXPECT_NE(e.find("big.png: 4x2"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(out));
  fs::remove(in / "val" / "boot" / "big.png");
  std::ofstream(in / "val" / "boot" / "broken.png") << "not a png";
  e = error_of([&] { prepare_images({"imagefolder", in, out, 4}); });
  EXPECT_NE(e.find("broken.png: not a readable PNG"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { list_image_folder(in / "train" / "coat"); }).find("no class folders"), std::string::npos);
}

}  // namespace
}  // namespace kiln::data
