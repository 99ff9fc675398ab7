// Sharded checkpoints: flat range -> boxes, writing under one layout and reading under
// another, atomic commit, corruption detection with fallback, pruning.
#include "checkpoint/checkpoint.h"
#include "checkpoint_test_util.h"

#include "core/dtype.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

namespace kiln::checkpoint {
namespace {

namespace fs = std::filesystem;
using namespace test;

std::vector<int64_t> dims(const Shape& s) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.ndim(); ++i) d.push_back(s[i]);
  return d;
}

// Flat indices of a box's elements in row-major order of the box.
std::vector<int64_t> box_flat_indices(const Shape& shape, const Box& b) {
  std::vector<int64_t> out;
  const auto d = dims(shape);
  const size_t n = d.size();
  if (n == 0) return {0};
  std::vector<int64_t> idx(n, 0);
  for (;;) {
    int64_t flat = 0;
    for (size_t k = 0; k < n; ++k) flat = flat * d[k] + b.offset[k] + idx[k];
    out.push_back(flat);
    int k = static_cast<int>(n) - 1;
    while (k >= 0 && ++idx[k] == b.extent[k]) idx[k--] = 0;
    if (k < 0) break;
  }
  return out;
}

TEST(FlatRangeToBoxes, ExhaustiveOverSmallShapes) {
  const std::vector<Shape> shapes = {{5},       {1},          {3, 4},       {4, 1},
                                     {1, 4},    {2, 3, 4},    {3, 1, 2},    {2, 1, 3, 2},
                                     {2, 2, 2, 2, 2}, {1, 3, 1, 2}};
  for (const Shape& shape : shapes) {
    const int64_t numel = shape.numel();
    for (int64_t b = 0; b <= numel; ++b) {
      for (int64_t e = b; e <= numel; ++e) {
        const auto boxes = flat_range_to_boxes(shape, b, e);
        SCOPED_TRACE(fmt::format("shape {} range [{}, {})", shape.str(), b, e));
        if (b == e) {
          EXPECT_TRUE(boxes.empty());
          continue;
        }
        EXPECT_LE(static_cast<int>(boxes.size()), 2 * shape.ndim() - 1);
        std::vector<int64_t> all;
        for (const Box& box : boxes) {
          ASSERT_EQ(box.offset.size(), static_cast<size_t>(shape.ndim()));
          for (int d = 0; d < shape.ndim(); ++d) {
            EXPECT_GT(box.extent[d], 0);
            EXPECT_GE(box.offset[d], 0);
            EXPECT_LE(box.offset[d] + box.extent[d], shape[d]);
          }
          const auto idx = box_flat_indices(shape, box);
          EXPECT_EQ(static_cast<int64_t>(idx.size()), box.numel());
          all.insert(all.end(), idx.begin(), idx.end());
        }
        // The boxes laid end to end are exactly b, b+1, ..., e-1.
        std::vector<int64_t> want(static_cast<size_t>(e - b));
        std::iota(want.begin(), want.end(), b);
        EXPECT_EQ(all, want);
      }
    }
  }
}

TEST(FlatRangeToBoxes, ScalarAndErrors) {
  const auto boxes = flat_range_to_boxes(Shape{}, 0, 1);
  ASSERT_EQ(boxes.size(), 1u);
  EXPECT_TRUE(boxes[0].offset.empty());
  EXPECT_EQ(boxes[0].numel(), 1);
  EXPECT_THROW(flat_range_to_boxes(Shape{3, 4}, 0, 13), Error);
  EXPECT_THROW(flat_range_to_boxes(Shape{3, 4}, 5, 4), Error);
  EXPECT_THROW(flat_range_to_boxes(Shape{3, 4}, -1, 4), Error);
  // Full rows in the middle: one box.
  const auto rows = flat_range_to_boxes(Shape{6, 4}, 8, 20);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].offset, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(rows[0].extent, (std::vector<int64_t>{3, 4}));
}

