// DeviceMesh over the real world communicator: for every (dp, cp, tp, pp) whose product is
// the world size, each axis communicator holds exactly the ranks group_ranks() names, in
// that order (and the dp x cp one too, and the ep and edp ones for every ep dividing dp x
// cp). Runs under mpirun (4 ranks) and alone.
#include "mpi_test_main.h"
#include "parallel/mesh.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

/// Each ep dividing dp * cp: the ep and edp communicators hold ep_ranks / edp_ranks, in order.
void check_expert_groups(Communicator& world, MeshSizes sizes) {
  const DeviceMesh shape(world.size(), world.rank(), sizes);
  for (int ep = 2; ep <= shape.dp() * shape.cp(); ++ep) {
    if (shape.dp() * shape.cp() % ep != 0) continue;
    sizes.ep = ep;
    DeviceMesh mesh(world, sizes);
    SCOPED_TRACE(mesh.str());
    ASSERT_NE(mesh.ep_comm(), nullptr);
    for (auto [c, expect] : {std::pair{mesh.ep_comm(), mesh.ep_ranks(world.rank())},
                             std::pair{&mesh.edp_comm(), mesh.edp_ranks(world.rank())}}) {
      ASSERT_EQ(c->size(), static_cast<int>(expect.size())) << c->name();
      int32_t me = world.rank();
      std::vector<int32_t> got(expect.size());
      c->all_gather(Tensor::view(got.data(), {static_cast<int64_t>(got.size())}, DType::I32),
                    Tensor::view(&me, {1}, DType::I32));
      for (size_t i = 0; i < expect.size(); ++i) EXPECT_EQ(got[i], expect[i]) << c->name();
    }
  }
}

TEST(DeviceMeshMpi, AxisCommunicatorsMatchGroups) {
  Communicator& world = testing::world();
  const int n = world.size();
  for (int cp = 1; cp <= n; ++cp)
  for (int tp = 1; tp * cp <= n; ++tp) {
    for (int pp = 1; pp * tp * cp <= n; ++pp) {
      if (n % (cp * tp * pp) != 0) continue;
      DeviceMesh mesh(world, {.dp = 0, .cp = cp, .tp = tp, .pp = pp});
      SCOPED_TRACE(mesh.str());
      {  // the dp x cp group: its members, in order
        Communicator& c = mesh.dp_cp_comm();
        const std::vector<int> expect = mesh.dp_cp_ranks(world.rank());
        ASSERT_EQ(c.size(), static_cast<int>(expect.size()));
        int32_t me = world.rank();
        std::vector<int32_t> got(expect.size());
        c.all_gather(Tensor::view(got.data(), {static_cast<int64_t>(got.size())}, DType::I32),
                     Tensor::view(&me, {1}, DType::I32));
        for (size_t i = 0; i < expect.size(); ++i) EXPECT_EQ(got[i], expect[i]) << "dp_cp";
      }
      check_expert_groups(world, {.dp = 0, .cp = cp, .tp = tp, .pp = pp});
      for (Axis a : kAllAxes) {
        Communicator& c = mesh.comm(a);
        const std::vector<int> expect = mesh.group_ranks(a);
        ASSERT_EQ(c.size(), static_cast<int>(expect.size()));
        EXPECT_EQ(c.rank(), mesh.coord()[a]);
        int32_t me = world.rank();
        std::vector<int32_t> got(expect.size());
        c.all_gather(Tensor::view(got.data(), {static_cast<int64_t>(got.size())}, DType::I32),
                     Tensor::view(&me, {1}, DType::I32));
        for (size_t i = 0; i < expect.size(); ++i) EXPECT_EQ(got[i], expect[i]) << axis_name(a);
        int32_t sum = me, want = 0;
        c.all_reduce(Tensor::view(&sum, {1}, DType::I32));
        for (int r : expect) want += r;
        EXPECT_EQ(sum, want) << axis_name(a);
      }
      world.barrier();
    }
  }
}

}  // namespace
}  // namespace kiln
