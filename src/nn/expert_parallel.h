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
//      are consecutive in expert order, so send_rows[q] = sum_j c_r[q El + j]; what
//      arrives is laid out by source, then local expert;
//   3. the grouped GEMMs want it by local expert, then source: to_expert_order maps each
//      received row to its row there (Megatron-core's sort_chunks_by_idxs), and offsets
//      [El + 1] bound each local expert's rows;
//   4. backward and the return trip run the same maps the other way.
// Steps 2-4 run in two chunks (kEpChunks below), so that the all_to_all of one overlaps
// the experts of the other: each chunk is such a call over its share of the counts, and
// the sender lays its slots out by chunk (ep_chunk_rows), each chunk in expert order.
// Within an expert, rows keep their source's order (slots in token order, source ranks
// ascending), so the rows of each expert are a fixed function of the routing.
//
// The group is an interface (EpGroup): src/parallel implements it over a Communicator
// (the DeviceMesh's ep communicator) and the expert-parallel plan installs it on the MoE
// layers, so the layer library includes no communication header.
#pragma once

#include "backend/backend.h"
#include "core/tensor.h"

#include <array>
#include <cstdint>
#include <memory>
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

/// The all-to-all of one expert-parallel group, on buffers of the layers' backend. Every
/// rank of the group calls it in the same order.
class EpGroup {
 public:
  /// An all_to_all in flight; wait() returns once it is done. Its buffers stay untouched
  /// (in) and unread (out) until then.
  class Transfer {
   public:
    virtual ~Transfer() = default;
    virtual void wait() = 0;
  };
  virtual ~EpGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// Starts an all_to_all of rows: of in [>= sum send_rows, W...] the send_rows[q] rows that
  /// follow those for ranks below q go to rank q; what rank q sends this rank lands in out
  /// [>= sum recv_rows, W...] (one dtype, the same trailing shape W...), recv_rows[q]
  /// rows, after what ranks below q sent. recv_rows[q] must be rank q's send_rows[rank()].
  /// Ordered after the work queued on `s`.
  virtual std::unique_ptr<Transfer> all_to_all_rows(Stream s, const Tensor& out, const Tensor& in,
                                                    std::span<const int64_t> send_rows,
                                                    std::span<const int64_t> recv_rows) = 0;
  /// Step 1's count exchange, on the host: incoming [size() El] (row q: rank q's slots for
  /// this rank's El local experts) from own [size() El] (this rank's slots per global
  /// expert). The default runs all_to_all_rows on int32 buffers of `be`; a planner
  /// overrides it with the counts of the routing it models (plan/).
  virtual void exchange_counts(Backend& be, Stream s, std::span<const int32_t> own,
                               std::span<int32_t> incoming);
};

/// The overlap (Megatron-core's and DeepSeek's two micro-batch halves, here within one
/// call): what a rank sends each rank is split in two chunks, the first ceil(n / 2) of
/// its n rows (in expert order) in chunk 0 and the rest in chunk 1, so that chunk 1's
/// dispatch travels while the experts compute chunk 0 and chunk 0's return while they
/// compute chunk 1 (backward likewise). The sender's slots are laid out in chunk order
/// (chunk 0's rows for ranks 0, 1, .., then chunk 1's), so each chunk is one all_to_all.
inline constexpr int kEpChunks = 2;

/// One chunk of a call: its bookkeeping (from the chunk's counts) and, on the device,
/// order int32 [R_c, 1] (to_expert_order: received row i -> its row by local expert) and
/// offsets int32 [El + 1] (the grouped linears' local expert rows); its rows in the
/// sender's chunk-ordered buffer are [send_begin, send_begin + sent).
struct EpChunk {
  EpDispatch plan;
  Tensor order, offsets;
  int64_t send_begin = 0, sent = 0;
};

/// One call's dispatch, from forward to backward: the chunks, and to_chunk_order
/// [M_kept] (a kept slot's row in expert order -> its row in chunk order, on the host).
struct EpExchange {
  std::array<EpChunk, kEpChunks> chunks;
  std::vector<int32_t> to_chunk_order;
  int64_t received() const;  // R: the rows of both chunks
};

/// Chunk 0's counts: of every run of El counts in `counts` (what one rank sends, or
/// receives from, another, by local expert), the first ceil(n / 2) of the run's n rows.
std::vector<int32_t> ep_first_chunk(std::span<const int32_t> counts, int64_t El);

/// Step 1 of the top of this file: reads `offsets` int32 [E + 1] (moe_permute_plan's, of
/// this rank's slots in global expert order; a host wait) and exchanges the counts over
/// the group. The device tensors are allocated with `category`. Collective. Throws
/// kiln::Error unless the group's size divides E.
EpExchange ep_exchange(Backend& be, Stream s, EpGroup& group, const Tensor& offsets,
                       MemCategory category);
/// rows int32 [N, k] (moe_permute_plan's: a kept slot's row in expert order, -1 dropped)
/// <- the kept slots' rows in chunk order (a host round trip), so that moe_permute lays
/// the slots out for the chunks' all_to_alls and moe_unpermute reads them back there.
void ep_chunk_rows(Backend& be, Stream s, const EpExchange& x, const Tensor& rows);

/// A chunk's all_to_all in flight and the buffer it fills or sends.
struct EpTransfer {
  std::unique_ptr<EpGroup::Transfer> transfer;
  Tensor buffer;
};
/// Starts step 2 for chunk c: its rows of `in` [>= M_kept, W] (chunk order) to the ranks
/// that hold their experts. Collective.
EpTransfer ep_dispatch_start(Backend& be, Stream s, EpGroup& group, const EpExchange& x, int c,
                             const Tensor& in);
/// Waits for it and sorts what arrived (by source) into out [R_c, W] by local expert
/// (step 3).
void ep_dispatch_finish(Backend& be, Stream s, const EpExchange& x, int c, EpTransfer& t,
                        const Tensor& out);
/// Starts the return trip (step 4) of chunk c: the rows of in [R_c, W] (by local expert)
/// back to their sources, into chunk c's rows of out [>= M_kept, W] (chunk order). Wait on
/// the transfer before reading out. Collective.
EpTransfer ep_combine_start(Backend& be, Stream s, EpGroup& group, const EpExchange& x, int c,
                            const Tensor& out, const Tensor& in);

}  // namespace kiln::nn
