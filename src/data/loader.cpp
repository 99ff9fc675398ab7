#include "data/loader.h"

#include "core/error.h"
#include "data/position_index.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::data {

namespace fs = std::filesystem;

DataLoader::DataLoader(const fs::path& dir, std::string split, int seq_len, uint64_t seed, bool shuffle,
                       bool documents)
    : split_(std::move(split)), T_(seq_len), documents_(documents) {
  KILN_CHECK(seq_len >= 1, "data loader: seq_len {} < 1", seq_len);
  meta_ = read_dataset_meta(dir);
  const auto it = meta_.splits.find(split_);
  KILN_CHECK(it != meta_.splits.end(), "{}: no '{}' split", (dir / "meta.json").string(), split_);
  for (const auto& s : it->second.shards) {
    const fs::path p = dir / s.file;
    KILN_CHECK(fs::exists(p), "{}: missing shard listed in meta.json", p.string());
    ShardReader r(p);
    KILN_CHECK(r.size() == s.tokens, "{}: {} tokens but meta.json says {}", p.string(), r.size(), s.tokens);
    KILN_CHECK(r.dtype() == meta_.dtype(),
               "{}: {} tokens but meta.json says {} (a shard of another vocabulary?)", p.string(),
               token_dtype_name(r.dtype()), token_dtype_name(meta_.dtype()));
    KILN_CHECK(r.format() == meta_.format, "{}: shard version {} but meta.json says shard_version {}", p.string(),
               shard_version(r.format()), shard_version(meta_.format));
    starts_.push_back(total_);
    total_ += r.size();
    shards_.push_back(std::move(r));
  }
  starts_.push_back(total_);
  if (const IndexFileInfo& loss = it->second.loss_index; !loss.file.empty())
    loss_bounds_ = read_position_index(dir / loss.file, PositionIndexKind::LossSpans, total_, loss.count);
  has_loss_spans_ = !it->second.loss_index.file.empty();
  if (documents) {
    const IndexFileInfo& docs = it->second.doc_index;
    KILN_CHECK(!docs.file.empty(), "{}: split '{}' has no document index, which data.packing = "
               "\"document\" needs (prepare the data set again with kiln prepare)",
               (dir / "meta.json").string(), split_);
    doc_starts_ = read_position_index(dir / docs.file, PositionIndexKind::DocumentStarts, total_, docs.count);
  }
  samples_ = total_ > 0 ? (total_ - 1) / T_ : 0;
  KILN_CHECK(samples_ >= 1, "{}: split '{}' has {} tokens, too few for one sample of seq_len {} (needs {})",
             dir.string(), split_, total_, T_, static_cast<int64_t>(T_) + 1);
  order_ = VisitOrder(samples_, seed, shuffle, fmt::format("{} split '{}'", dir.string(), split_));
}

void DataLoader::read_sample(int64_t sample, int32_t* out) const {
  KILN_CHECK(sample >= 0 && sample < samples_, "data loader: sample {} outside [0, {})", sample, samples_);
  int64_t pos = sample * T_;
  int64_t left = static_cast<int64_t>(T_) + 1;
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
  while (left > 0) {
    const ShardReader& r = shards_[k];
    const int64_t local = pos - starts_[k];
    const int64_t n = std::min(left, r.size() - local);
    r.read(local, n, out, meta_.vocab_size);  // every id checked, with file and position
    out += n;
    pos += n;
    left -= n;
    ++k;
  }
}

void DataLoader::read_pair(int64_t sample, int32_t* inputs, int32_t* targets,
                           std::vector<int32_t>* starts) {
  const int64_t T = T_;
  row_.resize(static_cast<size_t>(T + 1));
  read_sample(sample, row_.data());
  std::copy(row_.begin(), row_.begin() + T, inputs);
  std::copy(row_.begin() + 1, row_.end(), targets);
  if (starts) {
    KILN_CHECK(documents_, "data loader: document starts of a loader opened without documents");
    // 0, then each document start inside the sample's inputs [sample T, sample T + T).
    const int64_t p0 = sample * T;
    starts->assign(1, 0);
    for (auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), p0);
         it != doc_starts_.end() && *it < p0 + T; ++it)
      starts->push_back(static_cast<int32_t>(*it - p0));
  }
  if (!has_loss_spans_) return;
  // Target t is stream position p = sample * T + 1 + t: in the loss when an odd number of
  // span bounds are <= p (inside [begin, end)).
  const int64_t p0 = sample * T + 1;
  auto bound = std::upper_bound(loss_bounds_.begin(), loss_bounds_.end(), p0);
  for (int64_t t = 0; t < T; ++t) {
    while (bound != loss_bounds_.end() && *bound <= p0 + t) ++bound;
    if ((bound - loss_bounds_.begin()) % 2 == 0) targets[t] = -1;
  }
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets, int micro_batch, int dp_rank, int dp_size,
                            std::vector<std::vector<int32_t>>* starts) {
  const std::vector<int64_t> mine = order_.next_batch(micro_batch, dp_rank, dp_size);
  if (starts) starts->resize(mine.size());
  for (size_t b = 0; b < mine.size(); ++b) {
    const int64_t at = static_cast<int64_t>(b) * T_;
    read_pair(mine[b], inputs + at, targets + at, starts ? &(*starts)[b] : nullptr);
  }
}

}  // namespace kiln::data
