#include "eval/eval.h"

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "data/loader.h"
#include "data/utf8.h"
#include "model_io/lora_io.h"
#include "model_io/model_io.h"
#include "models/capabilities.h"
#include "models/hf_formats.h"
#include "models/registry.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

namespace kiln {

namespace fs = std::filesystem;

ScoringModel load_scoring_model(const fs::path& path, Backend& backend,
                                const std::string& lora_base) {
  KILN_CHECK(fs::is_directory(path), "{}: not a checkpoint directory or a Hugging Face folder", path.string());
  ScoringModel s;
  KILN_CHECK(lora_base.empty() || !is_hf_folder(path), "{}: a Hugging Face folder: --lora-base "
             "applies to a LoRA checkpoint", path.string());
  if (is_hf_folder(path)) {
    const ModelOptions options = hf_folder_options(path);
    s.model = make_model(options, backend);
    load_weights_into(*s.model, options, path);
    if (fs::exists(path / "tokenizer.json")) s.tokenizer = data::load_hf_tokenizer(path / "tokenizer.json");
  } else {
    checkpoint::CheckpointReader reader(path);
    CheckpointModel m = load_checkpoint_model(reader, backend, false, lora_base);  // LoRA: base + adapters
    s.lora = std::move(m.lora);
    s.model = std::move(m.model);
    s.tokenizer = load_checkpoint_tokenizer(reader);
  }
  as_language_model(*s.model, path.string());
  s.model->set_dropout(false, 0, 0);
  return s;
}

namespace {

// One forward of tokens and targets int32 [B, T] (host): the loss sum and target count.
LossSum forward_loss(Model& model, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int B,
                     int T) {
  Backend& be = model.backend();
  Tensor tok = be.empty(Shape{B, T}, DType::I32, MemCategory::Temporaries);
  Tensor tgt = be.empty(Shape{B, T}, DType::I32, MemCategory::Temporaries);
  be.copy_from_host(be.default_stream(), tok, tokens.data());
  be.copy_from_host(be.default_stream(), tgt, targets.data());
  return model.forward(Batch::of_tokens(tok, tgt), 0.f);
}

}  // namespace

PerplexityResult evaluate_perplexity(Model& model, const fs::path& data, const std::string& split, int seq_len,
                                     int micro_batch, int64_t max_samples, const data::Tokenizer* tokenizer) {
  const LanguageModel& lm = as_language_model(model, "eval");
  KILN_CHECK(seq_len >= 1 && seq_len <= lm.max_positions(), "eval: seq_len {} outside [1, {}] (the model's context)",
             seq_len, lm.max_positions());
  KILN_CHECK(micro_batch >= 1, "eval: micro_batch {} < 1", micro_batch);
  data::DataLoader loader(data, split, seq_len, 0, /*shuffle=*/false);
  KILN_CHECK(loader.meta().vocab_size <= lm.vocab_size(), "{}: a vocabulary of {} ids, the model's has {}",
             data.string(), loader.meta().vocab_size, lm.vocab_size());
  KILN_CHECK(tokenizer == nullptr || tokenizer->hash() == loader.meta().tokenizer_hash,
             "{}: prepared with another tokenizer ({} {}) than the model's ({} {})", data.string(),
             loader.meta().tokenizer_kind, loader.meta().tokenizer_hash, tokenizer ? tokenizer->kind() : "",
             tokenizer ? tokenizer->hash() : "");
  PerplexityResult r{data.string(), split, seq_len};
  r.samples = max_samples > 0 ? std::min(max_samples, loader.samples_per_epoch()) : loader.samples_per_epoch();
  const int T = seq_len;
  double sum = 0;
  for (int64_t first = 0; first < r.samples; first += micro_batch) {
    const int B = static_cast<int>(std::min<int64_t>(micro_batch, r.samples - first));
    std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
    for (int b = 0; b < B; ++b) {
      const auto at = static_cast<size_t>(b) * static_cast<size_t>(T);
      loader.read_pair(first + b, &tokens[at], &targets[at]);
    }
    const LossSum l = forward_loss(model, tokens, targets, B, T);
    sum += l.sum;
    r.targets += l.targets;
  }
  KILN_CHECK(r.targets > 0, "{}: split '{}' has no token to score", data.string(), split);
  r.loss = sum / static_cast<double>(r.targets);
  r.perplexity = std::exp(r.loss);
  return r;
}

double continuation_loglik(Model& model, std::span<const int32_t> context, std::span<const int32_t> continuation) {
  KILN_CHECK(!context.empty(), "eval: an empty context (it holds the separator at least)");
  if (continuation.empty()) return 0.0;
  const int max_len = as_language_model(model, "eval").max_positions();
  std::vector<int32_t> seq(context.begin(), context.end());
  seq.insert(seq.end(), continuation.begin(), continuation.end());
  // Inputs are all but the last token; targets the next tokens, scored on the continuation.
  const size_t drop = seq.size() - 1 > static_cast<size_t>(max_len) ? seq.size() - 1 - static_cast<size_t>(max_len) : 0;
  KILN_CHECK(continuation.size() <= static_cast<size_t>(max_len), "eval: a choice of {} tokens, the model's context "
             "is {}", continuation.size(), max_len);
  const auto T = static_cast<int>(seq.size() - 1 - drop);
  std::vector<int32_t> tokens(seq.begin() + static_cast<long>(drop), seq.end() - 1);
  std::vector<int32_t> targets(static_cast<size_t>(T), -1);
  const size_t first = static_cast<size_t>(T) - continuation.size();  // the target of the first choice token
  for (size_t i = 0; i < continuation.size(); ++i) targets[first + i] = continuation[i];
  return -forward_loss(model, tokens, targets, 1, T).sum;
}

MultipleChoiceResult evaluate_multiple_choice(Model& model, const data::Tokenizer& tok, const fs::path& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "{}: cannot open for reading", path.string());
  const int max_len = as_language_model(model, "eval").max_positions();
  MultipleChoiceResult r{path.string()};
  int64_t right = 0, right_norm = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path.string(), line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      KILN_FAIL("{}: invalid JSON ({})", where, e.what());
    }
    KILN_CHECK(j.is_object() && j.contains("context") && j["context"].is_string() && j.contains("choices") &&
                   j["choices"].is_array() && !j["choices"].empty() && j.contains("label") &&
                   j["label"].is_number_integer(),
               "{}: expected {{\"context\": string, \"choices\": [string, ...], \"label\": integer}}", where);
    const int64_t label = j["label"].get<int64_t>();
    KILN_CHECK(label >= 0 && label < static_cast<int64_t>(j["choices"].size()), "{}: label {} outside the {} choices",
               where, label, j["choices"].size());
    std::vector<int32_t> context{tok.eot_id()};
    for (int32_t id : tok.encode(j["context"].get<std::string>())) context.push_back(id);
    double best = -INFINITY, best_norm = -INFINITY;
    int64_t pick = -1, pick_norm = -1;
    for (size_t c = 0; c < j["choices"].size(); ++c) {
      KILN_CHECK(j["choices"][c].is_string(), "{}: choices[{}] is not a string", where, c);
      const std::string choice = j["choices"][c].get<std::string>();
      const std::vector<int32_t> ids = tok.encode(choice);
      KILN_CHECK(!ids.empty(), "{}: choices[{}] is empty", where, c);
      KILN_CHECK(ids.size() <= static_cast<size_t>(max_len), "{}: choices[{}] has {} tokens, the model's context is {}",
                 where, c, ids.size(), max_len);
      const double ll = continuation_loglik(model, context, ids);
      size_t chars = 0;
      for (size_t i = 0; i < choice.size(); ++chars) data::utf8_next(choice, i);
      const double per_char = ll / static_cast<double>(chars);
      if (ll > best) best = ll, pick = static_cast<int64_t>(c);
      if (per_char > best_norm) best_norm = per_char, pick_norm = static_cast<int64_t>(c);
    }
    right += pick == label;
    right_norm += pick_norm == label;
    ++r.examples;
  }
  KILN_CHECK(r.examples > 0, "{}: no multiple-choice record", path.string());
  r.acc = static_cast<double>(right) / static_cast<double>(r.examples);
  r.acc_norm = static_cast<double>(right_norm) / static_cast<double>(r.examples);
  return r;
}

nlohmann::json to_json(const PerplexityResult& r) {
  return {{"data", r.data}, {"split", r.split}, {"seq_len", r.seq_len}, {"samples", r.samples},
          {"targets", r.targets}, {"loss", r.loss}, {"perplexity", r.perplexity}};
}

nlohmann::json to_json(const MultipleChoiceResult& r) {
  return {{"file", r.file}, {"examples", r.examples}, {"acc", r.acc}, {"acc_norm", r.acc_norm}};
}

}  // namespace kiln
