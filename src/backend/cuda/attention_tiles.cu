// The tiles of a blockwise (ring) attention (Liu et al. 2023) with fp32 arithmetic on the
// CUDA cores, the CPU backend's tile functions (cpu/attention.cpp) on the GPU: a tile is
// the query rows [q_begin, +q_len) of qkv against the key/value rows [k_begin, +k_len) of
// kv; forward merges the tile's softmax output into fp32 running results by log-sum-exp,
// backward accumulates the tile's fp32 gradients from the FINAL out and lse
// (FlashAttention-2's backward, Dao 2023: P = exp(S - lse), dS = P o (dP - D),
// D_i = dO_i . O_i). Correctness first: one query (or key) row per thread, keys staged
// in shared memory as fp32; the tensor-core kernels of attention_tc.cu are not used.
//
// Which keys a query sees (tile_window, the rule of cpu::key_windows): query i of the
// tile sees its key rows [lo_i, hi_i): all of them, or 0..i on a diagonal (causal) tile;
// with documents also only those of its own document, found by a binary search of
// cu_seqlens for the query's token b S + q_pos + i, cut at the sequence's ends [b S,
// (b+1) S) and counted from the tile's first key (k_pos). A row with an empty window is
// left unchanged by forward and gets no gradient.
//
// Forward (tile_fwd): grid (ceil(q_len/64), B*NH), thread = query row i holding q_i (times
// 1/sqrt(HD)) and its output accumulator in registers; the block walks only the union of
// its rows' windows, BK keys at a time through shared memory (broadcast reads), with an
// online softmax (m, l rescaled when the max grows). Then, rows with l > 0:
//   l' = m + log l,  lse' = max(lse, l') + log1p(exp(-|lse - l'|)),
//   out <- e^(lse - lse') out + e^(l' - lse') acc / l.
//
// Backward, two launches; each gradient element has one owning thread that adds the
// tile's sum to it (no atomics: deterministic, bit for bit from run to run):
//   tile_bwd_dq: grid (ceil(q_len/BQ), B*NH), thread = query row i (q_i and dq_i in
//     registers, dO_i in a padded shared row), D_i computed from dO_i and out_i; over the
//     keys of the block's windows: dq_i += p (dO_i.v_j - D_i) k_j; then dq += dq_i / sqrt(HD).
//   tile_bwd_dkdv: grid (ceil(k_len/BK), B*NKV), thread = key row j of a kv head (k_j, v_j
//     in padded shared rows, dk_j, dv_j in registers); over the tile's query rows BQ at a
//     time (a block of rows skipped when no row's window meets the block's keys), and for
//     each block over the query heads of the kv head's group in order (grouped-query: the
//     kv head's gradient sums over them): dv_j += p dO_i, dk_j += p (dO_i.v_j - D_i) q_i.
//
// Head sizes: instantiated for D = 16, 32, 64, 128 (dispatch_head_dim), any HD <= D.
#include "backend/cuda/attention_tiles.h"

#include "backend/cuda/common.cuh"

#include <climits>
#include <cmath>

