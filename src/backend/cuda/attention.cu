// Self-attention (causal or bidirectional, multi-head or grouped-query), FlashAttention
// style (Dao et al. 2022, "FlashAttention"; Dao 2023, "FlashAttention-2" for the loop
// order), with fp32 arithmetic on the CUDA cores: q, k, v tiles are staged in shared
// memory (as fp32, whatever the storage type), softmax is computed online, the forward
// saves only lse = m + log(l) per row, and the backward recomputes P = exp(S - lse).
// Nothing of size T x T is ever stored.
//
// Head size: the kernels are instantiated for D = 16, 32, 64, 128 and run any HD <= D
// (shared tiles and registers zero-padded), so odd head sizes work at the cost of the
// padding. GPT-2 (HD = 64) runs D = 64.
//
// Layout (AttentionShape): qkv rows of W = (NH + 2 NKV) HD columns, q head h at h HD, k
// and v heads of kv head kvh at (NH + kvh) HD and (NH + NKV + kvh) HD; query head h reads
// kv head h / (NH / NKV). Causal: query i sees keys j <= i; bidirectional: every key.
//
// Forward (attn_fwd): grid (ceil(T/64), B*NH), 64 threads; thread = one query row i,
// holding q_i (pre-scaled by 1/sqrt(HD)) and its output accumulator in registers. Key and
// value tiles of BK rows (64, or 32 for D = 128) go through shared memory; every thread
// reads the same k_j/v_j element at once (a broadcast, no bank conflicts). Keys are
// taken 8 at a time: 8 scores, one max update (rescaling the accumulator only when the
// max grows), 8 exp, 8 axpys. Query tiles run heaviest (last) first.
//   FLOPs: 4 T^2 HD / 2 per (b,h) (causal half of QK^T and PV; 4 T^2 HD
//   bidirectional). Bytes: q read once,
//   k/v read once per query tile (T/64 times), out written once, lse 4 T.
//
// Backward: three launches, deterministic (no atomics):
//   1. attn_bwd_rowdot: D_i = dO_i . O_i (the softmax backward's row term), one warp per
//      row. Bytes 2 B T C size.
//   2. attn_bwd_dkdv: grid (ceil(T/BKV), B*NKV), thread = key row j of a kv head owning
//      dk_j, dv_j in registers, k_j/v_j in padded shared rows (stride D+1: conflict-free);
//      loops over the query heads of the kv head's group in order (grouped-query: the
//      kv head's gradient sums over them in registers, deterministically), and for each
//      over the query tiles i >= j (all i bidirectional; q, dO, lse, D staged in shared,
//      broadcast reads):
//        p = exp(q.k - lse_i); dv_j += p~ dO_i; ds = p (keep dO_i.v_j - D_i); dk_j += ds q_i
//   3. attn_bwd_dq: grid (ceil(T/BQ), B*NH), thread = query row i owning q_i and dq_i in
//      registers, dO_i in padded shared rows; loops over key tiles j <= i (all j
//      bidirectional) of its kv head:
//        dq_i += ds k_j.
//   FlashAttention-2 computes dq in the dk/dv loop with float atomics; recomputing S and
//   dP in a separate pass costs 7 instead of 5 HD-long dot/axpy per (i,j) pair but makes
//   dq reproducible bit for bit. FLOPs about 7 T^2 HD (causal half) per (b,h).
//
// Dropout on the probabilities: element ((b*NH+h)*T+i)*T+j of Philox stream (seed,
// stream), kept iff its uniform >= p and then scaled by 1/(1-p): the CPU backend's mask.
// The normaliser l uses the undropped probabilities, as the CPU does.
//
// Documents (AttnShape::cu_seqlens, Backend::attention_varlen_forward): attn_doc_windows
// first writes each row's document window into scratch, win[b T + i] = [lo, hi): the
// positions in sequence b of the document holding token b T + i, cut at the sequence's
// ends. Query i sees key j iff lo_i <= j < hi_i (and j <= i causal); as a document is a
// run of rows, key j is seen by query i iff lo_j <= i < hi_j (and i >= j causal), so the
// dk/dv pass reads its keys' windows the same way. Windows only grow with the row, so a
// tile of rows r0..r1 touches keys [lo_r0, hi_r1) at most: every kernel loops over those
// tiles only (the speed-up of packing: about sum of L_d^2 instead of T^2 per sequence)
// and masks the rest. The kernels are templates on kDocs: without documents the code is
// the whole-sequence one. The dropout index is unchanged (i, j positions in the
// sequence), so one document per sequence gives the whole-sequence op bit for bit.
// A row whose window is empty (none for valid cu_seqlens: a query sees itself) gets
// out = 0 and lse = -inf, as the CPU backend.
//
// Limits: HD <= 128 (kMaxHeadDim). These fp32 CUDA-core kernels run for fp32 inputs
// (the golden tests need fp32 without TF32), for dropout > 0, for head sizes other than
// 32/64/128, for unaligned pointers, and when the caller asks for them (the backend's
// backend.attention = "simt"); bf16 without dropout goes to the tensor-core kernels of
// attention_tc.cu (see attention_tc_applies).
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_tc.h"
#include "backend/cuda/common.cuh"

