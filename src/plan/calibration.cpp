#include "plan/calibration.h"

#include "backend/probe.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "core/error.h"
#include "train/gemm_peak.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

namespace kiln::plan {

namespace {

constexpr const char* kFormat = "kiln.calibration";

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Everything but the checksum, in one canonical text (nlohmann dumps object keys sorted).
nlohmann::json body(const Calibration& c) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = 1;
  j["backend"] = c.backend;
  j["machine"] = c.machine;
  j["threads"] = c.threads;
  j["date"] = c.date;
  nlohmann::json g = nlohmann::json::object();
  for (const auto& [dtype, points] : c.gemm) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& [n, flops] : points) arr.push_back({n, flops});
    g[dtype] = arr;
  }
  j["gemm"] = g;
  j["mem_bandwidth"] = c.mem_bandwidth;
  return j;
}

std::string crc_of(const nlohmann::json& j) {
  const std::string text = j.dump();
  return fmt::format("{:08x}", checkpoint::buffer_crc32(text.data(), text.size()));
}

double positive_number(const nlohmann::json& j, const std::string& key, const std::string& where) {
  KILN_CHECK(j.is_number() && j.get<double>() > 0 && std::isfinite(j.get<double>()),
             "{}: \"{}\" must be a positive number, got {}", where, key, j.dump());
  return j.get<double>();
}

}  // namespace

Calibration measure_calibration(Backend& backend, const std::vector<DType>& dtypes,
                                double seconds) {
  Calibration c;
  c.backend = backend.name().rfind("cuda", 0) == 0 ? "cuda" : "cpu";
  c.machine = c.backend == "cpu" ? cpu_model() : backend.name();
  c.threads = c.backend == "cpu" ? omp_get_max_threads() : 0;
  c.date = utc_now();
  for (const DType dt : dtypes) {
    if (!backend.supports(Op::LinearForward, dt)) continue;
    auto& points = c.gemm[std::string(dtype_name(dt))];
    std::vector<int64_t> sizes = kCalibrationSizes;
    if (c.backend == "cuda") sizes.insert(sizes.end(), {4096, 8192});
    for (const int64_t n : sizes) points.emplace_back(n, measure_gemm_flops(backend, dt, n, seconds));
  }
  c.mem_bandwidth = measure_copy_bandwidth(backend, 64ll << 20, seconds);
  return c;
}

void save_calibration(const Calibration& c, const std::filesystem::path& path) {
  nlohmann::json j = body(c);
  j["crc32"] = crc_of(j);
  checkpoint::detail::atomic_write_file(path, j.dump(1) + "\n");
}

Calibration load_calibration(const std::filesystem::path& path) {
  const std::string where = path.string();
  const std::string text = checkpoint::detail::read_file(path);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  KILN_CHECK(j.is_object(), "{}: not a JSON object (a calibration from kiln bench --calibrate)",
             where);
  KILN_CHECK(j.value("format", "") == kFormat && j.value("version", 0) == 1,
             "{}: not a kiln calibration file (\"format\": \"{}\", \"version\": 1 expected)", where,
             kFormat);
  for (const char* key : {"backend", "machine", "date", "crc32"})
    KILN_CHECK(j.contains(key) && j[key].is_string(), "{}: no \"{}\" string", where, key);
  KILN_CHECK(j.contains("threads") && j["threads"].is_number_integer(), "{}: no \"threads\" integer",
             where);
  KILN_CHECK(j.contains("gemm") && j["gemm"].is_object() && !j["gemm"].empty(),
             "{}: no \"gemm\" rates", where);
  KILN_CHECK(j.contains("mem_bandwidth"), "{}: no \"mem_bandwidth\"", where);
  const std::string crc = j["crc32"].get<std::string>();
  j.erase("crc32");
  KILN_CHECK(crc_of(j) == crc, "{}: checksum mismatch (crc32 {} in the file, {} of its contents): "
             "the file was changed or damaged; measure again with kiln bench --calibrate", where,
             crc, crc_of(j));
  Calibration c;
  c.backend = j["backend"].get<std::string>();
  c.machine = j["machine"].get<std::string>();
  c.threads = j["threads"].get<int>();
  c.date = j["date"].get<std::string>();
  c.mem_bandwidth = positive_number(j["mem_bandwidth"], "mem_bandwidth", where);
  for (const auto& [dtype, arr] : j["gemm"].items()) {
    const std::string key = "gemm." + dtype;
    KILN_CHECK(arr.is_array() && !arr.empty(), "{}: \"{}\" must be a list of [n, FLOP/s]", where, key);
    auto& points = c.gemm[dtype];
    for (const auto& p : arr) {
      KILN_CHECK(p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[0].get<int64_t>() > 0,
                 "{}: \"{}\" entry {} must be [n, FLOP/s]", where, key, p.dump());
      const int64_t n = p[0].get<int64_t>();
      KILN_CHECK(points.empty() || n > points.back().first, "{}: \"{}\" sizes must increase", where,
                 key);
      points.emplace_back(n, positive_number(p[1], key, where));
    }
  }
  return c;
}

double gemm_rate(const Calibration& c, const std::string& dtype, double m, double n, double k) {
  const auto it = c.gemm.find(dtype);
  KILN_CHECK(it != c.gemm.end(), "calibration of {} ({}) has no {} GEMM rates; measure them with "
             "kiln bench --calibrate on a backend that runs {}", c.machine, c.date, dtype, dtype);
  const auto& pts = it->second;
  const double size = std::cbrt(std::max(1.0, m) * std::max(1.0, n) * std::max(1.0, k));
  if (size <= static_cast<double>(pts.front().first)) return pts.front().second;
  if (size >= static_cast<double>(pts.back().first)) return pts.back().second;
  size_t i = 1;
  while (static_cast<double>(pts[i].first) < size) ++i;
  const double x0 = std::log(static_cast<double>(pts[i - 1].first));
  const double x1 = std::log(static_cast<double>(pts[i].first));
  const double w = (std::log(size) - x0) / (x1 - x0);
  return std::exp((1.0 - w) * std::log(pts[i - 1].second) + w * std::log(pts[i].second));
}

}  // namespace kiln::plan