namespace kiln::cuda {

namespace {

// Rows per block and keys (or queries) per shared chunk, as attention.cu's kernels.
template <int D>
struct TileBlocks {
  static constexpr int kFwdQ = 64, kFwdK = D <= 64 ? 64 : 32;
  static constexpr int kDqQ = D <= 64 ? 64 : 32, kDqK = D <= 64 ? 32 : 16;
  static constexpr int kKvK = D <= 64 ? 64 : 32, kKvQ = D <= 64 ? 16 : 8;
};

// TileShape as the kernels read it. Row widths: W of qkv, KW of kv, CQ of out.
struct TileGeo {
  int nq, nk, T, Tk, q_begin, k_begin;
  int NH, NKV, HD, group;
  int64_t W, KW, CQ;
  bool causal;
  float scale;
  const int32_t* cu;  // documents (nullptr: none): cu_count entries over B * S tokens
  int cu_count, S, q_pos, k_pos;
};

// Query i's window [lo, hi) in the tile's key rows, in sequence b (see the top comment).
__device__ int2 tile_window(const TileGeo& g, int b, int i) {
  int lo = 0, hi = g.causal ? i + 1 : g.nk;
  if (g.cu) {
    const int row = b * g.S, token = row + g.q_pos + i;
    int a = 0, e = g.cu_count;  // a: the first entry > token
    while (a < e) {
      const int mid = (a + e) / 2;
      if (g.cu[mid] <= token) a = mid + 1;
      else e = mid;
    }
    const int first = max(a > 0 ? g.cu[a - 1] : 0, row);
    const int last = a < g.cu_count ? min(g.cu[a], row + g.S) : row + g.S;
    lo = max(lo, first - row - g.k_pos);
    hi = min(hi, last - row - g.k_pos);
  }
  return make_int2(min(max(lo, 0), g.nk), min(max(hi, 0), g.nk));
}

// The keys [lo, hi) some row of the block sees: the union of the rows' windows w (empty
// windows ignored; lo >= hi when no row sees any). `shared2`: two shared ints.
__device__ int2 block_keys(int2 w, int* shared2) {
  if (threadIdx.x == 0) {
    shared2[0] = INT_MAX;
    shared2[1] = 0;
  }
  __syncthreads();
  if (w.x < w.y) {
    atomicMin(&shared2[0], w.x);  // min and max: the order does not matter
    atomicMax(&shared2[1], w.y);
  }
  __syncthreads();
  return make_int2(shared2[0], shared2[1]);
}

// Rows [k0, k0 + BK) of one kv head of the tile's keys (kbase: key row 0 of the head, vbase
// its values) into K, V as fp32 ([BK][P], P >= D columns), zero past `k_end` and past HD.
template <class T, int BK, int D, int P>
__device__ void stage_keys(float (&K)[BK][P], float (&V)[BK][P], const T* kbase, const T* vbase,
                           int k0, int k_end, const TileGeo& g) {
  for (int idx = threadIdx.x; idx < BK * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D, kj = k0 + r;
    const bool in = kj < k_end && d < g.HD;
    K[r][d] = in ? to_f(kbase[kj * g.KW + d]) : 0.f;
    V[r][d] = in ? to_f(vbase[kj * g.KW + d]) : 0.f;
  }
}

// a . b over D (zero-padded past HD).
template <int D>
__device__ __forceinline__ float dot(const float* a, const float* b) {
  float s = 0.f;
#pragma unroll
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

template <class T, int D>
__global__ void __launch_bounds__(TileBlocks<D>::kFwdQ)
    tile_fwd(float* out, float* lse, const T* qkv, const T* kv, TileGeo g) {
  constexpr int BQ = TileBlocks<D>::kFwdQ, BK = TileBlocks<D>::kFwdK;
  __shared__ float Ks[BK][D];
  __shared__ float Vs[BK][D];
  __shared__ int range[2];
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH), kvh = h / g.group;
  const int i = blockIdx.x * BQ + threadIdx.x;
  const bool valid = i < g.nq;
  const int64_t qrow = static_cast<int64_t>(b) * g.T + g.q_begin + (valid ? i : 0);
  const T* qp = qkv + qrow * g.W + static_cast<int64_t>(h) * g.HD;
  const T* kbase = kv + (static_cast<int64_t>(b) * g.Tk + g.k_begin) * g.KW +
                   static_cast<int64_t>(kvh) * g.HD;
  const T* vbase = kbase + static_cast<int64_t>(g.NKV) * g.HD;

  float q[D], acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    q[d] = (valid && d < g.HD) ? to_f(qp[d]) * g.scale : 0.f;
    acc[d] = 0.f;
  }
  const int2 w = valid ? tile_window(g, b, i) : make_int2(0, 0);
  const int2 keys = block_keys(w, range);
  float m = -INFINITY, l = 0.f;
  for (int k0 = keys.x; k0 < keys.y; k0 += BK) {
    __syncthreads();  // the previous chunk's reads are done
    stage_keys<T, BK, D, D>(Ks, Vs, kbase, vbase, k0, keys.y, g);
    __syncthreads();
    const int jn = min(BK, keys.y - k0);
    for (int j = 0; j < jn; ++j) {  // the same j across the warp: broadcast reads
      if (k0 + j < w.x || k0 + j >= w.y) continue;
      const float s = dot<D>(q, Ks[j]);
      if (s > m) {  // a new max: rescale what is summed so far (0 at the first key)
        const float corr = expf(m - s);
        l *= corr;
#pragma unroll
        for (int d = 0; d < D; ++d) acc[d] *= corr;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
#pragma unroll
      for (int d = 0; d < D; ++d) acc[d] += p * Vs[j][d];
    }
  }
  if (!valid || l == 0.f) return;  // no key of the tile: the row is left as it was
  const float lt = m + logf(l);
  float* lp = lse + bh * g.T + g.q_begin + i;
  const float lo = *lp;
  const float lnew = lo == -INFINITY ? lt : fmaxf(lo, lt) + log1pf(expf(-fabsf(lo - lt)));
  const float wo = expf(lo - lnew), wt = expf(lt - lnew), inv = 1.f / l;
  float* o = out + qrow * g.CQ + static_cast<int64_t>(h) * g.HD;
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < g.HD) o[d] = wo * o[d] + wt * (acc[d] * inv);
  *lp = lnew;
}

template <class T, int D>
__global__ void __launch_bounds__(TileBlocks<D>::kDqQ)
    tile_bwd_dq(float* dq, const T* dout, const T* qkv, const T* kv, const T* out,
                const float* lse, TileGeo g) {
  constexpr int BQ = TileBlocks<D>::kDqQ, BK = TileBlocks<D>::kDqK;
  __shared__ float dOown[BQ][D + 1];  // padded: each thread reads its own row
  __shared__ float Ks[BK][D];
  __shared__ float Vs[BK][D];
  __shared__ int range[2];
  const int64_t bh = blockIdx.y;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH), kvh = h / g.group;
  const int tid = threadIdx.x, i = blockIdx.x * BQ + tid;
  const bool valid = i < g.nq;
  const int64_t qrow = static_cast<int64_t>(b) * g.T + g.q_begin + (valid ? i : 0);
  const int64_t orow = qrow * g.CQ + static_cast<int64_t>(h) * g.HD;  // out, dout, dq
  const T* qp = qkv + qrow * g.W + static_cast<int64_t>(h) * g.HD;
  const T* kbase = kv + (static_cast<int64_t>(b) * g.Tk + g.k_begin) * g.KW +
                   static_cast<int64_t>(kvh) * g.HD;
  const T* vbase = kbase + static_cast<int64_t>(g.NKV) * g.HD;

