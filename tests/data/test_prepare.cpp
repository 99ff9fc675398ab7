#include "core/error.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace kiln::data;
using kiln::data::testing::random_utf8;
using kiln::data::testing::read_text;
using kiln::data::testing::TempDir;
using kiln::data::testing::write_text;
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> read_split(const fs::path& dir, const DatasetMeta& m, const std::string& split) {
  std::vector<int32_t> all;
  if (!m.splits.count(split)) return all;
  for (const auto& s : m.splits.at(split).shards) {
    ShardReader r(dir / s.file);
    EXPECT_EQ(r.size(), s.tokens);
    EXPECT_EQ(r.dtype(), m.dtype());
    EXPECT_EQ(r.format(), m.format);
    const size_t at = all.size();
    all.resize(at + r.size());
    r.read(0, r.size(), all.data() + at);
  }
  return all;
}

// Only the directory entries that prepare could have left: shards, meta, staging, temp files.
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

void expect_error(const PrepareOptions& o, const std::vector<std::string>& needles) {
  try {
    prepare_dataset(o);
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
  EXPECT_TRUE(leftovers(o.out_dir).empty()) << "left behind: " << leftovers(o.out_dir).front();
}

}  // namespace

TEST(Prepare, ByteDatasetRoundTripAndSplit) {
  TempDir dir;
  kiln::Philox rng(1, 0);
  std::vector<std::string> docs = {random_utf8(rng, 3000), "short doc\n", random_utf8(rng, 5000)};
  write_text(dir / "a.txt", docs[0]);
  write_text(dir / "b.txt", docs[1] + "@@SEP@@" + docs[2] + "@@SEP@@");
  PrepareOptions o;
  o.inputs = {dir / "a.txt", dir / "b.txt"};
  o.out_dir = dir / "out";
  o.tokenizer = "byte";
  o.val_fraction = 0.1;
  o.shard_tokens = 1000;
  o.separator = "@@SEP@@";
  const PrepareSummary s = prepare_dataset(o);
  const DatasetMeta& m = s.meta;
  EXPECT_EQ(m.documents, 3);
  EXPECT_EQ(m.vocab_size, 257);
  EXPECT_EQ(m.eot_id, 256);
  EXPECT_EQ(m.dtype(), TokenDType::U16);
  std::vector<int32_t> expected;
  for (const auto& d : docs) {
    expected.push_back(256);
    for (unsigned char c : d) expected.push_back(c);
  }
  const int64_t total = static_cast<int64_t>(expected.size());
  const int64_t n_val = static_cast<int64_t>(std::ceil(0.1 * total));
  ASSERT_EQ(m.splits.at("val").tokens, n_val);
  ASSERT_EQ(m.splits.at("train").tokens, total - n_val);
  for (const auto& [name, split] : m.splits) {
    for (size_t i = 0; i < split.shards.size(); ++i) {
      EXPECT_EQ(split.shards[i].file, fmt::format("{}_{:06d}.bin", name, i));
      if (i + 1 < split.shards.size()) {
        EXPECT_EQ(split.shards[i].tokens, 1000);
      }
    }
  }
  std::vector<int32_t> got = read_split(o.out_dir, m, "train");
  const auto val = read_split(o.out_dir, m, "val");
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, expected);
  // meta.json on disk agrees; the tokenizer is saved beside the shards.
  const DatasetMeta disk = read_dataset_meta(o.out_dir);
  EXPECT_EQ(disk.splits.at("val").tokens, n_val);
  EXPECT_EQ(disk.tokenizer_hash, make_byte_tokenizer()->hash());
  const auto j = nlohmann::json::parse(read_text(o.out_dir / "meta.json"));
  EXPECT_EQ(j["token_dtype"], "uint16");
  EXPECT_EQ(j["tokenizer"]["kind"], "byte");
  EXPECT_EQ(load_tokenizer(o.out_dir)->kind(), "byte");
  for (const auto& name : leftovers(o.out_dir)) {
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
    EXPECT_NE(name.front(), '.') << name;
  }
  // A second run into the same directory is refused and leaves it intact.
  EXPECT_THROW(prepare_dataset(o), kiln::Error);
  EXPECT_TRUE(fs::exists(o.out_dir / "meta.json"));
}

TEST(Prepare, NoValSplitAndTinyVal) {
  TempDir dir;
  write_text(dir / "a.txt", "hello world");
  PrepareOptions o;
  o.inputs = {dir / "a.txt"};
  o.out_dir = dir / "out";
  o.tokenizer = "byte";
  o.shard_tokens = 5;
  auto m = prepare_dataset(o).meta;
  EXPECT_EQ(m.splits.count("val"), 0u);
  EXPECT_EQ(m.splits.at("train").tokens, 12);
  EXPECT_EQ(m.splits.at("train").shards.size(), 3u);
  o.out_dir = dir / "out2";
  o.val_fraction = 0.001;  // still one val token, hence one val shard
  m = prepare_dataset(o).meta;
  EXPECT_EQ(m.splits.at("val").tokens, 1);
  EXPECT_EQ(read_split(o.out_dir, m, "val"), (std::vector<int32_t>{'d'}));
}