TEST(CheckpointNames, DirNames) {
  EXPECT_EQ(checkpoint_dir_name(0), "step_00000000");
  EXPECT_EQ(checkpoint_dir_name(1234), "step_00001234");
  EXPECT_EQ(checkpoint_dir_name(123456789), "step_123456789");
  EXPECT_EQ(parse_checkpoint_dir_name("step_00001234"), 1234);
  EXPECT_EQ(parse_checkpoint_dir_name("step_123456789"), 123456789);
  EXPECT_FALSE(parse_checkpoint_dir_name("step_"));
  EXPECT_FALSE(parse_checkpoint_dir_name("step_12a"));
  EXPECT_FALSE(parse_checkpoint_dir_name(".tmp_step_00000001"));
  EXPECT_EQ(rank_file_stem(3), "rank_00003");
  EXPECT_EQ(buffer_crc32("123456789", 9), 0xCBF43926u);  // the standard CRC-32 check value
}

TEST(Checkpoint, WorldSizeOneRoundTrip) {
  TempDir tmp;
  FlatModel m;
  const fs::path dir = tmp.path() / checkpoint_dir_name(10);
  nlohmann::json state = {{"step", 10}, {"loader", {{"shard", 3}, {"position", 12345}}},
                          {"rng", {{"seed", 42}, {"offset", 7}}}};
  write_sharded(m, dir, 1, 1, state,
                {{"config.toml", "[model]\nn_layer = 2\n"}, {"tokenizer/vocab.json", "{}"}});
  ASSERT_TRUE(fs::exists(dir / "manifest.json"));
  EXPECT_FALSE(fs::exists(tmp.path() / ".tmp_step_00000010"));
  EXPECT_FALSE(fs::exists(dir / "rank_00000.json"));  // part files merged away

  CheckpointReader r(dir);
  EXPECT_EQ(r.state(), state);
  EXPECT_EQ(r.extra_file("config.toml"), "[model]\nn_layer = 2\n");
  EXPECT_EQ(r.extra_file_names(),
            (std::vector<std::string>{"config.toml", "tokenizer/vocab.json"}));
  EXPECT_EQ(r.extra_file("tokenizer/vocab.json"), "{}");
  EXPECT_TRUE(r.has_extra_file("tokenizer/vocab.json"));
  EXPECT_THROW(r.extra_file("nope"), Error);
  EXPECT_TRUE(r.has("qkv"));
  EXPECT_FALSE(r.has("nope"));
  EXPECT_EQ(r.global_shape("qkv"), (Shape{2, 3, 6, 6}));
  EXPECT_EQ(r.global_shape("scalar"), Shape{});
  EXPECT_EQ(r.dtype("wte"), DType::F32);
  EXPECT_EQ(m.read_shard(r, 0, m.size), m.data);
  for (size_t p = 0; p < m.params.size(); ++p) {
    const auto v = r.read_f32(m.params[p].first);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), m.data.begin() + m.offsets[p])) << m.params[p].first;
  }
  EXPECT_THROW(r.global_shape("nope"), Error);
  std::vector<float> buf(10);
  EXPECT_THROW(r.read_flat_range("wte", 70, 80, buf.data(), DType::F32), Error);  // past the end
  EXPECT_THROW(r.read_flat_range("wte", 0, 4, buf.data(), DType::I32), Error);
}

TEST(Checkpoint, ThreeRanksReadUnderOtherLayouts) {
  TempDir tmp;
  FlatModel m;
  const fs::path dir = tmp.path() / "step_00000005";
  write_sharded(m, dir, 3, 7);
  CheckpointReader r(dir);
  // Read back as 1, 2, 4 and 5 shards, and at many random ranges.
  for (int world : {1, 2, 4, 5}) {
    const auto pts = split_points(m.size, world, 100 + world);
    for (int k = 0; k < world; ++k) {
      const auto got = m.read_shard(r, pts[k], pts[k + 1]);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), m.data.begin() + pts[k])) << world << " " << k;
    }
  }
  std::mt19937 rng(3);
  for (int it = 0; it < 300; ++it) {
    const size_t p = rng() % m.params.size();
    const int64_t n = m.params[p].second.numel();
    int64_t b = std::uniform_int_distribution<int64_t>(0, n)(rng);
    int64_t e = std::uniform_int_distribution<int64_t>(0, n)(rng);
    if (b > e) std::swap(b, e);
    std::vector<float> got(static_cast<size_t>(e - b));
    r.read_flat_range(m.params[p].first, b, e, got.data(), DType::F32);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), m.data.begin() + m.offsets[p] + b));
  }
  // The manifest lists three data files (every rank had data).
  EXPECT_EQ(r.manifest()["files"].size(), 3u);
  EXPECT_EQ(r.manifest()["world_size"], 3);
}

