// The unigram baseline: the loss of a model that ignores context, the floor a language
// model must beat (`kiln unigram`, and the line on `kiln report`'s loss chart).
#pragma once

#include <cstdint>
#include <filesystem>

namespace kiln::data {

struct UnigramLoss {
  double nats_per_token = 0.0;  // cross-entropy on the val split
  int64_t tokens = 0;           // val tokens scored
};

/// Fits a unigram model on the train split of `dir` (a kiln prepare directory: token
/// counts with add-one smoothing over the vocabulary) and returns its cross-entropy on
/// the val split. Throws kiln::Error naming `dir` when it lacks either split, or a shard
/// file when a token lies outside the vocabulary.
UnigramLoss unigram_val_loss(const std::filesystem::path& dir);

}  // namespace kiln::data
