#include "plan/scratch_models.h"

#include "backend/cpu/gemm.h"
#include "core/error.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <tuple>

namespace kiln::plan {

namespace {
// Restores the OpenMP thread count on scope exit.
struct ThreadScope {
  explicit ThreadScope(int threads) : saved(omp_get_max_threads()) {
    if (threads > 0) omp_set_num_threads(threads);
  }
  ~ThreadScope() { omp_set_num_threads(saved); }
  int saved;
};

// The set bits of m, largest first: the pieces cpu/grouped_linear.cpp runs m rows in.
void add_bits(std::vector<int64_t>& out, int64_t m) {
  for (int b = 62; b >= 0; --b)
    if (m & (int64_t{1} << b)) out.push_back(int64_t{1} << b);
}

// The GEMMs of one linear call over `N` rows (cpu/linear.cpp: forward [N,IC]x[OC,IC]^T
// + bias; backward dinp = dout @ W, dW += dout^T @ inp).
std::vector<GemmProblem> linear_gemms(const MetaCallInfo& c, int64_t N) {
  std::vector<GemmProblem> out;
  const int64_t IC = c.IC, OC = c.OC;
  if (c.call == Op::LinearForward || c.call == Op::GroupedLinearForward ||
      c.call == Op::Fp8LinearForward) {
    GemmProblem g;
    g.m = N, g.n = OC, g.k = IC, g.lda = IC, g.ldb = IC, g.trans_b = true, g.ldc = OC;
    g.bias = c.has_bias;
    g.dtype = g.c_dtype = c.dtype;
    out.push_back(g);
  } else if (c.call == Op::LinearBackward || c.call == Op::GroupedLinearBackward ||
             c.call == Op::Fp8LinearBackward) {
    if (c.has_dinp) {
      GemmProblem g;
      g.m = N, g.n = IC, g.k = OC, g.lda = OC, g.ldb = IC, g.ldc = IC;
      g.dtype = g.c_dtype = c.dtype;
      out.push_back(g);
    }
    if (c.has_dweight) {
      GemmProblem g;
      g.m = OC, g.n = IC, g.k = N, g.lda = OC, g.trans_a = true, g.ldb = IC, g.ldc = IC;
      g.accumulate = true;
      g.dtype = c.dtype;
      g.c_dtype = c.grad_dtype;
      out.push_back(g);
    }
  }
  return out;
}

// The quantized copies of an fp8 linear's operands, held for the call (the CPU's and the
// CUDA backend's emulation alike; CudaScratch also counts the CUDA fp8 GEMMs' codes): inp
// and weight in forward; dout, and inp for dweight and weight for dinp, in backward (the
// bias gradient reads dout unquantized).
int64_t fp8_quantized_bytes(const MetaCallInfo& c) {
  int64_t n = 0;
  if (c.call == Op::Fp8LinearForward) n = c.N * c.IC + c.OC * c.IC;
  if (c.call == Op::Fp8LinearBackward && (c.has_dinp || c.has_dweight))
    n = c.N * c.OC + (c.has_dweight ? c.N * c.IC : 0) + (c.has_dinp ? c.OC * c.IC : 0);
  return n * static_cast<int64_t>(dtype_size(c.dtype));
}

}  // namespace

MoeRouting parse_moe_routing(const std::string& name, const std::string& what) {
  if (name == "worst") return MoeRouting::Worst;
  KILN_CHECK(name == "balanced", "{}: the MoE routing is worst or balanced, got '{}'", what, name);
  return MoeRouting::Balanced;
}

const char* moe_routing_name(MoeRouting r) {
  return r == MoeRouting::Worst ? "worst" : "balanced";
}

std::vector<int64_t> grouped_linear_pieces(int64_t M, int64_t E, const MoeRoutingModel& r) {
  std::vector<int64_t> out;
  if (M <= 0 || E <= 0) return out;
  if (r.routing == MoeRouting::Worst) {
    // An expert's count is anything from 0 to N = M / k: every power of two up to N.
    const int64_t most = std::max<int64_t>(1, M / std::max(1, r.top_k));
    for (int64_t p = std::bit_floor(static_cast<uint64_t>(most)); p >= 1; p /= 2) out.push_back(p);
    return out;
  }
  add_bits(out, (M + E - 1) / E);  // the experts that take one row more
  if (M % E != 0) add_bits(out, M / E);
  std::sort(out.begin(), out.end(), std::greater<>());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t onednn_matmul_scratchpad_bytes(const GemmProblem& g, int threads) {
  ThreadScope ts(threads);
  cpu::GemmArgs a;
  a.m = g.m, a.n = g.n, a.k = g.k;
  a.lda = g.lda, a.trans_a = g.trans_a, a.ldb = g.ldb, a.trans_b = g.trans_b, a.ldc = g.ldc;
  a.accumulate = g.accumulate;
  a.bias = g.bias ? &a : nullptr;  // any non-null pointer: only its presence matters
  a.a_type = a.b_type = a.bias_type = g.dtype;
  a.c_type = g.c_dtype;
  return static_cast<int64_t>(cpu::Gemm::scratchpad_bytes(a));
}

std::vector<GemmProblem> cpu_linear_gemms(const MetaCallInfo& c, const MoeRoutingModel& moe) {
  const bool grouped = c.call == Op::GroupedLinearForward || c.call == Op::GroupedLinearBackward;
  if (!grouped) return linear_gemms(c, c.N);
  // A grouped linear runs each expert's rows in power-of-two pieces
  // (src/backend/cpu/grouped_linear.cpp): the GEMMs of every piece the routing allows.
  std::vector<GemmProblem> out;
  for (const int64_t rows : grouped_linear_pieces(c.N, c.E, moe))
    for (const GemmProblem& g : linear_gemms(c, rows)) out.push_back(g);
  return out;
}

namespace {

class CpuScratch final : public MetaScratchModel {
 public:
  CpuScratch(int threads, MoeRoutingModel moe)
      : threads_(threads > 0 ? threads : omp_get_max_threads()), moe_(moe) {}
  std::string name() const override {
    return fmt::format("cpu (oneDNN scratchpad and widened operands, {} thread{})", threads_, threads_ == 1 ? "" : "s");
  }
  int64_t growing_bytes(const MetaCallInfo& c) override {
    int64_t most = 0;
    for (const GemmProblem& g : cpu_linear_gemms(c, moe_)) {
      const auto key = std::make_tuple(g.m, g.n, g.k, g.trans_a, g.trans_b, g.bias, g.accumulate,
                                       static_cast<int>(g.dtype), static_cast<int>(g.c_dtype));
      std::lock_guard lock(mu_);
      auto it = cache_.find(key);
      if (it == cache_.end()) it = cache_.emplace(key, onednn_matmul_scratchpad_bytes(g, threads_)).first;
      most = std::max(most, it->second);
    }
    return most;
  }
  int64_t transient_bytes(const MetaCallInfo& c) override { return fp8_quantized_bytes(c); }

 private:
  int threads_;
  MoeRoutingModel moe_;
  std::mutex mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, bool, int, int>, int64_t> cache_;
};

// The CUDA backend's fp8 tensor-core path (cuda_fp8_ops.cpp, sm_89+ with IC and OC
// multiples of 16): 1-byte codes in 256-byte aligned pieces after a 256-byte piece of
// descale factors: q(x) and q(W) in forward; q(dout) and q(W)^T for dinp, q(dout)^T and
// q(x)^T (N padded to 16) for dweight in backward. 0 where the call is always emulated.
int64_t cuda_fp8_gemm_bytes(const MetaCallInfo& c) {
  if (c.N <= 0 || c.IC <= 0 || c.OC <= 0 || c.IC % 16 != 0 || c.OC % 16 != 0) return 0;
  auto up256 = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t Np = (c.N + 15) / 16 * 16;
  if (c.call == Op::Fp8LinearForward) return 256 + up256(c.N * c.IC) + up256(c.OC * c.IC);
  if (c.call != Op::Fp8LinearBackward || (!c.has_dinp && !c.has_dweight)) return 0;
  return 256 + (c.has_dinp ? up256(c.N * c.OC) + up256(c.IC * c.OC) : 0) +
         (c.has_dweight ? up256(c.OC * Np) + up256(c.IC * Np) : 0);
}

class CudaScratch final : public MetaScratchModel {
 public:
  std::string name() const override { return "cuda (32 MiB cuBLASLt workspace + op scratch)"; }
  int64_t persistent_bytes() const override { return kCudaGemmWorkspaceBytes; }
  int64_t transient_bytes(const MetaCallInfo& c) override {
    auto chunks = [](int64_t n) { return (n + 63) / 64; };
    auto up256 = [](int64_t b) { return (b + 255) / 256 * 256; };
    switch (c.call) {
      case Op::LayerNormBackward: return 4 * 2 * chunks(c.N) * c.C;
      case Op::RMSNormBackward: return 4 * chunks(c.N) * c.C;
      case Op::LinearBackward: return c.has_bias ? 4 * chunks(c.N) * c.OC : 0;
      // The larger of the emulation's copies and the fp8 path's codes: which one runs
      // depends on the device (sm_89+) and on cuBLASLt offering the fp8 GEMMs.
      case Op::Fp8LinearForward: return std::max(fp8_quantized_bytes(c), cuda_fp8_gemm_bytes(c));
      case Op::Fp8LinearBackward:
        return std::max(fp8_quantized_bytes(c), cuda_fp8_gemm_bytes(c)) +
               (c.has_bias ? 4 * chunks(c.N) * c.OC : 0);
      case Op::AttentionBackward: return 4 * c.B * c.NH * c.T;
      // cuda/attention.cu: each row's document window (two int32), after D_i in backward.
      case Op::AttentionVarlenForward: return 8 * c.B * c.T;
      case Op::AttentionVarlenBackward: return up256(4 * c.B * c.NH * c.T) + 8 * c.B * c.T;
      case Op::EmbeddingBackward: {
        const int64_t n = c.B * c.T;
        return 4 * up256(4 * n) + up256(8 * n + (64 << 10));
      }
      case Op::SumSquares: {
        const int64_t blocks = std::clamp<int64_t>((c.numel + 2047) / 2048, 1, 1024);
        return 8 * blocks;  // the per-block partial sums
      }
      // The router's per-row log-sum-exp and sigmoid sum (fp64) and per-expert counts.
      case Op::MoeBalanceStats: return 16 * c.N + 4 * c.C;
      // The plan's histogram: an int32 per expert and chunk of 256 slots.
      case Op::MoePermutePlan: return 4 * ((c.numel + 255) / 256) * c.E;
      default: return 0;
    }
  }
};

}  // namespace

std::shared_ptr<MetaScratchModel> cpu_scratch_model(int threads, MoeRoutingModel moe) {
  return std::make_shared<CpuScratch>(threads, moe);
}
std::shared_ptr<MetaScratchModel> cuda_scratch_model() { return std::make_shared<CudaScratch>(); }

}  // namespace kiln::plan