TEST(Checkpoint, TensorParallelBoxesAndDtypes) {
  // Column blocks of a matrix (as a tensor-parallel layout would write), bf16 and int32.
  TempDir tmp;
  const fs::path dir = tmp.path() / "step_00000001";
  const Shape shape{5, 8};
  std::vector<float> full(40);
  for (int i = 0; i < 40; ++i) full[i] = static_cast<float>(i) * 0.5f - 3.f;
  std::vector<int32_t> ints(9);
  std::iota(ints.begin(), ints.end(), -4);
  std::vector<std::vector<uint16_t>> cols(2);
  {
    CheckpointWriter w0(dir, 0, 2), w1(dir, 1, 2);
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 5; ++i)
        for (int j = 4 * r; j < 4 * r + 4; ++j) cols[r].push_back(f32_to_bf16(full[i * 8 + j]));
      (r == 0 ? w0 : w1).add_box("w", shape, DType::BF16, {0, 4 * r}, {5, 4}, cols[r].data());
    }
    w1.add_tensor("ints", Shape{9}, DType::I32, ints.data());
    w1.write_rank_files();
    w0.write_rank_files();
    w0.commit(nlohmann::json::object());
  }
  CheckpointReader r(dir);
  EXPECT_EQ(r.dtype("w"), DType::BF16);
  for (int b = 0; b <= 40; ++b) {
    for (int e = b; e <= 40; ++e) {
      std::vector<float> got(static_cast<size_t>(e - b));
      r.read_flat_range("w", b, e, got.data(), DType::F32);
      for (int i = b; i < e; ++i) ASSERT_EQ(got[i - b], full[i]) << b << " " << e;  // exact in bf16
    }
  }
  std::vector<uint16_t> as_bf16(40);
  r.read("w", as_bf16.data(), DType::BF16);
  EXPECT_EQ(as_bf16[9], f32_to_bf16(full[9]));
  std::vector<int32_t> got_ints(9);
  r.read("ints", got_ints.data(), DType::I32);
  EXPECT_EQ(got_ints, ints);
  EXPECT_THROW(r.read("ints", got_ints.data(), DType::F32), Error);
}

