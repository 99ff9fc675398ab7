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

void round_trip(TokenDType dtype, uint32_t vocab) {
  TempDir dir;
  const auto path = dir / "s.bin";
  const auto tokens = random_tokens(10007, vocab, vocab);
  {
    ShardWriter w(path, dtype);
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
  std::vector<int32_t> back(tokens.size());
  r.read(0, r.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(r[123], tokens[123]);
  // llm.c's header layout.
  std::ifstream f(path, std::ios::binary);
  int32_t h[3];
  f.read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], dtype == TokenDType::U16 ? 1 : 2);
  EXPECT_EQ(h[2], 10007);
  EXPECT_THROW(r.read(10000, 8, back.data()), kiln::Error);
}

}  // namespace

TEST(Shard, RoundTripUint16) { round_trip(TokenDType::U16, 65535); }
TEST(Shard, RoundTripUint32) { round_trip(TokenDType::U32, 200000); }

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
