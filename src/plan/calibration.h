// A machine's measured rates for the planner's time model (plan/time_model.h,
// docs/plan.md): GEMM FLOP/s by dtype and size, and memory bandwidth, measured by
// `kiln bench --calibrate FILE` through the backend's own ops and read by
// `kiln plan --calibration FILE`.
//
// The file is JSON, written atomically, with a CRC-32 of its contents checked on load:
//   {"format": "kiln.calibration", "version": 1, "backend": "cpu", "machine": "...",
//    "threads": 2, "date": "2026-12-06T09:00:00Z",
//    "gemm": {"fp32": [[128, 4.1e10], [512, 9.0e10], [2048, 9.6e10]], "bf16": [...]},
//    "attention": {"fp32": [[128, 1.9e10], [512, 2.1e10], [1024, 2.0e10]], ...},
//    "mem_bandwidth": 2.1e10,
//    "link": {"ranks": 2, "latency": 2.1e-5, "busbw": [[65536, 1.2e9], ..., [67108864, 3.1e8]]},
//    "crc32": "89abcdef"}
// gemm: [n, FLOP/s] of n x n x n GEMMs (2 n^3 FLOP each), n increasing; attention
// (optional): [T, FLOP/s] of causal attention forward + backward at sequence length T
// (measure_attention_flops: 4 heads of 64, B x T = 2048 tokens), in the models' FLOPs
// (12 T C per token); mem_bandwidth in bytes/s (a large copy, read + write counted); link
// (optional, when calibrated under mpirun/srun): the all-reduce between the launched ranks
// (one node): latency in seconds and bus bandwidth (nccl-tests' busbw, bytes/s) by message
// bytes (a CPU's copies run from cache for small messages, from memory for large ones).
#pragma once

#include "backend/backend.h"
#include "comm/communicator.h"

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
  /// dtype name -> (T, FLOP/s) of attention forward + backward, T increasing; may be empty.
  std::map<std::string, std::vector<std::pair<int64_t, double>>> attention;
  double mem_bandwidth = 0;  // bytes/s
  /// The launched ranks' all-reduce (0 ranks: not measured).
  struct Link {
    int ranks = 0;
    double latency = 0;  // seconds per collective
    std::vector<std::pair<int64_t, double>> busbw;  // (message bytes, bytes/s), bytes increasing
  } link;
};

/// The GEMM sizes `kiln bench --calibrate` measures (on cuda also 4096 and 8192, where a
/// Hopper GPU's bf16 GEMMs come near their peak).
inline const std::vector<int64_t> kCalibrationSizes = {64, 128, 256, 512, 1024, 2048};
/// The sequence lengths it measures attention at.
inline const std::vector<int64_t> kCalibrationSeqLens = {128, 512, 1024};

/// Measures `dtypes` (those the backend supports): GEMMs at kCalibrationSizes, attention at
/// kCalibrationSeqLens, and the copy bandwidth, on `backend` (about `seconds` per
/// measurement).
Calibration measure_calibration(Backend& backend, const std::vector<DType>& dtypes,
                                double seconds = 0.3);

/// Measures the all-reduce over `world` (collective: every rank calls it): latency from a
/// one-element all-reduce, bus bandwidth at 64 KiB, 1 MiB, 16 MiB and 64 MiB less that
/// latency (the best of a fixed number of repetitions, the same count on every rank).
Calibration::Link measure_link(Communicator& world, Backend& backend);

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

/// The attention rate (FLOP/s, forward + backward in the models' FLOPs) at sequence length
/// T: interpolated in log-log between the measured lengths, clamped at the ends. 0 when
/// the calibration has no attention rates for `dtype` (then attention is priced as GEMMs).
double attention_rate(const Calibration& c, const std::string& dtype, double T);

/// Log-log interpolation of (size, value) points (sizes increasing) at x, clamped at the ends.
double interpolate(const std::vector<std::pair<int64_t, double>>& points, double x);

}  // namespace kiln::plan
