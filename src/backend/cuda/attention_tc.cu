// Attention on the tensor cores for bf16 (FlashAttention-2, Dao 2023): the same
// contract as attention.cu (packed qkv [B,T,(NH+2NKV)*HD], causal or bidirectional,
// multi-head or grouped-query; lse fp32 [B,NH,T] = row log-sum-exp, nothing of size
// T x T in memory), with every matrix product on mma.sync.m16n8k16
// (bf16 operands, fp32 accumulation; sm_80+). Softmax, lse, D_i and all accumulators
// are fp32; P and dS are rounded to bf16 only as mma operands (as FlashAttention).
// No dropout here: attention.cu keeps its fp32 kernels for p > 0 (and for fp32 inputs).
//
// Fragments (PTX ISA, mma.m16n8k16, g = lane/4, t = lane%4): A 16x16 row-major, 4 regs
// of bf16x2: (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B 16x8 "col": 2 regs,
// (k = 2t.., n = g), (k = 2t+8.., n = g); C 16x8 fp32: (g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1). The C fragments of two adjacent n-tiles are exactly an A fragment, so
// P (or dS) goes from the accumulators into the next product without shared memory.
// All operand loads are 32-bit shared loads of element pairs: tiles are staged row-major
// (stride D+8 bf16: conflict-free) and, where a product needs pairs along the other
// axis (V in P V, dO and Q in dV/dK, K in dQ), also transposed (stride rows+8).
//
// Tiles: 4 warps per block, each owning 16 rows of the block's 64.
//   forward (grid T/64 x B*NH, heaviest query tiles first): Q fragments in registers; for
//     each key tile k0 <= q0 (64 keys; every tile bidirectional) of the query head's kv
//     head: S = Q K^T (16x64 per warp), scaled into log2 units, causal mask on the
//     diagonal tile only (and the T bound on the last), online max/sum, O += P V.
//     lse = (m + log2 l) ln 2.
//   backward: D_i = dO_i . O_i (one warp per row); then
//     dK/dV (grid T/64 x B*NKV, one block per 64 keys of a kv head, heaviest first):
//       loops over the query heads of the kv head's group in order (grouped-query: their
//       contributions sum in the accumulators, deterministically), and for each over
//       query tiles (64, or 32 for HD = 128) from the diagonal on (from 0 bidirectional):
//       S^T = K Q^T, dP^T = V dO^T,
//       P^T = exp2(S^T - lse_i), dS^T = P^T (dP^T - D_i), dV += P^T dO, dK += dS^T Q;
//     dQ (grid T/64 x B*NH, one block per 64 queries): loops over key tiles (64, or 32
//       for HD = 128) up to the diagonal (all bidirectional) of its kv head: recomputes
//       S and dP, dQ += dS K.
//   A separate dQ pass (as attention.cu) instead of FlashAttention-2's float atomics:
//   deterministic, at the cost of recomputing QK^T and dO V^T (7 instead of 5 products).
// Documents (kDocs; see attention.cu): each row's window [lo, hi) from win; a block loops
//   only over the tiles of its rows' windows (forward and dQ: key tiles from lo of its
//   first query to hi of its last; dK/dV: query tiles from lo of its first key to hi of
//   its last) and masks element by element only on the tiles that some window cuts.
// FLOPs per (b,h): forward 2 T^2 HD (causal half of two products), backward 3.5 T^2 HD.
#include "backend/cuda/attention_tc.h"
#include "backend/cuda/common.cuh"

#include <cmath>
#include <cstring>

namespace kiln::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kThreads = 128;  // 4 warps

// CQ = NH HD (out's row width), W = (NH + 2 NKV) HD (qkv's), group = NH / NKV.
struct TcGeo {
  int T, CQ, NH, NKV, W, group;
  bool causal;
  float scale;    // 1/sqrt(HD)
  float scale2;   // scale * log2(e)
};

// Rows or keys row_a and row_a + 8 of a thread's fragments (rows >= T: an empty window)
// and, for the tile of rows first..last, the range [all.x, all.y) inside every row's
// window (windows grow with the row: lo of the last row, hi of the first).
struct TileWindows {
  int2 own[2];
  int2 all;
};
__device__ __forceinline__ TileWindows tile_windows(const int2* wb, int row_a, int first,
                                                    int last, int T) {
  TileWindows t;
#pragma unroll
  for (int r = 0; r < 2; ++r) t.own[r] = row_a + 8 * r < T ? wb[row_a + 8 * r] : make_int2(0, 0);
  t.all = make_int2(wb[last].x, wb[first].y);
  return t;
}
__device__ __forceinline__ bool outside(int2 w, int x) { return x < w.x || x >= w.y; }

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

