// LLaVA's image-text pair records (data/llava.h): a good record becomes chat messages, each
// broken kind of record gets its own reason, a record's tokens follow LLaVA-1.5's
// conversation format with the image's place and the answers' loss, and a file is read as
// a JSON array (LLaVA's releases) or as JSONL, each record with its place in the file.
#include "core/error.h"
#include "data/llava.h"
#include "data/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

using namespace kiln::data;
using kiln::data::testing::TempDir;
using kiln::data::testing::write_text;
using json = nlohmann::json;

namespace {

// A two-round record about an image, in LLaVA's own shape.
json good_record() {
  return json::parse(R"({"id": "000000033471", "image": "coco/000000033471.png",
    "conversations": [
      {"from": "human", "value": "<image>\nWhat are the colors of the bus?"},
      {"from": "gpt", "value": "The bus is white and red."},
      {"from": "human", "value": "What is in front of it?"},
      {"from": "gpt", "value": "A car."}]})");
}

// The error of `record` with `edit` applied.
std::string error_of(const std::function<void(json&)>& edit) {
  json r = good_record();
  edit(r);
  const LlavaRecord parsed = parse_llava_record(r);
  EXPECT_TRUE(parsed.messages.empty()) << "a bad record keeps no messages";
  return parsed.error;
}

TEST(Llava, GoodRecordBecomesChatMessages) {
  const LlavaRecord r = parse_llava_record(good_record());
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.id, "000000033471");
  EXPECT_EQ(r.image, "coco/000000033471.png");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "<image>\nWhat are the colors of the bus?");
  EXPECT_EQ(r.messages[1].role, "assistant");
  EXPECT_EQ(r.messages[3].content, "A car.");
  // A numeric id as its digits; a text-only record (no image, no <image>); extra keys.
  const LlavaRecord t = parse_llava_record(json::parse(R"({"id": 7, "source": "x",
    "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]})"));
  EXPECT_EQ(t.error, "");
  EXPECT_EQ(t.id, "7");
  EXPECT_EQ(t.image, "");
  EXPECT_EQ(t.messages.size(), 2u);
}

TEST(Llava, EachBrokenRecordSaysWhy) {
  EXPECT_EQ(parse_llava_record(json::array()).error, "not a JSON object");
  EXPECT_EQ(error_of([](json& r) { r["id"] = 1.5; }), "\"id\" is neither a string nor an integer");
  EXPECT_EQ(error_of([](json& r) { r["image"] = 3; }), "\"image\" is not a string");
  EXPECT_EQ(error_of([](json& r) { r["image"] = ""; }),
            "\"image\" is empty (leave the key out for a text-only record)");
  EXPECT_EQ(error_of([](json& r) { r.erase("conversations"); }), "no \"conversations\" list");
  EXPECT_EQ(error_of([](json& r) { r["conversations"] = json::array(); }), "no \"conversations\" list");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][1] = "text"; }),
            "conversations[1] is not {\"from\": string, \"value\": string}");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][2].erase("value"); }),
            "conversations[2] is not {\"from\": string, \"value\": string}");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][1]["from"] = "assistant"; }),
            "conversations[1]: from 'assistant' (expected human or gpt)");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][1]["from"] = "human"; }),
            "conversations[1] is from human, but the turns alternate human, gpt, human, ... "
            "(this one should be from gpt)");
  EXPECT_EQ(error_of([](json& r) { r["conversations"] = json::array({r["conversations"][0]}); }),
            "no gpt turn (nothing in the loss)");
  EXPECT_EQ(error_of([](json& r) { r["conversations"].erase(3); }),
            "it ends with a human turn, which no gpt turn answers");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][0]["value"] = "What is this?"; }),
            "it has an image but 0 <image> (expected one, where the image's tokens go)");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][2]["value"] = "<image> and <image>"; }),
            "it has an image but 3 <image> (expected one, where the image's tokens go)");
  EXPECT_EQ(error_of([](json& r) { r["conversations"][1]["value"] = "It is <image>."; }),
            "conversations[1]: <image> in a gpt turn (the image goes in a human one)");
  EXPECT_EQ(error_of([](json& r) { r.erase("image"); }), "1 <image> but no \"image\"");
}

// The ids' bytes (the byte tokenizer: id b is byte b), "|" for the end-of-text id 256.
std::string text_of(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += id == 256 ? '|' : static_cast<char>(id);
  return out;
}

TEST(Llava, TokensFollowLlavaConversations) {
  const auto tok = make_byte_tokenizer();
  const CaptionTokens t = tokenize_llava(*tok, parse_llava_record(good_record()));
  const std::string head = std::string(kLlavaSystem) + " USER: ";
  // The image's place: after "USER: ", the newline after it kept as LLaVA keeps it.
  EXPECT_EQ(text_of(t.ids), head + "\nWhat are the colors of the bus? ASSISTANT: The bus is "
                            "white and red.|USER: What is in front of it? ASSISTANT: A car.|");
  EXPECT_EQ(t.image_at, static_cast<int64_t>(head.size()));
  // The loss: the answers (their leading space included) and the end-of-text after each.
  std::string loss;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (t.in_loss[i]) loss += text_of({t.ids[i]});
  EXPECT_EQ(loss, " The bus is white and red.| A car.|");
  ASSERT_EQ(t.in_loss.size(), t.ids.size());
  // Text only: no image place; <image> mid-question keeps the text around it.
  json r = good_record();
  r.erase("image");
  r["conversations"][0]["value"] = "Hi";
  EXPECT_EQ(tokenize_llava(*tok, parse_llava_record(r)).image_at, -1);
  r["image"] = "x.png";
  r["conversations"][0]["value"] = "Look: <image> here";
  const CaptionTokens mid = tokenize_llava(*tok, parse_llava_record(r));
  EXPECT_EQ(text_of(mid.ids).substr(head.size(), 15), "Look:  here ASS");
  EXPECT_EQ(mid.image_at, static_cast<int64_t>(head.size() + 6));
}

