#include "apps/kiln/commands.h"
#include "checkpoint/file_util.h"
#include "core/error.h"
#include "eval/eval.h"
#include "models/capabilities.h"
#include "train/device.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>


namespace kiln::app {

void register_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "Score a language model: perplexity on prepared data sets, accuracy on multiple-choice JSONL");
  struct Args {
    std::string model, split = "val", json, device = "cpu", lora_base;
    std::vector<std::string> data, mc;
    int seq_len = 0, micro_batch = 4;
    int64_t max_samples = 0;
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
  cmd->add_option("--json", a->json, "Also write the results as JSON to this file");
  cmd->add_option("--lora-base", a->lora_base,
                  "A LoRA checkpoint's base where it is now (default: where it was trained)");
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([a] {
    KILN_CHECK(!a->data.empty() || !a->mc.empty(), "eval: nothing to score (give --data and/or --mc)");
    auto backend = make_device_backend(a->device);
    ScoringModel s = load_scoring_model(a->model, *backend, a->lora_base);
    const int context = as_language_model(*s.model, "eval").max_positions();
    nlohmann::json out = {{"model", a->model}, {"perplexity", nlohmann::json::array()},
                          {"multiple_choice", nlohmann::json::array()}};
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
    if (!a->json.empty()) checkpoint::detail::atomic_write_file(a->json, out.dump(2) + "\n");
  });
}

}  // namespace kiln::app
