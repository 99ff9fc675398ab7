#include "backend/cuda/gemm.h"

#include "core/error.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>

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

size_t elem_bytes(Elem e) { return e == Elem::F32 ? 4 : 2; }

cudaDataType_t fp8_type(Fp8Operand f) {
  return f == Fp8Operand::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// "t e m n k lda ldb ldc epilogue align beta tf32 c_elem": the key's 13 integers (e: the
// element type | fp8 A format << 2 | fp8 B format << 4).
template <class Key>
std::string key_text(const Key& k) {
  std::ostringstream o;
  std::apply([&](const auto&... v) { ((o << v << ' '), ...); }, k);
  return o.str();
}
template <class Key>
bool parse_key(std::istream& in, Key& k) {
  bool ok = true;
  std::apply([&](auto&... v) { ((ok = ok && static_cast<bool>(in >> v)), ...); }, k);
  return ok;
}

}  // namespace

// The descriptors of one shape (host objects; creating them costs microseconds, so they
// are built once) and its algorithm.
struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
  // The per-call pointers: the bias, the GELU pre-activation, fp8's descale factors.
  void set_pointers(const GemmArgs& g, void* aux) const {
    if (g.fp8()) {
      const void* sa = g.a_scale;
      const void* sb = g.b_scale;
      LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
      LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
    }
    if (g.epilogue == Epilogue::None) return;
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                      sizeof(g.bias)));
    if (aux)
      LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                        sizeof(aux)));
  }
};

Gemm::Gemm() { LT(cublasLtCreate(&handle_)); }

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

std::unique_ptr<Gemm::Plan> Gemm::make_plan(cudaStream_t s, const GemmArgs& g, const Key& key) {
  const cudaDataType_t dt = g.elem == Elem::F32 ? CUDA_R_32F : CUDA_R_16BF;
  // fp8: A and B are 1-byte codes, `elem` is C and D's type.
  const cudaDataType_t dt_a = g.fp8() ? fp8_type(g.fp8_a) : dt;
  const cudaDataType_t dt_b = g.fp8() ? fp8_type(g.fp8_b) : dt;
  const Elem c_elem = g.c_elem.value_or(g.elem);
  const cudaDataType_t ct_c = c_elem == Elem::F32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t ct = (g.elem == Elem::F32 && allow_tf32_ && !g.fp8())
                                     ? CUBLAS_COMPUTE_32F_FAST_TF32
                                     : CUBLAS_COMPUTE_32F;
  auto plan = std::make_unique<Plan>();
  Plan& d = *plan;
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
  if (g.epilogue == Epilogue::GeluBias && g.gelu_aux) {
    const int64_t ld = g.ldc;
    LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                      sizeof(ld)));
  }
  if (g.fp8()) {
    // Promote the tensor cores' partial sums to fp32 periodically (the default, stated).
    const int8_t fast_accum = 0;
    LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                      sizeof(fast_accum)));
    if (g.epilogue != Epilogue::None) {
      const int32_t bias_type = ct_c;  // D's type, not fp8's default (bf16 for an fp32 D)
      LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                        sizeof(bias_type)));
    }
  }
  d.set_pointers(g, g.gelu_aux);
  // Column-major layouts of the stored matrices: A is [m,k] (or [k,m] when transposed).
  const uint64_t a_rows = static_cast<uint64_t>(g.trans_a ? g.k : g.m);
  const uint64_t a_cols = static_cast<uint64_t>(g.trans_a ? g.m : g.k);
  const uint64_t b_rows = static_cast<uint64_t>(g.trans_b ? g.n : g.k);
  const uint64_t b_cols = static_cast<uint64_t>(g.trans_b ? g.k : g.n);
  LT(cublasLtMatrixLayoutCreate(&d.a, dt_a, a_rows, a_cols, g.lda));
  LT(cublasLtMatrixLayoutCreate(&d.b, dt_b, b_rows, b_cols, g.ldb));
  LT(cublasLtMatrixLayoutCreate(&d.c, ct_c, static_cast<uint64_t>(g.m), static_cast<uint64_t>(g.n),
                                g.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t ws = workspace_bytes_;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                          sizeof(ws)));
  // The heuristic assumes 256-byte aligned pointers unless told otherwise; views into
  // flat buffers can be less aligned, so state each operand's actual alignment.
  const uint32_t al_a = static_cast<uint32_t>(alignment_of(g.a));
  const uint32_t al_b = static_cast<uint32_t>(alignment_of(g.b));
  const uint32_t al_c = static_cast<uint32_t>(alignment_of(g.c));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                          sizeof(al_a)));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                          sizeof(al_b)));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                          sizeof(al_c)));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                          sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t res[kTuneCandidates]{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, d.op, d.a, d.b, d.c, d.c, pref, tune_ ? kTuneCandidates : 1, res, &count);
  d.found = st == CUBLAS_STATUS_SUCCESS && count > 0;
  if (!d.found) return plan;
  d.algo = res[0].algo;
  if (!tune_ || count == 1) return plan;
  if (auto it = persisted_.find(key); it != persisted_.end()) {
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(handle_, d.op, d.a, d.b, d.c, d.c, &it->second, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= workspace_bytes_) {
      d.algo = it->second;
      return plan;
    }
  }
  if (time_candidates(s, g, d, res, count)) {
    persisted_[key] = d.algo;
    save_cache();
  }
  return plan;
}