  float q[D], dqi[D];
  float Di = 0.f;
#pragma unroll
  for (int d = 0; d < D; ++d) {
    const bool in = valid && d < g.HD;
    q[d] = in ? to_f(qp[d]) * g.scale : 0.f;
    dqi[d] = 0.f;
    const float o = in ? to_f(dout[orow + d]) : 0.f;
    dOown[tid][d] = o;
    if (in) Di += o * to_f(out[orow + d]);
  }
  const float L = valid ? lse[bh * g.T + g.q_begin + i] : 0.f;
  const int2 w = valid ? tile_window(g, b, i) : make_int2(0, 0);
  const int2 keys = block_keys(w, range);
  for (int k0 = keys.x; k0 < keys.y; k0 += BK) {
    __syncthreads();
    stage_keys<T, BK, D, D>(Ks, Vs, kbase, vbase, k0, keys.y, g);
    __syncthreads();
    const int jn = min(BK, keys.y - k0);
    for (int j = 0; j < jn; ++j) {
      if (k0 + j < w.x || k0 + j >= w.y) continue;
      const float p = expf(dot<D>(q, Ks[j]) - L);
      const float ds = p * (dot<D>(dOown[tid], Vs[j]) - Di);
#pragma unroll
      for (int d = 0; d < D; ++d) dqi[d] += ds * Ks[j][d];
    }
  }
  if (!valid || w.x >= w.y) return;
  float* o = dq + orow;
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < g.HD) o[d] += dqi[d] * g.scale;
}

