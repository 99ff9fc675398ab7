// Pipeline schedules (parallel/pipeline_schedule.h) run through the simulator over many
// shapes: no deadlock, every message matched, every pass once, each micro-batch's forward
// before its backward; the bubble against theory and the in-flight bound as documented;
// broken schedules caught; stage splits balanced or as given.
#include "support/error_of.h"
#include "core/error.h"
#include "parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

namespace kiln::pp {
namespace {

using kiln::testing::error_of;

TEST(PipelineSchedule, OneFOneBOrderOnTwoStages) {
  // pp 2, 3 micro-batches: stage 0 warms up with one forward, stage 1 with none.
  const Schedule s = make_schedule(ScheduleKind::OneFOneB, 2, 1, 3);
  auto names = [&](int r) {
    std::string out;
    for (const Action& a : s.ranks[static_cast<size_t>(r)]) out += a.str() + " ";
    return out;
  };
  EXPECT_EQ(names(0),
            "F(c=0,mb=0) send_act(c=0,mb=0)->1 F(c=0,mb=1) send_act(c=0,mb=1)->1 "
            "recv_grad(c=1,mb=0)<-1 B(c=0,mb=0) F(c=0,mb=2) send_act(c=0,mb=2)->1 "
            "recv_grad(c=1,mb=1)<-1 B(c=0,mb=1) recv_grad(c=1,mb=2)<-1 B(c=0,mb=2) ");
  EXPECT_EQ(names(1),
            "recv_act(c=0,mb=0)<-0 F(c=1,mb=0) B(c=1,mb=0) send_grad(c=1,mb=0)->0 "
            "recv_act(c=0,mb=1)<-0 F(c=1,mb=1) B(c=1,mb=1) send_grad(c=1,mb=1)->0 "
            "recv_act(c=0,mb=2)<-0 F(c=1,mb=2) B(c=1,mb=2) send_grad(c=1,mb=2)->0 ");
}

TEST(PipelineSchedule, EveryShapeRunsWithTheDocumentedBubbleAndInFlight) {
  int runs = 0;
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m : {1, 2, 3, 4, 5, 7, 8, 12, 16}) {
      for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        SCOPED_TRACE(::testing::Message() << schedule_kind_name(kind) << " pp=" << pp << " m=" << m);
        const SimResult r = simulate(make_schedule(kind, pp, 1, m));
        ++runs;
        // Equal stages, forward 1 and backward 2: exactly the theory.
        EXPECT_EQ(r.makespan, 3 * (m + pp - 1));
        EXPECT_NEAR(r.bubble_fraction, theoretical_bubble(kind, pp, 1, m), 1e-12);
        for (int s = 0; s < pp; ++s) {
          const int bound = kind == ScheduleKind::GPipe ? m : std::min(pp - s, m);
          EXPECT_EQ(r.peak_in_flight[static_cast<size_t>(s)], bound) << "stage " << s;
        }
      }
      for (int v = 2; v <= 4; ++v) {
        if (m % pp != 0) {
          EXPECT_NE(error_of([&] { make_schedule(ScheduleKind::Interleaved, pp, v, m); })
                        .find("multiple of parallel.pp"), std::string::npos);
          continue;
        }
        SCOPED_TRACE(::testing::Message() << "interleaved pp=" << pp << " v=" << v << " m=" << m);
        // A chunk is 1/v of a stage: its forward and backward cost the same units as a
        // plain stage's (the theory's time unit is a chunk's forward + backward / v).
        const SimResult r = simulate(make_schedule(ScheduleKind::Interleaved, pp, v, m), 2, 4);
        ++runs;
        const double theory = theoretical_bubble(ScheduleKind::Interleaved, pp, v, m);
        // Megatron-LM's interleaved order meets the theory's bubble exactly.
        EXPECT_NEAR(r.bubble_fraction, theory, 1e-12);
        EXPECT_LT(r.bubble_fraction, theoretical_bubble(ScheduleKind::OneFOneB, pp, 1, m) + 1e-12);
        for (int s = 0; s < pp; ++s) {
          const int warmup = std::min(v * m, (pp - s - 1) * 2 + (v - 1) * pp);
          EXPECT_LE(r.peak_in_flight[static_cast<size_t>(s)], std::min(v * m, warmup + 1)) << "stage " << s;
        }
      }
    }
  }
  EXPECT_GT(runs, 150);
}

