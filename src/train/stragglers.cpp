#include "train/stragglers.h"

#include "comm/ledger.h"
#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

double StragglerSummary::ratio() const {
  return median_compute_s > 0 ? slowest_compute_s / median_compute_s : 1.0;
}

StragglerSummary summarize_ranks(const std::vector<RankTimes>& ranks) {
  KILN_CHECK(!ranks.empty(), "summarize_ranks: no ranks");
  StragglerSummary s;
  std::vector<double> step, compute;
  for (size_t r = 0; r < ranks.size(); ++r) {
    step.push_back(ranks[r].step_s);
    compute.push_back(ranks[r].compute_s);
    if (ranks[r].compute_s > ranks[static_cast<size_t>(s.slowest_rank)].compute_s)
      s.slowest_rank = static_cast<int>(r);
  }
  s.slowest_step_s = ranks[static_cast<size_t>(s.slowest_rank)].step_s;
  s.slowest_compute_s = ranks[static_cast<size_t>(s.slowest_rank)].compute_s;
  s.median_step_s = median(step);
  s.median_compute_s = median(compute);
  return s;
}

void RankWindow::add(double step_s, double comm_wait_s) {
  step_s_ += step_s;
  wait_s_ += comm_wait_s;
  ++updates_;
}

RankTimes RankWindow::take() {
  RankTimes t;
  if (updates_ > 0) {
    t.step_s = step_s_ / static_cast<double>(updates_);
    t.compute_s = std::max(0.0, (step_s_ - wait_s_) / static_cast<double>(updates_));
  }
  *this = RankWindow();
  return t;
}

std::vector<RankTimes> gather_rank_times(Communicator& world, const RankTimes& mine) {
  std::vector<double> all(2 * static_cast<size_t>(world.size()));
  double own[2] = {mine.step_s, mine.compute_s};
  const CommSite site("train.all_gather step times");
  world.all_gather(Tensor::view(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::F64),
                   Tensor::view(own, Shape{2}, DType::F64));
  std::vector<RankTimes> out(static_cast<size_t>(world.size()));
  for (size_t r = 0; r < out.size(); ++r) out[r] = {all[2 * r], all[2 * r + 1]};
  return out;
}

double injected_update_delay_s(int world_rank, int world_size) {
  const char* env = std::getenv("KILN_SLOW_RANK");
  if (env == nullptr || *env == '\0') return 0;
  int rank = -1;
  double ms = -1;
  char tail = 0;
  KILN_CHECK(std::sscanf(env, "%d:%lf%c", &rank, &ms, &tail) == 2 && rank >= 0 && ms >= 0,
             "KILN_SLOW_RANK must be RANK:MS (e.g. 1:20), got '{}'", env);
  KILN_CHECK(std::isfinite(ms), "KILN_SLOW_RANK='{}': MS must be a finite number", env);
  KILN_CHECK(rank < world_size, "KILN_SLOW_RANK names rank {}, but the world has {} ranks", rank,
             world_size);
  return rank == world_rank ? ms / 1e3 : 0.0;
}

StragglerWatch::StragglerWatch(double factor, int windows) : factor_(factor), windows_(windows) {
  KILN_CHECK(factor >= 0 && windows >= 1,
             "StragglerWatch: factor must be >= 0 and windows >= 1, got {} and {}", factor, windows);
}

std::optional<std::string> StragglerWatch::observe(const StragglerSummary& s) {
  if (factor_ <= 0) return std::nullopt;
  if (s.ratio() < factor_) {
    rank_ = -1, count_ = 0, warned_ = false;
    return std::nullopt;
  }
  if (s.slowest_rank != rank_) rank_ = s.slowest_rank, count_ = 0, warned_ = false;
  if (++count_ < windows_ || warned_) return std::nullopt;
  warned_ = true;
  return fmt::format("rank {} is a straggler: its compute took {:.1f}x the median of the ranks "
                     "({:.1f} ms vs {:.1f} ms per update) for {} logged updates in a row "
                     "(log.straggler_factor = {}); its update took {:.1f} ms, the median {:.1f} ms",
                     s.slowest_rank, s.ratio(), 1e3 * s.slowest_compute_s, 1e3 * s.median_compute_s,
                     count_, factor_, 1e3 * s.slowest_step_s, 1e3 * s.median_step_s);
}

}  // namespace kiln
