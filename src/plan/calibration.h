// A machine's measured rates for the planner's time model (plan/time_model.h,
// docs/plan.md): GEMM FLOP/s by dtype and size, and memory bandwidth, measured by
// `kiln bench --calibrate FILE` through the backend's own ops and read by
// `kiln plan --calibration FILE`.
//
// The file is JSON, written atomically, with a CRC-32 of its contents checked on load:
//   {"format": "kiln.calibration", "version": 1, "backend": "cpu", "machine": "...",
//    "threads": 2, "date": "2026-12-06T09:00:00Z",
//    "gemm": {"fp32": [[128, 4.1e10], [512, 9.0e10], [2048, 9.6e10]], "bf16": [...]},
//    "mem_bandwidth": 2.1e10, "crc32": "89abcdef"}
// gemm: [n, FLOP/s] of n x n x n GEMMs (2 n^3 FLOP each), n increasing; mem_bandwidth in
// bytes/s (a large copy, read + write counted).
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::plan {

struct Calibration {
  std::string backend;  // "cpu" or "cuda"
  std::string machine;  // the CPU's model name (/proc/cpuinfo); the backend's name on cuda
  int threads = 0;      // OpenMP threads per rank when measured (cpu)
  std::string date;     // UTC, ISO 8601
  /// dtype name ("fp32", "bf16") -> (n, FLOP/s) of n^3 GEMMs, n increasing.
  std::map<std::string, std::vector<std::pair<int64_t, double>>> gemm;
  double mem_bandwidth = 0;  // bytes/s
};

/// The GEMM sizes `kiln bench --calibrate` measures (on cuda also 4096 and 8192, where a
/// Hopper GPU's bf16 GEMMs come near their peak).
inline const std::vector<int64_t> kCalibrationSizes = {64, 128, 256, 512, 1024, 2048};

/// Measures `dtypes` (those the backend supports) at kCalibrationSizes, and the copy
/// bandwidth, on `backend` (about `seconds` per measurement).
Calibration measure_calibration(Backend& backend, const std::vector<DType>& dtypes,
                                double seconds = 0.3);

/// Writes `c` to `path` atomically with its CRC-32. Throws kiln::Error naming the file.
void save_calibration(const Calibration& c, const std::filesystem::path& path);
/// Reads a file save_calibration wrote; a missing file, bad JSON, a missing or bad key, or
/// a CRC mismatch is a kiln::Error naming the file (and the key).
Calibration load_calibration(const std::filesystem::path& path);

/// The GEMM rate (FLOP/s) the calibration gives an m x n x k GEMM in `dtype`: interpolated
/// in log-log between the measured sizes at the cube root of m n k (the GEMM's "shape
/// class"), clamped to the smallest and largest measured. Throws kiln::Error when `dtype`
/// was not measured.
double gemm_rate(const Calibration& c, const std::string& dtype, double m, double n, double k);

}  // namespace kiln::plan
