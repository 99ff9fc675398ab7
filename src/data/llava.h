// Image-text pairs in LLaVA's format (Liu et al. 2023, "Visual Instruction Tuning": the
// files of its data releases, e.g. llava_instruct_150k.json), as `kiln prepare` will read
// them for a vision-language model (docs/data.md):
//
//   {"id": "000000033471", "image": "coco/train2017/000000033471.png",
//    "conversations": [{"from": "human", "value": "<image>\nWhat are the colors of the bus?"},
//                      {"from": "gpt", "value": "The bus is white and red."}, ...]}
//
// A file is a JSON array of such records (LLaVA's own files) or JSONL (one per line).
// "image" is a path relative to the image folder; a record without it is text only. The
// turns alternate "human" and "gpt", the human first and a gpt one last (so at least one
// gives the loss something to learn); a record with an image holds exactly one "<image>" (where
// the image's tokens go), in a human turn, and one without holds none. Other keys are
// ignored. The turns become chat messages: human -> "user", gpt -> "assistant".
#pragma once

#include "data/chat.h"
#include "data/image_shard.h"
#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

/// Where the image's tokens go in a record's text.
inline constexpr const char* kImageToken = "<image>";

/// One record, or (error not empty) why it is bad, in words for a report such as
/// "pairs.json[17] (id 000000033471): ...".
struct LlavaRecord {
  std::string id;     // its "id" as text (a number's digits); "" when absent
  std::string image;  // its "image" path, relative to the image folder; "" for text only
  std::vector<ChatMessage> messages;  // its turns in order, as chat messages
  /// Its "kinds" when that is a list of strings (kiln scenes' question kinds, one per gpt
  /// turn: kiln eval --llava reports by them); else empty.
  std::vector<std::string> kinds;
  std::string error;
};

/// Checks and converts one record (the rules above): not an object, an "id" or "image"
/// that is not a string (or a number, for the id), an empty "image", no "conversations"
/// list, a turn that is not {"from": string, "value": string}, a "from" other than human
/// or gpt, turns that do not alternate from a human one, no gpt turn or a last human one,
/// and the "<image>"
/// count (one, in a human turn, with an image; none without). Never throws.
LlavaRecord parse_llava_record(const nlohmann::json& record);

/// LLaVA-1.5's conversation format (its "vicuna_v1" template), with any kiln tokenizer:
///   kLlavaSystem " USER: " q1 " ASSISTANT: " a1 <eot> "USER: " q2 " ASSISTANT: " a2 <eot> ...
/// (as LLaVA's SeparatorStyle.TWO joins the turns: " " after a question, "</s>" after an
/// answer) where <eot> is the tokenizer's end-of-text id (LLaVA's "</s>") and each q holds its
/// record's "<image>" at most once. Each piece is tokenized on its own (so a token never
/// spans two pieces, nor the image), the text before the image apart from the text after
/// it (which keeps the newline LLaVA's files put after "<image>", as LLaVA's
/// tokenizer_image_token does).
inline constexpr const char* kLlavaSystem =
    "A chat between a curious human and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the human's questions.";

/// The pieces of a good record's conversation in the format above, in order: prompt text
/// (the system sentence, role markers, questions), where the image goes, each answer's
/// text and the end-of-text after it. tokenize_llava tokenizes each piece on its own;
/// kiln prepare trains a SentencePiece tokenizer on their text. Throws as tokenize_llava.
enum class LlavaPiece { Prompt, Image, Answer, EndOfText };
using LlavaPieceVisitor = std::function<void(LlavaPiece kind, std::string_view text)>;
void for_each_llava_piece(const LlavaRecord& record, const LlavaPieceVisitor& visit);

/// A good record's tokens (parse_llava_record without error), as above: `ids` without the
/// image, `image_at` the number of ids before it (-1: text only; the model puts the image's
/// tokens there), and `in_loss` per id: each answer's tokens and the <eot> closing it (the
/// loss learns to answer and to stop), nothing else; an image shard's caption
/// (data/image_shard.h). A message whose role is neither user nor assistant throws
/// kiln::Error (a record parse_llava_record refused).
CaptionTokens tokenize_llava(const Tokenizer& tok, const LlavaRecord& record);

/// The answers of a record's tokens (tokenize_llava's): [begin, end) of each run of loss
/// ids, in order (an answer's text and the end-of-text closing it). The ids before an
/// answer's begin are the prompt a model answers it from (LLaVA's multi-turn evaluation:
/// the earlier turns as the record has them).
std::vector<std::pair<size_t, size_t>> llava_answers(const CaptionTokens& tokens);

/// The text an answer's piece holds: " " + the answer (the separator after "ASSISTANT:").
std::string answer_text(std::string_view answer);

/// The caption a text-to-image model reads for `text` (kiln sample-images --prompt), laid
/// out as a record's last answer is, which such a model trains on (train/image_data.h):
/// the answer piece's ids and the end-of-text id. An empty text is the empty caption (no
/// ids), the null caption of classifier-free guidance. Characters the tokenizer never saw
/// become what it makes of them (SentencePiece: byte pieces), which the model has
/// rarely or never read.
std::vector<int32_t> llava_caption(const Tokenizer& tok, std::string_view text);

/// A text-to-image model's caption in a record's tokens (tokenize_llava's): its last
/// answer and the end-of-text closing it, [begin, end) of tokens.ids; nullopt when the
/// record has no answer or does not end with a whole one (kiln prepare cut it at its
/// --caption-tokens slots).
std::optional<std::pair<size_t, size_t>> llava_last_answer(const CaptionTokens& tokens,
                                                           int32_t eot_id);

/// The prompt of one question, as tokenize_llava lays out a one-round record up to its
/// answer: ids and where the image goes (a question without "<image>" gets it first, with
/// the newline after it, as LLaVA's files put it; with_image false: text only, and a
/// "<image>" in it is an error).
CaptionTokens llava_prompt(const Tokenizer& tok, const std::string& question, bool with_image);

/// A record of a file and where it is: "FILE[INDEX]" for a JSON array (0-based, as
/// Python indexes LLaVA's lists), "FILE:LINE" for JSONL (1-based).
struct LlavaEntry {
  std::string where;
  LlavaRecord record;
};

/// Every record of a LLaVA pair file, bad ones with their error (the caller reports or
/// skips them). A file whose first non-blank byte is '[' is one JSON array; otherwise JSONL,
/// where a blank line is skipped and a line that is not JSON is a bad record. Throws
/// kiln::Error naming the file when it cannot be read, an array file is not valid JSON,
/// or it holds no record.
std::vector<LlavaEntry> read_llava_file(const std::filesystem::path& path);

}  // namespace kiln::data
