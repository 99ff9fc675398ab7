#include "data/loader.h"

#include "core/error.h"
#include "core/rng.h"

#include <algorithm>

namespace kiln::data {

namespace fs = std::filesystem;

DataLoader::DataLoader(const fs::path& dir, std::string split, int seq_len, uint64_t seed, bool shuffle)
    : split_(std::move(split)), T_(seq_len), seed_(seed), shuffle_(shuffle) {
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
  samples_ = total_ > 0 ? (total_ - 1) / T_ : 0;
  KILN_CHECK(samples_ >= 1, "{}: split '{}' has {} tokens, too few for one sample of seq_len {} (needs {})",
             dir.string(), split_, total_, T_, static_cast<int64_t>(T_) + 1);
  KILN_CHECK(samples_ <= static_cast<int64_t>(UINT32_MAX), "{}: {} samples per epoch exceed 2^32",
             dir.string(), samples_);
}

void DataLoader::ensure_permutation(int64_t epoch) {
  if (!shuffle_ || perm_epoch_ == epoch) return;
  perm_.resize(static_cast<size_t>(samples_));
  for (int64_t i = 0; i < samples_; ++i) perm_[i] = static_cast<uint32_t>(i);
  // Fisher-Yates: for i = n-1 .. 1 swap i with j uniform in [0, i]. j comes from 64 random
  // bits by multiply-high (bias < n / 2^64, negligible).
  Philox rng(seed_, static_cast<uint64_t>(epoch));
  for (int64_t i = samples_ - 1; i > 0; --i) {
    const uint64_t r = (static_cast<uint64_t>(rng.next_u32()) << 32) | rng.next_u32();
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm_[i], perm_[j]);
  }
  perm_epoch_ = epoch;
}

int64_t DataLoader::sample_at(int64_t epoch, int64_t index) {
  KILN_CHECK(index >= 0 && index < samples_, "data loader: index {} outside [0, {})", index, samples_);
  if (!shuffle_) return index;
  ensure_permutation(epoch);
  return perm_[static_cast<size_t>(index)];
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

void DataLoader::next_batch(int32_t* inputs, int32_t* targets, int micro_batch, int dp_rank, int dp_size) {
  KILN_CHECK(micro_batch >= 1 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
             "data loader: bad batch arguments micro_batch={} dp_rank={} dp_size={}", micro_batch, dp_rank,
             dp_size);
  const int64_t T = T_;
  std::vector<int32_t> row(static_cast<size_t>(T + 1));
  LoaderState s = state_;
  const int64_t global = static_cast<int64_t>(micro_batch) * dp_size;
  const int64_t first = static_cast<int64_t>(dp_rank) * micro_batch;
  for (int64_t g = 0; g < global; ++g) {
    if (g >= first && g < first + micro_batch) {
      read_sample(sample_at(s.epoch, s.index), row.data());
      const int64_t b = g - first;
      std::copy(row.begin(), row.begin() + T, inputs + b * T);
      std::copy(row.begin() + 1, row.end(), targets + b * T);
    }
    if (++s.index == samples_) {
      s.index = 0;
      ++s.epoch;
    }
  }
  state_ = s;
}

void DataLoader::set_state(const LoaderState& s) {
  KILN_CHECK(s.epoch >= 0 && s.index >= 0 && s.index < samples_,
             "data loader: state (epoch {}, index {}) outside [0, {}) samples of split '{}'", s.epoch, s.index,
             samples_, split_);
  state_ = s;
}

}  // namespace kiln::data
