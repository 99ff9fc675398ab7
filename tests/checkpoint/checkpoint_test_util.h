// Helpers shared by the checkpoint tests: a temporary directory, a model-like flat
// parameter buffer written and read as simulated ranks, file damage.
#pragma once

#include "checkpoint/checkpoint.h"

#include "core/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <random>

namespace kiln::checkpoint::test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("kiln_ckpt_{}_{}_{}_{}", ::getpid(), info ? info->name() : "x", counter++,
                        std::random_device{}());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A model-like set of parameters in one flat fp32 buffer.
struct FlatModel {
  std::vector<std::pair<std::string, Shape>> params;
  std::vector<int64_t> offsets;
  std::vector<float> data;
  int64_t size = 0;

  FlatModel() {
    params = {{"wte", Shape{13, 6}}, {"ln.w", Shape{6}},     {"qkv", Shape{2, 3, 6, 6}},
              {"bias", Shape{18}},   {"scalar", Shape{}},    {"proj", Shape{6, 7}}};
    for (const auto& [name, shape] : params) {
      offsets.push_back(size);
      size += shape.numel();
    }
    data.resize(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) data[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i) - 7.f;
  }

  // Adds the part of every parameter inside the flat buffer range [lo, hi).
  void add_shard(CheckpointWriter& w, int64_t lo, int64_t hi) const {
    for (size_t p = 0; p < params.size(); ++p) {
      const int64_t b = std::max(lo, offsets[p]);
      const int64_t e = std::min(hi, offsets[p] + params[p].second.numel());
      if (b >= e) continue;
      w.add_flat_range(params[p].first, params[p].second, DType::F32, b - offsets[p],
                       e - offsets[p], data.data() + b);
    }
  }

  // Reads [lo, hi) of the flat buffer back through the reader, parameter by parameter.
  std::vector<float> read_shard(const CheckpointReader& r, int64_t lo, int64_t hi) const {
    std::vector<float> out(static_cast<size_t>(hi - lo), -999.f);
    for (size_t p = 0; p < params.size(); ++p) {
      const int64_t b = std::max(lo, offsets[p]);
      const int64_t e = std::min(hi, offsets[p] + params[p].second.numel());
      if (b >= e) continue;
      r.read_flat_range(params[p].first, b - offsets[p], e - offsets[p], out.data() + (b - lo),
                        DType::F32);
    }
    return out;
  }
};

// Splits [0, n) into `parts` uneven chunks.
inline std::vector<int64_t> split_points(int64_t n, int parts, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> pts = {0, n};
  while (static_cast<int>(pts.size()) < parts + 1) pts.push_back(std::uniform_int_distribution<int64_t>(1, n - 1)(rng));
  std::sort(pts.begin(), pts.end());
  return pts;
}

// Writes a FlatModel as `world` simulated ranks (all in this process) and commits.
inline void write_sharded(const FlatModel& m, const fs::path& dir, int world, unsigned seed,
                   const nlohmann::json& state = {{"step", 1}},
                   const std::map<std::string, std::string>& extra = {}) {
  const auto pts = split_points(m.size, world, seed);
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (int r = 0; r < world; ++r) {
    writers.push_back(std::make_unique<CheckpointWriter>(dir, r, world));
    m.add_shard(*writers.back(), pts[r], pts[r + 1]);
  }
  for (int r = world - 1; r >= 0; --r) writers[r]->write_rank_files();
  writers[0]->commit(state, extra);
}

// Flips one byte in the middle of a file.
inline void flip_byte(const fs::path& p) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = fs::file_size(p);
  f.seekg(static_cast<std::streamoff>(size / 2));
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(static_cast<std::streamoff>(size / 2));
  f.write(&c, 1);
}

inline std::string open_error(const fs::path& dir) {
  try {
    CheckpointReader r(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}


}  // namespace kiln::checkpoint::test