#include <cmath>

namespace kiln::cuda {

namespace {

template <int D>
struct Tiles {
  static constexpr int kFwdQ = 64, kFwdK = D <= 64 ? 64 : 32;
  static constexpr int kKvK = D <= 64 ? 64 : 32, kKvQ = D <= 64 ? 16 : 8;
  static constexpr int kDqQ = D <= 64 ? 64 : 32, kDqK = D <= 64 ? 32 : 16;
};

// CQ = NH HD (out's row width), W = (NH + 2 NKV) HD (qkv's), group = NH / NKV.
struct Geo {
  int T, CQ, NH, NKV, HD, W, group;
  bool causal;
  float scale;
};

// The document window of each of the B*T rows: win[r] = [lo, hi), the positions in r's
// sequence of the document holding r (cu[k] <= r < cu[k+1], k the last such entry: empty
// documents are skipped), cut at the sequence's ends. cu_seqlens outside the contract
// give some window inside the sequence (never a read outside cu or a key outside it).
__global__ void attn_doc_windows(int2* win, const int32_t* cu, int count, int T, int rows) {
  const int64_t r64 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r64 >= rows) return;
  const int r = static_cast<int>(r64);
  int a = 0, e = count;  // upper bound: the first entry > r
  while (a < e) {
    const int mid = (a + e) / 2;
    if (cu[mid] <= r) a = mid + 1;
    else e = mid;
  }
  const int first = a > 0 ? cu[a - 1] : 0, last = a < count ? cu[a] : rows;
  const int row0 = r - r % T;
  const int lo = min(max(first - row0, 0), T);
  win[r] = make_int2(lo, max(min(last - row0, T), lo));
}

// The dropout index of probability (i, 0) of local head row bh (of NH heads): at the
// global head row (DropoutSpec::global_bh), after the spec's offset.
__device__ __forceinline__ uint64_t drop_row_index(const AttnDropout& dr, int64_t bh, int NH,
                                                   int T, int i) {
  const uint64_t gbh = dr.total_heads == 0
                           ? static_cast<uint64_t>(bh)
                           : static_cast<uint64_t>(bh / NH) * dr.total_heads + dr.head_offset + bh % NH;
  return dr.offset + (gbh * T + i) * static_cast<uint64_t>(T);
}

// Keep factor of probability (i, j) of local head row bh (of NH heads): 0 or 1/(1-p).
__device__ __forceinline__ float keep_factor(const AttnDropout& dr, int64_t bh, int NH, int T, int i,
                                             int j) {
  const uint64_t idx = drop_row_index(dr, bh, NH, T, i) + j;
  return uniform_at(dr.seed, dr.stream, idx) >= dr.p ? dr.scale : 0.f;
}

// The keys a block of query rows q0..q_last of sequence b reads (forward and the dQ pass):
// from k_first (a multiple of BK) to k_last, the causal triangle's and, with documents,
// the union of the rows' windows (windows only grow with the row); w, query row i's own
// window (i < 0: a padding row of the block).
template <bool kDocs>
struct QueryBlockKeys {
  int2 w;
  int k_first, k_last;
  __device__ QueryBlockKeys(const int2* win, const Geo& g, int b, int q0, int q_last, int i, int BK) {
    w = make_int2(0, g.T);
    k_first = 0;
    k_last = g.causal ? q_last : g.T - 1;
    if constexpr (kDocs) {
      const int2* wb = win + static_cast<int64_t>(b) * g.T;
      if (i >= 0) w = wb[i];
      k_first = wb[q0].x / BK * BK;
      k_last = min(k_last, wb[q_last].y - 1);
    }
  }
};

template <class T, int D, bool kDocs>
__global__ void __launch_bounds__(Tiles<D>::kFwdQ)
    attn_fwd(T* out, float* lse, const T* qkv, Geo g, AttnDropout dr, const int2* win) {
  constexpr int BQ = Tiles<D>::kFwdQ, BK = Tiles<D>::kFwdK;
  __shared__ float Ks[BK][D];
  __shared__ float Vs[BK][D];
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH), kvh = h / g.group;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
  const int i = q0 + threadIdx.x;
  const bool valid = i < g.T;
  const int64_t row3 = g.W;
  const T* rows = qkv + static_cast<int64_t>(b) * g.T * row3;
  const T* base = rows + static_cast<int64_t>(h) * g.HD;
  const T* kbase = rows + static_cast<int64_t>(g.NH + kvh) * g.HD;
  const T* vbase = kbase + static_cast<int64_t>(g.NKV) * g.HD;

