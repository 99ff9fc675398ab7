#include "backend/cuda/gemm.h"

#include "core/error.h"

#include <algorithm>
#include <cstdint>

namespace kiln::cuda {

namespace {

void lt_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    KILN_FAIL("cuda: cuBLASLt {} failed: {} ({})", what, cublasLtGetStatusString(st),
              static_cast<int>(st));
}
#define LT(expr) lt_check((expr), #expr)

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  for (int a : {256, 16, 8, 4})
    if (v % a == 0) return a;
  return 2;
}

// RAII for the per-call descriptors (host objects; creating them costs microseconds).
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

Gemm::Gemm() { LT(cublasLtCreate(&handle_)); }

Gemm::~Gemm() {
  if (handle_) cublasLtDestroy(handle_);
}

bool Gemm::run(cudaStream_t s, const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return true;
  const cudaDataType_t dt = g.elem == Elem::F32 ? CUDA_R_32F : CUDA_R_16BF;
  const Elem c_elem = g.c_elem.value_or(g.elem);
  const cudaDataType_t ct_c = c_elem == Elem::F32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t ct = (g.elem == Elem::F32 && allow_tf32_)
                                     ? CUBLAS_COMPUTE_32F_FAST_TF32
                                     : CUBLAS_COMPUTE_32F;
  Desc d;
  LT(cublasLtMatmulDescCreate(&d.op, ct, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  if (g.epilogue == Epilogue::Bias) ep = CUBLASLT_EPILOGUE_BIAS;
  if (g.epilogue == Epilogue::GeluBias)
    ep = g.gelu_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
  LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  if (g.epilogue != Epilogue::None) {
    LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                      sizeof(g.bias)));
    if (g.epilogue == Epilogue::GeluBias && g.gelu_aux) {
      const int64_t ld = g.ldc;
      LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                        &g.gelu_aux, sizeof(g.gelu_aux)));
      LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                        sizeof(ld)));
    }
  }
  // Column-major layouts of the stored matrices: A is [m,k] (or [k,m] when transposed).
  const uint64_t a_rows = static_cast<uint64_t>(g.trans_a ? g.k : g.m);
  const uint64_t a_cols = static_cast<uint64_t>(g.trans_a ? g.m : g.k);
  const uint64_t b_rows = static_cast<uint64_t>(g.trans_b ? g.n : g.k);
  const uint64_t b_cols = static_cast<uint64_t>(g.trans_b ? g.k : g.n);
  LT(cublasLtMatrixLayoutCreate(&d.a, dt, a_rows, a_cols, g.lda));
  LT(cublasLtMatrixLayoutCreate(&d.b, dt, b_rows, b_cols, g.ldb));
  LT(cublasLtMatrixLayoutCreate(&d.c, ct_c, static_cast<uint64_t>(g.m), static_cast<uint64_t>(g.n),
                                g.ldc));

  // A bias pointer below 16-byte alignment is left to the caller's fallback (GEMM, then
  // a bias kernel): the epilogue's alignment needs are not part of the preference.
  if (g.epilogue != Epilogue::None && alignment_of(g.bias) < 16) return false;
  const int align = alignment_of(g.a) | alignment_of(g.b) << 9 | alignment_of(g.c) << 18;
  const Key key{static_cast<int>(g.trans_a) | static_cast<int>(g.trans_b) << 1,
                static_cast<int>(g.elem), g.m, g.n, g.k, g.lda, g.ldb, g.ldc,
                static_cast<int>(g.epilogue) | (g.gelu_aux ? 4 : 0), align,
                g.beta != 0.f ? 1 : 0, allow_tf32_ ? 1 : 0, static_cast<int>(c_elem)};
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  {
    std::lock_guard lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      found = it->second.first;
      algo = it->second.second;
    } else {
      LT(cublasLtMatmulPreferenceCreate(&d.pref));
      const uint64_t ws = workspace_bytes_;
      LT(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &ws, sizeof(ws)));
      // The heuristic assumes 256-byte aligned pointers unless told otherwise; views into
      // flat buffers can be less aligned, so state each operand's actual alignment.
      const uint32_t al_a = static_cast<uint32_t>(alignment_of(g.a));
      const uint32_t al_b = static_cast<uint32_t>(alignment_of(g.b));
      const uint32_t al_c = static_cast<uint32_t>(alignment_of(g.c));
      LT(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
      LT(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
      LT(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
      LT(cublasLtMatmulPreferenceSetAttribute(
          d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
      cublasLtMatmulHeuristicResult_t res{};
      int count = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c,
                                                               d.pref, 1, &res, &count);
      found = st == CUBLAS_STATUS_SUCCESS && count > 0;
      if (found) algo = res.algo;
      cache_.emplace(key, std::make_pair(found, algo));
    }
  }
  if (!found) {
    if (g.epilogue != Epilogue::None) return false;
    KILN_FAIL("cuda: cuBLASLt has no algorithm for a {} GEMM{} m={} n={} k={} (trans {}{})",
              g.elem == Elem::F32 ? "fp32" : "bf16",
              c_elem != g.elem ? (c_elem == Elem::F32 ? " (fp32 C)" : " (bf16 C)") : "", g.m, g.n, g.k, g.trans_a ? 'T' : 'N',
              g.trans_b ? 'T' : 'N');
  }
  const float alpha = 1.f, beta = g.beta;
  LT(cublasLtMatmul(handle_, d.op, &alpha, g.a, d.a, g.b, d.b, &beta, g.c, d.c, g.c, d.c, &algo,
                    workspace_, workspace_bytes_, s));
  return true;
}

}  // namespace kiln::cuda
