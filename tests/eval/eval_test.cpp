// kiln eval: perplexity equals the trainer's validation loss, a checkpoint and its Hugging
// Face folder score alike, a continuation's log-likelihood equals the one the KV-cache
// decode path gives, a model that learned the answers picks them, and bad input.
#include "backend/registry.h"
#include "eval/eval.h"
#include "model_io/model_io.h"
#include "models/capabilities.h"
#include "support/error_of.h"
#include "../train/trainer_fixture.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::quiet;
using testing::read_metrics;
using testing::TempDir;
using testing::tiny_config;

const char* kPairs[][2] = {{"red", "apple"}, {"blue", "sky"}, {"green", "grass"}, {"white", "snow"},
                           {"black", "night"}, {"gold", "sun"}};

// Questions with one answer each, in a shuffled order, prepared with the byte tokenizer.
fs::path question_dataset(const fs::path& root) {
  std::mt19937 rng(3);
  std::ofstream out(root / "qa.txt");
  for (int i = 0; i < 900; ++i) {
    const auto& p = kPairs[rng() % 6];
    out << "What is " << p[0] << "? The answer is " << p[1] << ". ";
  }
  out.close();
  data::PrepareOptions o;
  o.inputs = {root / "qa.txt"};
  o.out_dir = root / "qa";
  o.tokenizer = "byte";
  o.val_fraction = 0.1;
  data::prepare_dataset(o);
  return o.out_dir;
}

// A tiny GPT trained on the questions, evaluated on the whole val split at the end.
struct Trained {
  TempDir tmp;
  fs::path data, ckpt;
  double val_loss = 0;
  Trained() {
    data = question_dataset(tmp.path);
    TrainConfig c = tiny_config(data, tmp.path / "run", 600);
    c.model.n_embd = 64;
    c.model.n_head = 4;
    c.model.block_size = 64;
    c.train.micro_batch = 8;
    c.train.global_batch = 8;
    c.train.seq_len = 64;
    c.model.dropout = 0.f;
    c.eval.every = 600;
    c.eval.batches = 1000;  // the whole split
    Trainer(c, quiet()).run();
    val_loss = read_metrics(tmp.path / "run").back()["val_loss"].get<double>();
    ckpt = tmp.path / "run" / "ckpt" / "step_00000600";
  }
};

Trained& trained() {
  static Trained t;
  return t;
}

TEST(Eval, PerplexityIsTheTrainersValLossAndTheHfFolderScoresAlike) {
  auto be = make_backend("cpu");
  ScoringModel s = load_scoring_model(trained().ckpt, *be);
  const PerplexityResult r = evaluate_perplexity(*s.model, trained().data, "val", 64, 3, 0);
  EXPECT_NEAR(r.loss, trained().val_loss, 1e-6 * trained().val_loss);
  EXPECT_NEAR(r.perplexity, std::exp(r.loss), 1e-9);
  EXPECT_EQ(r.targets, r.samples * 64);
  const fs::path hf = trained().tmp.path / "hf";
  ExportOptions eo;
  eo.format = "hf";
  eo.dtype = "fp32";
  export_checkpoint(trained().ckpt, eo, hf);
  ScoringModel h = load_scoring_model(hf, *be);
  EXPECT_NEAR(evaluate_perplexity(*h.model, trained().data, "val", 64, 5, 0).loss, r.loss, 1e-6);
  EXPECT_EQ(evaluate_perplexity(*h.model, trained().data, "val", 32, 2, 3).samples, 3);
  // Data of another tokenizer than the model's: refused, naming the data set.
  data::SentencePieceTrainOptions so;
  so.vocab_size = 260;
  const auto other = data::train_sentencepiece_on_texts(
      [](const std::function<void(std::string_view)>& add) { add("What is red? The answer is apple."); }, so);
  const std::string e = error_of([&] { evaluate_perplexity(*s.model, trained().data, "val", 64, 3, 0, other.get()); });
  EXPECT_NE(e.find("qa: prepared with another tokenizer (byte "), std::string::npos) << e;
  EXPECT_NO_THROW(evaluate_perplexity(*s.model, trained().data, "val", 64, 3, 1, s.tokenizer.get()));
}