TEST(Llava, AnswersAndPromptsForDecoding) {
  const auto tok = make_byte_tokenizer();
  const CaptionTokens t = tokenize_llava(*tok, parse_llava_record(good_record()));
  // Each answer's span: its text (leading space) and the end-of-text; the prompt before it.
  const auto answers = llava_answers(t);
  ASSERT_EQ(answers.size(), 2u);
  auto text = [&](size_t b, size_t e) {
    return text_of(std::vector<int32_t>(t.ids.begin() + static_cast<int64_t>(b),
                                        t.ids.begin() + static_cast<int64_t>(e)));
  };
  EXPECT_EQ(text(answers[0].first, answers[0].second), " The bus is white and red.|");
  EXPECT_EQ(text(answers[1].first, answers[1].second), " A car.|");
  EXPECT_TRUE(text(0, answers[1].first).ends_with("What is in front of it? ASSISTANT:"));
  // A one-question prompt is the record's tokens up to its answer, the image first.
  const CaptionTokens p = llava_prompt(*tok, "What are the colors of the bus?", true);
  EXPECT_EQ(p.ids, std::vector<int32_t>(t.ids.begin(), t.ids.begin() + static_cast<int64_t>(answers[0].first)));
  EXPECT_EQ(p.image_at, t.image_at);
  EXPECT_EQ(p.in_loss, std::vector<uint8_t>(p.ids.size(), 0));
  // "<image>" where the question puts it; none without an image.
  EXPECT_EQ(llava_prompt(*tok, "<image>\nWhat are the colors of the bus?", true).ids, p.ids);
  const CaptionTokens plain = llava_prompt(*tok, "Hi", false);
  EXPECT_EQ(plain.image_at, -1);
  EXPECT_TRUE(text_of(plain.ids).ends_with("USER: Hi ASSISTANT:"));
  EXPECT_THROW(llava_prompt(*tok, "<image> Hi", false), kiln::Error);
  EXPECT_THROW(llava_prompt(*tok, "<image><image> Hi", true), kiln::Error);
  // The kinds of kiln scenes' records ride along; anything else is dropped.
  json r = good_record();
  r["kinds"] = {"colour", "position"};
  EXPECT_EQ(parse_llava_record(r).kinds, (std::vector<std::string>{"colour", "position"}));
  r["kinds"] = {"colour", 3};
  EXPECT_TRUE(parse_llava_record(r).kinds.empty());
}

TEST(Llava, ReadsJsonArraysAndJsonl) {
  TempDir dir;
  const auto array = dir.path() / "pairs.json";
  json records = json::array({good_record(), json::object(), good_record()});
  write_text(array, "\n  " + records.dump(2));
  const auto a = read_llava_file(array);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[1].where, array.string() + "[1]");
  EXPECT_EQ(a[0].record.error, "");
  EXPECT_EQ(a[1].record.error, "no \"conversations\" list");
  EXPECT_EQ(a[2].record.messages.size(), 4u);

  const auto lines = dir.path() / "pairs.jsonl";  // a byte order mark first, as some editors write
  write_text(lines, "\xEF\xBB\xBF" + good_record().dump() + "\n\n{not json\n" + good_record().dump() + "\n");
  const auto l = read_llava_file(lines);
  ASSERT_EQ(l.size(), 3u);  // the blank line skipped
  EXPECT_EQ(l[0].where, lines.string() + ":1");
  EXPECT_EQ(l[1].where, lines.string() + ":3");
  EXPECT_NE(l[1].record.error.find("invalid JSON"), std::string::npos) << l[1].record.error;
  EXPECT_EQ(l[2].where, lines.string() + ":4");
  EXPECT_EQ(l[2].record.error, "");
}

TEST(Llava, UnreadableFilesAreOneLineErrors) {
  TempDir dir;
  auto message = [](const std::filesystem::path& p) {
    try {
      read_llava_file(p);
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto missing = dir.path() / "missing.json";
  EXPECT_EQ(message(missing), missing.string() + ": cannot read this LLaVA pair file");
  const auto broken = dir.path() / "broken.json";
  write_text(broken, "[{\"id\": 1},");
  EXPECT_NE(message(broken).find(broken.string() + ": a JSON array file that is not valid JSON"),
            std::string::npos) << message(broken);
  const auto empty = dir.path() / "empty.jsonl";
  write_text(empty, "\n\n");
  EXPECT_NE(message(empty).find("holds no LLaVA record"), std::string::npos) << message(empty);
  for (const auto& p : {missing, broken, empty})
    EXPECT_EQ(message(p).find('\n'), std::string::npos) << message(p);
}

}  // namespace