TEST(Prepare, StreamDocumentsChunking) {
  TempDir dir;
  kiln::Philox rng(9, 0);
  std::vector<std::string> docs;
  std::string file;
  for (int i = 0; i < 20; ++i) {
    docs.push_back(random_utf8(rng, 5 + 37 * i));
    file += docs.back() + "<|sep|>";
    if (i % 5 == 0) file += "<|sep|>";  // an empty document, skipped
  }
  write_text(dir / "f.txt", file);
  for (size_t chunk : {16u, 23u, 64u, 4096u}) {
    std::vector<std::string> got;
    stream_documents(dir / "f.txt", "<|sep|>", [&](std::string_view piece, bool start) {
      EXPECT_TRUE(utf8_valid(piece));
      if (start) got.emplace_back();
      ASSERT_FALSE(got.empty());
      got.back() += piece;
    }, chunk);
    EXPECT_EQ(got, docs) << "chunk " << chunk;
  }
}

TEST(Prepare, BadInputsLeaveNoShards) {
  TempDir dir;
  write_text(dir / "good.txt", "some good text\nwith lines\n");
  write_text(dir / "empty.txt", "");
  std::string bad = std::string(5000, 'a') + "\xE2\x82" + "z";  // truncated 3-byte sequence at 5000
  write_text(dir / "bad.txt", bad);
  PrepareOptions o;
  o.out_dir = dir / "out";
  o.tokenizer = "byte";
  o.shard_tokens = 4;

  o.inputs = {dir / "good.txt", dir / "missing.txt"};
  expect_error(o, {"missing.txt"});
  o.inputs = {dir / "good.txt", dir / "empty.txt"};
  expect_error(o, {"empty.txt", "empty"});
  o.inputs = {dir / "good.txt", dir / "bad.txt"};
  expect_error(o, {"bad.txt", "UTF-8", "offset 5000"});
  o.inputs = {};
  expect_error(o, {"no input"});

  o.inputs = {dir / "good.txt"};
  o.vocab_size = 100;
  expect_error(o, {"vocab_size 100", "byte"});
  o.tokenizer = "sentencepiece";
  expect_error(o, {"vocab_size 100", "sentencepiece"});
  o.vocab_size = 0;
  o.tokenizer = "gpt2";
  expect_error(o, {"gpt2", "tokenizer files"});
  o.tokenizer = "wordpiece";
  expect_error(o, {"wordpiece"});
  o.tokenizer = "byte";
  o.val_fraction = 1.0;
  expect_error(o, {"val_fraction"});
  o.val_fraction = 0.0;
  o.shard_tokens = 0;
  expect_error(o, {"shard_tokens"});
  o.shard_tokens = 4;

  // A staging area left by an interrupted run (its process gone) is removed.
  o.inputs = {dir / "good.txt"};
  o.out_dir = dir / "after_interrupt";
  std::filesystem::create_directories(o.out_dir / ".kiln-prepare-999999999" / "chunks");
  prepare_dataset(o);
  EXPECT_FALSE(std::filesystem::exists(o.out_dir / ".kiln-prepare-999999999"));
  EXPECT_TRUE(std::filesystem::exists(o.out_dir / "meta.json"));

  // Unwritable output: a path below a regular file.
  o.out_dir = dir / "good.txt" / "out";
  try {
    prepare_dataset(o);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("good.txt/out"), std::string::npos) << e.what();
  }
}

TEST(Prepare, SentencePieceDataset) {
  TempDir dir;
  kiln::Philox rng(3, 0);
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the data loader reads shards of tokens " + random_utf8(rng, 6) + "\n";
  write_text(dir / "c.txt", text);
  PrepareOptions o;
  o.inputs = {dir / "c.txt"};
  o.out_dir = dir / "out";
  o.tokenizer = "sentencepiece";
  o.vocab_size = 400;
  o.val_fraction = 0.05;
  o.shard_tokens = 2000;
  const DatasetMeta m = prepare_dataset(o).meta;
  EXPECT_EQ(m.tokenizer_kind, "sentencepiece");
  auto tok = load_tokenizer(o.out_dir);
  EXPECT_EQ(tok->hash(), m.tokenizer_hash);
  std::vector<int32_t> all = read_split(o.out_dir, m, "train");
  const auto val = read_split(o.out_dir, m, "val");
  all.insert(all.end(), val.begin(), val.end());
  ASSERT_EQ(all.front(), m.eot_id);
  EXPECT_EQ(tok->decode(std::span(all).subspan(1)), text);
  EXPECT_LT(all.size(), text.size() / 2);  // it compresses
}