__device__ __forceinline__ uint32_t ld32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment of rows r0.., cols c0.. of a row-major shared tile with stride S.
template <int S>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* X, int r0, int c0, int g,
                                       int t) {
  a[0] = ld32(X + (r0 + g) * S + c0 + 2 * t);
  a[1] = ld32(X + (r0 + g + 8) * S + c0 + 2 * t);
  a[2] = ld32(X + (r0 + g) * S + c0 + 2 * t + 8);
  a[3] = ld32(X + (r0 + g + 8) * S + c0 + 2 * t + 8);
}

// A fragment from the C fragments of n-tiles 2k and 2k+1 (16 rows x 16 columns).
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// ROWS x D tile from global rows row0.. (stride `ld` elements; rows >= T are zero) into
// shared X (row-major, stride D+8) and/or XT (transposed, stride ROWS+8). 16-byte loads.
template <int ROWS, int D>
__device__ __forceinline__ void stage(bf16* X, bf16* XT, const bf16* src, int64_t ld, int row0,
                                      int T) {
  constexpr int V = D / 8, SD = D + 8, ST = ROWS + 8;
  for (int v = threadIdx.x; v < ROWS * V; v += kThreads) {
    const int r = v / V, c = (v % V) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) x = *reinterpret_cast<const uint4*>(src + (row0 + r) * ld + c);
    if (X) *reinterpret_cast<uint4*>(X + r * SD + c) = x;
    if (XT) {
      bf16 e[8];
      memcpy(e, &x, 16);
#pragma unroll
      for (int k = 0; k < 8; ++k) XT[(c + k) * ST + r] = e[k];
    }
  }
}

template <int D>
struct TcTiles {
  static constexpr int kFwdQ = 64, kFwdK = 64;
  static constexpr int kKvK = 64, kKvQ = D <= 64 ? 64 : 32;
  static constexpr int kDqQ = 64, kDqK = D <= 64 ? 64 : 32;
  static constexpr size_t fwd_smem() {
    return sizeof(bf16) * (size_t{kFwdQ} * (D + 8) + size_t{kFwdK} * (D + 8) + size_t{D} * (kFwdK + 8));
  }
  static constexpr size_t kv_smem() {
    return sizeof(bf16) * (2 * size_t{kKvK} * (D + 8) + 2 * size_t{kKvQ} * (D + 8) +
                           2 * size_t{D} * (kKvQ + 8)) +
           sizeof(float) * 2 * kKvQ;
  }
  static constexpr size_t dq_smem() {
    return sizeof(bf16) * (2 * size_t{kDqQ} * (D + 8) + 2 * size_t{kDqK} * (D + 8) +
                           size_t{D} * (kDqK + 8));
  }
};