template <class T, int D>
__global__ void __launch_bounds__(TileBlocks<D>::kKvK)
    tile_bwd_dkdv(float* dkv, const T* dout, const T* qkv, const T* kv, const T* out,
                  const float* lse, TileGeo g) {
  constexpr int BK = TileBlocks<D>::kKvK, BQ = TileBlocks<D>::kKvQ;
  static_assert(BQ <= BK, "the first BQ threads stage a query block's rows");
  __shared__ float Kown[BK][D + 1];  // padded: each thread reads its own row
  __shared__ float Vown[BK][D + 1];
  __shared__ float Qs[BQ][D];
  __shared__ float dOs[BQ][D];
  __shared__ float Ls[BQ], Ds[BQ];
  __shared__ int2 Ws[BQ];
  const int64_t bk = blockIdx.y;  // (b, kv head)
  const int b = static_cast<int>(bk / g.NKV), kvh = static_cast<int>(bk % g.NKV);
  const int tid = threadIdx.x, k0 = blockIdx.x * BK, j = k0 + tid;
  const int k_end = min(k0 + BK, g.nk);
  const bool validk = j < g.nk;
  const int64_t krow = static_cast<int64_t>(b) * g.Tk + g.k_begin;  // the tile's key row 0
  const T* kbase = kv + krow * g.KW + static_cast<int64_t>(kvh) * g.HD;
  const T* vbase = kbase + static_cast<int64_t>(g.NKV) * g.HD;
  const int64_t qrow0 = static_cast<int64_t>(b) * g.T + g.q_begin;  // the tile's query row 0

  stage_keys<T, BK, D, D + 1>(Kown, Vown, kbase, vbase, k0, k_end, g);
  float dk[D], dv[D];
#pragma unroll
  for (int d = 0; d < D; ++d) dk[d] = dv[d] = 0.f;

  for (int q0 = 0; q0 < g.nq; q0 += BQ) {
    __syncthreads();  // the previous block's reads are done
    bool meets = false;  // some row of the block sees a key of ours
    if (tid < BQ) {
      const int i = q0 + tid;
      const int2 w = i < g.nq ? tile_window(g, b, i) : make_int2(0, 0);
      Ws[tid] = w;
      meets = w.x < w.y && w.x < k_end && w.y > k0;
    }
    if (!__syncthreads_or(meets)) continue;
    for (int h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
      const int64_t bh = static_cast<int64_t>(b) * g.NH + h;
      const int64_t hcol = static_cast<int64_t>(h) * g.HD;
      __syncthreads();  // the previous head's reads are done
      for (int idx = tid; idx < BQ * D; idx += BK) {
        const int r = idx / D, d = idx % D, i = q0 + r;
        const bool in = i < g.nq && d < g.HD;
        Qs[r][d] = in ? to_f(qkv[(qrow0 + i) * g.W + hcol + d]) * g.scale : 0.f;
        dOs[r][d] = in ? to_f(dout[(qrow0 + i) * g.CQ + hcol + d]) : 0.f;
      }
      if (tid < BQ) {
        const int i = q0 + tid;
        float Di = 0.f;
        if (i < g.nq) {
          const int64_t o = (qrow0 + i) * g.CQ + hcol;
          for (int d = 0; d < g.HD; ++d) Di += to_f(dout[o + d]) * to_f(out[o + d]);
        }
        Ds[tid] = Di;
        Ls[tid] = i < g.nq ? lse[bh * g.T + g.q_begin + i] : 0.f;
      }
      __syncthreads();
      if (!validk) continue;
      for (int u = 0; u < BQ; ++u) {
        const int2 w = Ws[u];
        if (j < w.x || j >= w.y) continue;  // query q0 + u does not see key j
        const float p = expf(dot<D>(Qs[u], Kown[tid]) - Ls[u]);
        const float ds = p * (dot<D>(dOs[u], Vown[tid]) - Ds[u]);
#pragma unroll
        for (int d = 0; d < D; ++d) {
          dv[d] += p * dOs[u][d];
          dk[d] += ds * Qs[u][d];
        }
      }
    }
  }
  if (!validk) return;
  float* o = dkv + (krow + j) * g.KW + static_cast<int64_t>(kvh) * g.HD;  // dk; dv NKV heads on
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < g.HD) {
      o[d] += dk[d];
      o[static_cast<int64_t>(g.NKV) * g.HD + d] += dv[d];
    }
}

