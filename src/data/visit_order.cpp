#include "data/visit_order.h"

#include "core/error.h"
#include "core/rng.h"

#include <utility>

namespace kiln::data {

VisitOrder::VisitOrder(int64_t samples, uint64_t seed, bool shuffle, const std::string& what)
    : samples_(samples), seed_(seed), shuffle_(shuffle), what_(what) {
  KILN_CHECK(samples_ >= 1, "{}: no sample to visit", what_);
  KILN_CHECK(samples_ <= static_cast<int64_t>(UINT32_MAX), "{}: {} samples per epoch exceed 2^32",
             what_, samples_);
}

void VisitOrder::ensure_permutation(int64_t epoch) {
  if (!shuffle_ || perm_epoch_ == epoch) return;
  perm_.resize(static_cast<size_t>(samples_));
  for (int64_t i = 0; i < samples_; ++i) perm_[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  // Fisher-Yates: for i = n-1 .. 1 swap i with j uniform in [0, i]. j comes from 64 random
  // bits by multiply-high (bias < n / 2^64, negligible).
  Philox rng(seed_, static_cast<uint64_t>(epoch));
  for (int64_t i = samples_ - 1; i > 0; --i) {
    const uint64_t r = (static_cast<uint64_t>(rng.next_u32()) << 32) | rng.next_u32();
    const auto j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
  }
  perm_epoch_ = epoch;
}

int64_t VisitOrder::sample_at(int64_t epoch, int64_t index) {
  KILN_CHECK(index >= 0 && index < samples_, "data loader: index {} outside [0, {})", index, samples_);
  if (!shuffle_) return index;
  ensure_permutation(epoch);
  return perm_[static_cast<size_t>(index)];
}

std::vector<int64_t> VisitOrder::next_batch(int micro_batch, int dp_rank, int dp_size) {
  KILN_CHECK(micro_batch >= 1 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
             "data loader: bad batch arguments micro_batch={} dp_rank={} dp_size={}", micro_batch,
             dp_rank, dp_size);
  std::vector<int64_t> mine;
  LoaderState s = state_;
  const int64_t global = static_cast<int64_t>(micro_batch) * dp_size;
  const int64_t first = static_cast<int64_t>(dp_rank) * micro_batch;
  for (int64_t g = 0; g < global; ++g) {
    if (g >= first && g < first + micro_batch) mine.push_back(sample_at(s.epoch, s.index));
    if (++s.index == samples_) {
      s.index = 0;
      ++s.epoch;
    }
  }
  state_ = s;
  return mine;
}

void VisitOrder::set_state(const LoaderState& s) {
  KILN_CHECK(s.epoch >= 0 && s.index >= 0 && s.index < samples_,
             "data loader: state (epoch {}, index {}) outside [0, {}) samples of {}", s.epoch,
             s.index, samples_, what_);
  state_ = s;
}

}  // namespace kiln::data
