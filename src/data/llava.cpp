#include "data/llava.h"

#include "core/error.h"
#include "data/jsonl.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace kiln::data {

namespace {

// Occurrences of `needle` in `text`.
int count_of(const std::string& text, std::string_view needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size()))
    ++n;
  return n;
}

// The record's "id" and "image", or why they are bad ("" when fine).
std::string read_keys(const nlohmann::json& j, LlavaRecord& r) {
  if (j.contains("id")) {
    const auto& id = j["id"];
    if (id.is_string()) r.id = id.get<std::string>();
    else if (id.is_number_integer()) r.id = id.dump();
    else return "\"id\" is neither a string nor an integer";
  }
  if (j.contains("image")) {
    if (!j["image"].is_string()) return "\"image\" is not a string";
    r.image = j["image"].get<std::string>();
    if (r.image.empty()) return "\"image\" is empty (leave the key out for a text-only record)";
  }
  return "";
}

// The turns as messages, or why they are bad ("" when fine).
std::string read_turns(const nlohmann::json& j, LlavaRecord& r) {
  if (!j.contains("conversations") || !j["conversations"].is_array() || j["conversations"].empty())
    return "no \"conversations\" list";
  const auto& turns = j["conversations"];
  int images = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& t = turns[i];
    if (!t.is_object() || !t.contains("from") || !t["from"].is_string() || !t.contains("value") ||
        !t["value"].is_string())
      return fmt::format("conversations[{}] is not {{\"from\": string, \"value\": string}}", i);
    const std::string from = t["from"].get<std::string>();
    if (from != "human" && from != "gpt")
      return fmt::format("conversations[{}]: from '{}' (expected human or gpt)", i, from);
    const char* expected = i % 2 == 0 ? "human" : "gpt";
    if (from != expected)
      return fmt::format("conversations[{}] is from {}, but the turns alternate human, gpt, "
                         "human, ... (this one should be from {})", i, from, expected);
    std::string value = t["value"].get<std::string>();
    const int here = count_of(value, kImageToken);
    if (here > 0 && from == "gpt")
      return fmt::format("conversations[{}]: {} in a gpt turn (the image goes in a human one)",
                         i, kImageToken);
    images += here;
    r.messages.push_back({from == "human" ? "user" : "assistant", std::move(value)});
  }
  if (turns.size() < 2) return "no gpt turn (nothing in the loss)";
  if (turns.size() % 2 == 1) return "it ends with a human turn, which no gpt turn answers";
  if (!r.image.empty() && images != 1)
    return fmt::format("it has an image but {} {} (expected one, where the image's tokens go)",
                       images, kImageToken);
  if (r.image.empty() && images > 0)
    return fmt::format("{} {} but no \"image\"", images, kImageToken);
  return "";
}

}  // namespace

LlavaRecord parse_llava_record(const nlohmann::json& record) {
  LlavaRecord r;
  if (!record.is_object()) {
    r.error = "not a JSON object";
    return r;
  }
  r.error = read_keys(record, r);
  if (r.error.empty()) r.error = read_turns(record, r);
  if (!r.error.empty()) r.messages.clear();
  const auto kinds = record.find("kinds");
  if (r.error.empty() && kinds != record.end() && kinds->is_array())
    for (const auto& k : *kinds) {
      if (!k.is_string()) {
        r.kinds.clear();
        break;
      }
      r.kinds.push_back(k.get<std::string>());
    }
  return r;
}

std::string answer_text(std::string_view answer) { return " " + std::string(answer); }

void for_each_llava_piece(const LlavaRecord& record, const LlavaPieceVisitor& visit) {
  // A question: the text before its <image> (and the newline after it), the image, the
  // rest.
  auto question = [&](const std::string& q) {
    const size_t at = q.find(kImageToken);
    if (at == std::string::npos) return visit(LlavaPiece::Prompt, q);
    visit(LlavaPiece::Prompt, q.substr(0, at));
    visit(LlavaPiece::Image, "");
    visit(LlavaPiece::Prompt, q.substr(at + std::string_view(kImageToken).size()));  // "\n..." as LLaVA keeps it
  };
  visit(LlavaPiece::Prompt, std::string(kLlavaSystem) + " ");
  for (const ChatMessage& m : record.messages) {
    if (m.role == "user") {
      visit(LlavaPiece::Prompt, "USER: ");
      question(m.content);
      visit(LlavaPiece::Prompt, " ASSISTANT:");
    } else {
      KILN_CHECK(m.role == "assistant", "LLaVA record {}: a message of role '{}'", record.id,
                 m.role);
      visit(LlavaPiece::Answer, answer_text(m.content));
      visit(LlavaPiece::EndOfText, "");
    }
  }
}