// Times each candidate (one warm-up, then kReps launches between two events) writing to
// scratch outputs, so that C (which beta = 1 accumulates into) is untouched; the fastest
// becomes the plan's algorithm. false (keeping the heuristic's first) when the scratch
// cannot be allocated or no candidate runs.
bool Gemm::time_candidates(cudaStream_t s, const GemmArgs& g, Plan& plan,
                           const cublasLtMatmulHeuristicResult_t* res, int count) {
  constexpr int kReps = 3;
  const size_t c_bytes = static_cast<size_t>(g.ldc) * static_cast<size_t>(g.n) *
                         elem_bytes(g.c_elem.value_or(g.elem));
  const size_t aux_offset = (c_bytes + 255) / 256 * 256;
  const size_t aux_bytes = g.gelu_aux ? static_cast<size_t>(g.ldc) * g.n * 4 : 0;
  void* scratch = nullptr;
  if (cudaMalloc(&scratch, aux_offset + aux_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(cudaMemsetAsync(scratch, 0, aux_offset + aux_bytes, s));
  void* aux = g.gelu_aux ? static_cast<char*>(scratch) + aux_offset : nullptr;
  plan.set_pointers(g, aux);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  KILN_CUDA_CHECK(cudaEventCreate(&e0));
  KILN_CUDA_CHECK(cudaEventCreate(&e1));
  const float alpha = 1.f, beta = g.beta;
  int best = -1;
  float best_ms = std::numeric_limits<float>::infinity();
  for (int i = 0; i < count; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > workspace_bytes_) continue;
    auto launch = [&] {
      return cublasLtMatmul(handle_, plan.op, &alpha, g.a, plan.a, g.b, plan.b, &beta, scratch,
                            plan.c, scratch, plan.c, &res[i].algo, workspace_, workspace_bytes_, s);
    };
    bool ok = launch() == CUBLAS_STATUS_SUCCESS;
    KILN_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int r = 0; ok && r < kReps; ++r) ok = launch() == CUBLAS_STATUS_SUCCESS;
    KILN_CUDA_CHECK(cudaEventRecord(e1, s));
    KILN_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (ok && ms < best_ms) best = i, best_ms = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  KILN_CUDA_CHECK(cudaFree(scratch));  // (synchronises the device)
  plan.set_pointers(g, g.gelu_aux);
  if (best < 0) return false;
  plan.algo = res[best].algo;
  return true;
}

void Gemm::set_cache_file(const std::filesystem::path& path, const std::string& device_name) {
  std::lock_guard lock(mu_);
  cache_path_ = path;
  cache_header_ = fmt::format("# kiln cuBLASLt algorithm cache v1; cublasLt {}; device {}",
                              cublasLtGetVersion(), device_name);
  std::ifstream in(path);
  if (!in) return;  // none yet: written at the first tuned shape
  std::string line;
  if (!std::getline(in, line) || line != cache_header_) return;  // another device: replaced
  for (int lineno = 2; std::getline(in, line); ++lineno) {
    std::istringstream fields(line);
    Key key;
    cublasLtMatmulAlgo_t algo{};
    bool ok = parse_key(fields, key);
    for (uint64_t& w : algo.data) ok = ok && static_cast<bool>(fields >> std::hex >> w);
    KILN_CHECK(ok, "{}:{}: not a GEMM cache line (13 integers and 8 hex words expected); delete "
               "the file to re-tune", path.string(), lineno);
    persisted_[key] = algo;
  }
}

void Gemm::save_cache() const {
  if (cache_path_.empty()) return;
  std::ostringstream o;
  o << cache_header_ << '\n';
  for (const auto& [key, algo] : persisted_) {
    o << key_text(key) << std::hex;
    for (uint64_t w : algo.data) o << ' ' << w;
    o << std::dec << '\n';
  }
  // Atomically: a temporary file in the same folder, renamed over the cache.
  const std::filesystem::path tmp =
      cache_path_.string() + fmt::format(".tmp.{}", static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << o.str();
    out.close();
    KILN_CHECK(out.good(), "{}: cannot write the GEMM cache", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, cache_path_, ec);
  KILN_CHECK(!ec, "{}: cannot replace the GEMM cache: {}", cache_path_.string(), ec.message());
}

GemmArgs linear_forward_gemm(Elem e, void* out, const void* inp, const void* weight, int64_t N,
                             int64_t IC, int64_t OC) {
  // Row-major out[N,OC] = inp[N,IC] W[OC,IC]^T is column-major out^T = W^T' inp^T:
  // m = OC, n = N, k = IC, A = W (transposed, lda IC), B = inp (ldb IC).
  GemmArgs g;
  g.trans_a = true;
  g.m = OC, g.n = N, g.k = IC;
  g.a = weight, g.lda = IC;
  g.b = inp, g.ldb = IC;
  g.c = out, g.ldc = OC;
  g.elem = e;
  return g;
}

GemmArgs linear_dinp_gemm(Elem e, void* dinp, const void* dout, const void* weight, int64_t N,
                          int64_t IC, int64_t OC) {
  // dinp[N,IC] = dout[N,OC] W[OC,IC]: column-major dinp^T = W^T dout^T.
  GemmArgs g;
  g.m = IC, g.n = N, g.k = OC;
  g.a = weight, g.lda = IC;
  g.b = dout, g.ldb = OC;
  g.c = dinp, g.ldc = IC;
  g.elem = e;
  return g;
}

GemmArgs linear_dweight_gemm(Elem e, Elem gd, void* dweight, const void* dout, const void* inp,
                             int64_t N, int64_t IC, int64_t OC) {
  // dW[OC,IC] += dout^T inp: column-major dW^T[IC,OC] += inp^T dout. With bf16
  // activations and fp32 gradients: bf16 A/B, fp32 C, accumulated with beta = 1.
  GemmArgs g;
  g.trans_b = true;
  g.m = IC, g.n = OC, g.k = N;
  g.a = inp, g.lda = IC;
  g.b = dout, g.ldb = OC;
  g.c = dweight, g.ldc = IC;
  g.beta = 1.f;
  g.elem = e;
  g.c_elem = gd;
  return g;
}

Gemm::Key Gemm::key_of(const GemmArgs& g) const {
  const Elem c_elem = g.c_elem.value_or(g.elem);
  const int align = alignment_of(g.a) | alignment_of(g.b) << 9 | alignment_of(g.c) << 18;
  // The element field also holds the fp8 operand formats (0 without fp8, so that the
  // cache files of earlier runs keep their keys).
  const Key key{static_cast<int>(g.trans_a) | static_cast<int>(g.trans_b) << 1,
                static_cast<int>(g.elem) | static_cast<int>(g.fp8_a) << 2 |
                    static_cast<int>(g.fp8_b) << 4,
                g.m, g.n, g.k, g.lda, g.ldb, g.ldc,
                static_cast<int>(g.epilogue) | (g.gelu_aux ? 4 : 0), align,
                g.beta != 0.f ? 1 : 0, allow_tf32_ && !g.fp8() ? 1 : 0, static_cast<int>(c_elem)};
  return key;
}

bool Gemm::available(cudaStream_t s, const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return true;
  if (g.epilogue != Epilogue::None && alignment_of(g.bias) < 16) return false;
  const Key key = key_of(g);
  std::lock_guard lock(mu_);
  std::unique_ptr<Plan>& plan = plans_[key];
  if (!plan) plan = make_plan(s, g, key);
  return plan->found;
}

bool Gemm::run(cudaStream_t s, const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return true;
  // A bias pointer below 16-byte alignment is left to the caller's fallback (GEMM, then
  // a bias kernel): the epilogue's alignment needs are not part of the preference.
  if (g.epilogue != Epilogue::None && alignment_of(g.bias) < 16) return false;
  const Elem c_elem = g.c_elem.value_or(g.elem);
  const Key key = key_of(g);
  // Held across the pointer update and the launch: the plan's descriptor is shared.
  std::lock_guard lock(mu_);
  std::unique_ptr<Plan>& plan = plans_[key];
  if (!plan) plan = make_plan(s, g, key);
  if (!plan->found) {
    if (g.epilogue != Epilogue::None || g.fp8()) return false;
    KILN_FAIL("cuda: cuBLASLt has no algorithm for a {} GEMM{} m={} n={} k={} (trans {}{})",
              g.elem == Elem::F32 ? "fp32" : "bf16",
              c_elem != g.elem ? (c_elem == Elem::F32 ? " (fp32 C)" : " (bf16 C)") : "", g.m,
              g.n, g.k, g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N');
  }
  plan->set_pointers(g, g.gelu_aux);
  const float alpha = 1.f, beta = g.beta;
  LT(cublasLtMatmul(handle_, plan->op, &alpha, g.a, plan->a, g.b, plan->b, &beta, g.c, plan->c,
                    g.c, plan->c, &plan->algo, workspace_, workspace_bytes_, s));
  return true;
}

}  // namespace kiln::cuda
