// Expert parallelism as the MoE layer sees it (issue 40; GShard, Lepikhin et al. 2020;
// Megatron-core's MoEAlltoAllTokenDispatcher; torchtitan's expert_parallel): the E
// experts of a layer are split over the ep ranks of a group, rank r holding the El = E/ep
// experts [r El, (r+1) El), and each rank's routed (token, choice) slots travel to the
// rank that holds their expert and back.
//
// One call, on rank r of the group (host-side bookkeeping here; the movement is the
// group's all_to_all):
//   1. the rank's slots, permuted into global expert order (moe_permute_plan), count
//      c_r[e] per expert; the counts of the experts rank q holds, c_r[q El .. (q+1) El),
//      go to rank q (an all_to_all of El int32 per rank), so that rank r learns
//      c_s[r El + j] for every source s and local expert j;
//   2. the slots' rows go to their expert's rank (an all_to_all of rows): rank q's rows
//      are consecutive in expert order already, so send_rows[q] = sum_j c_r[q El + j];
//      what arrives is laid out by source, then local expert;
//   3. the grouped GEMMs want it by local expert, then source: to_expert_order maps each
//      received row to its row there (Megatron-core's sort_chunks_by_idxs), and offsets
//      [El + 1] bound each local expert's rows;
//   4. backward and the return trip run the same maps the other way.
// Within an expert, rows keep their source's order (slots in token order, source ranks
// ascending), so the rows of each expert are a fixed function of the routing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kiln::nn {

/// Rank `rank`'s bookkeeping for one call over an ep group of `ep` ranks (see the top of
/// this file). Row counts are in rows of the layer's width; everything on the host.
struct EpDispatch {
  int ep = 1, rank = 0;
  int64_t local_experts = 0;           // El = E / ep
  std::vector<int64_t> send_rows;      // [ep]: rows this rank sends rank q
  std::vector<int64_t> recv_rows;      // [ep]: rows rank s sends this rank
  std::vector<int32_t> to_expert_order;  // [received]: received row i -> its row by expert
  std::vector<int32_t> offsets;          // [El + 1]: local expert j's rows, by expert
  int64_t received() const { return offsets.empty() ? 0 : offsets.back(); }
};

/// The dispatch of rank `rank` of `ep` from `own` int32 [E] (this rank's slots per global
/// expert, from moe_permute_plan's offsets) and `incoming` int32 [ep * El] (row s: rank
/// s's slots for this rank's local experts, as the counts all_to_all delivers them).
/// Throws kiln::Error unless ep divides E (ep >= 1, 0 <= rank < ep), the sizes match and
/// no count is negative.
EpDispatch make_ep_dispatch(std::span<const int32_t> own, std::span<const int32_t> incoming,
                            int ep, int rank);

}  // namespace kiln::nn