  float q[D], acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    q[d] = (valid && d < g.HD) ? to_f(base[i * row3 + d]) * g.scale : 0.f;
    acc[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const QueryBlockKeys<kDocs> keys(win, g, b, q0, min(g.T, q0 + BQ) - 1, valid ? i : -1, BK);
  const int2 w = keys.w;
  const int k_first = keys.k_first, k_last = keys.k_last;
  const uint64_t drop_row = drop_row_index(dr, bh, g.NH, g.T, valid ? i : 0);

  for (int k0 = k_first; k0 <= k_last; k0 += BK) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < BK * D; idx += BQ) {
      const int j = idx / D, d = idx % D, kj = k0 + j;
      float kv = 0.f, vv = 0.f;
      if (kj < g.T && d < g.HD) {
        kv = to_f(kbase[kj * row3 + d]);
        vv = to_f(vbase[kj * row3 + d]);
      }
      Ks[j][d] = kv;
      Vs[j][d] = vv;
    }
    __syncthreads();
    const int jn = min(BK, k_last - k0 + 1);
    for (int j0 = 0; j0 < jn; j0 += 8) {
      float sc[8];
      float mx = -INFINITY;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int j = j0 + u;
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < D; ++d) s += q[d] * Ks[j][d];
        sc[u] = (j < jn && (!g.causal || k0 + j <= i)) ? s : -INFINITY;
        if constexpr (kDocs)
          if (k0 + j < w.x || k0 + j >= w.y) sc[u] = -INFINITY;
        mx = fmaxf(mx, sc[u]);
      }
      if (mx > m) {
        const float corr = expf(m - mx);
        l *= corr;
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] *= corr;
        m = mx;
      }
      float pw[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float p = sc[u] == -INFINITY ? 0.f : expf(sc[u] - m);
        l += p;
        pw[u] = p;
      }
      if (dr.p > 0.f) {
        uint64_t cached = ~uint64_t{0};
        Philox4 r{};
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          if (pw[u] == 0.f) continue;
          const uint64_t idx = drop_row + static_cast<uint64_t>(k0 + j0 + u);
          if ((idx >> 2) != cached) {
            cached = idx >> 2;
            r = philox_block(dr.seed, dr.stream, cached);
          }
          pw[u] = u32_to_uniform(r[static_cast<int>(idx & 3)]) >= dr.p ? pw[u] * dr.scale : 0.f;
        }
      }
#pragma unroll
      for (int d = 0; d < D; ++d) {
        float a = acc[d];
#pragma unroll
        for (int u = 0; u < 8; ++u) a += pw[u] * Vs[j0 + u][d];
        acc[d] = a;
      }
    }
  }
  if (!valid) return;
  const float inv = (!kDocs || l > 0.f) ? 1.f / l : 0.f;  // l = 0: no key (lse -inf)
  T* o = out + (static_cast<int64_t>(b) * g.T + i) * g.CQ + static_cast<int64_t>(h) * g.HD;
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < g.HD) o[d] = from_f<T>(acc[d] * inv);
  lse[bh * g.T + i] = m + logf(l);
}

