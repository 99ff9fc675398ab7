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
  nlohmann::json att = nlohmann::json::object();
  for (const auto& [dtype, points] : c.attention) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& [t, flops] : points) arr.push_back({t, flops});
    att[dtype] = arr;
  }
  j["attention"] = att;
  j["mem_bandwidth"] = c.mem_bandwidth;
  if (c.link.ranks > 1) {
    nlohmann::json bw = nlohmann::json::array();
    for (const auto& [bytes, rate] : c.link.busbw) bw.push_back({bytes, rate});
    j["link"] = {{"ranks", c.link.ranks}, {"latency", c.link.latency}, {"busbw", bw}};
  }
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

// {dtype: [[size, FLOP/s], ...]} with sizes increasing, into `out`.
void read_rates(const nlohmann::json& j, const std::string& name, const std::string& where,
                std::map<std::string, std::vector<std::pair<int64_t, double>>>& out) {
  KILN_CHECK(j.is_object(), "{}: \"{}\" must be an object of rates by dtype", where, name);
  for (const auto& [dtype, arr] : j.items()) {
    const std::string key = name + "." + dtype;
    KILN_CHECK(arr.is_array() && !arr.empty(), "{}: \"{}\" must be a list of [size, FLOP/s]", where, key);
    auto& points = out[dtype];
    for (const auto& p : arr) {
      KILN_CHECK(p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[0].get<int64_t>() > 0,
                 "{}: \"{}\" entry {} must be [size, FLOP/s]", where, key, p.dump());
      const int64_t n = p[0].get<int64_t>();
      KILN_CHECK(points.empty() || n > points.back().first, "{}: \"{}\" sizes must increase", where,
                 key);
      points.emplace_back(n, positive_number(p[1], key, where));
    }
  }
}

}  // namespace

double interpolate(const std::vector<std::pair<int64_t, double>>& pts, double x) {
  if (x <= static_cast<double>(pts.front().first)) return pts.front().second;
  if (x >= static_cast<double>(pts.back().first)) return pts.back().second;
  size_t i = 1;
  while (static_cast<double>(pts[i].first) < x) ++i;
  const double x0 = std::log(static_cast<double>(pts[i - 1].first));
  const double x1 = std::log(static_cast<double>(pts[i].first));
  const double w = (std::log(x) - x0) / (x1 - x0);
  return std::exp((1.0 - w) * std::log(pts[i - 1].second) + w * std::log(pts[i].second));
}

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
    if (!backend.supports(Op::AttentionForward, dt) || !backend.supports(Op::AttentionBackward, dt))
      continue;
    auto& att = c.attention[std::string(dtype_name(dt))];
    for (const int64_t T : kCalibrationSeqLens)
      att.emplace_back(T, measure_attention_flops(backend, dt, std::max<int64_t>(1, 2048 / T), T, 4,
                                                  64, seconds));
  }
  c.mem_bandwidth = measure_copy_bandwidth(backend, 64ll << 20, seconds);
  return c;
}

Calibration::Link measure_link(Communicator& world, Backend& backend) {
  using clock = std::chrono::steady_clock;
  const int n = world.size();
  auto best_seconds = [&](const Tensor& t, int reps) {
    world.barrier();
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = clock::now();
      world.all_reduce(t);
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    return best;
  };
  auto buffer = [&](int64_t elements) {
    Tensor t = backend.empty(Shape{elements}, DType::F32, MemCategory::CommBuffers);
    backend.fill(backend.default_stream(), t, 1.f);
    backend.synchronize(backend.default_stream());
    return t;
  };
  Calibration::Link l;
  l.ranks = n;
  l.latency = best_seconds(buffer(1), 50);
  for (const int64_t bytes : {int64_t{64} << 10, int64_t{1} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
    const double seconds = best_seconds(buffer(bytes / 4), bytes >= (16 << 20) ? 4 : 10);
    l.busbw.emplace_back(bytes, static_cast<double>(bytes) * bus_bandwidth_factor(Collective::AllReduce, n) /
                                    std::max(1e-9, seconds - l.latency));
  }
  return l;
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
  read_rates(j["gemm"], "gemm", where, c.gemm);
  if (j.contains("attention")) read_rates(j["attention"], "attention", where, c.attention);
  if (j.contains("link")) {
    const auto& l = j["link"];
    KILN_CHECK(l.is_object() && l.contains("ranks") && l["ranks"].is_number_integer() &&
                   l["ranks"].get<int>() > 1 && l.contains("busbw") && l.contains("latency"),
               "{}: \"link\" must be {{\"ranks\" > 1, \"latency\", \"busbw\"}}", where);
    c.link.ranks = l["ranks"].get<int>();
    c.link.latency = positive_number(l["latency"], "link.latency", where);
    std::map<std::string, std::vector<std::pair<int64_t, double>>> bw;
    read_rates(nlohmann::json{{"all_reduce", l["busbw"]}}, "link.busbw", where, bw);
    c.link.busbw = bw["all_reduce"];
  }
  return c;
}

double gemm_rate(const Calibration& c, const std::string& dtype, double m, double n, double k) {
  const auto it = c.gemm.find(dtype);
  KILN_CHECK(it != c.gemm.end(), "calibration of {} ({}) has no {} GEMM rates; measure them with "
             "kiln bench --calibrate on a backend that runs {}", c.machine, c.date, dtype, dtype);
  return interpolate(it->second, std::cbrt(std::max(1.0, m) * std::max(1.0, n) * std::max(1.0, k)));
}

double attention_rate(const Calibration& c, const std::string& dtype, double T) {
  const auto it = c.attention.find(dtype);
  return it == c.attention.end() || it->second.empty() ? 0.0 : interpolate(it->second, T);
}

}  // namespace kiln::plan