// The loss-based log-likelihood against the decode path: token by token through the KV
// cache, log-softmax of the logits in double.
TEST(Eval, ContinuationLogLikelihoodEqualsTheDecodePath) {
  auto be = make_backend("cpu");
  ScoringModel s = load_scoring_model(trained().ckpt, *be);
  LanguageModel& lm = as_language_model(*s.model, "test");
  std::vector<int32_t> ctx = {s.tokenizer->eot_id()};
  for (int32_t id : s.tokenizer->encode("What is gold? The answer is")) ctx.push_back(id);
  const std::vector<int32_t> cont = s.tokenizer->encode(" sun. What");
  const double fast = continuation_loglik(*s.model, ctx, cont);
  lm.begin_decode(1, static_cast<int>(ctx.size() + cont.size()));
  Tensor logits = be->empty(Shape{1, lm.padded_vocab_size()}, DType::F32, MemCategory::Temporaries);
  std::vector<float> host(static_cast<size_t>(lm.padded_vocab_size()));
  std::vector<int32_t> seq = ctx;
  double slow = 0;
  std::vector<int32_t> feed = ctx;
  for (int32_t next : cont) {
    Tensor tok = be->empty(Shape{1, static_cast<int64_t>(feed.size())}, DType::I32, MemCategory::Temporaries);
    be->copy_from_host(be->default_stream(), tok, feed.data());
    lm.decode(tok, logits);
    be->copy_to_host(be->default_stream(), host.data(), logits);
    double mx = -INFINITY, z = 0;
    for (int v = 0; v < lm.vocab_size(); ++v) mx = std::max(mx, static_cast<double>(host[static_cast<size_t>(v)]));
    for (int v = 0; v < lm.vocab_size(); ++v) z += std::exp(host[static_cast<size_t>(v)] - mx);
    slow += host[static_cast<size_t>(next)] - mx - std::log(z);
    feed = {next};
  }
  lm.end_decode();
  EXPECT_NEAR(fast, slow, 1e-4 * std::abs(slow)) << fast << " vs " << slow;
  EXPECT_GT(fast, -5.0);  // it learned the answer: sun. is likely
}

TEST(Eval, MultipleChoicePicksTheLearnedAnswers) {
  auto be = make_backend("cpu");
  ScoringModel s = load_scoring_model(trained().ckpt, *be);
  const fs::path mc = trained().tmp.path / "mc.jsonl";
  {
    std::ofstream f(mc);
    for (const auto& p : kPairs) {
      nlohmann::json choices = nlohmann::json::array();
      int label = 0;
      for (const auto& q : kPairs) {
        if (q[1] == p[1]) label = static_cast<int>(choices.size());
        choices.push_back(std::string(" ") + q[1] + ".");
      }
      f << nlohmann::json({{"context", std::string("What is ") + p[0] + "? The answer is"},
                           {"choices", choices}, {"label", label}}).dump() << "\n";
    }
  }
  const MultipleChoiceResult r = evaluate_multiple_choice(*s.model, *s.tokenizer, mc);
  EXPECT_EQ(r.examples, 6);
  EXPECT_EQ(r.acc, 1.0);
  EXPECT_EQ(r.acc_norm, 1.0);
  // A label outside the choices, and other bad lines: file:line, one line.
  std::ofstream(trained().tmp.path / "bad.jsonl") << "{\"context\": \"a\", \"choices\": [\" b\"], \"label\": 3}\n";
  const std::string e = error_of([&] { evaluate_multiple_choice(*s.model, *s.tokenizer, trained().tmp.path / "bad.jsonl"); });
  EXPECT_NE(e.find("bad.jsonl:1: label 3 outside the 1 choices"), std::string::npos) << e;
  std::ofstream(trained().tmp.path / "bad2.jsonl") << "\n{\"context\": 1}\n";
  EXPECT_NE(error_of([&] { evaluate_multiple_choice(*s.model, *s.tokenizer, trained().tmp.path / "bad2.jsonl"); })
                .find("bad2.jsonl:2: expected {\"context\": string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_scoring_model(trained().tmp.path / "nowhere", *be); }).find("nowhere: not a checkpoint"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
