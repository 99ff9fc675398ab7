// JSONL input for `kiln prepare`: compressed input files, lines, records, the document
// index, multi-threaded tokenization and bad lines.
#include "core/error.h"
#include "data/position_index.h"
#include "data/input_file.h"
#include "data/jsonl.h"
#include "data/meta.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>
#include <zstd.h>

#include <fstream>

using namespace kiln::data;
using kiln::data::testing::random_utf8;
using kiln::data::testing::read_text;
using kiln::data::testing::TempDir;
using kiln::data::testing::write_text;
namespace fs = std::filesystem;
constexpr auto kDocs = PositionIndexKind::DocumentStarts;

namespace {

std::string random_bytes(kiln::Philox& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.next_u32() & 0xFF);
  return s;
}

// `parts` as concatenated gzip members.
void write_gzip(const fs::path& p, const std::vector<std::string>& parts) {
  std::string all;
  for (const auto& part : parts) {
    const std::string tmp = p.string() + ".part";
    gzFile g = gzopen(tmp.c_str(), "wb");
    ASSERT_NE(g, nullptr);
    if (!part.empty()) {
      ASSERT_EQ(gzwrite(g, part.data(), static_cast<unsigned>(part.size())), static_cast<int>(part.size()));
    }
    ASSERT_EQ(gzclose(g), Z_OK);
    all += read_text(tmp);
    fs::remove(tmp);
  }
  write_text(p, all);
}

// `parts` as concatenated zstd frames, with content checksums (as the zstd tool writes).
void write_zstd(const fs::path& p, const std::vector<std::string>& parts) {
  std::string all;
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_checksumFlag, 1);
  for (const auto& part : parts) {
    std::string out(ZSTD_compressBound(part.size()), '\0');
    const size_t n = ZSTD_compress2(ctx, out.data(), out.size(), part.data(), part.size());
    ASSERT_FALSE(ZSTD_isError(n));
    all.append(out.data(), n);
  }
  ZSTD_freeCCtx(ctx);
  write_text(p, all);
}

std::string read_all(const fs::path& p) {
  InputFile f(p);
  std::string out;
  std::vector<char> buf(7777);  // an awkward read size
  while (size_t n = f.read(buf.data(), buf.size())) out.append(buf.data(), n);
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<int32_t> read_split(const fs::path& dir, const DatasetMeta& m, const std::string& split) {
  std::vector<int32_t> all;
  for (const auto& s : m.splits.at(split).shards) {
    ShardReader r(dir / s.file);
    const size_t at = all.size();
    all.resize(at + static_cast<size_t>(r.size()));
    r.read(0, r.size(), all.data() + at);
  }
  return all;
}

}  // namespace