TEST(Checkpoint, CommitRejectsBadLayouts) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "step_00000001";
  std::vector<float> d(12, 1.f);
  {  // a missing rank
    CheckpointWriter w0(dir, 0, 2);
    w0.add_flat_range("x", Shape{12}, DType::F32, 0, 6, d.data());
    w0.write_rank_files();
    try {
      w0.commit({});
      FAIL() << "commit without rank 1";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank_00001.json"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir));
  }
  fs::remove_all(tmp.path() / ".tmp_step_00000001");
  {  // overlapping slices
    CheckpointWriter w0(dir, 0, 2), w1(dir, 1, 2);
    w0.add_flat_range("x", Shape{12}, DType::F32, 0, 7, d.data());
    w1.add_flat_range("x", Shape{12}, DType::F32, 6, 12, d.data());
    w0.write_rank_files();
    w1.write_rank_files();
    EXPECT_THROW(w0.commit({}), Error);
  }
  fs::remove_all(tmp.path() / ".tmp_step_00000001");
  {  // a hole
    CheckpointWriter w0(dir, 0, 1);
    w0.add_flat_range("x", Shape{12}, DType::F32, 0, 11, d.data());
    w0.write_rank_files();
    try {
      w0.commit({});
      FAIL() << "commit with a hole";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(tmp.path() / ".tmp_step_00000001");
  {  // shape disagreement between ranks; commit on rank 1
    CheckpointWriter w0(dir, 0, 2), w1(dir, 1, 2);
    w0.add_flat_range("x", Shape{12}, DType::F32, 0, 6, d.data());
    w1.add_flat_range("x", Shape{3, 4}, DType::F32, 6, 12, d.data());
    w0.write_rank_files();
    w1.write_rank_files();
    EXPECT_THROW(w1.commit({}), Error);
    EXPECT_THROW(w0.commit({}), Error);
  }
  CheckpointWriter w(dir, 0, 1);
  EXPECT_THROW(w.add_box("x", Shape{3, 4}, DType::F32, {0, 2}, {3, 3}, d.data()), Error);
  EXPECT_THROW(w.add_box("x", Shape{3, 4}, DType::F32, {0}, {3}, d.data()), Error);
  EXPECT_THROW(w.add_flat_range("x", Shape{3, 4}, DType::F32, 0, 13, d.data()), Error);
  w.add_tensor("x", Shape{3, 4}, DType::F32, d.data());
  EXPECT_THROW(w.add_tensor("x", Shape{12}, DType::F32, d.data()), Error);
  w.write_rank_files();
  EXPECT_THROW(w.commit({}, {{"../evil", "x"}}), Error);
  EXPECT_THROW(w.commit({}, {{"a/../b", "x"}}), Error);
  EXPECT_THROW(w.commit({}, {{"/abs", "x"}}), Error);
  EXPECT_THROW(w.commit({}, {{".hidden", "x"}}), Error);
  EXPECT_THROW(w.commit({}, {{"rank_00001.json", "x"}}), Error);
  EXPECT_THROW(w.commit({}, {{"manifest.json", "x"}}), Error);
}

TEST(Checkpoint, ReplicatedTensorsKeptOnce) {
  // Plain data parallelism: every rank adds the whole tensor; the manifest keeps rank 0's.
  TempDir tmp;
  const fs::path dir = tmp.path() / "step_00000001";
  std::vector<float> d(12);
  std::iota(d.begin(), d.end(), 1.f);
  std::vector<std::unique_ptr<CheckpointWriter>> ws;
  for (int r = 0; r < 3; ++r) {
    ws.push_back(std::make_unique<CheckpointWriter>(dir, r, 3));
    ws.back()->add_tensor("x", Shape{3, 4}, DType::F32, d.data());
  }
  for (auto& w : ws) w->write_rank_files();
  ws[0]->commit({});
  CheckpointReader r(dir);
  EXPECT_EQ(r.read_f32("x"), d);
  ASSERT_EQ(r.manifest()["tensors"]["x"]["slices"].size(), 1u);
  EXPECT_EQ(r.manifest()["tensors"]["x"]["slices"][0]["file"], "rank_00000.safetensors");
}

TEST(Checkpoint, AtomicCommit) {
  TempDir tmp;
  FlatModel m;
  write_sharded(m, tmp.path() / "step_00000001", 1, 1);
  const fs::path dir = tmp.path() / "step_00000002";
  CheckpointWriter w0(dir, 0, 2), w1(dir, 1, 2);
  m.add_shard(w0, 0, 50);
  m.add_shard(w1, 50, m.size);
  w0.write_rank_files();
  w1.write_rank_files();
  // Everything written, nothing committed: no final directory; the previous one is latest.
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::exists(w0.tmp_dir() / "rank_00000.safetensors"));
  EXPECT_TRUE(fs::exists(w0.tmp_dir() / "rank_00001.json"));
  EXPECT_EQ(find_latest_checkpoint(tmp.path()), tmp.path() / "step_00000001");
  w0.commit({{"step", 2}});
  EXPECT_TRUE(fs::exists(dir / "manifest.json"));
  EXPECT_FALSE(fs::exists(w0.tmp_dir()));
  EXPECT_EQ(find_latest_checkpoint(tmp.path()), dir);

  // Saving the same step again replaces the checkpoint (leftover files dropped).
  write_sharded(m, dir, 1, 1, {{"step", 2}, {"again", true}});
  CheckpointReader r(dir);
  EXPECT_EQ(r.state()["again"], true);
  EXPECT_FALSE(fs::exists(dir / "rank_00001.safetensors"));
  EXPECT_EQ(m.read_shard(r, 0, m.size), m.data);
}

TEST(Checkpoint, CorruptionRejectedWithFallback) {
  TempDir tmp;
  FlatModel m;
  for (int s = 1; s <= 5; ++s)
    write_sharded(m, tmp.path() / checkpoint_dir_name(s), 2, s, {{"step", s}},
                  {{"config.toml", "x = 1\n"}});
  EXPECT_EQ(find_latest_checkpoint(tmp.path()), tmp.path() / "step_00000005");

  // 5: flipped byte in a data file -> checksum mismatch.
  const fs::path f5 = tmp.path() / "step_00000005" / "rank_00001.safetensors";
  flip_byte(f5);
  std::string err = open_error(tmp.path() / "step_00000005");
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("rank_00001.safetensors"), std::string::npos) << err;
  // Size-only verification does not read the bytes.
  EXPECT_NO_THROW(CheckpointReader(tmp.path() / "step_00000005", Verify::SizeOnly));

  // 4: truncated file.
  const fs::path f4 = tmp.path() / "step_00000004" / "rank_00000.safetensors";
  fs::resize_file(f4, fs::file_size(f4) - 3);
  err = open_error(tmp.path() / "step_00000004");
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_NE(err.find("rank_00000.safetensors"), std::string::npos) << err;

  // 3: missing file.
  fs::remove(tmp.path() / "step_00000003" / "config.toml");
  err = open_error(tmp.path() / "step_00000003");
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  EXPECT_NE(err.find("config.toml"), std::string::npos) << err;

  // 2: no manifest = incomplete.
  fs::remove(tmp.path() / "step_00000002" / "manifest.json");
  err = open_error(tmp.path() / "step_00000002");
  EXPECT_NE(err.find("incomplete"), std::string::npos) << err;

  testing::internal::CaptureStderr();
  const auto latest = find_latest_checkpoint(tmp.path());
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(latest, tmp.path() / "step_00000001");
  for (int s = 2; s <= 5; ++s)
    EXPECT_NE(warnings.find(checkpoint_dir_name(s)), std::string::npos) << warnings;
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 4) << warnings;
  CheckpointReader r(*latest);
  EXPECT_EQ(r.state()["step"], 1);
  EXPECT_EQ(m.read_shard(r, 0, m.size), m.data);

  // An extra file changed after open is caught when read.
  fs::remove(tmp.path() / "step_00000001" / "config.toml");
  { std::ofstream(tmp.path() / "step_00000001" / "config.toml") << "x = 2\n"; }
  EXPECT_THROW(r.extra_file("config.toml"), Error);

  EXPECT_FALSE(find_latest_checkpoint(tmp.path() / "does_not_exist"));
}

