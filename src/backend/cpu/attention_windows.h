// Which keys each query of an attention sees, as the CPU attention kernels read it: a
// window of key rows per query row. One rule covers the whole-sequence attention (causal
// or bidirectional), documents packed into the sequences (Backend::attention_varlen_forward)
// and the tiles of ring attention with or without documents.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::cpu {

/// The documents of B sequences of S tokens laid end to end (host copy of cu_seqlens,
/// `count` entries: Backend::attention_varlen_forward), and where the rows of one op or
/// tile sit in each sequence: queries from position q_pos, keys from k_pos.
struct DocumentRows {
  const int32_t* cu = nullptr;
  int64_t count = 0;
  int64_t S = 0, q_pos = 0, k_pos = 0;
};

/// Query row i of sequence b sees key rows [lo[b nq + i], hi[b nq + i]) of the same
/// sequence; an empty window (lo >= hi) sees none.
struct KeyWindows {
  std::vector<int32_t> lo, hi;
};

/// The windows of nq query rows over nk key rows in each of B sequences. causal: query i
/// sees keys 0..i (rows aligned, nq == nk); otherwise every key. With `docs`, also only the
/// keys of the query's document, a document cut at its sequence's end.
KeyWindows key_windows(int64_t B, int64_t nq, int64_t nk, bool causal, const DocumentRows* docs);

/// Throws kiln::Error naming `op` unless cu[0] = 0 <= cu[1] <= ... <= cu[count - 1] = total.
void check_cu_seqlens(const int32_t* cu, int64_t count, int64_t total, const char* op);

}  // namespace kiln::cpu
