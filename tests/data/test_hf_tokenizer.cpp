// The hf kind (Hugging Face's tokenizer.json, src/data/hf_tokenizer.cpp) and
// export_hf_tokenizer: a tokenizer.json written from kiln's GPT-2 tables encodes as the gpt2
// kind; added tokens; Llama 3's Split regex against pre-tokens worked out by hand and
// against node's own regex engine; one-line errors naming the field.
#include "support/error_of.h"
#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unicode/uchar.h>

#include <cstdlib>

using namespace kiln::data;
using kiln::data::testing::random_utf8;
using kiln::data::testing::read_text;
using kiln::data::testing::TempDir;
using kiln::data::testing::TinyGpt2;
using kiln::data::testing::write_text;
using json = nlohmann::json;

namespace {

// Llama 3's pre-tokenizer regex, as in its tokenizer.json.
const std::string kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The tiny GPT-2 tables of test_util.h as kiln's gpt2 kind and as an exported tokenizer.json.
struct Fixture {
  TempDir dir;
  std::unique_ptr<Tokenizer> gpt2;
  json hf;  // the exported tokenizer.json
  Fixture() {
    TinyGpt2 v;
    v.write(dir / "encoder.json", dir / "vocab.bpe");
    gpt2 = load_gpt2_tokenizer({dir.path()});
    export_hf_tokenizer(*gpt2, dir / "hf");
    hf = json::parse(read_text(dir / "hf" / "tokenizer.json"));
  }
  // Writes j as a tokenizer.json and loads it.
  std::unique_ptr<Tokenizer> load(const json& j, const std::string& name = "t.json") const {
    write_text(dir / name, j.dump());
    return load_hf_tokenizer(dir / name);
  }
  // The exported file with Llama 3's pre-tokenizer and specials appended after the vocabulary.
  json llama3() const {
    json j = hf;
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", false}}}}};
    j["model"]["ignore_merges"] = true;
    const int v = gpt2->vocab_size();
    int k = 0;
    for (const char* t : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"})
      j["added_tokens"].push_back({{"id", v + k++}, {"content", t}, {"special", true}});
    return j;
  }
};

// s without the code points in `drop`.
std::string without(const std::string& s, std::initializer_list<char32_t> drop) {
  std::string out;
  for (size_t k = 0; k < s.size();) {
    const size_t a = k;
    const char32_t c = kiln::data::utf8_next(s, k);
    if (std::find(drop.begin(), drop.end(), c) == drop.end()) out += s.substr(a, k - a);
  }
  return out;
}

using kiln::testing::error_of;

}  // namespace

TEST(HfTokenizer, ExportedGpt2TablesEncodeAsGpt2) {
  Fixture fx;
  EXPECT_TRUE(std::filesystem::exists(fx.dir / "hf" / "tokenizer_config.json"));
  const json cfg = json::parse(read_text(fx.dir / "hf" / "tokenizer_config.json"));
  EXPECT_EQ(cfg["bos_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_EQ(fx.hf["model"]["type"], "BPE");
  auto hf = load_hf_tokenizer(fx.dir / "hf");  // the directory form
  EXPECT_EQ(hf->kind(), "hf");
  EXPECT_EQ(hf->vocab_size(), fx.gpt2->vocab_size());
  EXPECT_EQ(hf->eot_id(), fx.gpt2->eot_id());
  kiln::Philox rng(7, 1);
  for (int i = 0; i < 300; ++i) {
    const std::string text = without(random_utf8(rng, 1 + i % 120), {0xFEFF, 0x85});
    const auto ids = hf->encode(text);
    ASSERT_EQ(ids, fx.gpt2->encode(text)) << text;
    ASSERT_EQ(hf->decode(ids), text);
  }
  // Where they differ: \s is Unicode White_Space for hf (Oniguruma), ECMAScript's for gpt2.
  using V = std::vector<std::string>;
  EXPECT_EQ(hf_pretokens(*hf, "a\xC2\x85\xC2\x85" "b"), (V{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(gpt2_pretokens("a\xC2\x85\xC2\x85" "b"), (V{"a", "\xC2\x85\xC2\x85", "b"}));
  EXPECT_EQ(hf_pretokens(*hf, "a\xEF\xBB\xBF" "b"), (V{"a", "\xEF\xBB\xBF", "b"}));
  EXPECT_EQ(gpt2_pretokens("a \xEF\xBB\xBF" "b"), (V{"a", " ", "\xEF\xBB\xBF", "b"}));
  EXPECT_EQ(hf_pretokens(*hf, "a \xEF\xBB\xBF" "b"), (V{"a", " \xEF\xBB\xBF", "b"}));
  // Merges in the newer [a, b] list form read the same.
  json pairs = fx.hf;
  for (auto& m : pairs["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  EXPECT_EQ(fx.load(pairs)->encode(" the hers and"), fx.gpt2->encode(" the hers and"));
}

TEST(HfTokenizer, AddedTokensMatchFirstLongestAndDecodeToTheirContent) {
  Fixture fx;
  auto hf = load_hf_tokenizer(fx.dir / "hf" / "tokenizer.json");
  const int eot = fx.gpt2->eot_id();
  const std::string text = "in the<|endoftext|> and<|endoftext|><|endoftext|>";
  const auto ids = hf->encode(text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 3);
  EXPECT_EQ(ids, ([&] {
              std::vector<int32_t> e = fx.gpt2->encode("in the");
              e.push_back(eot);
              for (int32_t x : fx.gpt2->encode(" and")) e.push_back(x);
              e.push_back(eot);
              e.push_back(eot);
              return e;
            }()));
  EXPECT_EQ(hf->decode(ids), text);
  // The gpt2 kind does not parse the text (encoder.py does not).
  const auto plain = fx.gpt2->encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  // Non-special added tokens too, the longest first: "<x>" and "<x>y" beside each other.
  json j = fx.hf;
  const int v = fx.gpt2->vocab_size();
  j["added_tokens"].push_back({{"id", v}, {"content", "<x>"}, {"special", false}});
  j["added_tokens"].push_back({{"id", v + 1}, {"content", "<x>y"}, {"special", false}});
  auto t = fx.load(j);
  EXPECT_EQ(t->vocab_size(), v + 2);
  const auto x = t->encode("a<x>y<x>b");
  ASSERT_EQ(x.size(), 4u);
  EXPECT_EQ(x[1], v + 1);
  EXPECT_EQ(x[2], v);
  EXPECT_EQ(t->decode(x), "a<x>y<x>b");
  EXPECT_EQ(hf_pretokens(*t, "a<x>y<x>b"), (std::vector<std::string>{"a", "<x>y", "<x>", "b"}));
}

TEST(HfTokenizer, SavedAndReloaded) {
  Fixture fx;
  auto hf = fx.load(fx.llama3());
  TempDir saved;
  hf->save(saved.path());
  EXPECT_TRUE(std::filesystem::exists(saved / "hf_tokenizer.json"));
  EXPECT_EQ(json::parse(read_text(saved / "tokenizer.json"))["kind"], "hf");
  auto back = load_tokenizer(saved.path());
  EXPECT_EQ(back->hash(), hf->hash());
  EXPECT_EQ(back->encode("In the beginning.\n"), hf->encode("In the beginning.\n"));
  EXPECT_NE(hf->hash(), load_hf_tokenizer(fx.dir / "hf")->hash());
  // Llama 3's separator: <|begin_of_text|> precedes each document.
  EXPECT_EQ(hf->eot_id(), fx.gpt2->vocab_size());
  EXPECT_EQ(hf->decode(std::vector<int32_t>{hf->eot_id()}), "<|begin_of_text|>");
  TempDir out;
  export_hf_tokenizer(*back, out.path());  // the original file, byte for byte
  EXPECT_EQ(read_text(out / "tokenizer.json"), read_text(fx.dir / "t.json"));
  const json cfg = json::parse(read_text(out / "tokenizer_config.json"));
  EXPECT_EQ(cfg["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(cfg["eos_token"], "<|end_of_text|>");
}

TEST(HfTokenizer, Llama3SplitRegexByHand) {
  Fixture fx;
  auto t = fx.load(fx.llama3());
  using V = std::vector<std::string>;
  const std::vector<std::pair<std::string, V>> cases = {
      {"Hello world", {"Hello", " world"}},
      {"I'm here", {"I", "'m", " here"}},
      {"IT'S", {"IT", "'S"}},                                  // (?i:...) contractions
      {"12345 apples", {"123", "45", " apples"}},              // \p{N}{1,3}
      {"end.\nNext", {"end", ".\n", "Next"}},                  // punctuation keeps its newlines
      {"a  b", {"a", " ", " b"}},                              // \s+(?!\S) leaves one space
      {"x\n\n  y", {"x", "\n\n", " ", " y"}},                  // \s*[\r\n]+
      {"don't stop!!!\n", {"don", "'t", " stop", "!!!\n"}},
      {"$100", {"$", "100"}},
      {"\tfoo", {"\tfoo"}},                                    // [^\r\n\p{L}\p{N}]?\p{L}+
      {"日本語テキスト", {"日本語テキスト"}},
      {"a\xC2\x85\xC2\x85" "b", {"a", "\xC2\x85", "\xC2\x85" "b"}},  // U+0085 is \s (as Oniguruma)
      {"hi<|eot_id|>there", {"hi", "<|eot_id|>", "there"}},
  };
  for (const auto& [text, want] : cases) EXPECT_EQ(hf_pretokens(*t, text), want) << text;
  // GPT-2's regex would keep "1234" whole and split ".\n".
  EXPECT_EQ(gpt2_pretokens("1234.\n"), (V{"1234", ".", "\n"}));
  const auto ids = t->encode("hi<|eot_id|>there");
  EXPECT_EQ(ids.at(t->encode("hi").size()), fx.gpt2->vocab_size() + 2);
  EXPECT_EQ(t->decode(ids), "hi<|eot_id|>there");
}

TEST(HfTokenizer, Llama3SplitRegexAgainstNode) {
  if (std::system("command -v node >/dev/null 2>&1") != 0) GTEST_SKIP() << "node not found";
  Fixture fx;
  auto t = fx.load(fx.llama3());
  // node's own regex engine (ECMAScript, Unicode mode), which lacks (?i:...): the
  // contractions spelled out. Its \s also differs from Oniguruma's at U+FEFF and U+0085,
  // and [sS] from (?i:s) at U+017F, which the texts leave out, as every code point that
  // ICU 72 (Unicode 15) has unassigned: node's Unicode is newer.
  const std::string js_pattern =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  write_text(fx.dir / "pattern.txt", js_pattern);
  kiln::Philox rng(11, 2);
  json texts = json::array();
  for (int i = 0; i < 200; ++i) {
    std::string s = without(random_utf8(rng, 5 + i % 80), {0xFEFF, 0x85, 0x17F}), clean;
    for (size_t k = 0; k < s.size();) {
      const size_t a = k;
      if (u_charType(static_cast<UChar32>(kiln::data::utf8_next(s, k))) != U_UNASSIGNED) clean += s.substr(a, k - a);
    }
    texts.push_back(clean);
  }
  write_text(fx.dir / "texts.json", texts.dump());
  write_text(fx.dir / "split.js", R"(
const fs = require('fs');
const [pat, inp, out] = process.argv.slice(2);
const re = new RegExp(fs.readFileSync(pat, 'utf8'), 'gu');
fs.writeFileSync(out, JSON.stringify(JSON.parse(fs.readFileSync(inp, 'utf8')).map(t => t.match(re) || [])));
)");
  const std::string cmd = "node '" + (fx.dir / "split.js").string() + "' '" + (fx.dir / "pattern.txt").string() +
                          "' '" + (fx.dir / "texts.json").string() + "' '" + (fx.dir / "ref.json").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json ref = json::parse(read_text(fx.dir / "ref.json"));
  ASSERT_EQ(ref.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    EXPECT_EQ(hf_pretokens(*t, text), ref[i].get<std::vector<std::string>>()) << text;
    EXPECT_EQ(t->decode(t->encode(text)), text);
  }
}

// A Split pattern that backtracks catastrophically stops at ICU's time limit with one line
// (a new user's finding: (a*)*b on 30,000 a's ran for ever).
TEST(HfTokenizer, CatastrophicSplitRegexIsAnErrorNotAHang) {
  Fixture fx;
  json j = fx.llama3();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a*)*b";
  auto t = fx.load(j, "redos.json");
  const std::string err = error_of([&] { t->encode(std::string(30000, 'a')); });
  EXPECT_NE(err.find("ran past its time limit"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

TEST(HfTokenizer, MalformedOrUnsupportedFilesGiveOneLineErrorsNamingTheField) {
  Fixture fx;
  using Mutation = std::function<void(json&)>;
  const std::vector<std::pair<Mutation, std::string>> cases = {
      {[](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type = 'WordPiece': only BPE is supported"},
      {[](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer = 'NFC'"},
      {[](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {[](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {[](json& j) { j["model"]["merges"][3] = 5; }, "model.merges[3]"},
      {[](json& j) { j["model"]["merges"][2] = "Ġt"; }, "model.merges[2]"},
      {[](json& j) { j["model"]["merges"][0] = "q zzz"; }, "merge 0"},
      {[](json& j) { j.erase("model"); }, "model is missing"},
      {[](json& j) { j["model"]["vocab"]["h"] = "seven"; }, "model.vocab['h']"},
      {[](json& j) { j["model"]["vocab"].erase("he"); }, "no token has id"},
      {[](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip"},
      {[](json& j) { j["added_tokens"][0]["id"] = 3; }, "added_tokens[0]"},
      {[](json& j) { j["added_tokens"][0]["special"] = "yes"; }, "added_tokens[0] has a field of the wrong type"},
      {[](json& j) { j["added_tokens"][0]["id"] = -2; }, "added_tokens[0].id = -2"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer.type = 'Whitespace'"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(a"}}},
                                                   {"behavior", "Isolated"}}}}};
       },
       "pre_tokenizer.pretokenizers[0].pattern.Regex"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Odd"}}; },
       "pre_tokenizer.behavior = 'Odd'"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}}; },
       "no ByteLevel step"},
      {[](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder = 'WordPiece'"},
      {[](json& j) { j["added_tokens"] = json::array(); j["model"]["vocab"].erase("<|endoftext|>"); },
       "no document separator"},
  };
  for (const auto& [mutate, want] : cases) {
    json j = fx.hf;
    mutate(j);
    const std::string err = error_of([&] { fx.load(j, "bad.json"); });
    EXPECT_NE(err.find(want), std::string::npos) << "expected '" << want << "' in: " << err;
    EXPECT_NE(err.find("bad.json"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  write_text(fx.dir / "broken.json", "{\"model\": ");
  const std::string err = error_of([&] { load_hf_tokenizer(fx.dir / "broken.json"); });
  EXPECT_NE(err.find("broken.json: malformed JSON"), std::string::npos) << err;
  EXPECT_NE(error_of([&] { load_hf_tokenizer(fx.dir / "none"); }).find("no such file"), std::string::npos);
}

TEST(HfTokenizer, ExportOfEachKind) {
  TempDir dir;
  EXPECT_NE(error_of([&] { export_hf_tokenizer(*make_byte_tokenizer(), dir / "b"); }).find("byte tokenizer"),
            std::string::npos);
  write_text(dir / "c.txt", "In the beginning God created the heaven and the earth.\nAnd the earth was "
                            "without form, and void.\n");
  SentencePieceTrainOptions so;
  so.vocab_size = 300;
  auto sp = train_sentencepiece({dir / "c.txt"}, so);
  export_hf_tokenizer(*sp, dir / "sp");
  sp->save(dir / "sp_saved");
  EXPECT_EQ(read_text(dir / "sp" / "tokenizer.model"), read_text(dir / "sp_saved" / "tokenizer.model"));
  const json cfg = json::parse(read_text(dir / "sp" / "tokenizer_config.json"));
  EXPECT_EQ(cfg["eos_token"], "<|endoftext|>");
  EXPECT_TRUE(cfg["bos_token"].is_null());
}

TEST(HfTokenizer, PrepareCutPointsNeverChangeLlama3Tokens) {
  // prepare cuts hf text only before a space: Llama 3's regex joins ".\n", so a cut before
  // the newline (as for gpt2) would change the tokens.
  Fixture fx;
  auto t = fx.load(fx.llama3());
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += "In the beginning God created the heaven and the earth.\nAnd the earth was without form, "
            "and void; 日本語のテキスト, ĉu vi? " + std::to_string(12345 * i) + "!!\n\n";
  write_text(fx.dir / "doc.txt", text);
  // Compared as pre-tokens: the tiny vocabulary has no merge that would show it in ids.
  const auto whole = hf_pretokens(*t, text);
  auto cut = [&](size_t chunk, bool spaces_only) {
    std::vector<std::string> out;
    stream_documents(fx.dir / "doc.txt", "", [&](std::string_view piece, bool) {
      for (auto& p : hf_pretokens(*t, piece)) out.push_back(std::move(p));
    }, chunk, spaces_only);
    return out;
  };
  for (size_t chunk : {16u, 37u, 100u}) EXPECT_EQ(cut(chunk, true), whole) << "chunk " << chunk;
  EXPECT_NE(cut(37, false), whole);  // the test can fail: gpt2's cut points split ".\n"
}

TEST(HfTokenizer, PrepareFromHuggingFaceDirAndFromTheSavedDir) {
  // Both directories hold a tokenizer.json: Hugging Face's, and kiln's own beside
  // hf_tokenizer.json in a prepared data set. Each is recognised for what it is.
  Fixture fx;
  std::filesystem::create_directories(fx.dir / "llama3");
  write_text(fx.dir / "llama3" / "tokenizer.json", fx.llama3().dump());
  write_text(fx.dir / "doc.txt", "In the beginning God created the heaven and the earth.\n");
  PrepareOptions o;
  o.inputs = {fx.dir / "doc.txt"};
  o.out_dir = fx.dir / "data1";
  o.tokenizer = "hf";
  o.tokenizer_files = {fx.dir / "llama3"};
  const auto a = prepare_dataset(o).meta;
  EXPECT_EQ(a.tokenizer_kind, "hf");
  EXPECT_EQ(a.eot_id, fx.gpt2->vocab_size());  // <|begin_of_text|>
  EXPECT_TRUE(std::filesystem::exists(o.out_dir / "hf_tokenizer.json"));
  EXPECT_EQ(json::parse(read_text(o.out_dir / "tokenizer.json"))["kind"], "hf");
  o.tokenizer_files = {o.out_dir};
  o.out_dir = fx.dir / "data2";
  const auto b = prepare_dataset(o).meta;
  EXPECT_EQ(b.tokenizer_hash, a.tokenizer_hash);
  EXPECT_EQ(b.splits.at("train").tokens, a.splits.at("train").tokens);
  EXPECT_EQ(load_tokenizer(o.out_dir)->hash(), a.tokenizer_hash);
  // A saved tokenizer of another kind given as hf: named for what it is, and a failed
  // prepare leaves no output directory behind.
  o.tokenizer = "byte";
  o.tokenizer_files = {};
  o.out_dir = fx.dir / "bytes";
  prepare_dataset(o);
  o.tokenizer = "hf";
  o.tokenizer_files = {fx.dir / "bytes"};
  o.out_dir = fx.dir / "data3";
  try {
    prepare_dataset(o);
    ADD_FAILURE() << "a saved byte tokenizer read as Hugging Face's";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("kiln's description of a saved 'byte' tokenizer"),
              std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(o.out_dir));
}