CaptionTokens tokenize_llava(const Tokenizer& tok, const LlavaRecord& record) {
  CaptionTokens out;
  for_each_llava_piece(record, [&](LlavaPiece kind, std::string_view text) {
    if (kind == LlavaPiece::Image) {
      out.image_at = static_cast<int64_t>(out.ids.size());
      return;
    }
    const std::vector<int32_t> ids =
        kind == LlavaPiece::EndOfText ? std::vector<int32_t>{tok.eot_id()} : tok.encode(text);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.in_loss.insert(out.in_loss.end(), ids.size(), kind == LlavaPiece::Prompt ? 0 : 1);
  });
  return out;
}

std::vector<int32_t> llava_caption(const Tokenizer& tok, std::string_view text) {
  if (text.empty()) return {};
  std::vector<int32_t> ids = tok.encode(answer_text(text));
  ids.push_back(tok.eot_id());
  return ids;
}

std::optional<std::pair<size_t, size_t>> llava_last_answer(const CaptionTokens& tokens,
                                                           int32_t eot_id) {
  const auto answers = llava_answers(tokens);
  if (answers.empty()) return std::nullopt;
  const auto [begin, end] = answers.back();
  if (end != tokens.ids.size() || tokens.ids[end - 1] != eot_id) return std::nullopt;
  return answers.back();
}

std::vector<std::pair<size_t, size_t>> llava_answers(const CaptionTokens& tokens) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < tokens.in_loss.size(); ++i) {
    if (!tokens.in_loss[i]) continue;
    if (out.empty() || out.back().second != i) out.emplace_back(i, i);
    out.back().second = i + 1;
  }
  return out;
}

CaptionTokens llava_prompt(const Tokenizer& tok, const std::string& question, bool with_image) {
  const size_t first = question.find(kImageToken);
  const bool has = first != std::string::npos;
  KILN_CHECK(with_image || !has, "a question without an image holds \"{}\"", kImageToken);
  KILN_CHECK(!has || question.find(kImageToken, first + 1) == std::string::npos,
             "a question holds \"{}\" twice (one image goes in one place)", kImageToken);
  LlavaRecord r;
  r.messages = {{"user", with_image && !has ? std::string(kImageToken) + "\n" + question : question},
                {"assistant", ""}};
  CaptionTokens t = tokenize_llava(tok, r);
  const size_t end = llava_answers(t).front().first;
  t.ids.resize(end);
  t.in_loss.assign(end, 0);
  return t;
}

std::vector<LlavaEntry> read_llava_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in, "{}: cannot read this LLaVA pair file", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte order mark
  const std::string name = path.string();
  std::vector<LlavaEntry> out;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {  // one JSON array (LLaVA's files)
    const JsonLine parsed = parse_json_line(text);
    KILN_CHECK(parsed.error.empty(), "{}: a JSON array file that is not valid JSON: {}", name,
               parsed.error);
    for (size_t i = 0; i < parsed.value.size(); ++i)
      out.push_back({fmt::format("{}[{}]", name, i), parse_llava_record(parsed.value[i])});
  } else {  // JSONL
    std::istringstream lines(text);
    size_t number = 0;
    for (std::string line; std::getline(lines, line);) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      JsonLine parsed = parse_json_line(line);
      LlavaRecord r;
      if (parsed.error.empty()) r = parse_llava_record(parsed.value);
      else r.error = std::move(parsed.error);
      out.push_back({fmt::format("{}:{}", name, number), std::move(r)});
    }
  }
  KILN_CHECK(!out.empty(), "{}: holds no LLaVA record (a JSON array of records, or one per "
             "line)", name);
  return out;
}

}  // namespace kiln::data
