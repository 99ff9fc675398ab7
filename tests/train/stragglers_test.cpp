// Stragglers (train/stragglers.h): the slowest rank against the median, the logging window's
// means, when the warning comes, and the KILN_SLOW_RANK fault hook. Under mpirun with a slow
// rank: tests/reliability/straggler_test.sh.
#include "train/stragglers.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace kiln {
namespace {

TEST(Stragglers, SlowestRankByComputeAgainstTheMedian) {
  // Rank 2 waits least, so it computes most; rank 0's update is the longest (it waited).
  const StragglerSummary s = summarize_ranks({{0.030, 0.010}, {0.025, 0.012}, {0.024, 0.020}});
  EXPECT_EQ(s.slowest_rank, 2);
  EXPECT_DOUBLE_EQ(s.slowest_compute_s, 0.020);
  EXPECT_DOUBLE_EQ(s.slowest_step_s, 0.024);
  EXPECT_DOUBLE_EQ(s.median_compute_s, 0.012);
  EXPECT_DOUBLE_EQ(s.median_step_s, 0.025);
  EXPECT_NEAR(s.ratio(), 20.0 / 12.0, 1e-12);
  // An even count: the mean of the two middle values; a tie: the lowest rank.
  const StragglerSummary even = summarize_ranks({{1, 3}, {1, 1}, {1, 3}, {1, 2}});
  EXPECT_EQ(even.slowest_rank, 0);
  EXPECT_DOUBLE_EQ(even.median_compute_s, 2.5);
  EXPECT_DOUBLE_EQ(summarize_ranks({{1, 0}, {1, 0}}).ratio(), 1.0);  // no compute measured
  EXPECT_THROW(summarize_ranks({}), Error);
}

TEST(Stragglers, WindowMeansAndReset) {
  RankWindow w;
  w.add(0.010, 0.004);
  w.add(0.030, 0.002);
  const RankTimes t = w.take();
  EXPECT_DOUBLE_EQ(t.step_s, 0.020);
  EXPECT_DOUBLE_EQ(t.compute_s, 0.017);
  const RankTimes empty = w.take();  // a new window
  EXPECT_EQ(empty.step_s, 0.0);
  EXPECT_EQ(empty.compute_s, 0.0);
}

StragglerSummary slow(int rank, double ratio) {
  StragglerSummary s;
  s.slowest_rank = rank;
  s.median_compute_s = 0.010;
  s.slowest_compute_s = 0.010 * ratio;
  return s;
}

TEST(Stragglers, WarnsOnceWhenTheSameRankStaysSlow) {
  StragglerWatch watch(1.5, 3);
  EXPECT_FALSE(watch.observe(slow(1, 2.0)));
  EXPECT_FALSE(watch.observe(slow(1, 2.0)));
  const std::optional<std::string> w = watch.observe(slow(1, 1.5));  // the third in a row
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("rank 1 is a straggler: its compute took 1.5x the median"), std::string::npos) << *w;
  EXPECT_NE(w->find("for 3 logged updates in a row"), std::string::npos) << *w;
  EXPECT_FALSE(watch.observe(slow(1, 2.0)));  // once per episode
  // Another rank restarts the count; a window below the factor ends the episode.
  EXPECT_FALSE(watch.observe(slow(3, 2.0)));
  EXPECT_FALSE(watch.observe(slow(3, 2.0)));
  EXPECT_FALSE(watch.observe(slow(3, 1.4)));
  EXPECT_FALSE(watch.observe(slow(3, 2.0)));
  EXPECT_FALSE(watch.observe(slow(3, 2.0)));
  EXPECT_TRUE(watch.observe(slow(3, 2.0)));
  StragglerWatch off(0.0, 1);  // log.straggler_factor = 0: never
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(off.observe(slow(1, 100.0)));
  EXPECT_THROW(StragglerWatch(1.5, 0), Error);
  EXPECT_THROW(StragglerWatch(-1, 1), Error);
}

TEST(Stragglers, SlowRankHook) {
  unsetenv("KILN_SLOW_RANK");
  EXPECT_EQ(injected_update_delay_s(1, 2), 0.0);
  setenv("KILN_SLOW_RANK", "1:25", 1);
  EXPECT_DOUBLE_EQ(injected_update_delay_s(1, 2), 0.025);
  EXPECT_EQ(injected_update_delay_s(0, 2), 0.0);
  for (const char* bad : {"1", "x:2", "1:-3", "1:2ms", "-1:5", "2:5", "1:inf", "1:nan"}) {
    setenv("KILN_SLOW_RANK", bad, 1);
    EXPECT_THROW(injected_update_delay_s(0, 2), Error) << bad;
  }
  unsetenv("KILN_SLOW_RANK");
}

}  // namespace
}  // namespace kiln
