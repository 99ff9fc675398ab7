// Measured peaks of a backend, for MFU and roofline tables: GEMM FLOP/s in a dtype
// (through the backend's own linear_forward, so it is the peak kiln can reach) and
// memory bandwidth (a large copy).
#pragma once

#include "backend/backend.h"

namespace kiln {

/// Best FLOP/s of an n x n x n GEMM (2 n^3 FLOP) over repeated runs for about
/// `seconds` of wall time. Throws when the backend does not support `dtype`.
double measure_gemm_flops(Backend& backend, DType dtype, int64_t n = 1024,
                          double seconds = 0.3);

/// Best rate of causal attention forward + backward (attention_forward, then
/// attention_backward) over B x T tokens of n_head heads of head_dim, in the FLOPs the
/// models count for it (Model::flops_per_token's attention term: 12 T C per token, C =
/// n_head x head_dim, the causal mask not halving it), per second. Throws when the backend
/// does not support `dtype`.
double measure_attention_flops(Backend& backend, DType dtype, int64_t B, int64_t T, int n_head,
                               int64_t head_dim, double seconds = 0.3);

/// Best copy bandwidth in bytes/s (read + write counted: 2 * bytes per copy) of a
/// `bytes`-sized buffer.
double measure_copy_bandwidth(Backend& backend, int64_t bytes = 256ll << 20,
                              double seconds = 0.3);

}  // namespace kiln
