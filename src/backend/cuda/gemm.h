// GEMMs through cuBLASLt, in cuBLAS's column-major terms:
//   C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C  (+ bias[m] per row, + GELU)
// with fp32 accumulation (CUBLAS_COMPUTE_32F). fp32 operands run in full fp32 (no TF32)
// unless allow_tf32 is set; bf16 operands use the tensor cores with fp32 accumulation.
// C may be fp32 while A and B are bf16 (mixed precision: weight gradients accumulate
// with beta = 1 into fp32 gradients).
// Epilogues fuse the bias (and, for a future fused linear+GELU op, GELU with the
// pre-activation saved for backward: cuBLASLt's GELU_AUX_BIAS) into the GEMM's stores.
//
// Plans: for each (shape, layout, dtype, epilogue, alignment) the descriptors are built
// once and kept with the chosen algorithm for the process; a call only sets the bias and
// GELU pointers and launches. The algorithm is cublasLtMatmulAlgoGetHeuristic's first
// result, or, with set_tuning(true) (the backend's backend.gemm_tuning), the fastest
// of its first kTuneCandidates results timed with CUDA events on scratch outputs the
// first time the shape is seen (a host synchronisation, once per shape). Different
// algorithms may round differently, so tuned choices are persisted (set_cache_file, the
// backend's KILN_CUDA_GEMM_CACHE) for this device and cuBLASLt version and reused by
// later runs: two runs with the same cache file give bitwise identical results.
// One 32 MiB workspace per backend.
//
// fp8 operands (train.fp8 on sm_89+, cuda_fp8_ops.cpp): A and B hold 1-byte E4M3/E5M2
// codes (GemmArgs::fp8_a/fp8_b), descaled by fp32 factors read on the device
// (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER: D = scale_a scale_b op(A) op(B) + beta C),
// with CUBLAS_COMPUTE_32F, scale type 32F, FAST_ACCUM off, and C/D of type `elem`
// (bf16 or fp32). cuBLASLt runs them only in the "TN" layout on sm_89/sm_90 (trans_a and
// not trans_b) with 16-byte aligned pointers and leading dimensions; for any fp8 GEMM it
// has no algorithm for, run returns false and the caller falls back (to the emulation).
#pragma once

#include "backend/cuda/common.h"

#include <cublasLt.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

namespace kiln::cuda {

enum class Epilogue { None, Bias, GeluBias };

/// An operand's storage when it is not `elem`: 1-byte OCP fp8 codes.
enum class Fp8Operand { None, E4M3, E5M2 };

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  float beta = 0.f;               // 1 accumulates into C
  Epilogue epilogue = Epilogue::None;
  const void* bias = nullptr;     // [m], same dtype as C
  void* gelu_aux = nullptr;       // GeluBias: pre-activation [m,n], ld = ldc
  Elem elem = Elem::F32;           // A and B (and C unless c_elem says otherwise)
  std::optional<Elem> c_elem;     // C/D when it differs: bf16 A/B with fp32 C (dW += in fp32)
  // fp8 GEMMs: both set (then `elem`/c_elem name only C and D's type), with the device
  // fp32 descale factors a_scale and b_scale (cuBLASLt's A/B_SCALE_POINTER; may be null =
  // 1). With Epilogue::Bias the bias has D's type (set explicitly: cuBLASLt's default for
  // fp8 with an fp32 D would be bf16).
  Fp8Operand fp8_a = Fp8Operand::None, fp8_b = Fp8Operand::None;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool fp8() const { return fp8_a != Fp8Operand::None; }
};

/// The GEMMs of a linear layer y = x W^T on row-major tensors (x [N,IC], W [OC,IC],
/// y [N,OC], all of element type e), in cuBLAS's column-major terms, without a bias
/// (the dense linear adds its epilogue to the forward's): forward y^T = W^T' x^T (m = OC,
/// n = N, k = IC); dinp dx^T = W^T dy^T (m = IC, n = N, k = OC); dweight dW^T += x^T dy
/// (m = IC, n = OC, k = N, beta = 1, dW of element type g: fp32 with bf16 activations).
GemmArgs linear_forward_gemm(Elem e, void* out, const void* inp, const void* weight, int64_t N,
                             int64_t IC, int64_t OC);
GemmArgs linear_dinp_gemm(Elem e, void* dinp, const void* dout, const void* weight, int64_t N,
                          int64_t IC, int64_t OC);
GemmArgs linear_dweight_gemm(Elem e, Elem g, void* dweight, const void* dout, const void* inp,
                             int64_t N, int64_t IC, int64_t OC);

class Gemm {
 public:
  /// Candidates timed per shape when tuning.
  static constexpr int kTuneCandidates = 8;

  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void set_workspace(void* ptr, size_t bytes) {
    workspace_ = ptr;
    workspace_bytes_ = bytes;
  }
  void set_allow_tf32(bool on) { allow_tf32_ = on; }
  /// Chooses each new shape's algorithm by timing (see the header comment).
  void set_tuning(bool on) { tune_ = on; }
  /// Reads the tuned choices of `path` for `device_name` (a missing file is an empty
  /// cache; one for another device or cuBLASLt version is ignored and later replaced),
  /// and rewrites it atomically whenever a new shape is tuned. Throws kiln::Error naming
  /// the file when it exists but cannot be parsed.
  void set_cache_file(const std::filesystem::path& path, const std::string& device_name);

  /// Runs the GEMM on stream s. Returns false (running nothing) when cuBLASLt has no
  /// algorithm for this epilogue, so that the caller can fall back to Epilogue::None and
  /// a separate bias kernel, or for an fp8 GEMM at all (the caller emulates it); throws
  /// kiln::Error on a cuBLAS failure.
  bool run(cudaStream_t s, const GemmArgs& g);
  /// Whether run(s, g) would launch (builds and keeps g's plan, as run does, without
  /// launching anything but a tuning's timed candidates): lets a caller choose a path
  /// before it prepares the operands (the fp8 GEMMs' codes).
  bool available(cudaStream_t s, const GemmArgs& g);

 private:
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                         int, int, int, int>;
  struct Plan;
  Key key_of(const GemmArgs& g) const;
  std::unique_ptr<Plan> make_plan(cudaStream_t s, const GemmArgs& g, const Key& key);
  bool time_candidates(cudaStream_t s, const GemmArgs& g, Plan& plan,
                       const cublasLtMatmulHeuristicResult_t* res, int count);
  void save_cache() const;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool allow_tf32_ = false;
  bool tune_ = false;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::filesystem::path cache_path_;
  std::string cache_header_;                        // device and cuBLASLt version
  std::map<Key, cublasLtMatmulAlgo_t> persisted_;  // tuned choices (file and this run)
};

}  // namespace kiln::cuda
