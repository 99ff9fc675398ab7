// Embedding forward: one thread per output element (grid-stride, 256 threads); bytes
// 3 B T C size (wte row, wpe row, out; 2 without a position table), no FLOPs to speak of.
// Position pos[b,t] is t, or positions[b,t] when given; rows with a token outside [0, Vp)
// or a position outside [0, maxT) are NaN.
//
// Embedding backward, deterministic and without float atomics:
//   dwpe, implicit positions: one thread per (t, c) sums dout[b, t, c] over b in order,
//         then += (bytes B T C size read).
//   dwte: the (token, position) pairs are sorted by token with CUB's stable radix sort
//         (positions stay in increasing order within a token), then one block per run of
//         equal tokens (a segment) sums its rows of dout in position order and adds the
//         sum into that token's row: every dwte element is written by one thread, in a
//         fixed order, so the result is the same on every run. (llm.c sorts on the host
//         instead; sorting on the device keeps the step free of host synchronisation.)
//         Bytes: B T C size read + (distinct tokens) C size read/written, plus the sort.
//   dwpe, explicit positions (which may repeat): the same sort and segment sum with the
//         positions as keys, after dwte, reusing the scratch.
#include "backend/cuda/common.cuh"
#include "backend/cuda/embedding.h"

#include <cub/device/device_radix_sort.cuh>

#include <cmath>

namespace kiln::cuda {

namespace {

// positions and wpe may be null (pos = t; no position table).
template <class T>
__global__ void embed_fwd(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                          const T* wpe, int64_t BT, int64_t T_, int64_t C, int64_t Vp,
                          int64_t maxT) {
  const int64_t n = BT * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C, c = i % C;
    const int64_t t = positions ? int64_t{positions[bt]} : bt % T_;
    const int32_t tok = tokens[bt];
    // tok == -1: a row held by another vocab-parallel rank, read as zero.
    const float w = tok == -1 ? 0.f : to_f(wte[int64_t{tok} * C + c]);
    if (tok < -1 || tok >= Vp) {
      out[i] = from_f<T>(NAN);
    } else if (!wpe) {
      out[i] = from_f<T>(w);
    } else {
      out[i] = (t < 0 || t >= maxT) ? from_f<T>(NAN) : from_f<T>(w + to_f(wpe[t * C + c]));
    }
  }
}

template <class G, class T>
__global__ void embed_bwd_wpe(G* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
  const int64_t n = T_ * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.f;
    for (int64_t b = 0; b < B; ++b) acc += to_f(dout[b * n + i]);
    dwpe[i] = from_f<G>(to_f(dwpe[i]) + acc);
  }
}

__global__ void iota_keys(const int32_t* ids, uint32_t* keys, int32_t* idx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    keys[i] = static_cast<uint32_t>(ids[i]);
    idx[i] = static_cast<int32_t>(i);
  }
}

// Block (blockIdx.x = sorted position i, blockIdx.y = channel tile): when i starts a run
// of equal ids (tokens, or positions for dwpe), sums that run's dout rows (in (b,t)
// order) into dwte[id]; ids outside [0, Vp) are skipped.
template <class G, class T>
__global__ void embed_bwd_wte(G* dwte, const T* dout, const uint32_t* keys, const int32_t* pos,
                              int64_t n, int64_t C, int64_t Vp) {
  const int64_t i = blockIdx.x;
  const uint32_t tok = keys[i];
  if (i > 0 && keys[i - 1] == tok) return;
  if (tok >= static_cast<uint64_t>(Vp)) return;  // negative ids are huge as uint32
  const int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int64_t j = i; j < n && keys[j] == tok; ++j) acc += to_f(dout[pos[j] * C + c]);
  G* w = dwte + static_cast<int64_t>(tok) * C + c;
  *w = from_f<G>(to_f(*w) + acc);
}

struct SortLayout {
  size_t keys_in, keys_out, idx_in, idx_out, cub, total, cub_bytes;
};

