#include "core/error.h"
#include "data/loader.h"
#include "data/meta.h"
#include "data/packing.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <numeric>

using namespace kiln::data;
using kiln::data::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// A dataset whose token at stream position p is p (vocab 65535), in shards of uneven sizes.
DatasetMeta make_dataset(const fs::path& dir, const std::vector<int64_t>& sizes, int vocab = 65535,
                         TokenDType dtype = TokenDType::U16) {
  DatasetMeta m;
  m.tokenizer_kind = "byte";
  m.tokenizer_hash = "0123456789abcdef";
  m.vocab_size = vocab;
  m.eot_id = 0;
  m.format = dtype == TokenDType::U16 ? ShardFormat::U16 : ShardFormat::KilnU32;
  m.documents = 1;
  SplitInfo& s = m.splits["train"];
  int32_t next = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int32_t> t(sizes[i]);
    std::iota(t.begin(), t.end(), next);
    next += static_cast<int32_t>(sizes[i]);
    const std::string name = fmt::format("train_{:06d}.bin", i);
    write_shard(dir / name, t, TokenDType::U16);
    s.shards.push_back({name, sizes[i]});
    s.tokens += sizes[i];
  }
  write_dataset_meta(dir, m);
  return m;
}

const std::vector<int64_t> kSizes = {1000, 7, 2500, 1234, 1};  // 4742 tokens

}  // namespace

TEST(DataLoader, EveryTokenOncePerEpochAcrossDpSizes) {
  TempDir dir;
  make_dataset(dir.path(), kSizes);
  const int T = 16;
  for (bool shuffle : {false, true}) {
    for (int dp : {1, 2, 3, 4}) {
      const int B = 5;
      std::vector<DataLoader> ranks;
      for (int r = 0; r < dp; ++r) ranks.emplace_back(dir.path(), "train", T, 42, shuffle);
      const int64_t S = ranks[0].samples_per_epoch();
      ASSERT_EQ(S, (4742 - 1) / T);
      std::vector<int64_t> order;  // samples in global visiting order
      std::vector<int32_t> in(B * T), tg(B * T);
      while (static_cast<int64_t>(order.size()) < S) {
        for (int r = 0; r < dp; ++r) {
          ranks[r].next_batch(in.data(), tg.data(), B, r, dp);
          for (int b = 0; b < B; ++b) {
            const int64_t sample = in[b * T] / T;
            ASSERT_EQ(in[b * T] % T, 0);
            for (int t = 0; t < T; ++t) {
              ASSERT_EQ(in[b * T + t], sample * T + t);
              ASSERT_EQ(tg[b * T + t], sample * T + t + 1);
            }
            order.push_back(sample);
          }
        }
        for (int r = 1; r < dp; ++r) ASSERT_EQ(ranks[r].state(), ranks[0].state());
      }
      order.resize(S);
      std::vector<int64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t i = 0; i < S; ++i) ASSERT_EQ(sorted[i], i) << "dp " << dp << " shuffle " << shuffle;
      const bool in_order = std::is_sorted(order.begin(), order.end());
      EXPECT_EQ(in_order, !shuffle);
    }
  }
}

TEST(DataLoader, ShuffleDependsOnSeedAndEpoch) {
  TempDir dir;
  make_dataset(dir.path(), kSizes);
  DataLoader a(dir.path(), "train", 8, 1, true), b(dir.path(), "train", 8, 1, true), c(dir.path(), "train", 8, 2, true);
  std::vector<int64_t> a0, a1, b0, c0;
  for (int64_t i = 0; i < a.samples_per_epoch(); ++i) {
    a0.push_back(a.sample_at(0, i));
    a1.push_back(a.sample_at(1, i));
    b0.push_back(b.sample_at(0, i));
    c0.push_back(c.sample_at(0, i));
  }
  EXPECT_EQ(a0, b0);
  EXPECT_NE(a0, a1);
  EXPECT_NE(a0, c0);
}

TEST(DataLoader, StateRestoreContinuesIdentically) {
  TempDir dir;
  make_dataset(dir.path(), kSizes);
  const int T = 32, steps = 40;  // 148 samples/epoch: crosses several epochs
  // Reference: dp=1, micro_batch 8 (global batch 8).
  DataLoader ref(dir.path(), "train", T, 7, true);
  std::vector<int32_t> in(8 * T), tg(8 * T);
  for (int s = 0; s < 13; ++s) ref.next_batch(in.data(), tg.data(), 8);
  const LoaderState saved = ref.state();
  std::vector<std::vector<int32_t>> expected;
  for (int s = 0; s < steps; ++s) {
    ref.next_batch(in.data(), tg.data(), 8);
    expected.push_back(in);
  }
  EXPECT_GT(ref.state().epoch, saved.epoch);
  // Resume with the same layout and with dp=4 x micro_batch 2 (same global batch).
  for (int dp : {1, 2, 4}) {
    const int B = 8 / dp;
    std::vector<DataLoader> ranks;
    for (int r = 0; r < dp; ++r) {
      ranks.emplace_back(dir.path(), "train", T, 7, true);
      ranks.back().set_state(saved);
    }
    std::vector<int32_t> rin(B * T), rtg(B * T);
    for (int s = 0; s < steps; ++s) {
      std::vector<int32_t> global;
      for (int r = 0; r < dp; ++r) {
        ranks[r].next_batch(rin.data(), rtg.data(), B, r, dp);
        global.insert(global.end(), rin.begin(), rin.end());
      }
      ASSERT_EQ(global, expected[s]) << "dp " << dp << " step " << s;
    }
    EXPECT_EQ(ranks[0].state(), ref.state());
  }
  EXPECT_THROW(ref.set_state({0, ref.samples_per_epoch()}), kiln::Error);
}

