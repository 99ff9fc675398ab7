#include "parallel/mesh.h"

#include <fmt/format.h>

namespace kiln {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::DP: return "dp";
    case Axis::CP: return "cp";
    case Axis::TP: return "tp";
    case Axis::PP: return "pp";
  }
  return "?";
}

std::string MeshCoord::str() const {
  std::string s = "(";
  for (size_t i = 0; i < kAllAxes.size(); ++i) {
    if (i > 0) s += ", ";
    s += fmt::format("{}={}", axis_name(kAllAxes[i]), (*this)[kAllAxes[i]]);
  }
  return s + ")";
}

DeviceMesh::DeviceMesh(int world_size, int rank, MeshSizes sizes)
    : world_size_(world_size), rank_(rank) {
  const int cp = sizes.cp, tp = sizes.tp, pp = sizes.pp;
  int dp = sizes.dp;
  KILN_CHECK(world_size >= 1, "parallel: world size must be >= 1, got {}", world_size);
  KILN_CHECK(rank >= 0 && rank < world_size, "parallel: rank {} out of range [0, {})", rank,
             world_size);
  KILN_CHECK(tp >= 1, "parallel.tp must be >= 1, got {}", tp);
  KILN_CHECK(pp >= 1, "parallel.pp must be >= 1, got {}", pp);
  KILN_CHECK(cp >= 1, "parallel.cp must be >= 1, got {}", cp);
  KILN_CHECK(dp >= 0, "parallel.dp must be >= 1 (or 0 to derive it), got {}", dp);
  // Messages name cp only when it is used, so that dp x tp x pp ones read as before.
  const std::string cps = cp > 1 ? fmt::format("cp ({}) * ", cp) : "";
  if (dp == 0) {
    KILN_CHECK(world_size % (cp * tp * pp) == 0,
               "parallel: {}tp ({}) * pp ({}) = {} does not divide the world size {}, so dp "
               "cannot be derived",
               cps, tp, pp, cp * tp * pp, world_size);
    dp = world_size / (cp * tp * pp);
  }
  KILN_CHECK(static_cast<int64_t>(dp) * cp * tp * pp == world_size,
             "parallel: dp ({}) * {}tp ({}) * pp ({}) = {} must equal the world size {}", dp, cps,
             tp, pp, static_cast<int64_t>(dp) * cp * tp * pp, world_size);
  sizes_[static_cast<size_t>(Axis::DP)] = dp;
  sizes_[static_cast<size_t>(Axis::CP)] = cp;
  sizes_[static_cast<size_t>(Axis::TP)] = tp;
  sizes_[static_cast<size_t>(Axis::PP)] = pp;
  ep_ = sizes.ep;
  KILN_CHECK(ep_ >= 1 && (dp * cp) % ep_ == 0,
             "parallel.ep = {} must divide dp ({}) * cp ({}) = {}: the expert-parallel group is "
             "carved out of the ranks sharing the parameters",
             ep_, dp, cp, dp * cp);
}

DeviceMesh::DeviceMesh(Communicator& world, MeshSizes sizes)
    : DeviceMesh(world.size(), world.rank(), sizes) {
  build_comms(world);
}

DeviceMesh::DeviceMesh(DeviceMesh&&) noexcept = default;
DeviceMesh& DeviceMesh::operator=(DeviceMesh&&) noexcept = default;
DeviceMesh::~DeviceMesh() = default;

MeshCoord DeviceMesh::coord(int rank) const {
  KILN_CHECK(rank >= 0 && rank < world_size_, "mesh {}: rank {} out of range", str(), rank);
  MeshCoord c;
  int rest = rank;
  for (auto it = kMeshLayout.rbegin(); it != kMeshLayout.rend(); ++it) {
    c[*it] = rest % size(*it);
    rest /= size(*it);
  }
  return c;
}

int DeviceMesh::rank_of(const MeshCoord& c) const {
  int r = 0;
  for (Axis a : kMeshLayout) {
    KILN_CHECK(c[a] >= 0 && c[a] < size(a), "mesh {}: coordinate {} = {} out of range [0, {})",
               str(), axis_name(a), c[a], size(a));
    r = r * size(a) + c[a];
  }
  return r;
}