TEST(Checkpoint, Prune) {
  TempDir tmp;
  FlatModel m;
  for (int s : {1, 2, 3, 4, 5}) write_sharded(m, tmp.path() / checkpoint_dir_name(s * 100), 1, s);
  fs::create_directories(tmp.path() / ".tmp_step_00000600");  // a crashed save
  fs::create_directories(tmp.path() / "step_00000700");       // incomplete
  fs::create_directories(tmp.path() / "unrelated");
  // A truncated newest-but-one: not counted as complete.
  const fs::path f = tmp.path() / "step_00000500" / "rank_00000.safetensors";
  fs::resize_file(f, fs::file_size(f) - 1);

  const auto removed = prune_checkpoints(tmp.path(), 2);
  EXPECT_EQ(removed.size(), 5u);  // 700, 500, 200, 100, .tmp
  EXPECT_TRUE(fs::exists(tmp.path() / "step_00000400"));
  EXPECT_TRUE(fs::exists(tmp.path() / "step_00000300"));
  EXPECT_TRUE(fs::exists(tmp.path() / "unrelated"));
  for (const char* gone : {"step_00000100", "step_00000200", "step_00000500", "step_00000700",
                           ".tmp_step_00000600"})
    EXPECT_FALSE(fs::exists(tmp.path() / gone)) << gone;
  EXPECT_EQ(list_checkpoint_dirs(tmp.path()),
            (std::vector<fs::path>{tmp.path() / "step_00000400", tmp.path() / "step_00000300"}));
  EXPECT_TRUE(prune_checkpoints(tmp.path(), 5).empty());
  // keep <= 0 keeps every complete checkpoint, still sweeping stale temporary directories.
  fs::create_directories(tmp.path() / ".tmp_step_00000900");
  EXPECT_EQ(prune_checkpoints(tmp.path(), 0),
            (std::vector<fs::path>{tmp.path() / ".tmp_step_00000900"}));
  EXPECT_EQ(list_checkpoint_dirs(tmp.path()).size(), 2u);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& text) {
  fs::remove(p);
  std::ofstream(p, std::ios::binary) << text;
}

