// Small helpers shared by the benchmark programs: kiln's own command-line flags (taken
// out of argv before Google Benchmark sees it), device tensors filled with
// deterministic random data, and counters.
#pragma once

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/rng.h"

#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace kiln::bench {

/// Flags of the form --name=value whose names are in `defaults`; each one found is
/// removed from argv (so that benchmark::Initialize does not reject it) and its value
/// replaces the default. `--help` prints them and lets Google Benchmark print its own.
class Flags {
 public:
  Flags(std::map<std::string, std::string> defaults, std::map<std::string, std::string> help)
      : values_(std::move(defaults)), help_(std::move(help)) {}

  void parse(int* argc, char** argv) {
    int out = 1;
    for (int i = 1; i < *argc; ++i) {
      const std::string a = argv[i];
      bool taken = false;
      if (a.rfind("--", 0) == 0) {
        const size_t eq = a.find('=');
        const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
        if (eq != std::string::npos && values_.count(name)) {
          values_[name] = a.substr(eq + 1);
          taken = true;
        }
      }
      if (a == "--help") print_help();
      if (!taken) argv[out++] = argv[i];
    }
    *argc = out;
  }

  const std::string& str(const std::string& name) const { return values_.at(name); }
  int64_t i64(const std::string& name) const {
    const std::string& v = values_.at(name);
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') {
      std::fprintf(stderr, "--%s=%s: not an integer\n", name.c_str(), v.c_str());
      std::exit(2);
    }
    return x;
  }

 private:
  void print_help() const {
    std::printf("kiln flags:\n");
    for (const auto& [name, value] : values_) {
      auto h = help_.find(name);
      std::printf("  --%s=%s\t%s\n", name.c_str(), value.c_str(),
                  h == help_.end() ? "" : h->second.c_str());
    }
    std::printf("\nGoogle Benchmark flags follow.\n\n");
  }
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> help_;
};

/// A tensor on `be` of `dtype` with N(0, std) values drawn from Philox stream `stream`
/// (computed on the host in fp32, converted, copied over).
inline Tensor randn(Backend& be, const Shape& shape, DType dtype, float std, uint64_t stream,
                    MemCategory cat = MemCategory::Activations) {
  Tensor t = be.empty(shape, dtype, cat);
  std::vector<float> h(static_cast<size_t>(t.numel()));
  fill_normal(h.data(), t.numel(), /*seed=*/20240601, stream, 0.f, std);
  if (dtype == DType::F32) {
    be.copy_from_host(be.default_stream(), t, h.data());
  } else {
    std::vector<unsigned char> c(t.nbytes());
    convert(h.data(), DType::F32, c.data(), dtype, h.size());
    be.copy_from_host(be.default_stream(), t, c.data());
  }
  return t;
}

/// A tensor on `be` with every element `value`.
inline Tensor full(Backend& be, const Shape& shape, DType dtype, float value,
                   MemCategory cat = MemCategory::Activations) {
  Tensor t = be.empty(shape, dtype, cat);
  be.fill(be.default_stream(), t, value);
  return t;
}

/// int32 ids uniform in [0, n) from Philox stream `stream`.
inline Tensor random_ids(Backend& be, const Shape& shape, int n, uint64_t stream) {
  Tensor t = be.empty(shape, DType::I32, MemCategory::Activations);
  std::vector<int32_t> h(static_cast<size_t>(t.numel()));
  Philox rng(/*seed=*/20240601, stream);
  for (auto& x : h) x = static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(n));
  be.copy_from_host(be.default_stream(), t, h.data());
  return t;
}

/// Runs `op` once untimed (first-call costs: GEMM primitive creation, first touch of
/// pages), then once per benchmark iteration, waiting for the device each time so that
/// the measured (real) time covers the work and not only its launch.
template <class F>
void run(benchmark::State& state, Backend& be, F&& op) {
  const Stream s = be.default_stream();
  op();
  be.synchronize(s);
  for (auto _ : state) {
    op();
    be.synchronize(s);
  }
}

/// Counter "FLOP/s": `flops` per iteration divided by the real time per iteration.
inline void set_flops(benchmark::State& state, double flops) {
  state.counters["FLOP/s"] = benchmark::Counter(
      flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

/// Counter "bytes_per_second" (shown with binary prefixes, GiB/s): `bytes` moved per
/// iteration divided by the real time per iteration. Call after the timing loop.
inline void set_bytes(benchmark::State& state, double bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
}

inline void add_thread_context() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("OMP_NUM_THREADS", env ? env : "(unset)");
}

}  // namespace kiln::bench
