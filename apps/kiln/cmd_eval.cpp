#include "apps/kiln/commands.h"
#include "checkpoint/file_util.h"
#include "core/error.h"
#include "eval/answers.h"
#include "eval/eval.h"
#include "models/capabilities.h"
#include "train/device.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>


namespace kiln::app {

namespace {

// `text` with its newlines as spaces (a question holds "<image>\n").
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

void register_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "Score a language model: perplexity on prepared data sets, accuracy on multiple-choice JSONL, "
      "or a vision-language model's answers to LLaVA pair files");
  struct Args {
    std::string model, split = "val", json, device = "cpu", lora_base;
    std::vector<std::string> data, mc, llava;
    int seq_len = 0, micro_batch = 4;
    int64_t max_samples = 0;
    AnswersOptions answers;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model", a->model, "A checkpoint directory (ckpt/step_XXXXXXXX) or a Hugging Face folder")
      ->required();
  cmd->add_option("--data", a->data, "Prepared token data sets to score (perplexity; repeatable)");
  cmd->add_option("--split", a->split, "Their split (default val)");
  cmd->add_option("--seq-len", a->seq_len, "Tokens per scored sequence (default: the model's context)")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--micro-batch", a->micro_batch, "Sequences per forward (default 4)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-samples", a->max_samples, "Score at most this many sequences per data set (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--mc", a->mc, "Multiple-choice JSONL files ({\"context\", \"choices\", \"label\"}; repeatable)");
  cmd->add_option("--llava", a->llava, "LLaVA pair files (JSON or JSONL): each answer decoded greedily from "
                  "the image and the conversation before it, scored by exact match, per kind (repeatable)");
  cmd->add_option("--images", a->answers.images, "The folder of --llava's image paths (default: each file's own)");
  cmd->add_option("--max-records", a->answers.max_records, "Answer at most this many records per --llava file (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--examples", a->answers.examples, "Print the answers of this many records per --llava file")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--json", a->json, "Also write the results as JSON to this file");
  cmd->add_option("--lora-base", a->lora_base,
                  "A LoRA checkpoint's base where it is now (default: where it was trained)");
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([a] {
    KILN_CHECK(!a->data.empty() || !a->mc.empty() || !a->llava.empty(),
               "eval: nothing to score (give --data, --mc and/or --llava)");
    if (!a->json.empty()) {  // checked before the scoring, which may take long
      const std::filesystem::path parent = std::filesystem::path(a->json).parent_path();
      KILN_CHECK(parent.empty() || std::filesystem::is_directory(parent),
                 "eval: --json {}: the folder {} does not exist", a->json, parent.string());
      KILN_CHECK(!std::filesystem::is_directory(a->json), "eval: --json {} is a folder", a->json);
    }
    auto backend = make_device_backend(a->device);
    ScoringModel s = load_scoring_model(a->model, *backend, a->lora_base);
    const int context = as_language_model(*s.model, "eval").max_positions();
    nlohmann::json out = {{"model", a->model}, {"perplexity", nlohmann::json::array()},
                          {"multiple_choice", nlohmann::json::array()}, {"answers", nlohmann::json::array()}};
    for (const auto& d : a->data) {
      const PerplexityResult r = evaluate_perplexity(*s.model, d, a->split, a->seq_len > 0 ? a->seq_len : context,
                                                     a->micro_batch, a->max_samples, s.tokenizer.get());
      fmt::print("{} ({}): loss {:.4f}, perplexity {:.3f} over {} tokens in {} sequences of {}\n", r.data, r.split,
                 r.loss, r.perplexity, r.targets, r.samples, r.seq_len);
      out["perplexity"].push_back(to_json(r));
    }
    for (const auto& f : a->mc) {
      KILN_CHECK(s.tokenizer != nullptr, "eval --mc: {} has no tokenizer (a Hugging Face folder needs its "
                 "tokenizer.json)", a->model);
      const MultipleChoiceResult r = evaluate_multiple_choice(*s.model, *s.tokenizer, f);
      fmt::print("{}: accuracy {:.4f} (length-normalised {:.4f}) over {} questions\n", r.file, r.acc, r.acc_norm,
                 r.examples);
      out["multiple_choice"].push_back(to_json(r));
    }
    for (const auto& f : a->llava) {
      KILN_CHECK(s.tokenizer != nullptr, "eval --llava: {} has no tokenizer", a->model);
      const AnswersResult r = evaluate_answers(*s.model, *s.tokenizer, f, a->answers);
      for (const AnswerExample& x : r.examples)
        fmt::print("{} [{}] {} -> {}{}{}\n", x.id, x.kind, one_line(x.question), x.answer,
                   x.cut ? " [cut at the answer cap]" : "",
                   x.right ? "" : fmt::format("  (expected: {})", x.reference));
      fmt::print("{}: exact-match accuracy {:.4f} over {} answers of {} records\n", r.file, r.all.accuracy(),
                 r.all.questions, r.records);
      for (const auto& [kind, t] : r.by_kind)
        fmt::print("  {:<12} {:.4f} ({} of {})\n", kind, t.accuracy(), t.right, t.questions);
      out["answers"].push_back(to_json(r));
    }
    if (!a->json.empty()) checkpoint::detail::atomic_write_file(a->json, out.dump(2) + "\n");
  });
}

}  // namespace kiln::app
