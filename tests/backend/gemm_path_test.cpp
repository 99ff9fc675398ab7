// The CPU backend's choice of GEMM path for bf16/fp16 (backend/cpu/gemm.h): decided from
// what oneDNN can create, reported in one line, and sized exactly by scratchpad_bytes()
// (the number the memory planner uses). ctest runs it natively and with
// DNNL_MAX_CPU_ISA=AVX2, where Debian's oneDNN 2.6 has no bf16 matrix kernels.
#include "backend/cpu/gemm.h"

#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace kiln::cpu {
namespace {

bool capped_at_avx2() {
  const char* isa = std::getenv("DNNL_MAX_CPU_ISA");
  return isa && std::string(isa) == "AVX2";
}

TEST(GemmPath, DecidedFromWhatOneDnnCreatesAndReported) {
  EXPECT_TRUE(Gemm::native(DType::F32));
  for (DType dt : {DType::BF16, DType::F16}) {
    const std::string line = Gemm::path_description(dt);
    SCOPED_TRACE(line);
    EXPECT_EQ(line.rfind(std::string(dtype_name(dt)) + " GEMMs: ", 0), 0u);
    if (Gemm::native(dt)) {
      EXPECT_EQ(line.find("fp32 compute"), std::string::npos);
    } else {
      EXPECT_NE(line.find("fp32 compute"), std::string::npos);
    }
  }
  if (capped_at_avx2()) {
    EXPECT_EQ(Gemm::isa(), "avx2");
    EXPECT_FALSE(Gemm::native(DType::BF16)) << "oneDNN 2.6 has no AVX2 bf16 matmul";
  }
  std::printf("kiln: %s\nkiln: %s\nkiln: %s\n", Gemm::path_description(DType::F32).c_str(),
              Gemm::path_description(DType::BF16).c_str(),
              Gemm::path_description(DType::F16).c_str());
}

// Runs one problem with strided operands and checks the result against a double reference
// of the same (exactly representable) inputs, and the scratch it allocated against
// scratchpad_bytes().
void check_problem(DType t, DType ct, bool trans_a, bool trans_b, bool bias, bool accumulate) {
  const int64_t m = 37, n = 53, k = 29, pad = 3;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  auto rounded = [&](DType d) {
    const float x = nd(rng);
    if (d == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
    if (d == DType::F16) return f16_to_f32(f32_to_f16(x));
    return x;
  };
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, lda = a_cols + pad;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n, ldb = b_cols + pad;
  const int64_t ldc = n + pad;
  std::vector<float> A(a_rows * lda), B(b_rows * ldb), C(m * ldc), bias_v(n);
  for (auto& x : A) x = rounded(t);
  for (auto& x : B) x = rounded(t);
  for (auto& x : C) x = rounded(ct);
  for (auto& x : bias_v) x = rounded(t);
  // Device buffers in their dtypes.
  auto pack = [](const std::vector<float>& v, DType d) {
    std::vector<uint8_t> out(v.size() * dtype_size(d));
    convert(v.data(), DType::F32, out.data(), d, v.size());
    return out;
  };
  auto pa = pack(A, t), pb = pack(B, t), pc = pack(C, ct), pbias = pack(bias_v, t);
  GemmArgs g{m, n, k, pa.data(), lda, trans_a, pb.data(), ldb, trans_b, pc.data(), ldc,
             bias ? pbias.data() : nullptr, accumulate};
  g.a_type = g.b_type = g.bias_type = t;
  g.c_type = ct;

  HostAllocator alloc;
  Gemm gemm(alloc);
  gemm.run(g);
  const size_t want_scratch = Gemm::scratchpad_bytes(g);
  EXPECT_EQ(alloc.stats().peak_of(MemCategory::Temporaries),
            static_cast<int64_t>((want_scratch + 3) / 4 * 4))
      << "scratchpad_bytes() must be what run() allocates";

  std::vector<float> got(C.size());
  convert(pc.data(), ct, got.data(), DType::F32, got.size());
  const double ulp = ct == DType::BF16 ? std::ldexp(1.0, -7) : ct == DType::F16 ? std::ldexp(1.0, -10) : 1e-6;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = accumulate ? C[i * ldc + j] : 0.0;
      if (bias) ref += bias_v[j];
      for (int64_t p = 0; p < k; ++p) {
        const double a = trans_a ? A[p * lda + i] : A[i * lda + p];
        const double b = trans_b ? B[j * ldb + p] : B[p * ldb + j];
        ref += a * b;
      }
      // Rounded once to C's dtype (half an ulp), after fp32 accumulation (~1e-6 of sqrt(k)).
      const double tol = 0.5 * ulp * std::abs(ref) + 1e-5 * std::sqrt(double(k)) * 4;
      ASSERT_NEAR(got[i * ldc + j], ref, tol) << "at " << i << "," << j;
    }
  }
  // Padding between rows is left alone.
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], C[i * ldc + j]);
}

TEST(GemmPath, LowPrecisionMatchesDoubleReferenceWithStridesTransposesBiasAndAccumulate) {
  for (DType t : {DType::BF16, DType::F16}) {
    for (DType ct : {t, DType::F32}) {
      for (int mask = 0; mask < 16; ++mask) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " C " + std::string(dtype_name(ct)) +
                     " mask " + std::to_string(mask));
        check_problem(t, ct, mask & 1, mask & 2, mask & 4, mask & 8);
      }
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
