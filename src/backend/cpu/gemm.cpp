#include "backend/cpu/gemm.h"

#include "backend/cpu/element.h"
#include "core/error.h"
#include "core/tensor.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <optional>
#include <mutex>
#include <tuple>
#include <unordered_map>

namespace kiln::cpu {

namespace {
using dt = dnnl::memory::data_type;

dt to_dnnl(DType t) {
  switch (t) {
    case DType::F32: return dt::f32;
    case DType::BF16: return dt::bf16;
    case DType::F16: return dt::f16;
    case DType::I32: return dt::s32;
    case DType::F64:
    case DType::E4M3:
    case DType::E5M2: return dt::undef;
  }
  return dt::undef;
}

bool low_precision(const GemmArgs& g) {
  return g.a_type != DType::F32 || g.b_type != DType::F32 || g.c_type != DType::F32 ||
         (g.bias && g.bias_type != DType::F32);
}

// The problem as the fp32-compute path runs it: fp32 operands, compact (ld = columns),
// C in place when it is fp32 already.
GemmArgs widened(const GemmArgs& g) {
  GemmArgs w = g;
  w.a_type = w.b_type = w.c_type = w.bias_type = DType::F32;
  w.lda = g.trans_a ? g.m : g.k;
  w.ldb = g.trans_b ? g.k : g.n;
  if (g.c_type != DType::F32) w.ldc = g.n;
  return w;
}

// The matmul primitive of one problem (user scratchpad; sum post-op to accumulate).
// Throws dnnl::error when oneDNN has no implementation.
dnnl::matmul::primitive_desc primitive_desc(const GemmArgs& g, const dnnl::engine& engine) {
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a(dims{g.m, g.k}, to_dnnl(g.a_type),
                             g.trans_a ? dims{1, g.lda} : dims{g.lda, 1});
  const dnnl::memory::desc b(dims{g.k, g.n}, to_dnnl(g.b_type),
                             g.trans_b ? dims{1, g.ldb} : dims{g.ldb, 1});
  const dnnl::memory::desc c(dims{g.m, g.n}, to_dnnl(g.c_type), dims{g.ldc, 1});
  dnnl::memory::desc bias;
  if (g.bias) bias = dnnl::memory::desc(dims{1, g.n}, to_dnnl(g.bias_type), dims{g.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  auto desc = g.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  return dnnl::matmul::primitive_desc(desc, attr, engine);
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// The primitive descriptor a low-precision problem runs natively with, or nothing when
// oneDNN has no implementation or only its (very slow) reference one.
std::optional<dnnl::matmul::primitive_desc> native_desc(const GemmArgs& g) {
  try {
    auto pd = primitive_desc(g, cpu_engine());
    if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return std::nullopt;
    return pd;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// The plan of one problem: which problem oneDNN runs, and where the widened operands go
// in the scratch buffer (byte offsets after oneDNN's scratchpad; -1 = not used).
struct Layout {
  bool widen = false;
  size_t onednn_bytes = 0;
  int64_t a_off = -1, b_off = -1, c_off = -1, bias_off = -1;
  size_t total = 0;
};

size_t align64(size_t b) { return (b + 63) / 64 * 64; }

Layout layout(const GemmArgs& g, size_t onednn_bytes, bool widen) {
  Layout l;
  l.widen = widen;
  l.onednn_bytes = onednn_bytes;
  size_t off = align64(onednn_bytes);
  auto take = [&](int64_t elems) {
    const auto at = static_cast<int64_t>(off);
    off += align64(static_cast<size_t>(elems) * 4);
    return at;
  };
  if (widen) {
    l.a_off = take(g.m * g.k);
    l.b_off = take(g.k * g.n);
    if (g.c_type != DType::F32) l.c_off = take(g.m * g.n);
    if (g.bias) l.bias_off = take(g.n);
  }
  l.total = widen ? off : onednn_bytes;
  return l;
}

// dst[rows, cols] (compact fp32) = src[rows, cols] with row stride ld, of dtype t.
template <class T>
void widen_t(float* dst, const T* src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = load(src[r * ld + c]);
}
void widen(float* dst, const void* src, DType t, int64_t rows, int64_t cols, int64_t ld) {
  switch (t) {
    case DType::F32: return widen_t(dst, static_cast<const float*>(src), rows, cols, ld);
    case DType::BF16: return widen_t(dst, static_cast<const bf16*>(src), rows, cols, ld);
    case DType::F16: return widen_t(dst, static_cast<const f16*>(src), rows, cols, ld);
    case DType::I32:
    case DType::F64:
    case DType::E4M3:
    case DType::E5M2: break;
  }
  KILN_FAIL("gemm: no fp32 widening for {}", dtype_name(t));
}

// dst[rows, cols] with row stride ld, of dtype t = src (compact fp32), rounded to nearest even.
template <class T>
void narrow_t(T* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = store<T>(src[r * cols + c]);
}
void narrow(void* dst, DType t, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  switch (t) {
    case DType::BF16: return narrow_t(static_cast<bf16*>(dst), src, rows, cols, ld);
    case DType::F16: return narrow_t(static_cast<f16*>(dst), src, rows, cols, ld);
    case DType::F32:
    case DType::I32:
    case DType::F64:
    case DType::E4M3:
    case DType::E5M2: break;
  }
  KILN_FAIL("gemm: no narrowing to {}", dtype_name(t));
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool, bool,
                       int, int, int, int>;

Key key_of(const GemmArgs& g) {
  return Key{g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.trans_a, g.trans_b, g.bias != nullptr,
             g.accumulate, static_cast<int>(g.a_type), static_cast<int>(g.b_type),
             static_cast<int>(g.c_type), static_cast<int>(g.bias_type)};
}

// The primitive descriptor and layout of a problem: native where oneDNN can, else fp32.
std::pair<dnnl::matmul::primitive_desc, Layout> plan(const GemmArgs& g) {
  if (low_precision(g)) {
    if (auto pd = native_desc(g)) return {*pd, layout(g, pd->scratchpad_desc().get_size(), false)};
    auto pd = primitive_desc(widened(g), cpu_engine());
    return {pd, layout(g, pd.scratchpad_desc().get_size(), true)};
  }
  auto pd = primitive_desc(g, cpu_engine());
  return {pd, layout(g, pd.scratchpad_desc().get_size(), false)};
}

struct Cached {
  dnnl::memory::desc a_md, b_md, c_md, bias_md, scratch_md;
  dnnl::matmul prim;
  Layout lay;
};
}  // namespace

struct Gemm::Impl {
  explicit Impl(Allocator& a) : alloc(a), stream(cpu_engine()) {}
  Allocator& alloc;
  dnnl::stream stream;
  std::map<Key, Cached> cache;
  Tensor scratch;  // grows to the largest scratch any problem asked for

  Cached& get(const GemmArgs& g) {
    const Key key = key_of(g);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Cached c;
    auto [pd, lay] = plan(g);
    // The descriptors of the problem oneDNN runs (the widened one on the fp32 path).
    c.a_md = pd.src_desc(), c.b_md = pd.weights_desc(), c.c_md = pd.dst_desc();
    c.bias_md = pd.bias_desc();
    c.scratch_md = pd.scratchpad_desc();
    c.prim = dnnl::matmul(pd);
    c.lay = lay;
    return cache.emplace(key, std::move(c)).first->second;
  }

  uint8_t* scratch_of(size_t bytes) {
    if (bytes > scratch.nbytes()) {
      scratch = Tensor();  // free the old one first so the peak stays honest
      const auto words = static_cast<int64_t>((bytes + 3) / 4);
      scratch = Tensor::empty(alloc, Shape{words}, DType::F32, MemCategory::Temporaries);
    }
    return static_cast<uint8_t*>(scratch.raw());
  }
};

size_t Gemm::scratchpad_bytes(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.k == 0) return 0;
  try {
    return plan(g).second.total;
  } catch (const dnnl::error& e) {
    KILN_FAIL("oneDNN matmul {}x{}x{}: no primitive for the scratchpad query: {}", g.m, g.n, g.k,
              e.what());
  }
}

namespace {
// The problem native() and path_description() ask oneDNN about: a shape of the kind a
// transformer's linear layers run (weights transposed, a bias), all operands in `dtype`.
GemmArgs probe(DType dtype) {
  static float dummy;
  GemmArgs g{64, 96, 64, &dummy, 64, false, &dummy, 64, true, &dummy, 96, &dummy, false};
  g.a_type = g.b_type = g.c_type = g.bias_type = dtype;
  return g;
}
}  // namespace

bool Gemm::native(DType dtype) {
  if (dtype == DType::F32) return true;
  static std::mutex mu;
  static std::map<DType, bool> known;
  std::lock_guard lock(mu);
  auto it = known.find(dtype);
  if (it != known.end()) return it->second;
  return known[dtype] = native_desc(probe(dtype)).has_value();
}

std::string Gemm::isa() {
  using I = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case I::sse41: return "sse41";
    case I::avx: return "avx";
    case I::avx2: return "avx2";
    case I::avx2_vnni: return "avx2_vnni";
    case I::avx512_mic: return "avx512_mic";
    case I::avx512_mic_4ops: return "avx512_mic_4ops";
    case I::avx512_core: return "avx512_core";
    case I::avx512_core_vnni: return "avx512_core_vnni";
    case I::avx512_core_bf16: return "avx512_core_bf16";
    case I::avx512_core_amx: return "avx512_core_amx";
    case I::all: break;
  }
  return "unknown";
}

std::string Gemm::path_description(DType dtype) {
  const dnnl_version_t* v = dnnl_version();
  const std::string lib = fmt::format("oneDNN {}.{}", v->major, v->minor);
  const std::string name(dtype_name(dtype));
  if (dtype == DType::F32) return fmt::format("fp32 GEMMs: {}, ISA {}", lib, isa());
  if (!native(dtype))
    return fmt::format("{} GEMMs: fp32 compute (ISA {}: this CPU has no {} matrix instructions "
                       "that {} uses)", name, isa(), name, lib);
  return fmt::format("{} GEMMs: {} {}", name, lib, native_desc(probe(dtype))->impl_info_str());
}

Gemm::Gemm(Allocator& alloc) : impl_(std::make_unique<Impl>(alloc)) {}
Gemm::~Gemm() = default;

void Gemm::run(const GemmArgs& g) {
  KILN_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm: negative size {}x{}x{}", g.m, g.n, g.k);
  if (g.m == 0 || g.n == 0) return;
  KILN_CHECK(g.k > 0, "gemm: K = 0 is not supported");
  try {
    Cached& c = impl_->get(g);
    const Layout& l = c.lay;
    uint8_t* scratch = impl_->scratch_of(l.total);
    auto at = [&](int64_t off) { return reinterpret_cast<float*>(scratch + off); };
    const void *a = g.a, *b = g.b, *bias = g.bias;
    void* cc = g.c;
    if (l.widen) {
      widen(at(l.a_off), g.a, g.a_type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda);
      widen(at(l.b_off), g.b, g.b_type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb);
      a = at(l.a_off), b = at(l.b_off);
      if (g.bias) widen(at(l.bias_off), g.bias, g.bias_type, 1, g.n, g.n), bias = at(l.bias_off);
      if (l.c_off >= 0) {
        if (g.accumulate) widen(at(l.c_off), g.c, g.c_type, g.m, g.n, g.ldc);
        cc = at(l.c_off);
      }
    }
    const auto& eng = cpu_engine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(c.a_md, eng, const_cast<void*>(a))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(c.b_md, eng, const_cast<void*>(b))},
        {DNNL_ARG_DST, dnnl::memory(c.c_md, eng, cc)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(c.bias_md, eng, const_cast<void*>(bias)));
    if (l.onednn_bytes > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(c.scratch_md, eng, scratch));
    c.prim.execute(impl_->stream, args);
    impl_->stream.wait();
    if (l.c_off >= 0) narrow(g.c, g.c_type, at(l.c_off), g.m, g.n, g.ldc);
  } catch (const dnnl::error& e) {
    KILN_FAIL("oneDNN matmul {}x{}x{} failed: {}", g.m, g.n, g.k, e.what());
  }
}

}  // namespace kiln::cpu
