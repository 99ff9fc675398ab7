#include "eval/answers.h"

#include "core/error.h"
#include "data/llava.h"
#include "data/pair_dataset.h"
#include "sampling/sampler.h"

#include <fmt/format.h>

namespace kiln {

namespace {

// The kind of gpt turn `turn` of a record: its "kinds" entry, else "turn N" (1-based).
std::string kind_of(const data::LlavaRecord& record, size_t turn) {
  if (turn < record.kinds.size()) return record.kinds[turn];
  return fmt::format("turn {}", turn + 1);
}

}  // namespace

AnswersResult evaluate_answers(Model& model, const data::Tokenizer& tok,
                               const std::filesystem::path& path, const AnswersOptions& o) {
  const VisionLanguageModel& vlm = as_vision_language_model(model, "eval --llava");
  const Shape image = vlm.image_shape();
  const data::ImageShape shape{static_cast<int>(image[0]), static_cast<int>(image[1]),
                               static_cast<int>(image[2])};
  const std::filesystem::path folder = o.images.empty() ? path.parent_path() : o.images;
  const std::vector<data::LlavaEntry> entries = data::read_llava_file(path);
  AnswersResult r;
  r.file = path.string();
  for (const data::LlavaEntry& e : entries) {
    if (o.max_records > 0 && r.records >= o.max_records) break;
    KILN_CHECK(e.record.error.empty(), "{}: {}", e.where, e.record.error);
    ImagePrompt prompt_image;
    if (!e.record.image.empty()) {
      std::vector<uint8_t> px;
      try {
        px = data::read_image_as(folder / e.record.image, shape);
      } catch (const Error& err) {
        KILN_FAIL("{} (id {}): {}", e.where, e.record.id, err.what());
      }
      prompt_image.pixels.resize(px.size());
      data::scale_pixels(px, prompt_image.pixels.data());
    }
    const data::CaptionTokens t = data::tokenize_llava(tok, e.record);
    const auto answers = data::llava_answers(t);
    KILN_CHECK(e.record.kinds.empty() || e.record.kinds.size() == answers.size(),
               "{} (id {}): \"kinds\" has {} entries for its {} gpt turns", e.where,
               e.record.id, e.record.kinds.size(), answers.size());
    std::vector<std::string> questions, references;
    for (const data::ChatMessage& m : e.record.messages)
      (m.role == "user" ? questions : references).push_back(m.content);
    for (size_t j = 0; j < answers.size(); ++j) {
      const auto [begin, end] = answers[j];
      const std::vector<int32_t> prompt(t.ids.begin(), t.ids.begin() + static_cast<int64_t>(begin));
      const std::vector<int32_t> want(t.ids.begin() + static_cast<int64_t>(begin),
                                      t.ids.begin() + static_cast<int64_t>(end));
      SampleOptions so;
      so.temperature = 0.f;
      so.stop_token = tok.eot_id();
      so.max_new_tokens = static_cast<int>(want.size()) + 8;
      prompt_image.image_at = static_cast<int>(t.image_at);
      std::vector<int32_t> got;
      try {
        got = sample_tokens(model, prompt, so, prompt_image.pixels.empty() ? nullptr : &prompt_image);
      } catch (const Error& err) {
        KILN_FAIL("{} (answer {}): {}", e.where, j + 1, err.what());
      }
      const bool right = got == want;
      const std::string kind = kind_of(e.record, j);
      for (AnswerTally* tally : {&r.all, &r.by_kind[kind]}) {
        ++tally->questions;
        tally->right += right ? 1 : 0;
      }
      if (r.records < o.examples) {
        const bool cut = got.empty() || got.back() != tok.eot_id();
        if (!cut) got.pop_back();
        std::string answer = tok.decode(got);
        if (answer.starts_with(' ')) answer.erase(0, 1);  // the space after "ASSISTANT:"
        r.examples.push_back({e.record.id, e.record.image, kind, questions.at(j),
                              references.at(j), answer, right, cut});
      }
    }
    ++r.records;
  }
  KILN_CHECK(r.all.questions > 0, "{}: no question to answer", path.string());
  return r;
}

nlohmann::json to_json(const AnswersResult& r) {
  nlohmann::json kinds = nlohmann::json::object();
  for (const auto& [kind, t] : r.by_kind)
    kinds[kind] = {{"questions", t.questions}, {"right", t.right}, {"accuracy", t.accuracy()}};
  nlohmann::json examples = nlohmann::json::array();
  for (const AnswerExample& x : r.examples)
    examples.push_back({{"id", x.id}, {"image", x.image}, {"kind", x.kind},
                        {"question", x.question}, {"reference", x.reference},
                        {"answer", x.answer}, {"right", x.right}, {"cut", x.cut}});
  return {{"file", r.file},        {"records", r.records},
          {"questions", r.all.questions}, {"right", r.all.right},
          {"accuracy", r.all.accuracy()}, {"by_kind", kinds},
          {"examples", examples}};
}

}  // namespace kiln