template <int D, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_tc(bf16* out, float* lse, const bf16* qkv, TcGeo g, const int2* win) {
  constexpr int BQ = TcTiles<D>::kFwdQ, BK = TcTiles<D>::kFwdK, SD = D + 8, SK = BK + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + BQ * SD;
  bf16* Vt = Ks + BK * SD;
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH), kvh = h / g.group;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int64_t row3 = g.W;
  const bf16* rows = qkv + static_cast<int64_t>(b) * g.T * row3;
  const bf16* base = rows + static_cast<int64_t>(h) * D;
  const bf16* kbase = rows + static_cast<int64_t>(g.NH + kvh) * D;
  const bf16* vbase = kbase + static_cast<int64_t>(g.NKV) * D;

  stage<BQ, D>(Qs, nullptr, base, row3, q0, g.T);
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) load_a<SD>(qa[ks], Qs, warp * 16, ks * 16, gr, tq);

  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int row_a = q0 + warp * 16 + gr;  // rows row_a (c0, c1) and row_a + 8 (c2, c3)

  int k_begin = 0;
  int k_end = g.causal ? q0 : g.T - 1;  // the last key tile starts at or before it
  TileWindows w{};
  if constexpr (kDocs) {
    const int q_last = min(g.T, q0 + BQ) - 1;
    const int2* wb = win + static_cast<int64_t>(b) * g.T;
    w = tile_windows(wb, row_a, q0, q_last, g.T);
    k_begin = wb[q0].x / BK * BK;
    k_end = min(g.causal ? q_last : g.T - 1, wb[q_last].y - 1);
  }
  for (int k0 = k_begin; k0 <= k_end; k0 += BK) {
    __syncthreads();  // the previous tile is consumed
    stage<BK, D>(Ks, nullptr, kbase, row3, k0, g.T);
    stage<BK, D>(nullptr, Vt, vbase, row3, k0, g.T);
    __syncthreads();
    float s[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int nt = 0; nt < BK / 8; ++nt) {
        const bf16* kr = Ks + (nt * 8 + gr) * SD + ks * 16 + 2 * tq;
        mma16816(s[nt], qa[ks], ld32(kr), ld32(kr + 8));
      }
    const bool need_mask = (g.causal && k0 + BK > q0) || k0 + BK > g.T ||
                           (kDocs && (k0 < w.all.x || k0 + BK > w.all.y));
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * g.scale2;
        if (need_mask) {
          const int col = k0 + nt * 8 + 2 * tq + (e & 1), row = row_a + (e >> 1) * 8;
          if ((g.causal && col > row) || col >= g.T || (kDocs && outside(w.own[e >> 1], col)))
            x = -INFINITY;
        }
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      mu[r] = mn == -INFINITY ? 0.f : mn;
      const float corr = exp2f(m[r] - mu[r]);  // m = -inf: 0
      m[r] = mn;
      l[r] *= corr;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * r] *= corr;
        o[dt][2 * r + 1] *= corr;
      }
    }
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nt][e] - mu[e >> 1]);
        l[e >> 1] += p;
        s[nt][e] = p;
      }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t pa[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const bf16* vr = Vt + (dt * 8 + gr) * SK + kk * 16 + 2 * tq;
        mma16816(o[dt], pa, ld32(vr), ld32(vr + 8));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = row_a + r * 8;
    if (row >= g.T) continue;
    const float inv = (!kDocs || l[r] > 0.f) ? 1.f / l[r] : 0.f;  // l = 0: no key (lse -inf)
    bf16* orow = out + (static_cast<int64_t>(b) * g.T + row) * g.CQ + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * tq) =
          pack_bf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (tq == 0) lse[bh * g.T + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// D_i = dO_i . O_i, one warp per (b, h, i) row; 2 bf16 per lane (HD >= 32, even).
__global__ void attn_rowdot_tc(float* Dvec, const bf16* dout, const bf16* out, int64_t rows,
                               int T, int C, int NH, int HD) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t bh = r / T, i = r % T;
  const int64_t b = bh / NH, h = bh % NH;
  const int64_t off = (b * T + i) * C + h * HD;
  float s = 0.f;
  for (int d = 2 * lane; d < HD; d += 64) {
    const __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(dout + off + d);
    const __nv_bfloat162 y = *reinterpret_cast<const __nv_bfloat162*>(out + off + d);
    s += __bfloat162float(x.x) * __bfloat162float(y.x) + __bfloat162float(x.y) * __bfloat162float(y.y);
  }
  s = warp_sum(s);
  if (lane == 0) Dvec[r] = s;
}

