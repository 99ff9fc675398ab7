// `kiln eval --llava FILE`: a vision-language model's greedy answers to the questions of a
// LLaVA pair file (data/llava.h), scored by exact match.
//
// Every gpt turn of every record is a question to answer: the model reads the record's
// image and its conversation up to that turn (the earlier answers as the record has them:
// LLaVA's multi-turn evaluation), in LLaVA-1.5's format (tokenize_llava), and decodes
// greedily until the end-of-text id; the answer is right when its ids and the end-of-text
// are the record's exactly. Records may name each turn's kind in a "kinds" list (one per
// gpt turn, as `kiln scenes` writes: "position", "presence", ...; a list of another length
// is an error naming the record); the accuracy is reported per kind ("turn N" for records
// without one) and overall.
#pragma once

#include "data/tokenizer.h"
#include "models/model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln {

struct AnswerTally {
  int64_t questions = 0, right = 0;
  double accuracy() const { return questions ? static_cast<double>(right) / questions : 0.0; }
};

/// One answer, for a report.
struct AnswerExample {
  std::string id, image, kind, question, reference, answer;
  bool right = false;
  bool cut = false;  // stopped at the answer cap (reference + 8 tokens), no end-of-text
};

struct AnswersResult {
  std::string file;
  int64_t records = 0;
  AnswerTally all;
  std::map<std::string, AnswerTally> by_kind;
  std::vector<AnswerExample> examples;  // the first `examples` records' answers
};

struct AnswersOptions {
  std::filesystem::path images;  // image paths' folder; empty: the pair file's own
  int64_t max_records = 0;       // 0: every record
  int examples = 0;              // records whose answers are kept as AnswerExample
};

/// Answers every question of the pair file `path` (the top of this file) with `model`, a
/// vision-language model whose tokenizer is `tokenizer`. Throws kiln::Error naming the
/// file and record for a bad record (data/llava.h's reasons, a missing image), a prompt
/// longer than the model's context, or a model that reads no image.
AnswersResult evaluate_answers(Model& model, const data::Tokenizer& tokenizer,
                               const std::filesystem::path& path, const AnswersOptions& options);

nlohmann::json to_json(const AnswersResult& r);

}  // namespace kiln
