#include "data/unigram.h"

#include "core/error.h"
#include "data/meta.h"
#include "data/shard.h"

#include <cmath>
#include <vector>

namespace kiln::data {

namespace {
std::vector<int64_t> count_tokens(const std::filesystem::path& dir, const SplitInfo& split,
                                  int vocab) {
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (const auto& s : split.shards) {
    ShardReader r(dir / s.file);
    for (int64_t i = 0; i < r.size(); ++i) {
      const int32_t t = r[i];
      KILN_CHECK(t >= 0 && t < vocab, "{}: token {} outside the vocabulary of {}", s.file, t, vocab);
      ++counts[static_cast<size_t>(t)];
    }
  }
  return counts;
}
}  // namespace

UnigramLoss unigram_val_loss(const std::filesystem::path& dir) {
  const auto meta = read_dataset_meta(dir);
  KILN_CHECK(meta.splits.count("train") && meta.splits.count("val"),
             "{}: needs both a train and a val split", dir.string());
  const auto train = count_tokens(dir, meta.splits.at("train"), meta.vocab_size);
  const auto val = count_tokens(dir, meta.splits.at("val"), meta.vocab_size);
  double total = 0;
  for (int64_t c : train) total += static_cast<double>(c) + 1.0;
  double nll = 0;
  UnigramLoss r;
  for (size_t t = 0; t < val.size(); ++t) {
    if (val[t] == 0) continue;
    nll -= static_cast<double>(val[t]) * std::log((static_cast<double>(train[t]) + 1.0) / total);
    r.tokens += val[t];
  }
  r.nats_per_token = r.tokens > 0 ? nll / static_cast<double>(r.tokens) : 0.0;
  return r;
}

}  // namespace kiln::data
