#include "data/chat.h"

#include "core/error.h"
#include "data/jsonl.h"
#include "data/utf8.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace kiln::data {

ChatTemplate parse_chat_template(const std::string& name) {
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "chatml") return ChatTemplate::ChatML;
  KILN_FAIL("unknown chat template '{}' (expected llama3 or chatml)", name);
}

const char* chat_template_name(ChatTemplate t) { return t == ChatTemplate::Llama3 ? "llama3" : "chatml"; }

ChatRecord parse_chat_record(std::string_view line) {
  ChatRecord r;
  JsonLine parsed = parse_json_line(line);
  if (!parsed.error.empty()) {
    r.error = std::move(parsed.error);
    return r;
  }
  nlohmann::json& j = parsed.value;
  if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    r.error = "no \"messages\" list";
    return r;
  }
  bool assistant = false;
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const auto& m = j["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      r.error = fmt::format("messages[{}] is not {{\"role\": string, \"content\": string}}", i);
      return r;
    }
    ChatMessage msg{m["role"].get<std::string>(), m["content"].get<std::string>()};
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      r.error = fmt::format("messages[{}]: role '{}' (expected system, user or assistant)", i, msg.role);
      return r;
    }
    assistant = assistant || msg.role == "assistant";
    r.messages.push_back(std::move(msg));
  }
  if (!assistant) {
    r.messages.clear();
    r.error = "no assistant message (nothing in the loss)";
  }
  return r;
}

namespace {

// Python's str.isspace for one code point (Unicode White_Space plus the separators
// U+001C..U+001F that Python counts too).
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The template's parts around one message's content, and its end-of-turn token.
struct Frame {
  std::string before, eot, after;
};

Frame frame_of(ChatTemplate t, const std::string& role) {
  if (t == ChatTemplate::Llama3) return {"<|start_header_id|>" + role + "<|end_header_id|>\n\n", "<|eot_id|>", ""};
  return {"<|im_start|>" + role + "\n", "<|im_end|>", "\n"};
}

}  // namespace

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t next = begin;
    if (!python_space(utf8_next(s, next))) break;
    begin = next;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t at = start;
    if (!python_space(utf8_next(s, at))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

RenderedChat render_chat(const std::vector<ChatMessage>& messages, ChatTemplate t) {
  RenderedChat r;
  for (const auto& m : messages) {
    const Frame f = frame_of(t, m.role);
    const std::string_view content = t == ChatTemplate::Llama3 ? python_strip(m.content) : std::string_view(m.content);
    r.text += f.before;
    const size_t begin = r.text.size();
    r.text.append(content);
    r.text += f.eot;
    if (m.role == "assistant") r.loss_bytes.emplace_back(begin, r.text.size());
    r.text += f.after;
  }
  return r;
}

void check_chat_tokens(const Tokenizer& tok, ChatTemplate t) {
  const std::vector<std::string> specials =
      t == ChatTemplate::Llama3 ? std::vector<std::string>{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
                                : std::vector<std::string>{"<|im_start|>", "<|im_end|>"};
  for (const auto& s : specials)
    KILN_CHECK(tok.encode(s).size() == 1,
               "chat template {}: the {} tokenizer has no token '{}' (it needs a Hugging Face tokenizer.json "
               "with the template's special tokens; --tokenizer hf)", chat_template_name(t), tok.kind(), s);
}

ChatTokens tokenize_chat(const Tokenizer& tok, const RenderedChat& chat) {
  ChatTokens out;
  out.ids = tok.encode(chat.text);
  out.in_loss.resize(out.ids.size(), 0);
  size_t at = 0, span = 0;  // byte offset of the token; the first loss range not yet passed
  for (size_t i = 0; i < out.ids.size(); ++i) {
    const size_t end = at + tok.decode(std::span<const int32_t>(&out.ids[i], 1)).size();
    while (span < chat.loss_bytes.size() && chat.loss_bytes[span].second <= at) ++span;
    out.in_loss[i] = span < chat.loss_bytes.size() && chat.loss_bytes[span].first < end ? 1 : 0;
    at = end;
  }
  KILN_CHECK(at == chat.text.size(), "chat: the {} tokenizer's ids do not decode to the rendered text "
             "({} bytes, not {})", tok.kind(), at, chat.text.size());
  return out;
}

}  // namespace kiln::data