// The manifest checks its own content: one changed digit of the state is caught.
TEST(Checkpoint, ManifestChecksum) {
  TempDir tmp;
  FlatModel m;
  write_sharded(m, tmp.path() / "step_00000001", 2, 1, {{"step", 1}, {"loader", {{"index", 1234}}}});
  write_sharded(m, tmp.path() / "step_00000002", 2, 2, {{"step", 2}, {"loader", {{"index", 5678}}}});
  const fs::path mpath = tmp.path() / "step_00000002" / "manifest.json";
  const std::string good = read_text(mpath);
  EXPECT_NE(good.find("\"manifest_crc32\""), std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("5678"), 4, "5679");
  write_text(mpath, bad);
  std::string err = open_error(tmp.path() / "step_00000002");
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("manifest.json"), std::string::npos) << err;
  testing::internal::CaptureStderr();
  EXPECT_EQ(find_latest_checkpoint(tmp.path()), tmp.path() / "step_00000001");
  testing::internal::GetCapturedStderr();

  // Version 2 without its checksum is refused; version 1 (written before it existed) loads.
  nlohmann::json j = nlohmann::json::parse(good);
  j.erase("manifest_crc32");
  write_text(mpath, j.dump(1));
  err = open_error(tmp.path() / "step_00000002");
  EXPECT_NE(err.find("manifest_crc32"), std::string::npos) << err;
  j["format_version"] = 1;
  write_text(mpath, j.dump(1));
  CheckpointReader r(tmp.path() / "step_00000002");
  EXPECT_EQ(r.state()["loader"]["index"], 5678);
  EXPECT_EQ(m.read_shard(r, 0, m.size), m.data);
  j["format_version"] = 3;
  write_text(mpath, j.dump(1));
  err = open_error(tmp.path() / "step_00000002");
  EXPECT_NE(err.find("format version 3"), std::string::npos) << err;
}

// A damaged checkpoint (right sizes, bad checksum) is not counted: keep = 2 keeps two
// valid ones.
TEST(Checkpoint, PruneKeepsOnlyVerifiedCheckpoints) {
  TempDir tmp;
  FlatModel m;
  for (int s : {1, 2, 3}) write_sharded(m, tmp.path() / checkpoint_dir_name(s), 2, s);
  flip_byte(tmp.path() / "step_00000003" / "rank_00001.safetensors");
  testing::internal::CaptureStderr();
  const auto removed = prune_checkpoints(tmp.path(), 2);
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(removed, (std::vector<fs::path>{tmp.path() / "step_00000003"}));
  EXPECT_NE(warnings.find("step_00000003"), std::string::npos) << warnings;
  EXPECT_NO_THROW(verify_checkpoint(tmp.path() / "step_00000002"));
  EXPECT_NO_THROW(verify_checkpoint(tmp.path() / "step_00000001"));
  // The newest valid one is never removed, whatever is newer.
  fs::create_directories(tmp.path() / "step_00000009");
  testing::internal::CaptureStderr();
  prune_checkpoints(tmp.path(), 1);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(list_checkpoint_dirs(tmp.path()), (std::vector<fs::path>{tmp.path() / "step_00000002"}));
}

TEST(Checkpoint, MoveAsideKeepsAbandonedCheckpoints) {
  TempDir tmp;
  FlatModel m;
  for (int s : {1, 2, 3}) write_sharded(m, tmp.path() / checkpoint_dir_name(s), 1, s);
  auto moved = move_checkpoints_aside(tmp.path(), 1);
  ASSERT_EQ(moved.size(), 2u);
  const fs::path dest = tmp.path() / "abandoned" / "from_step_00000001";
  EXPECT_EQ(moved[0], std::make_pair(tmp.path() / "step_00000003", dest / "step_00000003"));
  EXPECT_NO_THROW(verify_checkpoint(dest / "step_00000002"));
  EXPECT_EQ(list_checkpoint_dirs(tmp.path()), (std::vector<fs::path>{tmp.path() / "step_00000001"}));
  EXPECT_TRUE(move_checkpoints_aside(tmp.path(), 1).empty());
  // A second rollback to the same step goes to a new folder; pruning never touches them.
  write_sharded(m, tmp.path() / checkpoint_dir_name(2), 1, 2);
  moved = move_checkpoints_aside(tmp.path(), 1);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].second, tmp.path() / "abandoned" / "from_step_00000001.1" / "step_00000002");
  prune_checkpoints(tmp.path(), 1);
  EXPECT_TRUE(fs::exists(dest / "step_00000003"));
}

}  // namespace
}  // namespace kiln::checkpoint