TEST(InputFile, PlainGzipAndZstdReadTheSameBytes) {
  TempDir dir;
  kiln::Philox rng(7, 0);
  const std::vector<std::string> parts = {random_bytes(rng, 1), random_bytes(rng, 300'001), "",
                                          random_bytes(rng, 65'537)};
  std::string whole;
  for (const auto& p : parts) whole += p;
  write_text(dir / "plain", whole);
  write_gzip(dir / "g", parts);
  write_zstd(dir / "z", parts);
  EXPECT_EQ(InputFile(dir / "plain").compression(), Compression::None);
  EXPECT_EQ(InputFile(dir / "g").compression(), Compression::Gzip);
  EXPECT_EQ(InputFile(dir / "z").compression(), Compression::Zstd);
  EXPECT_EQ(read_all(dir / "plain"), whole);
  EXPECT_EQ(read_all(dir / "g"), whole);
  EXPECT_EQ(read_all(dir / "z"), whole);
  InputFile z(dir / "z");
  std::vector<char> buf(1 << 20);
  while (z.read(buf.data(), buf.size()) > 0) {}
  EXPECT_EQ(z.consumed_bytes(), static_cast<int64_t>(fs::file_size(dir / "z")));
}

TEST(InputFile, TruncatedAndCorruptStreamsNameTheFile) {
  TempDir dir;
  kiln::Philox rng(8, 0);
  const std::string text = random_utf8(rng, 30'000);  // compressible: corruption hits coded data
  write_gzip(dir / "g", {text});
  write_zstd(dir / "z", {text});
  for (const char* name : {"g", "z"}) {
    const std::string full = read_text(dir / name);
    write_text(dir / "cut", full.substr(0, full.size() / 2));
    const std::string cut = error_of([&] { read_all(dir / "cut"); });
    EXPECT_NE(cut.find("cut: truncated"), std::string::npos) << cut;
    std::string bad = full;
    for (size_t i = 20; i < 60; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    write_text(dir / "bad", bad);
    const std::string corrupt = error_of([&] { read_all(dir / "bad"); });
    EXPECT_NE(corrupt.find("bad: "), std::string::npos) << corrupt;
    EXPECT_EQ(corrupt.find('\n'), std::string::npos);
  }
  EXPECT_NE(error_of([&] { InputFile f(dir / "missing"); }).find("missing: cannot open"), std::string::npos);
}

TEST(LineReader, LinesCrLfLongLinesAndNoFinalNewline) {
  TempDir dir;
  const std::string long_line(3'000'001, 'x');
  write_text(dir / "a", "one\r\n\ntwo\n" + long_line + "\nlast");
  write_zstd(dir / "a.zst", {read_text(dir / "a")});
  for (const char* name : {"a", "a.zst"}) {
    LineReader r(dir / name);
    std::string line;
    std::vector<std::string> lines;
    while (r.next(line)) lines.push_back(line);
    ASSERT_EQ(lines.size(), 5u) << name;
    EXPECT_EQ(lines[0], "one");
    EXPECT_EQ(lines[1], "");
    EXPECT_EQ(lines[2], "two");
    EXPECT_EQ(lines[3], long_line);
    EXPECT_EQ(lines[4], "last");
    EXPECT_EQ(r.line_number(), 5);
  }
}

TEST(Jsonl, TextOrTheReasonTheLineIsBad) {
  EXPECT_EQ(jsonl_text(R"({"text": "a\nb \u00e9 \ud83d\ude00", "id": 3})", "text").text, "a\nb \u00e9 \U0001F600");
  EXPECT_EQ(jsonl_text(R"({"body": "x"})", "body").text, "x");
  EXPECT_EQ(jsonl_text(R"({"text": ""})", "text").error, "");
  EXPECT_NE(jsonl_text("{\"text\": \"a\xff\"}", "text").error.find("invalid UTF-8 at byte 11"), std::string::npos);
  EXPECT_NE(jsonl_text(R"({"text": "a")", "text").error.find("invalid JSON"), std::string::npos);
  EXPECT_NE(jsonl_text("", "text").error.find("invalid JSON"), std::string::npos);  // prepare skips blank lines
  EXPECT_NE(jsonl_text(R"("text")", "text").error.find("not a JSON object"), std::string::npos);
  EXPECT_EQ(jsonl_text(R"({"txt": "a"})", "text").error, "no key 'text'");
  EXPECT_EQ(jsonl_text(R"({"text": ["a"]})", "text").error, "'text' is an array, not a string");
  EXPECT_EQ(jsonl_text(R"({"text": null})", "text").error, "'text' is null, not a string");
  EXPECT_EQ(jsonl_text("[1]", "text").error, "not a JSON object but an array");
  EXPECT_NE(jsonl_text(R"({"text": "\ud800"})", "text").error.find("invalid JSON"), std::string::npos);
}

TEST(DocIndex, RoundTripAndCorruption) {
  TempDir dir;
  {
    PositionIndexWriter w(dir / "d.idx", kDocs);
    for (int64_t s : {0, 5, 6, 100'000}) w.add(s);
    EXPECT_NE(error_of([&] { w.add(6); }).find("after 100000"), std::string::npos);
    w.finish(1'000'000);
  }
  EXPECT_EQ(read_position_index(dir / "d.idx", kDocs, 1'000'000, 4), (std::vector<int64_t>{0, 5, 6, 100'000}));
  EXPECT_NE(error_of([&] { read_position_index(dir / "d.idx", kDocs, 1'000'001, 4); }).find("meta.json says 1000001"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_position_index(dir / "d.idx", kDocs, -1, 3); }).find("4 positions, meta.json says 3"),
            std::string::npos);
  std::string bytes = read_text(dir / "d.idx");
  bytes[kPositionIndexHeaderBytes + 24] ^= 1;  // the last start: still in order, so the crc32 finds it
  write_text(dir / "flip.idx", bytes);
  EXPECT_NE(error_of([&] { read_position_index(dir / "flip.idx", kDocs, -1, -1); }).find("flip.idx: crc32 mismatch"),
            std::string::npos);
  write_text(dir / "cut.idx", read_text(dir / "d.idx").substr(0, 40));
  EXPECT_NE(error_of([&] { read_position_index(dir / "cut.idx", kDocs, -1, -1); }).find("truncated"), std::string::npos);
  write_text(dir / "foreign.idx", std::string(64, 'x'));
  EXPECT_NE(error_of([&] { read_position_index(dir / "foreign.idx", kDocs, -1, -1); }).find("bad magic"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "d.idx.tmp"));
}

// The corpus: good records (unicode, escapes, newlines), bad lines and empty texts, in two
// files, one gzip and one zstd. `texts`: the good texts in input order; `bad`: the bad lines.
std::vector<fs::path> write_corpus(const TempDir& dir, std::vector<std::string>& texts, int64_t& bad,
                                   int64_t& empty) {
  kiln::Philox rng(11, 0);
  std::vector<std::string> files(2);
  std::vector<std::vector<std::string>> good(2);
  bad = empty = 0;
  for (int i = 0; i < 3000; ++i) {
    const auto k = static_cast<size_t>(i % 2);
    if (i % 97 == 13) {
      files[k] += i % 3 == 0 ? "{\"text\": 1}\n" : i % 3 == 1 ? "{broken\n" : "{\"txt\": \"a\"}\n";
      ++bad;
    } else if (i % 101 == 7) {
      files[k] += "{\"text\": \"\"}\n";
      ++empty;
    } else {
      good[k].push_back(random_utf8(rng, 1 + rng.next_u32() % 700));
      files[k] += nlohmann::json({{"id", i}, {"text", good[k].back()}}).dump() + "\n";
    }
  }
  texts = good[0];
  texts.insert(texts.end(), good[1].begin(), good[1].end());
  write_gzip(dir / "a.jsonl.gz", {files[0]});
  write_zstd(dir / "b.jsonl.zst", {files[1]});
  return {dir / "a.jsonl.gz", dir / "b.jsonl.zst"};
}

// Options to prepare that corpus with the byte tokenizer.
PrepareOptions corpus_options(const TempDir& dir, std::vector<std::string>& texts, int64_t& bad, int64_t& empty) {
  PrepareOptions o;
  o.inputs = write_corpus(dir, texts, bad, empty);
  o.input_format = "jsonl";
  o.tokenizer = "byte";
  return o;
}

TEST(PrepareJsonl, TokensDocumentIndexAndBadLinesAnyThreadCount) {
  TempDir dir;
  std::vector<std::string> texts;
  int64_t bad = 0, empty = 0;
  PrepareOptions o = corpus_options(dir, texts, bad, empty);
  o.val_fraction = 0.1;
  o.shard_tokens = 65'537;
  o.threads = 1;
  int progress_calls = 0;
  o.on_progress = [&](const PrepareProgress& p) {
    ++progress_calls;
    EXPECT_LE(p.bytes_done, p.bytes_total);
  };
  o.out_dir = dir / "one";
  const PrepareSummary one = prepare_dataset(o);
  o.threads = 2;
  o.on_progress = nullptr;
  o.out_dir = dir / "two";
  const PrepareSummary two = prepare_dataset(o);
  EXPECT_GE(progress_calls, 1);

  // The stream: eot before each good text's tokens, in input order.
  const auto tok = make_byte_tokenizer();
  std::vector<int32_t> expected;
  std::vector<int64_t> starts;
  for (const auto& t : texts) {
    starts.push_back(static_cast<int64_t>(expected.size()));
    expected.push_back(tok->eot_id());
    const auto ids = tok->encode(t);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  const DatasetMeta m = read_dataset_meta(dir / "one");
  std::vector<int32_t> got = read_split(dir / "one", m, "train");
  const int64_t split_at = static_cast<int64_t>(got.size());
  const std::vector<int32_t> val = read_split(dir / "one", m, "val");
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(m.documents, static_cast<int64_t>(texts.size()));
  EXPECT_EQ(one.bad_lines, bad);
  EXPECT_EQ(one.empty_texts, empty);
  ASSERT_EQ(one.bad_line_examples.size(), PrepareSummary::kMaxBadLineExamples);
  EXPECT_NE(one.bad_line_examples[0].find("a.jsonl.gz:56: no key 'text'"), std::string::npos)
      << one.bad_line_examples[0];

  // The document index of each split: the starts, cut at the split, val's from 0.
  std::vector<int64_t> train_starts, val_starts;
  for (int64_t s : starts) (s < split_at ? train_starts : val_starts).push_back(s < split_at ? s : s - split_at);
  if (val_starts.empty() || val_starts.front() != 0) val_starts.insert(val_starts.begin(), 0);
  const auto& tr = m.splits.at("train").doc_index;
  const auto& va = m.splits.at("val").doc_index;
  EXPECT_EQ(read_position_index(dir / "one" / tr.file, kDocs, m.splits.at("train").tokens, tr.count), train_starts);
  EXPECT_EQ(read_position_index(dir / "one" / va.file, kDocs, m.splits.at("val").tokens, va.count), val_starts);

  // Two threads: the same files, byte for byte.
  for (const auto& e : fs::directory_iterator(dir / "one")) {
    const fs::path other = dir / "two" / e.path().filename();
    ASSERT_TRUE(fs::exists(other)) << other;
    EXPECT_EQ(read_text(e.path()), read_text(other)) << e.path().filename();
  }
  EXPECT_EQ(two.bad_lines, bad);
}

TEST(PrepareJsonl, StrictKeyAndOptionErrorsAreOneLine) {
  TempDir dir;
  std::vector<std::string> texts;
  int64_t bad = 0, empty = 0;
  PrepareOptions o = corpus_options(dir, texts, bad, empty);
  o.out_dir = dir / "out";
  o.strict = true;
  const std::string strict = error_of([&] { prepare_dataset(o); });
  EXPECT_NE(strict.find("a.jsonl.gz:56: no key 'text' (--strict)"), std::string::npos) << strict;
  EXPECT_FALSE(fs::exists(o.out_dir / "meta.json"));
  o.strict = false;
  o.text_key = "body";
  const std::string none = error_of([&] { prepare_dataset(o); });
  EXPECT_NE(none.find("a.jsonl.gz and the other inputs: no good record: 3000 bad lines, the first: "
                      "" + (dir / "a.jsonl.gz").string() + ":1: no key 'body'"), std::string::npos) << none;
  o.text_key = "text";
  o.separator = "\n\n";
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("a separator is for text input"), std::string::npos);
  o.separator.clear();
  o.input_format = "csv";
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("unknown input format 'csv'"), std::string::npos);
}

TEST(PrepareJsonl, TrainsSentencepieceOnTheRecords) {
  TempDir dir;
  std::string lines;
  size_t text_bytes = 0;
  for (int i = 0; i < 400; ++i) {
    const std::string text = "the quick brown fox " + std::to_string(i) + "\njumps over the lazy dog";
    text_bytes += text.size();
    lines += nlohmann::json({{"text", text}}).dump() + "\n";
  }
  write_text(dir / "c.jsonl", lines);
  PrepareOptions o;
  o.inputs = {dir / "c.jsonl"};
  o.input_format = "jsonl";
  o.tokenizer = "sentencepiece";
  o.vocab_size = 300;
  o.out_dir = dir / "out";
  const PrepareSummary r = prepare_dataset(o);
  EXPECT_EQ(r.meta.documents, 400);
  const auto tok = load_tokenizer(dir / "out");
  const std::vector<int32_t> got = read_split(dir / "out", r.meta, "train");
  std::vector<int32_t> first = {tok->eot_id()};
  const auto ids = tok->encode("the quick brown fox 0\njumps over the lazy dog");
  first.insert(first.end(), ids.begin(), ids.end());
  ASSERT_GE(got.size(), first.size());
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + static_cast<long>(first.size())), first);
  EXPECT_LT(got.size(), text_bytes * 4 / 5);  // it learned merges from the records' texts
}

TEST(PrepareText, CompressedInputAndDocumentIndex) {
  TempDir dir;
  write_gzip(dir / "a.txt.gz", {"first document\n==\nsecond one", "\n==\nthird"});
  PrepareOptions o;
  o.inputs = {dir / "a.txt.gz"};
  o.tokenizer = "byte";
  o.separator = "\n==\n";
  o.out_dir = dir / "out";
  const PrepareSummary r = prepare_dataset(o);
  EXPECT_EQ(r.meta.documents, 3);
  const auto& s = r.meta.splits.at("train");
  EXPECT_EQ(read_position_index(dir / "out" / s.doc_index.file, kDocs, s.tokens, 3),
            (std::vector<int64_t>{0, 15, 26}));  // 1 + 14 bytes, 1 + 10 bytes
  EXPECT_EQ(r.input_bytes, 37);
}
