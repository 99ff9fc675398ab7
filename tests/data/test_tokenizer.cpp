#include "core/error.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace kiln::data;
using kiln::data::testing::random_utf8;
using kiln::data::testing::TinyGpt2;
using kiln::data::testing::TempDir;
using kiln::data::testing::write_text;

namespace {

void expect_round_trip(const Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text);
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size()) << id;
  ASSERT_EQ(tok.decode(ids), text) << tok.kind();
}

void random_round_trips(const Tokenizer& tok, uint64_t seed) {
  kiln::Philox rng(seed, 3);
  for (int i = 0; i < 200; ++i) expect_round_trip(tok, random_utf8(rng, 1 + i % 97));
  for (const char* s : {"", " ", "\n", "\n\n", "  lead", "trail  ", "\t\t", "\xE2\x96\x81", "a\xE2\x96\x81 b",
                        "<|endoftext|>", "\r\n", " \n \n"})
    expect_round_trip(tok, s);
}

}  // namespace

TEST(ByteTokenizer, RoundTripAndIds) {
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eot_id(), 256);
  EXPECT_EQ(tok->encode("A\xC3\xA9"), (std::vector<int32_t>{65, 0xC3, 0xA9}));
  const std::vector<int32_t> eot = {104, 256, 105};
  EXPECT_EQ(tok->decode(eot), "h<|endoftext|>i");
  random_round_trips(*tok, 1);
  EXPECT_THROW(tok->encode("bad \xFF utf8"), kiln::Error);
  const std::vector<int32_t> bad = {257};
  EXPECT_THROW(tok->decode(bad), kiln::Error);
  TempDir dir;
  tok->save(dir.path());
  auto back = load_tokenizer(dir.path());
  EXPECT_EQ(back->kind(), "byte");
  EXPECT_EQ(back->hash(), tok->hash());
}

