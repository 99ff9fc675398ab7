// The GEMM peak MFU is taken against: stable across runs on one machine.
#pragma once

#include "backend/backend.h"

#include <filesystem>
#include <string>

namespace kiln {

/// FLOP/s per rank and, for the start-up line, where the figure comes from.
struct GemmPeak {
  double flops = 0.0;
  std::string source;  // e.g. "log.peak_tflops", "best fp32 GEMM measured on this machine ..."
};

/// `peak_tflops` (log.peak_tflops) when > 0. Otherwise the best of this start's probe
/// (measure_gemm_flops: the fastest of repeated GEMMs in `dtype`, the trainer's
/// mfu_peak_dtype) and every earlier one on this machine with the same key (host name,
/// CPU model, backend, dtype, threads), kept in `cache` (a JSON object of GFLOP/s by
/// key; "" for none): a probe under load cannot lower the peak, and a faster one raises
/// it. The cache is best effort: an unreadable or unwritable file is ignored.
GemmPeak stable_gemm_peak(Backend& backend, DType dtype, double peak_tflops,
                          const std::filesystem::path& cache);

/// The CPU's model name from /proc/cpuinfo ("unknown CPU" when it has none).
std::string cpu_model();

/// $XDG_CACHE_HOME/kiln/gemm_peaks.json, else $HOME/.cache/kiln/gemm_peaks.json; "" when
/// neither variable is set (no cache).
std::filesystem::path peak_cache_file();

}  // namespace kiln
