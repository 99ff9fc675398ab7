// DeviceMesh: how the ranks of a job are arranged into data-, context-, tensor- and
// pipeline-parallel groups, and the communicator of each group.
//
// One object validates dp * cp * tp * pp == world_size and answers every question about
// ranks and groups (the role of torchtitan's ParallelDims); everything else asks it.
//
// The axes are always listed in one order, dp x cp x tp x pp: Axis, kAllAxes, MeshSizes,
// the messages, str(), MeshCoord::str(), the config keys and the docs.
//
// Layout (Megatron-LM's default): ranks are numbered with pp outermost, then dp, then cp,
// then tp innermost (kMeshLayout), so the tp ranks of one model replica are adjacent (on
// one node, where the fast links are) and the cp ranks of one sequence next to them:
//     rank = ((pp_index * dp + dp_index) * cp + cp_index) * tp + tp_index
// Example, world 8 = dp 2 x tp 2 x pp 2 (cp 1):
//     pp stage 0: dp 0 -> ranks {0, 1} (a tp group), dp 1 -> ranks {2, 3}
//     pp stage 1: dp 0 -> ranks {4, 5},              dp 1 -> ranks {6, 7}
//     dp groups {0,2} {1,3} {4,6} {5,7};  pp groups {0,4} {1,5} {2,6} {3,7}
// Example, world 8 = dp 2 x cp 2 x tp 2: cp groups {0,2} {1,3} {4,6} {5,7}, dp groups
// {0,4} {1,5} {2,6} {3,7}, dp x cp groups {0,2,4,6} {1,3,5,7}.
// The group of rank r on axis A is the set of ranks whose coordinates equal r's on every
// axis but A, ordered by their coordinate on A; a rank's index in its group (and its
// rank in the group's communicator) is its coordinate on A.
//
// The cp ranks hold replicas of the same parameters (each a part of every sequence), so
// gradients are reduced, and ZeRO shards, over the combined dp x cp group (dp_cp_comm();
// Megatron-LM's data-parallel group "with context parallel"); with cp = 1 it is the dp
// group. kiln calls it "the dp x cp group" (dp_cp in code) everywhere.
//
// Expert parallelism is carved out of the dp x cp group (torchtitan, Megatron-core: no
// extra ranks; ep is not a factor of the world size): with q = dp_index * cp + cp_index a
// rank's index in its dp x cp group, the ep group is the ep ranks with the same q / ep
// (consecutive q, ordered by q % ep, the ep rank), which together hold every expert once;
// the expert-data-parallel group ("edp", Megatron-core's expert data-parallel group) is
// the dp * cp / ep ranks with the same q % ep (ordered by q / ep), which hold the same
// experts: their gradients are reduced, and ZeRO shards them, over it. Example, world 8 =
// dp 4 x tp 2 with ep 2: dp groups {0,2,4,6} {1,3,5,7}; ep groups {0,2} {4,6} {1,3}
// {5,7}; edp groups {0,4} {2,6} {1,5} {3,7}. With ep = 1 the ep group is the rank alone
// and the edp group is the dp x cp group.
#pragma once

#include "comm/communicator.h"

#include <array>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

enum class Axis : uint8_t { DP, CP, TP, PP };
inline constexpr int kNumAxes = 4;
/// Every axis, in the mesh's order (the order sub-communicators are built in).
inline constexpr std::array<Axis, kNumAxes> kAllAxes = {Axis::DP, Axis::CP, Axis::TP, Axis::PP};
/// Rank layout, outermost axis first (the last one varies fastest): not a listing order.
inline constexpr std::array<Axis, kNumAxes> kMeshLayout = {Axis::PP, Axis::DP, Axis::CP,
                                                           Axis::TP};
/// "dp", "cp", "tp", "pp".
const char* axis_name(Axis a);

/// A rank's position on every axis.
struct MeshCoord {
  std::array<int, kNumAxes> index{};
  int operator[](Axis a) const { return index[static_cast<size_t>(a)]; }
  int& operator[](Axis a) { return index[static_cast<size_t>(a)]; }
  bool operator==(const MeshCoord&) const = default;
  std::string str() const;  // "(dp=1, cp=0, tp=0, pp=1)"
};

