// `kiln eval`: a language model's perplexity on prepared data sets and its accuracy on
// multiple-choice questions, from a kiln checkpoint or a Hugging Face folder.
//
// Multiple choice (HellaSwag's shape, as lm-evaluation-harness scores it): a JSONL line
// {"context": "...", "choices": ["...", ...], "label": i}. Each choice is scored by the
// log-likelihood of its tokens after the context's, log p(choice | context) =
// sum over its tokens of log softmax(logits)[token]; the prediction is the choice of the
// highest sum ("acc") and of the highest sum per character of its text ("acc_norm",
// characters = Unicode code points, lm-evaluation-harness's acc_norm). The context is
// encoded after the separator (eot_id, as every prepared document starts) and the choice
// on its own, so a choice usually starts with a space (" apple."); sequences longer than
// the model's context lose their oldest context tokens.
#pragma once

#include "backend/backend.h"
#include "data/tokenizer.h"
#include "models/lora_plan.h"
#include "models/model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln {

/// A language model (with its weights) and its tokenizer.
struct ScoringModel {
  std::unique_ptr<LoraPlan> lora;  // a LoRA checkpoint's adapters (outlives the model)
  std::unique_ptr<Model> model;
  std::unique_ptr<data::Tokenizer> tokenizer;  // null when the source has none
};

/// The model at `path`: a kiln checkpoint directory (its tokenizer too) or a Hugging Face
/// folder (config.json, safetensors; its tokenizer.json when present), on `backend`, in
/// fp32 with dropout off; `lora_base`: a LoRA checkpoint's base moved (load_lora_base).
/// Throws kiln::Error naming the path when it is neither, holds no language model, or its
/// weights are missing or corrupt.
ScoringModel load_scoring_model(const std::filesystem::path& path, Backend& backend,
                                const std::string& lora_base = "");

struct PerplexityResult {
  std::string data, split;
  int seq_len = 0;
  int64_t samples = 0;  // sequences scored
  int64_t targets = 0;  // tokens scored (a chat split's: the assistants' only)
  double loss = 0;      // mean nats per scored token
  double perplexity = 0;  // exp(loss)
};

/// Mean loss of `model` over split `split` of the token data set `data`, in samples of
/// `seq_len` tokens taken in order (the loader's, loss spans applied), micro_batch at a
/// time; the first `max_samples` (0: all). Throws kiln::Error naming the data set when it
/// is missing, has no such split, its vocabulary exceeds the model's, or it was prepared
/// with another tokenizer than `tokenizer` (when given: the model's).
PerplexityResult evaluate_perplexity(Model& model, const std::filesystem::path& data, const std::string& split,
                                     int seq_len, int micro_batch, int64_t max_samples,
                                     const data::Tokenizer* tokenizer = nullptr);

/// log p(continuation | context) of `model`: the sum of its tokens' log-probabilities,
/// one forward of context + continuation (the oldest tokens dropped past the model's
/// context). `context` must not be empty.
double continuation_loglik(Model& model, std::span<const int32_t> context, std::span<const int32_t> continuation);

struct MultipleChoiceResult {
  std::string file;
  int64_t examples = 0;
  double acc = 0, acc_norm = 0;  // fractions of examples right (see the top of this file)
};

/// Scores every line of the JSONL file `path` (the top of this file). Throws kiln::Error
/// naming file:line for a line that is not such a record (a label outside the choices, an
/// empty choice list), and when the file holds none.
MultipleChoiceResult evaluate_multiple_choice(Model& model, const data::Tokenizer& tokenizer,
                                              const std::filesystem::path& path);

nlohmann::json to_json(const PerplexityResult& r);
nlohmann::json to_json(const MultipleChoiceResult& r);

}  // namespace kiln
