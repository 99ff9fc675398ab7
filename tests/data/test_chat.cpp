// Chat data: records, the two templates, Python's strip, the loss mask token by token
// through `prepare --format chat` and the loader.
#include "core/error.h"
#include "data/chat.h"
#include "data/loader.h"
#include "data/meta.h"
#include "data/position_index.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace kiln::data;
using kiln::data::testing::read_text;
using kiln::data::testing::TempDir;
using kiln::data::testing::TinyGpt2;
using kiln::data::testing::write_text;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A Hugging Face tokenizer.json: the tiny GPT-2 tables with the chat templates' special
// tokens added, <|begin_of_text|> (the separator) first.
struct ChatTokenizer {
  TempDir dir;
  std::unique_ptr<Tokenizer> tok;
  ChatTokenizer() {
    TinyGpt2 v;
    v.write(dir / "encoder.json", dir / "vocab.bpe");
    const auto gpt2 = load_gpt2_tokenizer({dir.path()});
    export_hf_tokenizer(*gpt2, dir / "hf");
    json j = json::parse(read_text(dir / "hf" / "tokenizer.json"));
    int id = gpt2->vocab_size();
    for (const char* t : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                          "<|im_start|>", "<|im_end|>"})
      j["added_tokens"].push_back({{"id", id++}, {"content", t}, {"special", true}});
    write_text(dir / "tokenizer.json", j.dump());
    tok = load_hf_tokenizer(dir / "tokenizer.json");
  }
};

std::string line_of(const std::vector<std::pair<std::string, std::string>>& messages) {
  json m = json::array();
  for (const auto& [role, content] : messages) m.push_back({{"role", role}, {"content", content}});
  return json({{"messages", m}}).dump();
}

}  // namespace

TEST(Chat, PythonStripIsUnicodeWhitespace) {
  EXPECT_EQ(python_strip("  a b \n"), "a b");
  EXPECT_EQ(python_strip("\u3000\u00a0x\u2028\u0085"), "x");
  EXPECT_EQ(python_strip("\x1c\x1f y"), "y");
  EXPECT_EQ(python_strip(" \t\n"), "");
  EXPECT_EQ(python_strip("\u200bz\u200b"), "\u200bz\u200b");  // zero width space: not whitespace
}

TEST(Chat, RecordsAndTheirErrors) {
  const ChatRecord ok = parse_chat_record(line_of({{"system", "s"}, {"user", "u"}, {"assistant", "a"}}));
  ASSERT_EQ(ok.error, "");
  ASSERT_EQ(ok.messages.size(), 3u);
  EXPECT_EQ(ok.messages[2].content, "a");
  EXPECT_EQ(parse_chat_record("{}").error, "no \"messages\" list");
  EXPECT_EQ(parse_chat_record(R"({"messages": []})").error, "no \"messages\" list");
  EXPECT_NE(parse_chat_record(R"({"messages": [{"role": "user"}]})").error.find("messages[0] is not"),
            std::string::npos);
  EXPECT_NE(parse_chat_record(line_of({{"tool", "x"}, {"assistant", "a"}})).error.find("role 'tool'"),
            std::string::npos);
  EXPECT_EQ(parse_chat_record(line_of({{"user", "u"}})).error, "no assistant message (nothing in the loss)");
  EXPECT_NE(parse_chat_record("{\"messages\": \xff}").error.find("invalid UTF-8"), std::string::npos);
}

