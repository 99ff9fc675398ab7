// DeviceMesh without MPI: layout, coordinates and groups for many shapes.
#include "comm/local_communicator.h"
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace kiln {
namespace {

const MeshSizes kShapes[] = {{.dp = 1}, {.dp = 4}, {.dp = 1, .tp = 4}, {.dp = 1, .pp = 4},
                             {.dp = 2, .tp = 2}, {.dp = 2, .pp = 2}, {.dp = 1, .tp = 2, .pp = 2},
                             {.dp = 2, .tp = 2, .pp = 2}, {.dp = 3, .pp = 2},
                             {.dp = 1, .tp = 4, .pp = 2}, {.dp = 3, .tp = 2, .pp = 2},
                             {.dp = 2, .tp = 3, .pp = 4}, {.dp = 1, .cp = 4}, {.dp = 2, .cp = 2},
                             {.dp = 2, .cp = 2, .tp = 2, .pp = 2},
                             {.dp = 1, .cp = 2, .tp = 2, .pp = 3}, {.dp = 3, .cp = 3, .pp = 2}};

TEST(DeviceMesh, GroupsPartitionTheRanksConsistently) {
  for (const MeshSizes& s : kShapes) {
    const int world = s.dp * s.tp * s.pp * s.cp;
    for (int me = 0; me < world; ++me) {
      DeviceMesh mesh(world, me, s);
      SCOPED_TRACE(mesh.str() + " rank " + std::to_string(me));
      EXPECT_EQ(mesh.dp(), s.dp);
      EXPECT_EQ(mesh.coord(), mesh.coord(me));
      for (int r = 0; r < world; ++r) ASSERT_EQ(mesh.rank_of(mesh.coord(r)), r);
      for (Axis a : kAllAxes) {
        // The groups of an axis cover every rank exactly once, each of size(a) ranks.
        auto groups = mesh.groups(a);
        ASSERT_EQ(static_cast<int>(groups.size()), world / mesh.size(a));
        std::vector<int> seen(world, 0);
        for (size_t gi = 0; gi < groups.size(); ++gi) {
          ASSERT_EQ(static_cast<int>(groups[gi].size()), mesh.size(a));
          for (int r : groups[gi]) {
            ++seen[r];
            EXPECT_EQ(mesh.group_index(a, r), static_cast<int>(gi));
          }
        }
        for (int c : seen) ASSERT_EQ(c, 1);
        // My group: ordered by my axis coordinate, agreed on by every member, and the
        // members differ from me only on this axis.
        auto mine = mesh.group_ranks(a);
        ASSERT_EQ(mine[mesh.coord()[a]], me);
        EXPECT_EQ(mine, groups[mesh.group_index(a, me)]);
        for (size_t i = 0; i < mine.size(); ++i) {
          EXPECT_EQ(mesh.group_ranks(a, mine[i]), mine);
          MeshCoord c = mesh.coord(mine[i]);
          EXPECT_EQ(c[a], static_cast<int>(i));
          for (Axis b : kAllAxes) {
            if (b != a) {
              EXPECT_EQ(c[b], mesh.coord()[b]);
            }
          }
        }
      }
      // Groups of different axes meet in exactly one rank: me.
      auto dp = mesh.group_ranks(Axis::DP), tp = mesh.group_ranks(Axis::TP);
      std::vector<int> both;
      std::sort(dp.begin(), dp.end());
      std::sort(tp.begin(), tp.end());
      std::set_intersection(dp.begin(), dp.end(), tp.begin(), tp.end(), std::back_inserter(both));
      EXPECT_EQ(both, std::vector<int>{me});
    }
  }
}

TEST(DeviceMesh, MegatronLayoutTpInnermostPpOutermost) {
  DeviceMesh m(8, 5, {.dp = 2, .tp = 2, .pp = 2});
  // rank = (pp * dp_size + dp) * tp_size + tp
  EXPECT_EQ(m.coord(5)[Axis::PP], 1);
  EXPECT_EQ(m.coord(5)[Axis::DP], 0);
  EXPECT_EQ(m.coord(5)[Axis::TP], 1);
  EXPECT_EQ(m.coord(5).str(), "(dp=0, cp=0, tp=1, pp=1)");
  EXPECT_EQ(m.group_ranks(Axis::TP, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group_ranks(Axis::TP, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.groups(Axis::DP), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups(Axis::PP), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.group_ranks(Axis::DP), (std::vector<int>{5, 7}));
  // 1 x 4 x 2: tp groups are runs of 4 adjacent ranks.
  DeviceMesh t(8, 0, {.dp = 1, .tp = 4, .pp = 2});
  EXPECT_EQ(t.groups(Axis::TP), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(t.groups(Axis::DP).size(), 8u);
  // 3 x 1 x 2: dp runs over adjacent ranks within a pipeline stage.
  DeviceMesh d(6, 4, {.dp = 3, .pp = 2});
  EXPECT_EQ(d.group_ranks(Axis::DP), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(d.group_ranks(Axis::PP), (std::vector<int>{1, 4}));
  EXPECT_EQ(d.str(), "dp=3 tp=1 pp=2 (world 6)");
}

TEST(DeviceMesh, ContextParallelSitsBetweenDpAndTp) {
  // rank = ((pp * dp_size + dp) * cp_size + cp) * tp_size + tp; world 8 = dp2 cp2 tp2.
  DeviceMesh m(8, 5, {.dp = 2, .cp = 2, .tp = 2});
  EXPECT_EQ(m.coord(5).str(), "(dp=1, cp=0, tp=1, pp=0)");
  EXPECT_EQ(m.groups(Axis::CP), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups(Axis::DP), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.groups(Axis::TP), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.dp_cp_ranks(5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.str(), "dp=2 cp=2 tp=2 pp=1 (world 8)");
  // cp x pp: a pipeline stage's cp ranks are adjacent.
  DeviceMesh p(8, 6, {.dp = 1, .cp = 4, .pp = 2});
  EXPECT_EQ(p.group_ranks(Axis::CP), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(p.group_ranks(Axis::PP), (std::vector<int>{2, 6}));
  EXPECT_EQ(p.dp_cp_ranks(6), (std::vector<int>{4, 5, 6, 7}));
}

TEST(DeviceMesh, ExpertParallelIsCarvedOutOfDpCp) {
  // world 8 = dp 4 x tp 2, ep 2 (the example at the top of mesh.h).
  DeviceMesh m(8, 6, {.dp = 4, .tp = 2, .ep = 2});
  EXPECT_EQ(m.ep(), 2);
  EXPECT_EQ(m.ep_ranks(6), (std::vector<int>{4, 6}));
  EXPECT_EQ(m.edp_ranks(6), (std::vector<int>{2, 6}));
  EXPECT_EQ(m.ep_ranks(3), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.edp_ranks(3), (std::vector<int>{3, 7}));
  EXPECT_EQ(m.str(), "dp=4 tp=2 pp=1 ep=2 (world 8)");
  // dp 2 x cp 2 with ep 4: one ep group holds every dp x cp rank; edp groups of one.
  DeviceMesh c(8, 5, {.dp = 2, .cp = 2, .tp = 2, .ep = 4});
  EXPECT_EQ(c.ep_ranks(5), c.dp_cp_ranks(5));
  EXPECT_EQ(c.edp_ranks(5), (std::vector<int>{5}));
  // Every rank of a dp x cp group sits in exactly one ep group and one edp group, and an
  // ep group meets each edp group once (together they hold each expert once per replica).
  for (int ep : {1, 2, 4}) {
    DeviceMesh d(8, 0, {.dp = 4, .tp = 2, .ep = ep});
    for (int r = 0; r < 8; ++r) {
      const std::vector<int> e = d.ep_ranks(r), x = d.edp_ranks(r);
      EXPECT_EQ(static_cast<int>(e.size()), ep);
      EXPECT_EQ(static_cast<int>(x.size()), 4 / ep);
      EXPECT_EQ(std::ranges::count(e, r), 1);
      EXPECT_EQ(std::ranges::count(x, r), 1);
      for (int other : e) EXPECT_EQ(d.ep_ranks(other), e);
      for (int other : x) EXPECT_EQ(d.edp_ranks(other), x);
    }
  }
  // ep must divide dp * cp.
  EXPECT_THROW(DeviceMesh(8, 0, {.dp = 4, .tp = 2, .ep = 0}), Error);
}

TEST(DeviceMesh, DerivesDpAndExplainsBadShapes) {
  EXPECT_EQ(DeviceMesh(8, 0, {.dp = 0, .tp = 2, .pp = 2}).dp(), 2);
  EXPECT_EQ(DeviceMesh(6, 0, {.dp = 0}).dp(), 6);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { DeviceMesh(4, 0, {.dp = 2, .tp = 2, .pp = 2}); }),
            "parallel: dp (2) * tp (2) * pp (2) = 8 must equal the world size 4");
  EXPECT_EQ(message([] { DeviceMesh(4, 0, {.dp = 0, .tp = 3}); }),
            "parallel: tp (3) * pp (1) = 3 does not divide the world size 4, so dp cannot be derived");
  EXPECT_EQ(message([] { DeviceMesh(4, 0, {.dp = 4, .tp = 0}); }), "parallel.tp must be >= 1, got 0");
  EXPECT_EQ(message([] { DeviceMesh(4, 0, {.dp = 4, .pp = -1}); }), "parallel.pp must be >= 1, got -1");
  EXPECT_EQ(message([] { DeviceMesh(4, 0, {.dp = -2}); }), "parallel.dp must be >= 1 (or 0 to derive it), got -2");
  EXPECT_EQ(message([] { DeviceMesh(4, 4, {.dp = 4}); }), "parallel: rank 4 out of range [0, 4)");
  EXPECT_EQ(message([] { DeviceMesh(0, 0, {.dp = 0}); }), "parallel: world size must be >= 1, got 0");
  EXPECT_EQ(message([] { DeviceMesh(4, 0, {.dp = 1, .cp = 0}); }), "parallel.cp must be >= 1, got 0");
  EXPECT_EQ(message([] { DeviceMesh(8, 0, {.dp = 0, .cp = 3}); }),
            "parallel: cp (3) * tp (1) * pp (1) = 3 does not divide the world size 8, so dp cannot "
            "be derived");
  EXPECT_EQ(DeviceMesh(8, 0, {.dp = 0, .cp = 2, .tp = 2}).dp(), 2);
  EXPECT_EQ(message([] { DeviceMesh(8, 0, {.dp = 4, .tp = 2, .ep = 3}); }),
            "parallel.ep = 3 must divide dp (4) * cp (1) = 4: the expert-parallel group is "
            "carved out of the ranks sharing the parameters");
  DeviceMesh m(4, 0, {.dp = 2, .tp = 2});
  MeshCoord bad;
  bad[Axis::TP] = 2;
  EXPECT_THROW(m.rank_of(bad), Error);
  EXPECT_THROW(m.coord(4), Error);
}

TEST(DeviceMesh, CommunicatorsOfAWorldOfOne) {
  LocalCommunicator world;
  DeviceMesh unbuilt(1, 0, {.dp = 1});
  EXPECT_FALSE(unbuilt.has_comms());
  EXPECT_THROW(unbuilt.comm(Axis::DP), Error);
  DeviceMesh m(world, {.dp = 0});
  ASSERT_TRUE(m.has_comms());
  for (Axis a : kAllAxes) {
    EXPECT_EQ(m.comm(a).size(), 1);
    EXPECT_EQ(m.comm(a).name(), axis_name(a));
  }
  EXPECT_THROW(DeviceMesh(world, {.dp = 2}), Error);
  DeviceMesh moved = std::move(m);
  EXPECT_TRUE(moved.has_comms());
}

}  // namespace
}  // namespace kiln
