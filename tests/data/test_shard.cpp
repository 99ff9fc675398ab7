#include "core/error.h"
#include "core/rng.h"
#include "data/shard.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace kiln::data;
using kiln::data::testing::TempDir;

namespace {

std::vector<int32_t> random_tokens(int64_t n, uint32_t max_exclusive, uint64_t seed) {
  kiln::Philox rng(seed, 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.next_u32() % max_exclusive);
  return t;
}

void round_trip(ShardFormat format, uint32_t vocab) {
  const TokenDType dtype = shard_dtype(format);
  TempDir dir;
  const auto path = dir / "s.bin";
  const auto tokens = random_tokens(10007, vocab, vocab);
  {
    ShardWriter w(path, format);
    w.write(std::span(tokens).first(5000));
    EXPECT_FALSE(std::filesystem::exists(path)) << "shard visible before finish()";
    w.write(std::span(tokens).subspan(5000));
    EXPECT_EQ(w.count(), 10007);
    w.finish();
  }
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 10007u * token_width(dtype));
  EXPECT_FALSE(std::filesystem::exists(dir / "s.bin.tmp"));
  ShardReader r(path);
  EXPECT_EQ(r.size(), 10007);
  EXPECT_EQ(r.dtype(), dtype);
  EXPECT_EQ(r.format(), format);
  std::vector<int32_t> back(tokens.size());
  r.read(0, r.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(r[123], tokens[123]);
  // The header: llm.c's layout (dev/data/data_common.py), kiln's version 2 beside it.
  std::ifstream f(path, std::ios::binary);
  int32_t h[3];
  f.read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], format == ShardFormat::Llama3U32 ? 20240801 : 20240520);
  EXPECT_EQ(h[1], format == ShardFormat::U16 ? 1 : format == ShardFormat::KilnU32 ? 2 : 7);
  EXPECT_EQ(h[2], 10007);
  EXPECT_THROW(r.read(10000, 8, back.data()), kiln::Error);
}

}  // namespace

TEST(Shard, RoundTripUint16) { round_trip(ShardFormat::U16, 65535); }
TEST(Shard, RoundTripKilnUint32) { round_trip(ShardFormat::KilnU32, 200000); }
TEST(Shard, RoundTripLlmcUint32) { round_trip(ShardFormat::Llama3U32, 200000); }

TEST(Shard, ReadsFilesWrittenAsLlmcWritesThem) {
  // Written byte by byte here, as llm.c's write_datafile does: 256 int32 (magic, version,
  // count, zeros), then the tokens as uint16 ("gpt-2") or uint32 ("llama-3").
  TempDir dir;
  const std::vector<uint32_t> ids = {128000, 9906, 1917, 0, 65535, 65536, 128255};
  auto write = [&](const std::string& name, int32_t magic, int32_t version, int width) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(ids.size());
    std::ofstream f(dir / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    for (uint32_t id : ids) {
      const uint16_t lo = static_cast<uint16_t>(id);
      if (width == 2) f.write(reinterpret_cast<const char*>(&lo), 2);
      else f.write(reinterpret_cast<const char*>(&id), 4);
    }
  };
  write("llama3.bin", 20240801, 7, 4);
  write("gpt2.bin", 20240520, 1, 2);
  ShardReader l(dir / "llama3.bin");
  EXPECT_EQ(l.format(), ShardFormat::Llama3U32);
  std::vector<int32_t> back(ids.size());
  l.read(0, l.size(), back.data(), 128256);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(back[i], static_cast<int32_t>(ids[i]));
  ShardReader g(dir / "gpt2.bin");
  EXPECT_EQ(g.format(), ShardFormat::U16);
  EXPECT_EQ(g[0], 128000 & 0xFFFF);
  EXPECT_EQ(g[4], 65535);
  // A magic with the other magic's version is refused.
  write("mixed.bin", 20240801, 1, 2);
  EXPECT_THROW(ShardReader(dir / "mixed.bin"), kiln::Error);
  write("mixed2.bin", 20240520, 7, 4);
  EXPECT_THROW(ShardReader(dir / "mixed2.bin"), kiln::Error);
}

