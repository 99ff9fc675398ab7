// DataLoader: fixed-length training samples from a prepared dataset (see prepare.h).
//
// The split's shards, in meta.json order, are one token stream of N tokens. Sample i is
// tokens [i*T, i*T + T + 1): inputs = the first T, targets = the last T (shifted by one),
// as in llm.c. samples_per_epoch = (N - 1) / T; a tail shorter than a sample is unused.
// A split with loss spans (chat data) ignores the targets outside them (-1).
//
// Order and data parallelism: data/visit_order.h (a per-epoch Philox permutation when
// shuffling; rank r of dp takes its micro_batch of each global batch's positions; the
// position (epoch, index) is independent of dp_size).
#pragma once

#include "data/meta.h"
#include "data/shard.h"
#include "data/visit_order.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::data {

class DataLoader {
 public:
  /// Opens split `split` ("train", "val") of the dataset in `dir`. Throws kiln::Error
  /// naming the file when: dir or meta.json is missing/malformed; the split is absent; a
  /// shard is missing, corrupt, holds a different token count than meta.json says, or a
  /// different token dtype (a shard of another vocabulary); the split has fewer than
  /// seq_len + 1 tokens (not even one sample); seq_len < 1.
  /// With `documents` it also reads the split's document index (data/packing.h), and
  /// throws kiln::Error naming meta.json when the split has none.
  DataLoader(const std::filesystem::path& dir, std::string split, int seq_len, uint64_t seed,
             bool shuffle, bool documents = false);

  /// Fills inputs[micro_batch * T] and targets[micro_batch * T] (row-major [B, T], int32)
  /// with this rank's micro_batch samples of the next global batch, then advances by
  /// micro_batch * dp_size samples (crossing into the next epoch when needed). Throws
  /// kiln::Error on bad arguments or a token id >= vocab_size (file and position named).
  /// With `starts` (a loader opened with documents), each sample's document starts too
  /// (read_pair).
  void next_batch(int32_t* inputs, int32_t* targets, int micro_batch, int dp_rank = 0, int dp_size = 1,
                  std::vector<std::vector<int32_t>>* starts = nullptr);

  /// Tokens of sample `sample` (0 <= sample < samples_per_epoch()), T + 1 of them, into out.
  void read_sample(int64_t sample, int32_t* out) const;
  /// Sample `sample` as the model takes it: inputs[T] its first T tokens, targets[T] the
  /// last T; with loss spans (chat data, position_index.h) every target outside them is
  /// -1 (ignored by the loss). With `starts` (a loader opened with documents): where
  /// documents start in the sample, ascending in [0, T), 0 first (data/packing.h).
  void read_pair(int64_t sample, int32_t* inputs, int32_t* targets,
                 std::vector<int32_t>* starts = nullptr);
  /// The sample visited at position `index` of epoch `epoch`.
  int64_t sample_at(int64_t epoch, int64_t index) { return order_.sample_at(epoch, index); }

  LoaderState state() const { return order_.state(); }
  /// Resumes at `s`. Throws kiln::Error when s.index is outside [0, samples_per_epoch()).
  void set_state(const LoaderState& s) { order_.set_state(s); }

  int64_t samples_per_epoch() const { return samples_; }
  int64_t total_tokens() const { return total_; }
  int seq_len() const { return T_; }
  const std::string& split() const { return split_; }
  /// The parsed meta.json of the dataset (vocab size, eot id, tokenizer, shards).
  const DatasetMeta& meta() const { return meta_; }

 private:
  DatasetMeta meta_;
  std::string split_;
  int T_;
  std::vector<ShardReader> shards_;
  std::vector<int64_t> starts_;  // stream offset of each shard, plus the total at the end
  bool has_loss_spans_ = false;
  std::vector<int64_t> loss_bounds_;  // the split's loss spans: begin0 end0 begin1 end1 ...
  std::vector<int64_t> doc_starts_;   // the split's document starts (opened with documents)
  bool documents_ = false;
  std::vector<int32_t> row_;          // read_pair's T + 1 tokens
  int64_t total_ = 0;
  int64_t samples_ = 0;
  VisitOrder order_;
};

}  // namespace kiln::data