template <int D, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                     const float* Dvec, TcGeo g, const int2* win) {
  constexpr int BK = TcTiles<D>::kKvK, BQ = TcTiles<D>::kKvQ, SD = D + 8, SQ = BQ + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + BK * SD;
  bf16* Qs = Vs + BK * SD;
  bf16* dOs = Qs + BQ * SD;
  bf16* QsT = dOs + BQ * SD;
  bf16* dOsT = QsT + D * SQ;
  float* Ls = reinterpret_cast<float*>(dOsT + D * SQ);
  float* Ds = Ls + BQ;
  const int64_t bk = blockIdx.y;  // (b, kv head)
  const int b = static_cast<int>(bk / g.NKV), kvh = static_cast<int>(bk % g.NKV);
  const int k0 = blockIdx.x * BK;  // the lowest keys see the most queries: first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int64_t row3 = g.W;
  const bf16* rows = qkv + static_cast<int64_t>(b) * g.T * row3;
  const bf16* kbase = rows + static_cast<int64_t>(g.NH + kvh) * D;
  const bf16* vbase = kbase + static_cast<int64_t>(g.NKV) * D;

  stage<BK, D>(Ks, nullptr, kbase, row3, k0, g.T);
  stage<BK, D>(Vs, nullptr, vbase, row3, k0, g.T);
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  const int key_a = k0 + warp * 16 + gr;  // keys key_a (c0, c1) and key_a + 8 (c2, c3)
  int doc_begin = 0, doc_end = 0;  // documents: the query tiles that see a key
  TileWindows w{};                  // and the queries that see each key
  if constexpr (kDocs) {
    const int k_last = min(g.T, k0 + BK) - 1;
    const int2* wb = win + static_cast<int64_t>(b) * g.T;
    w = tile_windows(wb, key_a, k0, k_last, g.T);
    doc_begin = max(g.causal ? k0 : 0, wb[k0].x / BQ * BQ);
    doc_end = wb[k_last].y;
  }

  // The query heads of this kv head's group, in order (one head when NKV = NH).
  for (int h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    const int64_t bh = static_cast<int64_t>(b) * g.NH + h;
    const bf16* base = rows + static_cast<int64_t>(h) * D;
    const bf16* dbase = dout + static_cast<int64_t>(b) * g.T * g.CQ + static_cast<int64_t>(h) * D;
    for (int q0 = kDocs ? doc_begin : (g.causal ? k0 : 0); q0 < (kDocs ? doc_end : g.T);
         q0 += BQ) {
      __syncthreads();
      stage<BQ, D>(Qs, QsT, base, row3, q0, g.T);
      stage<BQ, D>(dOs, dOsT, dbase, g.CQ, q0, g.T);
      for (int r = threadIdx.x; r < BQ; r += kThreads) {
        const int qi = q0 + r;
        Ls[r] = qi < g.T ? lse[bh * g.T + qi] * kLog2e : 0.f;
        Ds[r] = qi < g.T ? Dvec[bh * g.T + qi] : 0.f;
      }
      __syncthreads();
      float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
      for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t ka[4], va[4];
        load_a<SD>(ka, Ks, warp * 16, ks * 16, gr, tq);
        load_a<SD>(va, Vs, warp * 16, ks * 16, gr, tq);
#pragma unroll
        for (int nt = 0; nt < BQ / 8; ++nt) {
          const bf16* qr = Qs + (nt * 8 + gr) * SD + ks * 16 + 2 * tq;
          mma16816(s[nt], ka, ld32(qr), ld32(qr + 8));
          const bf16* dr = dOs + (nt * 8 + gr) * SD + ks * 16 + 2 * tq;
          mma16816(dp[nt], va, ld32(dr), ld32(dr + 8));
        }
      }
      const bool need_mask = (g.causal && q0 < k0 + BK) || q0 + BQ > g.T ||
                             (kDocs && (q0 < w.all.x || q0 + BQ > w.all.y));
#pragma unroll
      for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ci = nt * 8 + 2 * tq + (e & 1);
          float p = exp2f(s[nt][e] * g.scale2 - Ls[ci]);
          if (need_mask) {
            const int i = q0 + ci, j = key_a + (e >> 1) * 8;
            if ((g.causal && i < j) || i >= g.T || (kDocs && outside(w.own[e >> 1], i))) p = 0.f;
          }
          s[nt][e] = p;
          dp[nt][e] = p * (dp[nt][e] - Ds[ci]);
        }
#pragma unroll
      for (int kq = 0; kq < BQ / 16; ++kq) {
        uint32_t pa[4], da[4];
        c_to_a(pa, s[2 * kq], s[2 * kq + 1]);
        c_to_a(da, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const bf16* orow = dOsT + (dt * 8 + gr) * SQ + kq * 16 + 2 * tq;
          mma16816(dv[dt], pa, ld32(orow), ld32(orow + 8));
          const bf16* qrow = QsT + (dt * 8 + gr) * SQ + kq * 16 + 2 * tq;
          mma16816(dk[dt], da, ld32(qrow), ld32(qrow + 8));
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = key_a + r * 8;
    if (j >= g.T) continue;
    bf16* o = dqkv + (static_cast<int64_t>(b) * g.T + j) * row3 +
              static_cast<int64_t>(g.NH + kvh) * D;  // dk; dv NKV heads further
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(o + dt * 8 + 2 * tq) =
          pack_bf16(dk[dt][2 * r] * g.scale, dk[dt][2 * r + 1] * g.scale);
      *reinterpret_cast<uint32_t*>(o + static_cast<int64_t>(g.NKV) * D + dt * 8 + 2 * tq) =
          pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <int D, bool kDocs>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                   const float* Dvec, TcGeo g, const int2* win) {
  constexpr int BQ = TcTiles<D>::kDqQ, BK = TcTiles<D>::kDqK, SD = D + 8, SK = BK + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dOs = Qs + BQ * SD;
  bf16* Ks = dOs + BQ * SD;
  bf16* Vs = Ks + BK * SD;
  bf16* KsT = Vs + BK * SD;
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH), kvh = h / g.group;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int64_t row3 = g.W;
  const bf16* rows = qkv + static_cast<int64_t>(b) * g.T * row3;
  const bf16* base = rows + static_cast<int64_t>(h) * D;
  const bf16* kbase = rows + static_cast<int64_t>(g.NH + kvh) * D;
  const bf16* vbase = kbase + static_cast<int64_t>(g.NKV) * D;
  const bf16* dbase = dout + static_cast<int64_t>(b) * g.T * g.CQ + static_cast<int64_t>(h) * D;

  stage<BQ, D>(Qs, nullptr, base, row3, q0, g.T);
  stage<BQ, D>(dOs, nullptr, dbase, g.CQ, q0, g.T);
  __syncthreads();
  uint32_t qa[D / 16][4], oa[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    load_a<SD>(qa[ks], Qs, warp * 16, ks * 16, gr, tq);
    load_a<SD>(oa[ks], dOs, warp * 16, ks * 16, gr, tq);
  }
  const int row_a = q0 + warp * 16 + gr;
  float L[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_a + 8 * r;
    L[r] = i < g.T ? lse[bh * g.T + i] * kLog2e : 0.f;
    Dr[r] = i < g.T ? Dvec[bh * g.T + i] : 0.f;
  }
  float dq[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
  const int q_last = min(g.T, q0 + BQ) - 1;
  int k_first = 0;                           // the first key tile any row sees
  int k_last = g.causal ? q_last : g.T - 1;  // the last key any row of the tile sees
  TileWindows w{};
  if constexpr (kDocs) {
    const int2* wb = win + static_cast<int64_t>(b) * g.T;
    w = tile_windows(wb, row_a, q0, q_last, g.T);
    k_first = wb[q0].x / BK * BK;
    k_last = min(k_last, wb[q_last].y - 1);
  }

  for (int k0 = k_first; k0 <= k_last; k0 += BK) {
    __syncthreads();
    stage<BK, D>(Ks, KsT, kbase, row3, k0, g.T);
    stage<BK, D>(Vs, nullptr, vbase, row3, k0, g.T);
    __syncthreads();
    float s[BK / 8][4], dp[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int nt = 0; nt < BK / 8; ++nt) {
        const bf16* kr = Ks + (nt * 8 + gr) * SD + ks * 16 + 2 * tq;
        mma16816(s[nt], qa[ks], ld32(kr), ld32(kr + 8));
        const bf16* vr = Vs + (nt * 8 + gr) * SD + ks * 16 + 2 * tq;
        mma16816(dp[nt], oa[ks], ld32(vr), ld32(vr + 8));
      }
    const bool need_mask = (g.causal && k0 + BK > q0) || k0 + BK > g.T ||
                           (kDocs && (k0 < w.all.x || k0 + BK > w.all.y));
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[nt][e] * g.scale2 - L[e >> 1]);
        if (need_mask) {
          const int j = k0 + nt * 8 + 2 * tq + (e & 1), i = row_a + (e >> 1) * 8;
          if ((g.causal && j > i) || j >= g.T || (kDocs && outside(w.own[e >> 1], j))) p = 0.f;
        }
        dp[nt][e] = p * (dp[nt][e] - Dr[e >> 1]);
      }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t da[4];
      c_to_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const bf16* kr = KsT + (dt * 8 + gr) * SK + kk * 16 + 2 * tq;
        mma16816(dq[dt], da, ld32(kr), ld32(kr + 8));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_a + r * 8;
    if (i >= g.T) continue;
    bf16* o = dqkv + (static_cast<int64_t>(b) * g.T + i) * row3 + static_cast<int64_t>(h) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(o + dt * 8 + 2 * tq) =
          pack_bf16(dq[dt][2 * r] * g.scale, dq[dt][2 * r + 1] * g.scale);
  }
}