std::vector<int> DeviceMesh::group_ranks(Axis a, int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> ranks;
  ranks.reserve(static_cast<size_t>(size(a)));
  for (int i = 0; i < size(a); ++i) {
    c[a] = i;
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int DeviceMesh::group_index(Axis a, int rank) const {
  const MeshCoord c = coord(rank);
  int index = 0;
  for (Axis b : kMeshLayout) {
    if (b != a) index = index * size(b) + c[b];
  }
  return index;
}

std::vector<std::vector<int>> DeviceMesh::groups(Axis a) const {
  std::vector<std::vector<int>> out(static_cast<size_t>(world_size_ / size(a)));
  for (int r = 0; r < world_size_; ++r) {
    if (coord(r)[a] == 0) out[static_cast<size_t>(group_index(a, r))] = group_ranks(a, r);
  }
  return out;
}

std::vector<int> DeviceMesh::dp_cp_ranks(int rank) const {
  MeshCoord c = coord(rank);
  std::vector<int> ranks;
  for (int d = 0; d < dp(); ++d)
    for (int k = 0; k < cp(); ++k) {
      c[Axis::DP] = d, c[Axis::CP] = k;
      ranks.push_back(rank_of(c));
    }
  return ranks;
}

std::vector<int> DeviceMesh::ep_ranks(int rank) const {
  const std::vector<int> dp_cp = dp_cp_ranks(rank);
  const MeshCoord c = coord(rank);
  const int first = (c[Axis::DP] * cp() + c[Axis::CP]) / ep_ * ep_;  // q of ep rank 0
  return {dp_cp.begin() + first, dp_cp.begin() + first + ep_};
}

std::vector<int> DeviceMesh::edp_ranks(int rank) const {
  const std::vector<int> dp_cp = dp_cp_ranks(rank);
  const MeshCoord c = coord(rank);
  std::vector<int> ranks;
  for (size_t q = static_cast<size_t>((c[Axis::DP] * cp() + c[Axis::CP]) % ep_); q < dp_cp.size();
       q += static_cast<size_t>(ep_))
    ranks.push_back(dp_cp[q]);
  return ranks;
}

void DeviceMesh::build_comms(Communicator& world) {
  KILN_CHECK(world.size() == world_size_ && world.rank() == rank_,
             "mesh {} (rank {}) built from communicator '{}' of size {} at rank {}", str(), rank_,
             world.name(), world.size(), world.rank());
  const MeshCoord me = coord();
  for (Axis a : kAllAxes) {
    // Every rank calls split once per axis, in the same order: color = my group on a,
    // key = my coordinate on a, so a group's ranks are ordered by that coordinate.
    comms_[static_cast<size_t>(a)] = world.split(group_index(a, rank_), me[a], axis_name(a));
    Communicator& c = *comms_[static_cast<size_t>(a)];
    KILN_CHECK(c.size() == size(a) && c.rank() == me[a],
               "mesh {}: the {} communicator has size {} and rank {}, expected {} and {}", str(),
               axis_name(a), c.size(), c.rank(), size(a), me[a]);
  }
  if (cp() > 1) {  // color: the coordinates on tp and pp; key: the rank in the group
    dp_cp_ = world.split(me[Axis::PP] * tp() + me[Axis::TP], me[Axis::DP] * cp() + me[Axis::CP],
                         "dp_cp");
    KILN_CHECK(dp_cp_->size() == dp() * cp(), "mesh {}: the dp x cp communicator has size {}",
               str(), dp_cp_->size());
  }
  if (ep_ > 1) build_expert_comms(world);
}

void DeviceMesh::build_expert_comms(Communicator& world) {
  // Colors: the tp and pp coordinates and the group's first member (unique per group);
  // keys: the rank's position in the group.
  const MeshCoord me = coord();
  const int q = me[Axis::DP] * cp() + me[Axis::CP];
  const int slice = me[Axis::PP] * tp() + me[Axis::TP];
  const int dpcp = dp() * cp();
  ep_comm_ = world.split(slice * dpcp + q / ep_, q % ep_, "ep");
  edp_comm_ = world.split(slice * dpcp + q % ep_, q / ep_, "edp");
  KILN_CHECK(ep_comm_->size() == ep_ && edp_comm_->size() == dpcp / ep_,
             "mesh {}: the ep and edp communicators have sizes {} and {}", str(),
             ep_comm_->size(), edp_comm_->size());
}

Communicator* DeviceMesh::ep_comm() const {
  KILN_CHECK(has_comms(), "mesh {}: ep_comm() asked before build_comms()", str());
  return ep_comm_.get();
}

Communicator& DeviceMesh::edp_comm() const {
  if (ep_ == 1) return dp_cp_comm();
  KILN_CHECK(edp_comm_ != nullptr, "mesh {}: edp_comm() asked before build_comms()", str());
  return *edp_comm_;
}

Communicator& DeviceMesh::dp_cp_comm() const {
  if (cp() == 1) return comm(Axis::DP);
  KILN_CHECK(dp_cp_ != nullptr, "mesh {}: dp_cp_comm() asked before build_comms()", str());
  return *dp_cp_;
}

Communicator& DeviceMesh::comm(Axis a) const {
  KILN_CHECK(has_comms(), "mesh {}: comm({}) asked before build_comms()", str(), axis_name(a));
  return *comms_[static_cast<size_t>(a)];
}

std::string DeviceMesh::str() const {
  const std::string cps = cp() > 1 ? fmt::format(" cp={}", cp()) : "";
  const std::string eps = ep_ > 1 ? fmt::format(" ep={}", ep_) : "";
  return fmt::format("dp={}{} tp={} pp={}{} (world {})", dp(), cps, tp(), pp(), eps, world_size_);
}

}  // namespace kiln