TileGeo geo_of(const TileShape& t) {
  if (t.HD > 128) fail("cuda: attention tiles support head sizes up to 128");
  if (t.NKV <= 0 || t.NH % t.NKV != 0) fail("cuda: attention tiles: NH must be a multiple of NKV");
  if (t.B * t.NH > 65535) fail("cuda: attention tiles support B * n_head <= 65535");
  if (t.B * t.T >= (int64_t{1} << 31) || t.B * t.Tk >= (int64_t{1} << 31))
    fail("cuda: attention tiles need B * T and B * Tk below 2^31");
  if (t.cu_seqlens && (t.B * t.seq_len >= (int64_t{1} << 31) || t.cu_count >= (int64_t{1} << 31)))
    fail("cuda: attention tiles: documents need B * seq_len and cu_seqlens's entries below 2^31");
  auto i32 = [](int64_t x) { return static_cast<int>(x); };
  return TileGeo{i32(t.q_len), i32(t.k_len), i32(t.T), i32(t.Tk), i32(t.q_begin), i32(t.k_begin),
                 i32(t.NH), i32(t.NKV), i32(t.HD), i32(t.NH / t.NKV),
                 (t.NH + 2 * t.NKV) * t.HD, 2 * t.NKV * t.HD, t.NH * t.HD, t.causal,
                 1.f / sqrtf(static_cast<float>(t.HD)), t.cu_seqlens, i32(t.cu_count),
                 i32(t.seq_len), i32(t.q_pos), i32(t.k_pos)};
}

unsigned blocks(int64_t rows, int per_block) {
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

template <class T>
void forward_t(cudaStream_t s, float* out, float* lse, const T* qkv, const T* kv,
               const TileShape& t) {
  const TileGeo g = geo_of(t);
  dispatch_head_dim(t.HD, [&]<int D>() {
    constexpr int BQ = TileBlocks<D>::kFwdQ;
    const dim3 grid(blocks(t.q_len, BQ), static_cast<unsigned>(t.B * t.NH));
    tile_fwd<T, D><<<grid, BQ, 0, s>>>(out, lse, qkv, kv, g);
  });
  KILN_CUDA_LAUNCHED("attention_tile_forward");
}

template <class T>
void backward_t(cudaStream_t s, float* dq, float* dkv, const T* dout, const T* qkv, const T* kv,
                const T* out, const float* lse, const TileShape& t) {
  const TileGeo g = geo_of(t);
  dispatch_head_dim(t.HD, [&]<int D>() {
    constexpr int BQ = TileBlocks<D>::kDqQ, BK = TileBlocks<D>::kKvK;
    const dim3 gq(blocks(t.q_len, BQ), static_cast<unsigned>(t.B * t.NH));
    tile_bwd_dq<T, D><<<gq, BQ, 0, s>>>(dq, dout, qkv, kv, out, lse, g);
    KILN_CUDA_LAUNCHED("attention_tile_backward (dq)");
    const dim3 gkv(blocks(t.k_len, BK), static_cast<unsigned>(t.B * t.NKV));
    tile_bwd_dkdv<T, D><<<gkv, BK, 0, s>>>(dkv, dout, qkv, kv, out, lse, g);
    KILN_CUDA_LAUNCHED("attention_tile_backward (dk, dv)");
  });
}

}  // namespace

void attention_tile_forward(cudaStream_t s, Elem e, float* out_acc, float* lse, const void* qkv,
                            const void* kv, const TileShape& t) {
  if (t.B * t.NH * t.q_len * t.k_len == 0) return;
  KILN_DISPATCH_ELEM(e, forward_t<scalar_t>(s, out_acc, lse, static_cast<const scalar_t*>(qkv),
                                            static_cast<const scalar_t*>(kv), t));
}

void attention_tile_backward(cudaStream_t s, Elem e, float* dq, float* dkv, const void* dout,
                             const void* qkv, const void* kv, const void* out, const float* lse,
                             const TileShape& t) {
  if (t.B * t.NH * t.q_len * t.k_len == 0) return;
  KILN_DISPATCH_ELEM(e, backward_t<scalar_t>(s, dq, dkv, static_cast<const scalar_t*>(dout),
                                             static_cast<const scalar_t*>(qkv),
                                             static_cast<const scalar_t*>(kv),
                                             static_cast<const scalar_t*>(out), lse, t));
}

}  // namespace kiln::cuda