// D_i = dO_i . O_i, one warp per (b, h, i) row.
template <class T>
__global__ void attn_bwd_rowdot(float* Dvec, const T* dout, const T* out, int64_t rows, Geo g) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int64_t bh = r / g.T, i = r % g.T;
  const int64_t b = bh / g.NH, h = bh % g.NH;
  const int64_t off = (b * g.T + i) * g.CQ + h * g.HD;
  float s = 0.f;
  for (int d = lane; d < g.HD; d += 32) s += to_f(dout[off + d]) * to_f(out[off + d]);
  s = warp_sum(s);
  if (lane == 0) Dvec[r] = s;
}

template <class T, int D, bool kDocs>
__global__ void __launch_bounds__(Tiles<D>::kKvK)
    attn_bwd_dkdv(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Dvec, Geo g,
                  AttnDropout dr, const int2* win) {
  constexpr int BK = Tiles<D>::kKvK, BQ = Tiles<D>::kKvQ;
  __shared__ float Kown[BK][D + 1];
  __shared__ float Vown[BK][D + 1];
  __shared__ float Qs[BQ][D];
  __shared__ float dOs[BQ][D];
  __shared__ float Ls[BQ], Ds[BQ];
  const int64_t bk = blockIdx.y;  // (b, kv head)
  const int b = static_cast<int>(bk / g.NKV), kvh = static_cast<int>(bk % g.NKV);
  const int k0 = (gridDim.x - 1 - blockIdx.x) * BK;
  const int tid = threadIdx.x;
  const int j = k0 + tid;
  const bool validk = j < g.T;
  const int64_t row3 = g.W;
  const T* rows = qkv + static_cast<int64_t>(b) * g.T * row3;
  const T* kbase = rows + static_cast<int64_t>(g.NH + kvh) * g.HD;
  const T* vbase = kbase + static_cast<int64_t>(g.NKV) * g.HD;

  for (int idx = tid; idx < BK * D; idx += BK) {
    const int r = idx / D, d = idx % D, kr = k0 + r;
    const bool in = kr < g.T && d < g.HD;
    Kown[r][d] = in ? to_f(kbase[kr * row3 + d]) : 0.f;
    Vown[r][d] = in ? to_f(vbase[kr * row3 + d]) : 0.f;
  }
  float dk[D], dv[D];
#pragma unroll
  for (int d = 0; d < D; ++d) dk[d] = dv[d] = 0.f;
  int2 w = make_int2(0, g.T), tile = make_int2(0, g.T);  // documents: the queries that see
  if constexpr (kDocs) {                                   // key j, and any key of the tile
    const int2* wb = win + static_cast<int64_t>(b) * g.T;
    if (validk) w = wb[j];
    tile = make_int2(wb[k0].x / BQ * BQ, wb[min(g.T, k0 + BK) - 1].y);
  }

  // The query heads of this kv head's group, in order (one head when NKV = NH).
  for (int h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    const int64_t bh = static_cast<int64_t>(b) * g.NH + h;
    const T* base = rows + static_cast<int64_t>(h) * g.HD;
    const T* dbase = dout + static_cast<int64_t>(b) * g.T * g.CQ + static_cast<int64_t>(h) * g.HD;
    for (int q0 = kDocs ? max(g.causal ? (k0 / BQ) * BQ : 0, tile.x)
                        : (g.causal ? (k0 / BQ) * BQ : 0);
         q0 < (kDocs ? tile.y : g.T); q0 += BQ) {
      __syncthreads();
      for (int idx = tid; idx < BQ * D; idx += BK) {
        const int r = idx / D, d = idx % D, qi = q0 + r;
        const bool in = qi < g.T && d < g.HD;
        Qs[r][d] = in ? to_f(base[qi * row3 + d]) * g.scale : 0.f;
        dOs[r][d] = in ? to_f(dbase[static_cast<int64_t>(qi) * g.CQ + d]) : 0.f;
      }
      if (tid < BQ) {
        const int qi = q0 + tid;
        Ls[tid] = qi < g.T ? lse[bh * g.T + qi] : 0.f;
        Ds[tid] = qi < g.T ? Dvec[bh * g.T + qi] : 0.f;
      }
      __syncthreads();
#pragma unroll 1
      for (int u = 0; u < BQ; ++u) {
        const int i = q0 + u;
        bool ok = validk && (!g.causal || i >= j) && i < g.T;
        if constexpr (kDocs) ok = ok && i >= w.x && i < w.y;
        float s = 0.f, dp = 0.f;
#pragma unroll
        for (int d = 0; d < D; ++d) {
          s += Qs[u][d] * Kown[tid][d];
          dp += dOs[u][d] * Vown[tid][d];
        }
        const float p = ok ? expf(s - Ls[u]) : 0.f;
        const float keep = (ok && dr.p > 0.f) ? keep_factor(dr, bh, g.NH, g.T, i, j) : 1.f;
        const float pd = p * keep;
        const float ds = p * (keep * dp - Ds[u]);
#pragma unroll
        for (int d = 0; d < D; ++d) {
          dv[d] += pd * dOs[u][d];
          dk[d] += ds * Qs[u][d];
        }
      }
    }
  }
  if (!validk) return;
  T* o = dqkv + (static_cast<int64_t>(b) * g.T + j) * row3 +
         static_cast<int64_t>(g.NH + kvh) * g.HD;  // dk; dv NKV heads further
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < g.HD) {
      o[d] = from_f<T>(dk[d]);
      o[static_cast<int64_t>(g.NKV) * g.HD + d] = from_f<T>(dv[d]);
    }
}