// The figures docs/distributed.md quotes: the simulator's idle fraction against theory.
TEST(PipelineSchedule, BubbleTable) {
  std::printf("%-12s %3s %3s %4s %10s %10s %10s\n", "schedule", "pp", "v", "m", "simulated",
              "theory", "in flight");  // stage 0's peak of chunk passes forwarded, not backwarded
  for (int pp : {2, 4, 8}) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      for (int v : {1, 2, 4}) {
        const ScheduleKind kind = v == 1 ? ScheduleKind::OneFOneB : ScheduleKind::Interleaved;
        const SimResult r = simulate(make_schedule(kind, pp, v, m));
        const double theory = theoretical_bubble(kind, pp, v, m);
        std::printf("%-12s %3d %3d %4d %10.4f %10.4f %10d\n", schedule_kind_name(kind), pp, v, m,
                    r.bubble_fraction, theory, r.peak_in_flight[0]);
        EXPECT_NEAR(r.bubble_fraction, theory, 1e-12);
      }
    }
  }
}

TEST(PipelineSchedule, BadCombinationsNameTheirKey) {
  EXPECT_NE(error_of([] { make_schedule(ScheduleKind::OneFOneB, 2, 2, 4); }).find("virtual_stages must be 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(ScheduleKind::Interleaved, 2, 1, 4); }).find("virtual_stages > 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(ScheduleKind::OneFOneB, 0, 1, 4); }).find("parallel.pp"), std::string::npos);
  EXPECT_NE(error_of([] { make_schedule(ScheduleKind::OneFOneB, 2, 1, 0); }).find("grad_accum_steps"), std::string::npos);
  EXPECT_NE(error_of([] { parse_schedule_kind("zb"); }).find("parallel.pp_schedule"), std::string::npos);
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::Interleaved);
}

TEST(PipelineSchedule, BrokenSchedulesAreCaught) {
  const Schedule good = make_schedule(ScheduleKind::OneFOneB, 3, 1, 4);
  {  // Stage 2 backwards before it forwards the next micro-batch's: swap two of its actions
    // so that stage 1 waits for a gradient that follows an activation it has not sent.
    Schedule s = good;
    auto& last = s.ranks[2];
    std::reverse(last.begin(), last.end());
    EXPECT_NE(error_of([&] { simulate(s); }).find("rank 2"), std::string::npos);
  }
  {  // Stage 0 never sends micro-batch 3: stage 1 blocks, and says on what.
    Schedule s = good;
    auto& first = s.ranks[0];
    first.erase(std::find(first.begin(), first.end(), Action{ActionKind::SendActivation, 0, 3, 1}));
    const std::string e = error_of([&] { simulate(s); });
    EXPECT_NE(e.find("deadlocks"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1 waits at recv_act(c=0,mb=3)<-0"), std::string::npos) << e;
  }
  {  // A send nobody receives.
    Schedule s = good;
    auto& mid = s.ranks[1];
    mid.erase(std::find(mid.begin(), mid.end(), Action{ActionKind::RecvGradient, 2, 1, 2}));
    EXPECT_NE(error_of([&] { simulate(s); }).find("not here"), std::string::npos);
  }
  {  // A pass run twice.
    Schedule s = good;
    s.ranks[0].push_back({ActionKind::Forward, 0, 0, -1});
    EXPECT_NE(error_of([&] { simulate(s); }).find("second forward"), std::string::npos);
  }
}

TEST(PipelineSchedule, StagesBalanceTheirCostOrFollowTheSplit) {
  // GPT-2-like: embeddings (cost 0 here), 6 equal blocks, a heavy head.
  const std::vector<double> costs = {0, 1, 1, 1, 1, 1, 1, 2};
  EXPECT_EQ(split_stages(costs, 1), (std::vector<int>{0}));
  EXPECT_EQ(split_stages(costs, 2), (std::vector<int>{0, 5}));  // 4 | 4
  EXPECT_EQ(split_stages(costs, 4), (std::vector<int>{0, 3, 5, 7}));  // 2 | 2 | 2 | 2
  EXPECT_EQ(split_stages(costs, 8), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(split_stages(costs, 2, {2}), (std::vector<int>{0, 2}));
  EXPECT_NE(error_of([&] { split_stages(costs, 9); }).find("cannot fill 9 stages"), std::string::npos);
  EXPECT_NE(error_of([&] { split_stages(costs, 3, {4, 4}); }).find("parallel.pp_split"), std::string::npos);
  EXPECT_NE(error_of([&] { split_stages(costs, 3, {4}); }).find("parallel.pp_split has 1"), std::string::npos);
}

}  // namespace
}  // namespace kiln::pp
