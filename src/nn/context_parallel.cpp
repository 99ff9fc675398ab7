#include "nn/context_parallel.h"

#include "core/error.h"

#include <limits>
#include <utility>

namespace kiln::nn {

std::vector<int32_t> cp_positions(int64_t T, int cp, int rank) {
  KILN_CHECK(cp >= 1 && rank >= 0 && rank < cp && T > 0 && T % (2 * cp) == 0,
             "context parallelism: sequence length {} is not a multiple of 2 x cp = {}", T,
             2 * cp);
  const int64_t Tc = T / (2 * cp);
  std::vector<int32_t> pos;
  pos.reserve(static_cast<size_t>(2 * Tc));
  for (const int64_t chunk : {int64_t{rank}, int64_t{2 * cp - 1 - rank}})
    for (int64_t t = 0; t < Tc; ++t) pos.push_back(static_cast<int32_t>(chunk * Tc + t));
  return pos;
}

std::vector<AttentionTile> ring_tiles(int rank, int source, int cp, int64_t T_local,
                                      bool causal) {
  const int64_t Tc = T_local / 2, S = T_local * cp;
  // Chunk c (0: a rank's first, 1: its second) of rank x: local rows c Tc.., at position
  // (c == 0 ? x : 2cp-1-x) Tc of the sequence.
  auto tile = [&](int qc, int kc, bool diagonal) {
    const int64_t q_chunk = qc == 0 ? rank : 2 * cp - 1 - rank;
    const int64_t k_chunk = kc == 0 ? source : 2 * cp - 1 - source;
    return AttentionTile{.q_begin = qc * Tc, .q_len = Tc, .k_begin = kc * Tc, .k_len = Tc,
                         .causal = diagonal, .q_pos = q_chunk * Tc, .k_pos = k_chunk * Tc,
                         .seq_len = S};
  };
  if (!causal) return {tile(0, 0, false), tile(0, 1, false), tile(1, 0, false), tile(1, 1, false)};
  if (source == rank) return {tile(0, 0, true), tile(1, 0, false), tile(1, 1, true)};
  if (source < rank) return {tile(0, 0, false), tile(1, 0, false)};
  return {tile(1, 0, false), tile(1, 1, false)};
}

namespace {

constexpr int kKeys = 0, kGrads = 1;  // the shifts' channels

// The rank's key and value columns of qkv as a kv buffer [B,T,2*NKV*HD].
void pack_kv(Backend& be, Stream s, const Tensor& kv, const Tensor& qkv, const AttentionShape& a) {
  be.copy_columns(s, kv, qkv, 0, a.q_width(), 2 * a.kv_width());
}

Shape kv_shape(const Tensor& qkv, const AttentionShape& a) {
  return Shape{qkv.size(0), qkv.size(1), 2 * a.kv_width()};
}

}  // namespace

void ring_attention_forward(Backend& be, Stream s, CpGroup& group, const Tensor& out,
                            const Tensor& lse, const Tensor& qkv, const Tensor& cu_seqlens,
                            const AttentionShape& shape) {
  const int cp = group.size(), r = group.rank();
  const int64_t T = qkv.size(1);
  KILN_CHECK(T % 2 == 0, "ring attention: {} local rows are not two equal chunks", T);
  const Shape kvs = kv_shape(qkv, shape);
  Tensor cur = be.empty(kvs, qkv.dtype(), MemCategory::Temporaries);
  Tensor next = be.empty(kvs, qkv.dtype(), MemCategory::Temporaries);
  const Tensor acc = be.empty(out.shape(), DType::F32, MemCategory::Temporaries);
  pack_kv(be, s, cur, qkv, shape);
  be.fill(s, acc, 0.f);
  be.fill(s, lse, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < cp; ++i) {
    // The next hop's keys travel while this hop's tile is computed.
    std::unique_ptr<CpGroup::Transfer> t = i + 1 < cp ? group.shift(s, cur, next, kKeys) : nullptr;
    const int source = ((r - i) % cp + cp) % cp;
    for (const AttentionTile& tile : ring_tiles(r, source, cp, T, shape.causal))
      be.attention_tile_forward(s, acc, lse, qkv, cur, cu_seqlens, shape, tile);
    if (t) {
      t->wait();
      std::swap(cur, next);
    }
  }
  be.copy(s, out, acc);
}

void ring_attention_backward(Backend& be, Stream s, CpGroup& group, const Tensor& dqkv,
                             const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, const Tensor& cu_seqlens,
                             const AttentionShape& shape) {
  const int cp = group.size(), r = group.rank();
  const int64_t T = qkv.size(1);
  const Shape kvs = kv_shape(qkv, shape);
  auto temp = [&](const Shape& sh, DType dt) { return be.empty(sh, dt, MemCategory::Temporaries); };
  Tensor cur = temp(kvs, qkv.dtype()), next = temp(kvs, qkv.dtype());
  // dkv: this hop's partial sums (two, as the previous hop's may still be in flight) and
  // the running sums that arrive with the keys from the previous rank.
  Tensor part[2] = {temp(kvs, DType::F32), temp(kvs, DType::F32)};
  const Tensor arrived = temp(kvs, DType::F32);
  const Tensor dq = temp(dout.shape(), DType::F32);
  pack_kv(be, s, cur, qkv, shape);
  be.fill(s, dq, 0.f);
  std::unique_ptr<CpGroup::Transfer> grads;  // the running dkv, one hop behind the keys
  for (int i = 0; i < cp; ++i) {
    std::unique_ptr<CpGroup::Transfer> keys = i + 1 < cp ? group.shift(s, cur, next, kKeys) : nullptr;
    const int source = ((r - i) % cp + cp) % cp;
    const Tensor& dkv = part[i % 2];
    be.fill(s, dkv, 0.f);
    for (const AttentionTile& tile : ring_tiles(r, source, cp, T, shape.causal))
      be.attention_tile_backward(s, dq, dkv, dout, qkv, cur, out, lse, cu_seqlens, shape, tile);
    if (grads) {  // the sums of the ranks before this one over `source`'s keys
      grads->wait();
      be.add(s, dkv, dkv, arrived);
    }
    grads = group.shift(s, dkv, arrived, kGrads);  // after the last hop: back to the owner
    if (keys) {
      keys->wait();
      std::swap(cur, next);
    }
  }
  grads->wait();  // `arrived` now holds the gradient of this rank's own keys and values
  be.copy_columns(s, dqkv, dq, 0, 0, shape.q_width());
  be.copy_columns(s, dqkv, arrived, shape.q_width(), 0, 2 * shape.kv_width());
}

}  // namespace kiln::nn