template <class T, int D, bool kDocs>
__global__ void __launch_bounds__(Tiles<D>::kDqQ)
    attn_bwd_dq(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* Dvec, Geo g,
                AttnDropout dr, const int2* win) {
  constexpr int BQ = Tiles<D>::kDqQ, BK = Tiles<D>::kDqK;
  __shared__ float dOown[BQ][D + 1];
  __shared__ float Ks[BK][D];
  __shared__ float Vs[BK][D];
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH), kvh = h / g.group;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;
  const int tid = threadIdx.x;
  const int i = q0 + tid;
  const bool valid = i < g.T;
  const int64_t row3 = g.W;
  const T* rows = qkv + static_cast<int64_t>(b) * g.T * row3;
  const T* base = rows + static_cast<int64_t>(h) * g.HD;
  const T* kbase = rows + static_cast<int64_t>(g.NH + kvh) * g.HD;
  const T* vbase = kbase + static_cast<int64_t>(g.NKV) * g.HD;
  const T* dbase = dout + static_cast<int64_t>(b) * g.T * g.CQ + static_cast<int64_t>(h) * g.HD;

  float q[D], dq[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    q[d] = (valid && d < g.HD) ? to_f(base[i * row3 + d]) * g.scale : 0.f;
    dq[d] = 0.f;
  }
  for (int idx = tid; idx < BQ * D; idx += BQ) {
    const int r = idx / D, d = idx % D, qi = q0 + r;
    dOown[r][d] = (qi < g.T && d < g.HD) ? to_f(dbase[static_cast<int64_t>(qi) * g.CQ + d]) : 0.f;
  }
  const float L = valid ? lse[bh * g.T + i] : 0.f;
  const float Di = valid ? Dvec[bh * g.T + i] : 0.f;
  const QueryBlockKeys<kDocs> keys(win, g, b, q0, min(g.T, q0 + BQ) - 1, valid ? i : -1, BK);
  const int2 w = keys.w;
  const int k_first = keys.k_first, k_last = keys.k_last;

  for (int k0 = k_first; k0 <= k_last; k0 += BK) {
    __syncthreads();
    for (int idx = tid; idx < BK * D; idx += BQ) {
      const int r = idx / D, d = idx % D, kj = k0 + r;
      const bool in = kj < g.T && d < g.HD;
      Ks[r][d] = in ? to_f(kbase[kj * row3 + d]) : 0.f;
      Vs[r][d] = in ? to_f(vbase[kj * row3 + d]) : 0.f;
    }
    __syncthreads();
#pragma unroll 1
    for (int u = 0; u < BK; ++u) {
      const int jj = k0 + u;
      if (jj > k_last) break;  // uniform over the block
      bool ok = valid && (!g.causal || jj <= i);
      if constexpr (kDocs) ok = ok && jj >= w.x && jj < w.y;
      float s = 0.f, dp = 0.f;
#pragma unroll
      for (int d = 0; d < D; ++d) {
        s += q[d] * Ks[u][d];
        dp += dOown[tid][d] * Vs[u][d];
      }
      const float p = ok ? expf(s - L) : 0.f;
      const float keep = (ok && dr.p > 0.f) ? keep_factor(dr, bh, g.NH, g.T, i, jj) : 1.f;
      const float ds = p * (keep * dp - Di);
#pragma unroll
      for (int d = 0; d < D; ++d) dq[d] += ds * Ks[u][d];
    }
  }
  if (!valid) return;
  T* o = dqkv + (static_cast<int64_t>(b) * g.T + i) * row3 + static_cast<int64_t>(h) * g.HD;
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < g.HD) o[d] = from_f<T>(dq[d] * g.scale);
}