TcGeo tc_geo(const AttnShape& d) {
  const float scale = 1.f / sqrtf(static_cast<float>(d.HD));
  return TcGeo{static_cast<int>(d.T),   static_cast<int>(d.CQ()), static_cast<int>(d.NH),
               static_cast<int>(d.NKV), static_cast<int>(d.W()),  static_cast<int>(d.NH / d.NKV),
               d.causal,                scale,                    scale * kLog2e};
}

template <class Fn>
void dispatch_hd(int64_t hd, Fn&& fn) {
  if (hd == 32) fn.template operator()<32>();
  else if (hd == 64) fn.template operator()<64>();
  else fn.template operator()<128>();
}

// fn.template operator()<kDocs>() with kDocs = (win != nullptr).
template <class Fn>
void dispatch_docs(const int2* win, Fn&& fn) {
  if (win) fn.template operator()<true>();
  else fn.template operator()<false>();
}

template <class K>
void launch(K kernel, dim3 grid, size_t smem, cudaStream_t s, const char* name, auto... args) {
  if (smem > 48 * 1024)
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  kernel<<<grid, kThreads, smem, s>>>(args...);
  KILN_CUDA_LAUNCHED(name);
}

}  // namespace

bool attention_tc_applies(Elem e, const AttnShape& d, const AttnDropout& drop,
                          std::initializer_list<const void*> ptrs) {
  if (e != Elem::BF16 || drop.p > 0.f) return false;
  if (d.HD != 32 && d.HD != 64 && d.HD != 128) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

void attention_tc_forward(cudaStream_t s, void* out, float* lse, const void* qkv,
                          const AttnShape& d, const int2* win) {
  const TcGeo g = tc_geo(d);
  dispatch_hd(d.HD, [&]<int D>() {
    const dim3 grid(static_cast<unsigned>((d.T + TcTiles<D>::kFwdQ - 1) / TcTiles<D>::kFwdQ),
                    static_cast<unsigned>(d.B * d.NH));
    dispatch_docs(win, [&]<bool kDocs>() {
      launch(attn_fwd_tc<D, kDocs>, grid, TcTiles<D>::fwd_smem(), s,
             "attention_forward (tensor cores)", static_cast<bf16*>(out), lse,
             static_cast<const bf16*>(qkv), g, win);
    });
  });
}

void attention_tc_backward(cudaStream_t s, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, const AttnShape& d,
                           float* Dvec, const int2* win) {
  const TcGeo g = tc_geo(d);
  const int64_t rows = d.B * d.NH * d.T;
  attn_rowdot_tc<<<static_cast<unsigned>((rows + 3) / 4), 128, 0, s>>>(
      Dvec, static_cast<const bf16*>(dout), static_cast<const bf16*>(out), rows, g.T, g.CQ, g.NH,
      static_cast<int>(d.HD));
  KILN_CUDA_LAUNCHED("attention_backward (D)");
  auto* dq = static_cast<bf16*>(dqkv);
  const auto* dO = static_cast<const bf16*>(dout);
  const auto* x = static_cast<const bf16*>(qkv);
  dispatch_hd(d.HD, [&]<int D>() {
    dispatch_docs(win, [&]<bool kDocs>() {
      const dim3 gkv(static_cast<unsigned>((d.T + TcTiles<D>::kKvK - 1) / TcTiles<D>::kKvK),
                     static_cast<unsigned>(d.B * d.NKV));
      launch(attn_bwd_dkdv_tc<D, kDocs>, gkv, TcTiles<D>::kv_smem(), s,
             "attention_backward (dk, dv; tensor cores)", dq, dO, x, lse,
             static_cast<const float*>(Dvec), g, win);
      const dim3 gq(static_cast<unsigned>((d.T + TcTiles<D>::kDqQ - 1) / TcTiles<D>::kDqQ),
                    static_cast<unsigned>(d.B * d.NH));
      launch(attn_bwd_dq_tc<D, kDocs>, gq, TcTiles<D>::dq_smem(), s,
             "attention_backward (dq; tensor cores)", dq, dO, x, lse,
             static_cast<const float*>(Dvec), g, win);
    });
  });
}

}  // namespace kiln::cuda