SortLayout sort_layout(int64_t n) {
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  SortLayout l{};
  size_t cub_bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes,
                                                  static_cast<const uint32_t*>(nullptr),
                                                  static_cast<uint32_t*>(nullptr),
                                                  static_cast<const int32_t*>(nullptr),
                                                  static_cast<int32_t*>(nullptr),
                                                  static_cast<int>(n)));
  const size_t a = up(sizeof(uint32_t) * n);
  l.keys_in = 0;
  l.keys_out = a;
  l.idx_in = 2 * a;
  l.idx_out = 3 * a;
  l.cub = 4 * a;
  l.cub_bytes = cub_bytes;
  l.total = 4 * a + up(cub_bytes);
  return l;
}

__global__ void shard_ids_kernel(int32_t* out, const int32_t* ids, int64_t n, int64_t begin,
                                 int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t id = ids[i];
    out[i] = (id >= begin && id < begin + count) ? static_cast<int32_t>(id - begin) : -1;
  }
}

}  // namespace

void embedding_forward(cudaStream_t s, Elem e, void* out, const int32_t* tokens,
                       const int32_t* positions, const void* wte, const void* wpe, int64_t B,
                       int64_t T, int64_t C, int64_t Vp, int64_t maxT) {
  const int64_t n = B * T * C;
  if (n <= 0) return;
  KILN_DISPATCH_ELEM(e, embed_fwd<<<grid_for(n, 256), 256, 0, s>>>(
                            static_cast<scalar_t*>(out), tokens, positions,
                            static_cast<const scalar_t*>(wte), static_cast<const scalar_t*>(wpe),
                            B * T, T, C, Vp, maxT));
  KILN_CUDA_LAUNCHED("embedding_forward");
}

size_t embedding_backward_scratch_bytes(int64_t BT) { return sort_layout(BT).total; }

void embedding_backward(cudaStream_t s, Elem e, Elem g, void* dwte, void* dwpe, const void* dout,
                        const int32_t* tokens, const int32_t* positions, int64_t B, int64_t T,
                        int64_t C, int64_t Vp, int64_t maxT, void* scratch,
                        size_t scratch_bytes) {
  const int64_t n = B * T;
  if (n <= 0 || C <= 0) return;
  if (dwpe && !positions) {
    KILN_DISPATCH_ELEM(e, KILN_DISPATCH_GRAD(g, embed_bwd_wpe<<<grid_for(T * C, 256), 256, 0, s>>>(
                              static_cast<grad_t*>(dwpe), static_cast<const scalar_t*>(dout), B,
                              T, C)));
    KILN_CUDA_LAUNCHED("embedding_backward (wpe)");
  }

  const SortLayout l = sort_layout(n);
  if (scratch_bytes < l.total) fail("cuda: embedding_backward scratch too small");
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint32_t*>(base + l.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + l.keys_out);
  auto* idx_in = reinterpret_cast<int32_t*>(base + l.idx_in);
  auto* idx_out = reinterpret_cast<int32_t*>(base + l.idx_out);
  const int threads = C >= 256 ? 256 : static_cast<int>((C + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((C + threads - 1) / threads));
  // Segment sum of dout's rows into table[ids[row]] (dwte by tokens, dwpe by positions).
  auto scatter = [&](void* table, const int32_t* ids, int64_t rows, const char* what) {
    iota_keys<<<grid_for(n, 256), 256, 0, s>>>(ids, keys_in, idx_in, n);
    KILN_CUDA_LAUNCHED(what);
    size_t cub_bytes = l.cub_bytes;
    KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + l.cub, cub_bytes, keys_in, keys_out,
                                                    idx_in, idx_out, static_cast<int>(n), 0, 32,
                                                    s));
    KILN_DISPATCH_ELEM(e, KILN_DISPATCH_GRAD(g, embed_bwd_wte<<<grid, threads, 0, s>>>(
                              static_cast<grad_t*>(table), static_cast<const scalar_t*>(dout),
                              keys_out, idx_out, n, C, rows)));
    KILN_CUDA_LAUNCHED(what);
  };
  scatter(dwte, tokens, Vp, "embedding_backward (wte)");
  if (dwpe && positions) scatter(dwpe, positions, maxT, "embedding_backward (wpe, positions)");
}

void shard_ids(cudaStream_t s, int32_t* out, const int32_t* ids, int64_t n, int64_t begin,
               int64_t count) {
  if (n <= 0) return;
  shard_ids_kernel<<<grid_for(n, 256), 256, 0, s>>>(out, ids, n, begin, count);
  KILN_CUDA_LAUNCHED("shard_ids");
}

}  // namespace kiln::cuda