/// The size of each axis, in the mesh's order; written with designated initializers,
/// which C++ keeps in that order: {.dp = 2, .tp = 2} (cp and pp 1). dp = 0 derives
/// world_size / (cp * tp * pp). ep (expert parallel) divides dp * cp and is no factor of
/// the world size.
struct MeshSizes {
  int dp = 0;
  int cp = 1;
  int tp = 1;
  int pp = 1;
  int ep = 1;
};

class DeviceMesh {
 public:
  /// A mesh of `world_size` ranks seen from `rank`. Throws kiln::Error unless every size
  /// is >= 1 (dp: or 0), dp * cp * tp * pp == world_size and ep divides dp * cp. No
  /// communicators (see
  /// build_comms); needs no MPI.
  DeviceMesh(int world_size, int rank, MeshSizes sizes);
  /// The mesh of `world` (its size and rank), with the sub-communicators built.
  /// Collective: every rank of `world` calls it with the same sizes.
  DeviceMesh(Communicator& world, MeshSizes sizes);
  DeviceMesh(DeviceMesh&&) noexcept;
  DeviceMesh& operator=(DeviceMesh&&) noexcept;
  ~DeviceMesh();

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int size(Axis a) const { return sizes_[static_cast<size_t>(a)]; }
  int dp() const { return size(Axis::DP); }
  int cp() const { return size(Axis::CP); }
  int tp() const { return size(Axis::TP); }
  int pp() const { return size(Axis::PP); }
  int ep() const { return ep_; }

  /// Coordinates of `rank` (of this process when omitted).
  MeshCoord coord(int rank) const;
  MeshCoord coord() const { return coord(rank_); }
  /// The rank at `c`; throws when a coordinate is out of range.
  int rank_of(const MeshCoord& c) const;

  /// The ranks of `rank`'s group on axis `a` (of this process's group when omitted),
  /// ordered by their coordinate on `a`.
  std::vector<int> group_ranks(Axis a, int rank) const;
  std::vector<int> group_ranks(Axis a) const { return group_ranks(a, rank_); }
  /// Which of the world_size / size(a) groups of axis `a` holds `rank`, in [0, count).
  int group_index(Axis a, int rank) const;
  /// Every group of axis `a`, by group_index.
  std::vector<std::vector<int>> groups(Axis a) const;

  /// The ranks of `rank`'s dp x cp group (those that differ from it on dp and cp only),
  /// ordered by dp_index * cp + cp_index.
  std::vector<int> dp_cp_ranks(int rank) const;
  /// The ranks of `rank`'s ep group (the same experts' tokens meet there), by ep rank;
  /// and of its expert-data-parallel group (the replicas of its experts), by edp rank. See
  /// the top of this file.
  std::vector<int> ep_ranks(int rank) const;
  std::vector<int> edp_ranks(int rank) const;

  /// Builds one communicator per axis, the dp x cp one when cp > 1 and the ep and edp ones
  /// when ep > 1, with world.split (collective over `world`).
  void build_comms(Communicator& world);
  bool has_comms() const { return comms_[0] != nullptr; }
  /// The communicator of this process's group on `a`; throws before build_comms.
  Communicator& comm(Axis a) const;
  /// The dp x cp group's communicator, rank dp_index * cp + cp_index: gradients are
  /// reduced, and ZeRO shards, over it. comm(Axis::DP) when cp is 1.
  Communicator& dp_cp_comm() const;
  /// The ep and edp groups' communicators (ranks as ep_ranks / edp_ranks order them);
  /// with ep = 1, nullptr for ep (a group of one) and dp_cp_comm() for edp.
  Communicator* ep_comm() const;
  Communicator& edp_comm() const;

  /// "dp=2 tp=2 pp=1 (world 4)"; " cp=2" after dp when cp > 1, " ep=2" after pp when ep > 1.
  std::string str() const;

 private:
  /// build_comms's ep and edp communicators (ep > 1).
  void build_expert_comms(Communicator& world);

  int world_size_ = 1;
  int rank_ = 0;
  std::array<int, kNumAxes> sizes_{};
  std::array<std::unique_ptr<Communicator>, kNumAxes> comms_{};
  int ep_ = 1;
  std::unique_ptr<Communicator> dp_cp_;  // cp > 1 only
  std::unique_ptr<Communicator> ep_comm_, edp_comm_;  // ep > 1 only
};

}  // namespace kiln
