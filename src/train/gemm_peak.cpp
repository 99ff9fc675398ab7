#include "train/gemm_peak.h"

#include "backend/probe.h"
#include "checkpoint/file_util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace kiln {

namespace fs = std::filesystem;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

namespace {
// The threads a GEMM runs on: OMP_NUM_THREADS, else every hardware thread.
std::string threads() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env != nullptr && *env != '\0') return env;
  return std::to_string(std::thread::hardware_concurrency());
}

std::string peak_key(Backend& backend, DType dtype) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return fmt::format("{} | {} | {} | {} | {} threads", host, cpu_model(), backend.name(),
                     dtype_name(dtype), threads());
}

nlohmann::json read_cache(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}
}  // namespace

fs::path peak_cache_file() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return fs::path(x) / "kiln" / "gemm_peaks.json";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return fs::path(h) / ".cache" / "kiln" / "gemm_peaks.json";
  return {};
}

GemmPeak stable_gemm_peak(Backend& backend, DType dtype, double peak_tflops, const fs::path& cache) {
  if (peak_tflops > 0) return {peak_tflops * 1e12, "log.peak_tflops"};
  const double now = measure_gemm_flops(backend, dtype);
  const std::string what = fmt::format("{} GEMM", dtype_name(dtype));
  if (cache.empty()) return {now, fmt::format("{} measured now", what)};
  const std::string key = peak_key(backend, dtype);
  nlohmann::json peaks = read_cache(cache);
  const double before = peaks.contains(key) && peaks[key].is_number() ? peaks[key].get<double>() * 1e9 : 0.0;
  if (now > before) {
    peaks[key] = now / 1e9;
    try {
      fs::create_directories(cache.parent_path());
      checkpoint::detail::atomic_write_file(cache, peaks.dump(1) + "\n");
    } catch (const std::exception&) {
      // Best effort: the figure of this start still serves.
    }
  }
  if (before <= 0.0) return {now, fmt::format("{} measured now, kept in {}", what, cache.string())};
  return {std::max(now, before),
          fmt::format("best {} measured on this machine: {:.1f} GFLOP/s now, {:.1f} before; {}; "
                      "log.peak_tflops overrides it", what, now / 1e9, before / 1e9, cache.string())};
}

}  // namespace kiln
