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

/// Best copy bandwidth in bytes/s (read + write counted: 2 * bytes per copy) of a
/// `bytes`-sized buffer.
double measure_copy_bandwidth(Backend& backend, int64_t bytes = 256ll << 20,
                              double seconds = 0.3);

}  // namespace kiln
