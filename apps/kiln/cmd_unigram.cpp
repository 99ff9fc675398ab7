// kiln unigram --data DIR: the baseline a language model must beat. Fits a unigram
// model on the train split (counts with add-one smoothing over the vocabulary) and
// prints its cross-entropy on the val split in nats per token, the loss of a model that
// ignores context.
#include "apps/kiln/commands.h"
#include "core/error.h"
#include "data/meta.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

namespace kiln::app {

namespace {
std::vector<int64_t> count_tokens(const std::filesystem::path& dir, const data::SplitInfo& split,
                                  int vocab) {
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (const auto& s : split.shards) {
    data::ShardReader r(dir / s.file);
    for (int64_t i = 0; i < r.size(); ++i) {
      const int32_t t = r[i];
      KILN_CHECK(t >= 0 && t < vocab, "{}: token {} outside the vocabulary of {}", s.file, t, vocab);
      ++counts[static_cast<size_t>(t)];
    }
  }
  return counts;
}
}  // namespace

void register_unigram(CLI::App& app) {
  auto* cmd = app.add_subcommand("unigram", "Cross-entropy of a unigram model (val split), nats/token");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--data", *dir, "A directory written by kiln prepare")->required();
  cmd->callback([dir] {
    const auto meta = data::read_dataset_meta(*dir);
    KILN_CHECK(meta.splits.count("train") && meta.splits.count("val"),
               "{}: needs both a train and a val split", *dir);
    const auto train = count_tokens(*dir, meta.splits.at("train"), meta.vocab_size);
    const auto val = count_tokens(*dir, meta.splits.at("val"), meta.vocab_size);
    double total = 0;
    for (int64_t c : train) total += static_cast<double>(c) + 1.0;
    double nll = 0;
    int64_t n = 0;
    for (size_t t = 0; t < val.size(); ++t) {
      if (val[t] == 0) continue;
      nll -= static_cast<double>(val[t]) * std::log((static_cast<double>(train[t]) + 1.0) / total);
      n += val[t];
    }
    fmt::print("unigram val loss: {:.4f} nats/token over {} tokens\n", nll / static_cast<double>(n), n);
  });
}

}  // namespace kiln::app
