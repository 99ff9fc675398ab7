#include "backend/cpu/gemm.h"

#include "core/error.h"
#include "core/tensor.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <unordered_map>
#include <tuple>

namespace kiln::cpu {

namespace {
using dt = dnnl::memory::data_type;

dt to_dnnl(DType t) {
  switch (t) {
    case DType::F32: return dt::f32;
    case DType::BF16: return dt::bf16;
    case DType::F16: return dt::f16;
    case DType::I32: return dt::s32;
  }
  return dt::undef;
}

// The matmul primitive of one problem (user scratchpad; sum post-op to accumulate). The
// memory descriptors are returned through the pointers when given.
dnnl::matmul::primitive_desc primitive_desc(const GemmArgs& g, const dnnl::engine& engine,
                                            dnnl::memory::desc* a_md = nullptr,
                                            dnnl::memory::desc* b_md = nullptr,
                                            dnnl::memory::desc* c_md = nullptr,
                                            dnnl::memory::desc* bias_md = nullptr) {
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
  if (a_md) *a_md = a, *b_md = b, *c_md = c, *bias_md = bias;
  auto desc = g.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  return dnnl::matmul::primitive_desc(desc, attr, engine);
}

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool, bool,
                       int, int, int, int>;

struct Cached {
  dnnl::memory::desc a_md, b_md, c_md, bias_md, scratch_md;
  dnnl::matmul prim;
  size_t scratch_bytes = 0;
};
}  // namespace

struct Gemm::Impl {
  explicit Impl(Allocator& a) : alloc(a), engine(dnnl::engine::kind::cpu, 0), stream(engine) {}
  Allocator& alloc;
  dnnl::engine engine;
  dnnl::stream stream;
  std::map<Key, Cached> cache;
  Tensor scratch;  // grows to the largest scratchpad any primitive asked for

  Cached& get(const GemmArgs& g) {
    const Key key{g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.trans_a, g.trans_b, g.bias != nullptr,
                  g.accumulate, static_cast<int>(g.a_type), static_cast<int>(g.b_type),
                  static_cast<int>(g.c_type), static_cast<int>(g.bias_type)};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Cached c;
    const auto pd = primitive_desc(g, engine, &c.a_md, &c.b_md, &c.c_md, &c.bias_md);
    c.scratch_md = pd.scratchpad_desc();
    c.scratch_bytes = c.scratch_md.get_size();
    c.prim = dnnl::matmul(pd);
    return cache.emplace(key, std::move(c)).first->second;
  }
};

size_t Gemm::scratchpad_bytes(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.k == 0) return 0;
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  try {
    return primitive_desc(g, engine).scratchpad_desc().get_size();
  } catch (const dnnl::error& e) {
    KILN_FAIL("oneDNN matmul {}x{}x{}: no primitive for the scratchpad query: {}", g.m, g.n, g.k,
              e.what());
  }
}

Gemm::Gemm(Allocator& alloc) : impl_(std::make_unique<Impl>(alloc)) {}
Gemm::~Gemm() = default;

void Gemm::run(const GemmArgs& g) {
  KILN_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm: negative size {}x{}x{}", g.m, g.n, g.k);
  if (g.m == 0 || g.n == 0) return;
  KILN_CHECK(g.k > 0, "gemm: K = 0 is not supported");
  try {
    Cached& c = impl_->get(g);
    auto& eng = impl_->engine;
    if (c.scratch_bytes > impl_->scratch.nbytes()) {
      impl_->scratch = Tensor();  // free the old one first so the peak stays honest
      const auto words = static_cast<int64_t>((c.scratch_bytes + 3) / 4);
      impl_->scratch =
          Tensor::empty(impl_->alloc, Shape{words}, DType::F32, MemCategory::Temporaries);
    }
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(c.a_md, eng, const_cast<void*>(g.a))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(c.b_md, eng, const_cast<void*>(g.b))},
        {DNNL_ARG_DST, dnnl::memory(c.c_md, eng, g.c)}};
    if (g.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(c.bias_md, eng, const_cast<void*>(g.bias)));
    if (c.scratch_bytes > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(c.scratch_md, eng, impl_->scratch.raw()));
    c.prim.execute(impl_->stream, args);
    impl_->stream.wait();
  } catch (const dnnl::error& e) {
    KILN_FAIL("oneDNN matmul {}x{}x{} failed: {}", g.m, g.n, g.k, e.what());
  }
}

}  // namespace kiln::cpu