Geo geo_of(const AttnShape& d) {
  return Geo{static_cast<int>(d.T),   static_cast<int>(d.CQ()), static_cast<int>(d.NH),
             static_cast<int>(d.NKV), static_cast<int>(d.HD),   static_cast<int>(d.W()),
             static_cast<int>(d.NH / d.NKV), d.causal, 1.f / sqrtf(static_cast<float>(d.HD))};
}

void check_shape(const AttnShape& d) {
  if (d.HD > kMaxHeadDim) fail("cuda: attention supports head sizes up to 128");
  if (d.NKV <= 0 || d.NH % d.NKV != 0) fail("cuda: attention: NH must be a multiple of NKV");
  if (d.B * d.NH > 65535) fail("cuda: attention supports B * n_head <= 65535");
  if (d.W() * d.T > (int64_t{1} << 31))
    fail("cuda: attention: T * (NH + 2 NKV) * HD must fit in 31 bits");
  if (d.cu_seqlens && (d.B * d.T >= (int64_t{1} << 31) || d.cu_count >= (int64_t{1} << 31)))
    fail("cuda: attention: documents need B * T and cu_seqlens's entries below 2^31");
}

// Bytes of the key windows (int2 [B*T]) with documents, else 0.
size_t windows_bytes(const AttnShape& d) {
  return d.cu_seqlens ? sizeof(int2) * static_cast<size_t>(d.B * d.T) : 0;
}

// With documents: each row's window written into `at` (windows_bytes(d) of scratch) and
// returned; without: nullptr.
const int2* doc_windows(cudaStream_t s, const AttnShape& d, void* at) {
  if (!d.cu_seqlens) return nullptr;
  auto* win = static_cast<int2*>(at);
  const int64_t rows = d.B * d.T;
  attn_doc_windows<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, s>>>(
      win, d.cu_seqlens, static_cast<int>(d.cu_count), static_cast<int>(d.T),
      static_cast<int>(rows));
  KILN_CUDA_LAUNCHED("attention (document windows)");
  return win;
}

// fn.template operator()<kDocs>() with kDocs = (win != nullptr).
template <class Fn>
void dispatch_docs(const int2* win, Fn&& fn) {
  if (win) fn.template operator()<true>();
  else fn.template operator()<false>();
}

template <class T>
void forward_t(cudaStream_t s, T* out, float* lse, const T* qkv, const AttnShape& d,
               const AttnDropout& dr, const int2* win) {
  const Geo g = geo_of(d);
  dispatch_head_dim(d.HD, [&]<int D>() {
    const dim3 grid(static_cast<unsigned>((d.T + Tiles<D>::kFwdQ - 1) / Tiles<D>::kFwdQ),
                    static_cast<unsigned>(d.B * d.NH));
    dispatch_docs(win, [&]<bool kDocs>() {
      attn_fwd<T, D, kDocs><<<grid, Tiles<D>::kFwdQ, 0, s>>>(out, lse, qkv, g, dr, win);
    });
  });
  KILN_CUDA_LAUNCHED("attention_forward");
}

