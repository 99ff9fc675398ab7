// The MFU peak: log.peak_tflops as given; else the best of this probe and the machine's
// cached ones, so that a probe under load cannot lower it.
#include "train/device.h"
#include "train/gemm_peak.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

namespace kiln {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

TEST(GemmPeak, ConfiguredPeakIsTakenAsGiven) {
  auto backend = make_device_backend("cpu");
  const GemmPeak p = stable_gemm_peak(*backend, DType::F32, 2.5, "");
  EXPECT_DOUBLE_EQ(p.flops, 2.5e12);
  EXPECT_EQ(p.source, "log.peak_tflops");
}

TEST(GemmPeak, TheBestProbeOnTheMachineIsKept) {
  auto backend = make_device_backend("cpu");
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln_peak_{}", ::getpid());
  fs::remove_all(dir);
  const fs::path cache = dir / "kiln" / "gemm_peaks.json";
  // First probe: measured and written.
  const GemmPeak first = stable_gemm_peak(*backend, DType::F32, 0.0, cache);
  EXPECT_GT(first.flops, 0.0);
  nlohmann::json j = read_json(cache);
  ASSERT_EQ(j.size(), 1u);
  const std::string key = j.begin().key();
  EXPECT_NE(key.find("| cpu | fp32 |"), std::string::npos) << key;
  EXPECT_DOUBLE_EQ(j[key].get<double>(), first.flops / 1e9);
  // A faster earlier probe (as on a quiet machine) wins over this one, and stays.
  j[key] = first.flops / 1e9 * 1000.0;
  std::ofstream(cache) << j.dump();
  const GemmPeak second = stable_gemm_peak(*backend, DType::F32, 0.0, cache);
  EXPECT_DOUBLE_EQ(second.flops, first.flops * 1000.0);
  EXPECT_NE(second.source.find("best fp32 GEMM measured on this machine"), std::string::npos)
      << second.source;
  EXPECT_DOUBLE_EQ(read_json(cache)[key].get<double>(), first.flops / 1e9 * 1000.0);
  // No cache: this probe alone.
  EXPECT_EQ(stable_gemm_peak(*backend, DType::F32, 0.0, "").source, "fp32 GEMM measured now");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
