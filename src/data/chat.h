// Chat fine-tuning data: conversations in JSONL rendered by a chat template, with the
// loss on the assistant's turns only (`kiln prepare --format chat`; docs/data.md).
//
// A record: {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
// (other keys ignored). Two templates, as their published Jinja templates render them
// (checked against python3-jinja2 by tests/data/chat_template_test.sh):
//   llama3  Meta's Llama 3 Instruct template (tokenizer_config.json's chat_template):
//           per message "<|start_header_id|>" role "<|end_header_id|>\n\n" content|trim
//           "<|eot_id|>", after the bos token. kiln's document separator is that bos
//           ("<|begin_of_text|>", the hf tokenizer's eot_id), so the rendering here starts at
//           the first header.
//   chatml  ChatML: per message "<|im_start|>" role "\n" content "<|im_end|>\n".
// The loss covers each assistant message's content and its end-of-turn token
// ("<|eot_id|>", "<|im_end|>"), not the headers, the other roles or what follows.
#pragma once

#include "data/tokenizer.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::data {

enum class ChatTemplate : uint8_t { Llama3, ChatML };

/// "llama3" or "chatml"; throws kiln::Error naming the choices otherwise.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate t);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

/// The messages of a JSONL line, or (error not empty) why the line is bad:
/// parse_json_line's reasons, no "messages" list, a message that is not {"role", "content"} strings, a role
/// other than system/user/assistant, or no assistant message (nothing to learn). Never
/// throws.
struct ChatRecord {
  std::vector<ChatMessage> messages;
  std::string error;
};
ChatRecord parse_chat_record(std::string_view line);

/// A rendered conversation: its text and the byte ranges [begin, end) of it in the loss.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> loss_bytes;
};
RenderedChat render_chat(const std::vector<ChatMessage>& messages, ChatTemplate t);

/// Python's str.strip() (what Jinja's trim filter calls): `s` without leading and trailing
/// Unicode whitespace (str.isspace). `s` must be valid UTF-8.
std::string_view python_strip(std::string_view s);

/// Throws kiln::Error unless each of the template's special tokens encodes to one id of
/// `tok` (an hf tokenizer.json that has them as added tokens), naming the token.
void check_chat_tokens(const Tokenizer& tok, ChatTemplate t);

/// The ids of a rendered conversation and whether each is in the loss: a token is when
/// any byte of it lies in a loss range. Offsets come from decoding each id (the bytes of a
/// byte-level tokenizer's ids concatenate to the text).
struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> in_loss;
};
ChatTokens tokenize_chat(const Tokenizer& tok, const RenderedChat& chat);

}  // namespace kiln::data