template <class T>
void backward_t(cudaStream_t s, T* dqkv, const T* dout, const T* qkv, const T* out,
                const float* lse, const AttnShape& d, const AttnDropout& dr, float* Dvec,
                const int2* win) {
  const Geo g = geo_of(d);
  const int64_t rows = d.B * d.NH * d.T;
  attn_bwd_rowdot<<<static_cast<unsigned>((rows + 3) / 4), 128, 0, s>>>(Dvec, dout, out, rows, g);
  KILN_CUDA_LAUNCHED("attention_backward (D)");
  dispatch_head_dim(d.HD, [&]<int D>() {
    dispatch_docs(win, [&]<bool kDocs>() {
      const dim3 gkv(static_cast<unsigned>((d.T + Tiles<D>::kKvK - 1) / Tiles<D>::kKvK),
                     static_cast<unsigned>(d.B * d.NKV));
      attn_bwd_dkdv<T, D, kDocs><<<gkv, Tiles<D>::kKvK, 0, s>>>(dqkv, dout, qkv, lse, Dvec, g,
                                                                 dr, win);
      KILN_CUDA_LAUNCHED("attention_backward (dk, dv)");
      const dim3 gq(static_cast<unsigned>((d.T + Tiles<D>::kDqQ - 1) / Tiles<D>::kDqQ),
                    static_cast<unsigned>(d.B * d.NH));
      attn_bwd_dq<T, D, kDocs><<<gq, Tiles<D>::kDqQ, 0, s>>>(dqkv, dout, qkv, lse, Dvec, g, dr,
                                                             win);
      KILN_CUDA_LAUNCHED("attention_backward (dq)");
    });
  });
}

// D_i's bytes in attention_backward's scratch, rounded up so that the windows behind it
// start on a 256-byte boundary.
size_t dvec_bytes(const AttnShape& d) {
  return (sizeof(float) * static_cast<size_t>(d.B * d.NH * d.T) + 255) / 256 * 256;
}

}  // namespace

size_t attention_forward_scratch_bytes(const AttnShape& d) { return windows_bytes(d); }

void attention_forward(cudaStream_t s, Elem e, void* out, float* lse, const void* qkv,
                       const AttnShape& d, const AttnDropout& drop, void* scratch, bool simt) {
  if (d.B * d.T * d.NH == 0) return;
  check_shape(d);
  const int2* win = doc_windows(s, d, scratch);
  if (!simt && attention_tc_applies(e, d, drop, {out, qkv})) {
    attention_tc_forward(s, out, lse, qkv, d, win);
    return;
  }
  KILN_DISPATCH_ELEM(e, forward_t<scalar_t>(s, static_cast<scalar_t*>(out), lse,
                                            static_cast<const scalar_t*>(qkv), d, drop, win));
}

size_t attention_backward_scratch_bytes(const AttnShape& d) {
  return d.cu_seqlens ? dvec_bytes(d) + windows_bytes(d)
                      : sizeof(float) * static_cast<size_t>(d.B * d.NH * d.T);
}

void attention_backward(cudaStream_t s, Elem e, void* dqkv, const void* dout, const void* qkv,
                        const void* out, const float* lse, const AttnShape& d,
                        const AttnDropout& drop, void* scratch, bool simt) {
  if (d.B * d.T * d.NH == 0) return;
  check_shape(d);
  auto* Dvec = static_cast<float*>(scratch);
  const int2* win = doc_windows(s, d, static_cast<char*>(scratch) + dvec_bytes(d));
  if (!simt && attention_tc_applies(e, d, drop, {dqkv, dout, qkv, out})) {
    attention_tc_backward(s, dqkv, dout, qkv, out, lse, d, Dvec, win);
    return;
  }
  KILN_DISPATCH_ELEM(e, backward_t<scalar_t>(s, static_cast<scalar_t*>(dqkv),
                                             static_cast<const scalar_t*>(dout),
                                             static_cast<const scalar_t*>(qkv),
                                             static_cast<const scalar_t*>(out), lse, d, drop,
                                             Dvec, win));
}

}  // namespace kiln::cuda