TEST(DataLoader, Errors) {
  TempDir dir;
  EXPECT_THROW(DataLoader(dir / "nope", "train", 8, 0, false), kiln::Error);
  try {
    DataLoader(dir.path(), "train", 8, 0, false);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta.json"), std::string::npos) << e.what();
  }
  make_dataset(dir.path(), {100});
  EXPECT_THROW(DataLoader(dir.path(), "val", 8, 0, false), kiln::Error);  // no such split
  try {
    DataLoader(dir.path(), "train", 100, 0, false);  // 100 tokens: no sample of 101
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("too few"), std::string::npos) << e.what();
  }
  DataLoader ok(dir.path(), "train", 99, 0, false);
  EXPECT_EQ(ok.samples_per_epoch(), 1);
  EXPECT_EQ(ok.meta().vocab_size, 65535);
  std::vector<int32_t> in(99), tg(99);
  EXPECT_THROW(ok.next_batch(in.data(), tg.data(), 1, 1, 1), kiln::Error);

  // Shards of another vocabulary: tokens beyond meta's vocab_size.
  TempDir small;
  make_dataset(small.path(), {300}, /*vocab=*/257);
  DataLoader l(small.path(), "train", 16, 0, false);
  std::vector<int32_t> a(16 * 18), b(16 * 18);
  try {
    l.next_batch(a.data(), b.data(), 18);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_000000.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocab"), std::string::npos) << e.what();
  }
  // meta.json says uint32 but the shard holds uint16.
  TempDir wide;
  make_dataset(wide.path(), {300}, 100000, TokenDType::U32);
  EXPECT_THROW(DataLoader(wide.path(), "train", 16, 0, false), kiln::Error);
  // A shard whose size disagrees with meta.json.
  TempDir shortd;
  make_dataset(shortd.path(), {300, 200});
  write_shard(shortd / "train_000001.bin", std::vector<int32_t>(150, 1), TokenDType::U16);
  try {
    DataLoader(shortd.path(), "train", 16, 0, false);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_000001.bin"), std::string::npos) << e.what();
  }
}

