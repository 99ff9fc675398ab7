#include "backend/probe.h"

#include <algorithm>
#include <chrono>

namespace kiln {

namespace {
template <class F>
double best_rate(double work, double seconds, Backend& be, F&& run) {
  using clock = std::chrono::steady_clock;
  run();  // warm-up (primitive creation, page faults)
  be.synchronize(be.default_stream());
  double best = 0.0;
  const auto deadline = clock::now() + std::chrono::duration<double>(seconds);
  int runs = 0;
  while (runs < 3 || clock::now() < deadline) {
    const auto t0 = clock::now();
    run();
    be.synchronize(be.default_stream());
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::max(best, work / std::max(dt, 1e-9));
    ++runs;
  }
  return best;
}
}  // namespace

double measure_gemm_flops(Backend& be, DType dtype, int64_t n, double seconds) {
  KILN_CHECK(be.supports(OpFamily::Linear, dtype), "{} backend: no {} GEMM to measure", be.name(),
             dtype_name(dtype));
  Tensor a = be.empty(Shape{n, n}, dtype, MemCategory::Temporaries);
  Tensor w = be.empty(Shape{n, n}, dtype, MemCategory::Temporaries);
  Tensor c = be.empty(Shape{n, n}, dtype, MemCategory::Temporaries);
  be.fill(be.default_stream(), a, 0.5f);
  be.fill(be.default_stream(), w, 0.25f);
  const double flop = 2.0 * static_cast<double>(n) * n * n;
  return best_rate(flop, seconds, be, [&] { be.linear_forward(be.default_stream(), c, a, w, Tensor()); });
}

double measure_attention_flops(Backend& be, DType dtype, int64_t B, int64_t T, int n_head,
                               int64_t head_dim, double seconds) {
  KILN_CHECK(be.supports(OpFamily::Attention, dtype), "{} backend: no {} attention to measure",
             be.name(), dtype_name(dtype));
  const AttentionShape shape = AttentionShape::mha(n_head, n_head * head_dim);
  const Stream s = be.default_stream();
  Tensor qkv = be.empty(Shape{B, T, shape.qkv_width()}, dtype, MemCategory::Temporaries);
  Tensor out = be.empty(Shape{B, T, shape.q_width()}, dtype, MemCategory::Temporaries);
  Tensor dout = be.empty(Shape{B, T, shape.q_width()}, dtype, MemCategory::Temporaries);
  Tensor dqkv = be.empty(Shape{B, T, shape.qkv_width()}, dtype, MemCategory::Temporaries);
  Tensor lse = be.empty(Shape{B, n_head, T}, DType::F32, MemCategory::Temporaries);
  be.fill(s, qkv, 0.01f);
  be.fill(s, dout, 0.01f);
  const double flop = 12.0 * static_cast<double>(B) * T * T * n_head * head_dim;
  return best_rate(flop, seconds, be, [&] {
    be.attention_forward(s, out, lse, qkv, shape, DropoutSpec{});
    be.attention_backward(s, dqkv, dout, qkv, out, lse, shape, DropoutSpec{});
  });
}

double measure_copy_bandwidth(Backend& be, int64_t bytes, double seconds) {
  const int64_t n = bytes / 4;
  Tensor a = be.empty(Shape{n}, DType::F32, MemCategory::Temporaries);
  Tensor b = be.empty(Shape{n}, DType::F32, MemCategory::Temporaries);
  be.fill(be.default_stream(), a, 1.f);
  be.fill(be.default_stream(), b, 0.f);
  return best_rate(2.0 * static_cast<double>(n) * 4, seconds, be,
                   [&] { be.copy(be.default_stream(), b, a); });
}

}  // namespace kiln
