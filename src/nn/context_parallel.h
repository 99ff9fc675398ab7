// Context parallelism as the layers see it: ring attention (Liu et al. 2023, "Ring
// Attention with Blockwise Transformers") over the ranks of a cp group, on the
// load-balanced causal split of Megatron-core and torchtitan.
//
// The split: a sequence of T tokens is cut into 2 cp chunks of T / (2 cp) and cp rank r
// holds chunks r and 2cp-1-r, concatenated (its T_local = T / cp rows, positions
// increasing), so that every rank does the same causal work:
//     cp = 2, T = 8:  chunks 0 1 2 3 -> rank 0 holds tokens 0 1 | 6 7, rank 1 holds 2 3 | 4 5
// Every layer but attention works on the rank's rows alone (positions are an explicit
// input, for rotary and learned position embeddings). Attention passes each rank's keys
// and values around the ring: at hop i rank r holds those of rank j = r - i (mod cp) and
// merges the attention of its queries over them into a running output by log-sum-exp
// (Backend::attention_tile_forward). The tiles are pairs of chunks (a: query chunk, b: key
// chunk; a > b whole, a == b the diagonal, a < b skipped), so that each side of a tile is
// one run of the sequence's positions:
//     j == r  first over first (causal), second over first, second over second (causal)
//     j <  r  both local chunks over j's first chunk, whole
//     j >  r  the second local chunk over both of j's chunks, whole
// Bidirectional attention: every hop is all four pairs. Documents packed into the
// sequences (cu_seqlens, Backend::attention_varlen_forward) mask inside each tile by
// position, so the same split and the same tiles serve packed data: a document may span
// chunks and ranks, and a query row with no key of its document in a tile is left as it
// was (its own key, on the diagonal, is always somewhere). The next hop's keys and
// values are sent while the current tile is computed. Backward runs the same ring with
// the final lse: the key/value gradients travel with their keys and values and reach
// their owner after cp hops (FlashAttention-2's backward per tile).
//
// The group is an interface (CpGroup): src/parallel implements it over a Communicator and
// the context-parallel plan installs it on the attention layers, so the layer library
// includes no communication header.
#pragma once

#include "backend/backend.h"
#include "core/tensor.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace kiln::nn {

/// The ring of one context-parallel group: rank r sends to r+1 and receives from r-1
/// (mod size). Every rank of the group calls the same operations in the same order.
class CpGroup {
 public:
  /// A shift in flight; wait() returns once both its send and its receive are done.
  class Transfer {
   public:
    virtual ~Transfer() = default;
    virtual void wait() = 0;
  };
  virtual ~CpGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// Starts sending `send` to the next rank and receiving `recv` (the same shape and
  /// dtype) from the previous one, on channel `tag` (0 or 1: shifts of one channel match
  /// in order). Both buffers stay untouched until wait().
  virtual std::unique_ptr<Transfer> shift(Stream s, const Tensor& send, const Tensor& recv,
                                          int tag) = 0;
};

/// The global positions 0..T-1 that cp rank `rank` of `cp` holds under the split above,
/// in local order (T_local = T / cp of them). Throws kiln::Error unless 2 cp divides T.
std::vector<int32_t> cp_positions(int64_t T, int cp, int rank);

/// The tiles of the queries of rank `rank` over the keys of rank `source` in a group of
/// cp, T_local rows each (the table above), with their positions in the sequence of
/// T_local * cp; none when the causal mask hides them all.
std::vector<AttentionTile> ring_tiles(int rank, int source, int cp, int64_t T_local,
                                      bool causal);

/// Attention of this rank's queries over the keys of the whole group: out [B,T,NH*HD] in
/// qkv's dtype and lse fp32 [B,NH,T] as Backend::attention_forward (with documents:
/// attention_varlen_forward) would give for the whole sequence, at this rank's rows; qkv
/// [B,T,qkv_width] the rank's T = T_local rows (rotated); cu_seqlens int32 [D+1] the
/// documents of the WHOLE sequences (B * T_local * cp tokens), the same on every rank, or
/// empty. No dropout. Collective over the group.
void ring_attention_forward(Backend& be, Stream s, CpGroup& group, const Tensor& out,
                            const Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                            const AttentionShape& shape);
/// dqkv [B,T,qkv_width] (overwritten) from dout, with forward's out and lse. Collective.
void ring_attention_backward(Backend& be, Stream s, CpGroup& group, const Tensor& dqkv,
                             const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, const Tensor& cu_seqlens,
                             const AttentionShape& shape);

}  // namespace kiln::nn