// uint32 shards: ids at or above 2^31 are out of the vocabulary like any other (they used
// to pass as negative int32), reported with file and position; the last token too.
TEST(DataLoader, Uint32IdsAbove2To31AreRejectedWithFileAndPosition) {
  for (const uint32_t bad : {0xFFFFFFFFu, 0x80000000u, 100000u}) {
    for (const int64_t pos : {int64_t{20}, int64_t{39}}) {  // inside, and the stream's last token
      TempDir dir;
      DatasetMeta m;
      m.tokenizer_kind = "byte";
      m.tokenizer_hash = "0123456789abcdef";
      m.vocab_size = 100000;
      m.eot_id = 0;
      m.format = ShardFormat::KilnU32;
      m.documents = 1;
      m.splits["train"].shards.push_back({"train_000000.bin", 40});
      m.splits["train"].tokens = 40;
      write_shard(dir / "train_000000.bin", std::vector<int32_t>(40, 99999), TokenDType::U32);
      {
        std::fstream f(dir / "train_000000.bin", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(kShardHeaderBytes + 4 * pos);
        f.write(reinterpret_cast<const char*>(&bad), 4);  // little-endian host
      }
      write_dataset_meta(dir.path(), m);
      DataLoader l(dir.path(), "train", 13, 0, false);  // 3 samples of 14 tokens: 0..39
      std::vector<int32_t> in(13), tg(13);
      std::string err;
      try {
        for (int i = 0; i < 3; ++i) l.next_batch(in.data(), tg.data(), 1);
      } catch (const kiln::Error& e) {
        err = e.what();
      }
      EXPECT_NE(err.find("train_000000.bin"), std::string::npos) << bad << " at " << pos << ": " << err;
      EXPECT_NE(err.find(fmt::format("token {} at position {}", bad, pos)), std::string::npos) << err;
    }
  }
}

TEST(DataLoader, ReadsEachShardLayoutThatPrepareWrites) {
  // kiln prepare --shard-format kiln | llmc | llmc-u32, then the loader: the same samples,
  // meta.json's shard_version naming the layout (1, 7) and a mismatch refused.
  TempDir dir;
  kiln::data::testing::write_text(dir / "a.txt", "In the beginning God created the heaven and the earth.");
  std::vector<std::vector<int32_t>> samples;
  for (const char* f : {"kiln", "llmc", "llmc-u32"}) {
    PrepareOptions o;
    o.inputs = {dir / "a.txt"};
    o.out_dir = dir / f;
    o.tokenizer = "byte";
    o.shard_format = f;
    o.shard_tokens = 20;
    const auto m = prepare_dataset(o).meta;
    const auto j = nlohmann::json::parse(kiln::data::testing::read_text(dir / f / "meta.json"));
    EXPECT_EQ(j["shard_version"], std::string(f) == "llmc-u32" ? 7 : 1) << f;
    EXPECT_EQ(j["token_dtype"], std::string(f) == "llmc-u32" ? "uint32" : "uint16") << f;
    DataLoader l(dir / f, "train", 8, 0, false);
    std::vector<int32_t> s(9);
    l.read_sample(2, s.data());
    samples.push_back(s);
  }
  EXPECT_EQ(samples[0], samples[1]);
  EXPECT_EQ(samples[0], samples[2]);
  // A v7 shard under a meta.json that says kiln's v2 (same width) is refused.
  auto j = nlohmann::json::parse(kiln::data::testing::read_text(dir / "llmc-u32" / "meta.json"));
  j["shard_version"] = 2;
  kiln::data::testing::write_text(dir / "llmc-u32" / "meta.json", j.dump());
  try {
    DataLoader l(dir / "llmc-u32", "train", 8, 0, false);
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard version 7 but meta.json says shard_version 2"), std::string::npos)
        << e.what();
  }
}

// Document packing (data/packing.h): kiln prepare's document index read back as each
// sample's document starts (where the separator falls, and 0), then positions and
// cu_seqlens; a data set without an index refused for packing with meta.json named.
TEST(DataLoader, DocumentStartsAndPacking) {
  TempDir dir;
  // Documents of 1, 4, 1 and 9 bytes, each after its separator: 19 tokens, separators at
  // 0, 2, 7 and 9.
  kiln::data::testing::write_text(dir / "a.txt", "x");
  kiln::data::testing::write_text(dir / "b.txt", "abcd");
  kiln::data::testing::write_text(dir / "c.txt", "y");
  kiln::data::testing::write_text(dir / "d.txt", "123456789");
  PrepareOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt", dir / "c.txt", dir / "d.txt"};
  o.out_dir = dir / "out";
  o.tokenizer = "byte";
  o.val_fraction = 0;
  prepare_dataset(o);
  const int T = 5;
  DataLoader plain(dir / "out", "train", T, 0, false);
  DataLoader l(dir / "out", "train", T, 0, false, /*documents=*/true);
  ASSERT_EQ(l.samples_per_epoch(), 3);
  std::vector<int32_t> row(T + 1);
  std::vector<int32_t> eot;  // stream positions of the separator
  for (int64_t s = 0; s < l.samples_per_epoch(); ++s) {
    l.read_sample(s, row.data());
    for (int t = 0; t < T; ++t)
      if (row[static_cast<size_t>(t)] == l.meta().eot_id) eot.push_back(static_cast<int32_t>(s * T + t));
  }
  ASSERT_EQ(eot, (std::vector<int32_t>{0, 2, 7, 9}));  // the stream's documents, as prepared
  std::vector<int32_t> in(T), tg(T), starts;
  std::vector<std::vector<int32_t>> all;
  for (int64_t s = 0; s < 3; ++s) {
    l.read_pair(s, in.data(), tg.data(), &starts);
    all.push_back(starts);
  }
  EXPECT_EQ(all[0], (std::vector<int32_t>{0, 2}));     // tokens 0..4: separators at 0 and 2
  EXPECT_EQ(all[1], (std::vector<int32_t>{0, 2, 4}));  // 5..9: inside b, then 7 and 9
  EXPECT_EQ(all[2], (std::vector<int32_t>{0}));        // 10..14: inside the last document
  EXPECT_THROW(plain.read_pair(0, in.data(), tg.data(), &starts), kiln::Error);

  std::vector<int32_t> positions(3 * T), cu(3 * T + 1);
  pack_documents(all, T, positions.data(), cu.data());
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 1, 0, 1, 0, 0, 1, 2, 3, 4}));
  std::vector<int32_t> want_cu{0, 2, 5, 7, 9, 10};
  want_cu.resize(3 * T + 1, 3 * T);
  EXPECT_EQ(cu, want_cu);
  EXPECT_THROW(pack_documents(std::vector<std::vector<int32_t>>{{1}}, T, positions.data(), cu.data()),
               kiln::Error);

  // No document index (a data set from before it, or written by hand): refused, named.
  auto j = nlohmann::json::parse(kiln::data::testing::read_text(dir / "out" / "meta.json"));
  j.erase("doc_index");
  kiln::data::testing::write_text(dir / "out" / "meta.json", j.dump());
  try {
    DataLoader bad(dir / "out", "train", T, 0, false, true);
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("meta.json: split 'train' has no document index, which "
                                         "data.packing = \"document\" needs"),
              std::string::npos)
        << e.what();
  }
}