TEST(Shard, FormatChoice) {
  EXPECT_EQ(choose_shard_format("kiln", 50257), ShardFormat::U16);
  EXPECT_EQ(choose_shard_format("kiln", 128256), ShardFormat::KilnU32);
  EXPECT_EQ(choose_shard_format("llmc", 50257), ShardFormat::U16);
  EXPECT_EQ(choose_shard_format("llmc", 128256), ShardFormat::Llama3U32);
  EXPECT_EQ(choose_shard_format("llmc-u32", 257), ShardFormat::Llama3U32);
  EXPECT_THROW(choose_shard_format("llama", 257), kiln::Error);
}

TEST(Shard, EmptyShard) {
  TempDir dir;
  write_shard(dir / "e.bin", {}, TokenDType::U16);
  ShardReader r(dir / "e.bin");
  EXPECT_EQ(r.size(), 0);
}

TEST(Shard, DtypeForVocab) {
  EXPECT_EQ(token_dtype_for_vocab(50257), TokenDType::U16);
  EXPECT_EQ(token_dtype_for_vocab(65535), TokenDType::U16);
  EXPECT_EQ(token_dtype_for_vocab(65536), TokenDType::U32);
  EXPECT_EQ(token_dtype_for_vocab(128256), TokenDType::U32);
}

TEST(Shard, WriterRejectsTokensOutsideDtype) {
  TempDir dir;
  {
    ShardWriter w(dir / "x.bin", TokenDType::U16);
    const std::vector<int32_t> bad = {1, 65536};
    EXPECT_THROW(w.write(bad), kiln::Error);
    const std::vector<int32_t> neg = {-1};
    EXPECT_THROW(w.write(neg), kiln::Error);
  }  // not finished: nothing left behind
  EXPECT_FALSE(std::filesystem::exists(dir / "x.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "x.bin.tmp"));
}

namespace {
void expect_error_naming(const std::filesystem::path& p, const std::string& needle) {
  try {
    ShardReader r(p);
    FAIL() << "no error for " << p;
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}
void patch_int(const std::filesystem::path& p, int index, int32_t value) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}
}  // namespace

TEST(Shard, CorruptionRejected) {
  TempDir dir;
  const auto tokens = random_tokens(100, 50257, 7);
  const auto good = dir / "good.bin";
  write_shard(good, tokens, TokenDType::U16);
  ASSERT_NO_THROW(ShardReader{good});

  const auto magic = dir / "magic.bin";
  std::filesystem::copy_file(good, magic);
  patch_int(magic, 0, 12345);
  expect_error_naming(magic, "magic");

  const auto version = dir / "version.bin";
  std::filesystem::copy_file(good, version);
  patch_int(version, 1, 7);
  expect_error_naming(version, "version");

  const auto truncated = dir / "truncated.bin";
  std::filesystem::copy_file(good, truncated);
  std::filesystem::resize_file(truncated, 1024 + 150);
  expect_error_naming(truncated, "truncated");

  const auto longer = dir / "longer.bin";
  std::filesystem::copy_file(good, longer);
  std::filesystem::resize_file(longer, 1024 + 202);
  expect_error_naming(longer, "bytes");

  const auto wrong_version = dir / "wrongver.bin";  // says uint32, has uint16 payload
  std::filesystem::copy_file(good, wrong_version);
  patch_int(wrong_version, 1, 2);
  expect_error_naming(wrong_version, "bytes");

  const auto tiny = dir / "tiny.bin";
  kiln::data::testing::write_text(tiny, "hello");
  expect_error_naming(tiny, "header");

  expect_error_naming(dir / "missing.bin", "cannot open");
}