TEST(Gpt2Tokenizer, PreTokenizer) {
  using V = std::vector<std::string>;
  EXPECT_EQ(gpt2_pretokens("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(gpt2_pretokens("it's they're I'll"), (V{"it", "'s", " they", "'re", " I", "'ll"}));
  EXPECT_EQ(gpt2_pretokens("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(gpt2_pretokens("x   "), (V{"x", "   "}));
  EXPECT_EQ(gpt2_pretokens("  \nfoo"), (V{"  ", "\n", "foo"}));
  EXPECT_EQ(gpt2_pretokens("a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(gpt2_pretokens("x 123abc?!'s"), (V{"x", " 123", "abc", "?!'", "s"}));
  EXPECT_EQ(gpt2_pretokens("Über 中文 ١٢٣"), (V{"Über", " 中文", " ١٢٣"}));
  EXPECT_EQ(gpt2_pretokens("a\u00a0b"), (V{"a", "\u00a0", "b"}));  // NBSP is \s, not ' '
  EXPECT_EQ(gpt2_pretokens(" 's"), (V{" '", "s"}));
  kiln::Philox rng(5, 0);
  for (int i = 0; i < 50; ++i) {
    const std::string s = random_utf8(rng, 80);
    std::string joined;
    for (const auto& p : gpt2_pretokens(s)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, s);
  }
}

TEST(Gpt2Tokenizer, TinyVocabularyMergesAndFormats) {
  TempDir dir;
  TinyGpt2 v;
  v.write(dir / "encoder.json", dir / "vocab.bpe");
  auto tok = load_gpt2_tokenizer({dir / "encoder.json", dir / "vocab.bpe"});
  EXPECT_EQ(tok->kind(), "gpt2");
  EXPECT_EQ(tok->vocab_size(), static_cast<int>(v.tokens.size()));
  EXPECT_EQ(tok->eot_id(), tok->vocab_size() - 1);
  // " the" -> Ġ t h e -> (Ġ,t) -> (h,e) -> (Ġt,he): one token.
  EXPECT_EQ(tok->encode(" the"), (std::vector<int32_t>{v.id("Ġthe")}));
  EXPECT_EQ(tok->encode(" and"), (std::vector<int32_t>{v.id("Ġand")}));
  EXPECT_EQ(tok->encode("hers"), (std::vector<int32_t>{v.id("he"), v.id("r"), v.id("s")}));
  EXPECT_EQ(tok->encode("it's"), (std::vector<int32_t>{v.id("i"), v.id("t"), v.id("'s")}));
  // Four spaces then a letter: "   " (3, merged ĠĠ + Ġ) and " x".
  EXPECT_EQ(tok->encode("    x"), (std::vector<int32_t>{v.id("ĠĠ"), v.id("Ġ"), v.id("Ġ"), v.id("x")}));
  const std::vector<int32_t> eot = {tok->eot_id()};
  EXPECT_EQ(tok->decode(eot), "<|endoftext|>");
  random_round_trips(*tok, 2);
  // Hugging Face names, same content: same hash and ids.
  std::filesystem::copy_file(dir / "encoder.json", dir / "vocab.json");
  std::filesystem::copy_file(dir / "vocab.bpe", dir / "merges.txt");
  auto hf = load_gpt2_tokenizer({dir / "vocab.json", dir / "merges.txt"});
  EXPECT_EQ(hf->hash(), tok->hash());
  // Save + load.
  TempDir saved;
  tok->save(saved.path());
  auto back = load_tokenizer(saved.path());
  EXPECT_EQ(back->hash(), tok->hash());
  EXPECT_EQ(back->encode(" the hers"), tok->encode(" the hers"));
  // A different merge order gives a different hash.
  TempDir other;
  TinyGpt2 v2;
  std::swap(v2.merges[0], v2.merges[1]);
  v2.write(other / "encoder.json", other / "vocab.bpe");
  EXPECT_NE(load_gpt2_tokenizer({other.path()})->hash(), tok->hash());
}

TEST(Gpt2Tokenizer, BadFilesRejected) {
  TempDir dir;
  TinyGpt2 v;
  v.write(dir / "encoder.json", dir / "vocab.bpe");
  write_text(dir / "bad.bpe", "#version: 0.2\nq zzz\n");
  try {
    load_gpt2_tokenizer({dir / "encoder.json", dir / "bad.bpe"});
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.bpe"), std::string::npos) << e.what();
  }
  write_text(dir / "broken.json", "{\"a\": 0, ");
  EXPECT_THROW(load_gpt2_tokenizer({dir / "broken.json", dir / "vocab.bpe"}), kiln::Error);
  EXPECT_THROW(load_gpt2_tokenizer({dir / "missing.json", dir / "vocab.bpe"}), kiln::Error);
  EXPECT_THROW(load_tokenizer(dir / "nothing"), kiln::Error);
  // Tampered saved model: hash mismatch.
  TempDir saved;
  load_gpt2_tokenizer({dir.path()})->save(saved.path());
  std::string m = kiln::data::testing::read_text(saved / "vocab.bpe");
  const size_t a = m.find("h e\n"), b = m.find("i n\n");
  std::swap_ranges(m.begin() + a, m.begin() + a + 4, m.begin() + b);
  write_text(saved / "vocab.bpe", m);
  try {
    load_tokenizer(saved.path());
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hash"), std::string::npos) << e.what();
  }
}

TEST(SentencePieceTokenizer, TrainRoundTripSaveLoad) {
  TempDir dir;
  kiln::Philox rng(11, 0);
  std::string corpus;
  static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
                                "Zürich", "naïve", "東京", "данные", "    indent", "x = 1;"};
  for (int line = 0; line < 2000; ++line) {
    for (int w = 0; w < 8; ++w) {
      corpus += words[rng.next_u32() % 14];
      corpus += rng.next_u32() % 5 == 0 ? "  " : " ";
    }
    corpus += line % 7 == 0 ? random_utf8(rng, 10) : "";
    corpus += "\n";
  }
  write_text(dir / "corpus.txt", corpus);
  SentencePieceTrainOptions opt;
  opt.vocab_size = 600;
  auto tok = train_sentencepiece({dir / "corpus.txt"}, opt);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_LE(tok->vocab_size(), 600);
  EXPECT_GT(tok->vocab_size(), 300);
  const std::vector<int32_t> eot = {tok->eot_id()};
  EXPECT_EQ(tok->decode(eot), "<|endoftext|>");
  // Merges were learned: a frequent word is shorter than its bytes.
  EXPECT_LT(tok->encode(" quick brown fox").size(), 8u);
  random_round_trips(*tok, 3);
  expect_round_trip(*tok, corpus.substr(0, 5000));
  TempDir saved;
  tok->save(saved.path());
  auto back = load_tokenizer(saved.path());
  EXPECT_EQ(back->hash(), tok->hash());
  EXPECT_EQ(back->encode(corpus.substr(0, 2000)), tok->encode(corpus.substr(0, 2000)));
  // Sampling: a smaller sample still trains.
  opt.max_sentences = 100;
  auto small = train_sentencepiece({dir / "corpus.txt"}, opt);
  random_round_trips(*small, 4);
  // Errors name the file.
  write_text(dir / "bad.txt", "ok\nbad \xC3\x28 here\n");
  try {
    train_sentencepiece({dir / "bad.txt"}, opt);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 7"), std::string::npos) << e.what();
  }
}