TEST(Chat, TemplatesRenderAndMarkTheAssistantsTurns) {
  const std::vector<ChatMessage> m = {{"system", " Be brief. "}, {"user", "Hi\n"}, {"assistant", " Hello! "}};
  const RenderedChat l = render_chat(m, ChatTemplate::Llama3);
  EXPECT_EQ(l.text,
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>");
  ASSERT_EQ(l.loss_bytes.size(), 1u);
  EXPECT_EQ(l.text.substr(l.loss_bytes[0].first, l.loss_bytes[0].second - l.loss_bytes[0].first),
            "Hello!<|eot_id|>");
  const RenderedChat c = render_chat(m, ChatTemplate::ChatML);
  EXPECT_EQ(c.text,
            "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi\n<|im_end|>\n"
            "<|im_start|>assistant\n Hello! <|im_end|>\n");
  EXPECT_EQ(c.text.substr(c.loss_bytes[0].first, c.loss_bytes[0].second - c.loss_bytes[0].first),
            " Hello! <|im_end|>");
}

TEST(Chat, SpecialTokensMustBeInTheTokenizer) {
  ChatTokenizer ct;
  check_chat_tokens(*ct.tok, ChatTemplate::Llama3);
  check_chat_tokens(*ct.tok, ChatTemplate::ChatML);
  const auto bytes = make_byte_tokenizer();
  try {
    check_chat_tokens(*bytes, ChatTemplate::ChatML);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the byte tokenizer has no token '<|im_start|>'"), std::string::npos);
  }
}

// prepare --format chat, then the loader: every target is in the loss exactly when its
// token is part of an assistant's content or end-of-turn token, token by token.
TEST(Chat, PrepareAndLoaderMaskTargetsTokenByToken) {
  ChatTokenizer ct;
  std::string lines;
  std::vector<std::string> expected_text;  // per conversation: the in-loss text
  for (int i = 0; i < 60; ++i) {
    const std::string answer = "the answer is " + std::to_string(i * 7) + (i % 3 ? " and" : "");
    lines += line_of({{"user", "what is " + std::to_string(i) + " times 7"}, {"assistant", answer},
                      {"user", "again"}, {"assistant", "  " + answer + "\n"}}) + "\n";
    if (i == 5) lines += "{\"messages\": 3}\n";  // a bad line, skipped
  }
  write_text(ct.dir / "chat.jsonl", lines);
  for (const char* tmpl : {"llama3", "chatml"}) {
    PrepareOptions o;
    o.inputs = {ct.dir / "chat.jsonl"};
    o.input_format = "chat";
    o.chat_template = tmpl;
    o.tokenizer = "hf";
    o.tokenizer_files = {ct.dir / "tokenizer.json"};
    o.val_fraction = 0.2;
    o.out_dir = ct.dir / tmpl;
    const PrepareSummary r = prepare_dataset(o);
    EXPECT_EQ(r.bad_lines, 1);
    EXPECT_EQ(r.meta.documents, 60);
    for (const char* split : {"train", "val"}) {
      const SplitInfo& s = r.meta.splits.at(split);
      ASSERT_FALSE(s.loss_index.file.empty());
      const auto bounds = read_position_index(o.out_dir / s.loss_index.file, PositionIndexKind::LossSpans, s.tokens,
                                              s.loss_index.count);
      // The stream and which positions are in the loss, from the shards and the spans.
      std::vector<int32_t> ids;
      for (const auto& sh : s.shards) {
        ShardReader rd(o.out_dir / sh.file);
        const size_t at = ids.size();
        ids.resize(at + static_cast<size_t>(rd.size()));
        rd.read(0, rd.size(), ids.data() + at);
      }
      std::vector<bool> in(ids.size(), false);
      for (size_t k = 0; k + 1 < bounds.size(); k += 2)
        for (int64_t p = bounds[k]; p < bounds[k + 1]; ++p) in[static_cast<size_t>(p)] = true;
      // The in-loss tokens decode to the assistants' turns: contents (trimmed for llama3)
      // and end-of-turn tokens, in order.
      std::string got_loss;
      for (size_t p = 0; p < ids.size(); ++p)
        if (in[p]) got_loss += ct.tok->decode(std::span<const int32_t>(&ids[p], 1));
      const std::string eot = std::string(tmpl) == "llama3" ? "<|eot_id|>" : "<|im_end|>";
      const bool train = std::string(split) == "train", llama3 = std::string(tmpl) == "llama3";
      const std::string second = llama3 ? "the answer is 7 and" : "  the answer is 7 and\n";
      if (train) {  // conversation 1's two answers, back to back (the user's turn between is not)
        EXPECT_NE(got_loss.find("the answer is 7 and" + eot + second + eot), std::string::npos) << got_loss;
      }
      for (size_t p = 0; p < ids.size(); ++p)
        if (ids[p] == ct.tok->eot_id()) {
          EXPECT_FALSE(in[p]) << "the separator at " << p;
        }
      // The loader: target t of sample i is stream position i*T + 1 + t.
      const int T = 16;
      DataLoader loader(o.out_dir, split, T, 0, false);
      std::vector<int32_t> inp(T), tgt(T);
      int64_t counted = 0;
      for (int64_t i = 0; i < loader.samples_per_epoch(); ++i) {
        loader.read_pair(i, inp.data(), tgt.data());
        for (int t = 0; t < T; ++t) {
          const size_t p = static_cast<size_t>(i * T + 1 + t);
          ASSERT_EQ(tgt[t] != -1, in[p]) << tmpl << " " << split << " position " << p;
          if (in[p]) {
            EXPECT_EQ(tgt[t], ids[p]);
            ++counted;
          }
        }
      }
      EXPECT_GT(counted, 0) << split;
    }
  }
}

TEST(Chat, OverlongConversationsAreDroppedOrKeptAndCounted) {
  ChatTokenizer ct;
  std::string lines = line_of({{"user", "hi"}, {"assistant", "short"}}) + "\n" +
                      line_of({{"user", std::string(400, 'x')}, {"assistant", "long"}}) + "\n";
  write_text(ct.dir / "chat.jsonl", lines);
  for (const char* how : {"drop", "split"}) {
    PrepareOptions o;
    o.inputs = {ct.dir / "chat.jsonl"};
    o.input_format = "chat";
    o.tokenizer = "hf";
    o.tokenizer_files = {ct.dir / "tokenizer.json"};
    o.chat_max_tokens = 64;
    o.chat_overlong = how;
    o.out_dir = ct.dir / how;
    const PrepareSummary r = prepare_dataset(o);
    EXPECT_EQ(r.overlong, 1);
    EXPECT_EQ(r.meta.documents, std::string(how) == "drop" ? 1 : 2);
  }
  PrepareOptions bad;
  bad.inputs = {ct.dir / "chat.jsonl"};
  bad.input_format = "chat";
  bad.tokenizer = "byte";
  bad.out_dir = ct.dir / "bad";
  try {
    prepare_dataset(bad);
    FAIL();
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat data needs the hf tokenizer"), std::string::npos);
  }
}
