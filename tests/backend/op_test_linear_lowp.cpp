// Linear layers in bf16 and fp16 (with fp32 or low-precision gradients) against the
// double reference of the rounded inputs. On the CPU these run natively where oneDNN has
// kernels for the dtype and through fp32 compute where it has none (backend/cpu/gemm.h);
// ctest runs this file a second time with DNNL_MAX_CPU_ISA=AVX2 so that both paths are
// tested on any machine (tests/backend/CMakeLists.txt).
//
// Bounds: a result rounded to bf16 is off by at most 2^-8 of itself (fp16: 2^-11), so the
// norm-relative error of a rounded output is below that; accumulation is fp32 (~1e-6).
#include "op_harness.h"

#include "core/dtype.h"

#include <sstream>

namespace kiln::test {
namespace {

// x rounded to dtype and back (round to nearest even, as the backend's copy).
std::vector<float> rounded(const std::vector<float>& x, DType dt) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    r[i] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
  return r;
}

TEST_P(OpTest, LinearLowPrecision) {
  // A tensor of dtype `dt` holding `host` (converted by the backend's copy), and back.
  auto up = [&](const std::vector<float>& host, const Shape& shape, DType dt, MemCategory cat) {
    Tensor f = upload(host, shape, cat);
    if (dt == DType::F32) return f;
    Tensor t = be().empty(shape, dt, cat);
    be().copy(st(), t, f);
    return t;
  };
  auto down = [&](const Tensor& t) {
    if (t.dtype() == DType::F32) return download(t);
    Tensor f = be().empty(t.shape(), DType::F32, MemCategory::Temporaries);
    be().copy(st(), f, t);
    return download(f);
  };
  struct Cfg { int N, IC, OC; bool bias; };
  for (DType dt : {DType::BF16, DType::F16}) {
    if (!be().supports(OpFamily::Linear, dt)) continue;
    const double out_tol = dt == DType::BF16 ? 4e-3 : 1e-3;
    for (DType gt : {DType::F32, dt}) {
      for (const Cfg& c : {Cfg{1, 7, 5, true}, Cfg{3, 13, 17, false}, Cfg{37, 64, 96, true},
                           Cfg{130, 257, 191, true}}) {
        std::ostringstream os;
        os << dtype_name(dt) << " grads " << dtype_name(gt) << " N=" << c.N << " IC=" << c.IC
           << " OC=" << c.OC << " bias=" << c.bias;
        const std::string what = os.str();
        const std::vector<float> x = rounded(randn(int64_t{c.N} * c.IC), dt),
                                 w = rounded(randn(int64_t{c.OC} * c.IC, 0.2f), dt),
                                 b = c.bias ? rounded(randn(c.OC), dt) : std::vector<float>{};
        Tensor tx = up(x, {c.N, c.IC}, dt, MemCategory::Activations);
        Tensor tw = up(w, {c.OC, c.IC}, dt, MemCategory::Parameters);
        Tensor tb = c.bias ? up(b, {c.OC}, dt, MemCategory::Parameters) : Tensor();
        Tensor out = be().empty({c.N, c.OC}, dt, MemCategory::Activations);
        be().linear_forward(st(), out, tx, tw, tb);
        const Vec want = ref::linear_forward(to_double(x), to_double(w), to_double(b), c.N, c.IC, c.OC);
        EXPECT_TRUE(near_by_norm("linear_forward " + what, down(out), want, out_tol)) << what;

        // Gradients accumulate into pre-filled buffers (exact in their dtype).
        const std::vector<float> dout = rounded(randn(int64_t{c.N} * c.OC), dt);
        const std::vector<float> dw0 = rounded(randn(int64_t{c.OC} * c.IC, 0.1f), gt == DType::F32 ? dt : gt),
                                 db0 = rounded(randn(c.OC, 0.1f), dt);
        Tensor tdout = up(dout, {c.N, c.OC}, dt, MemCategory::Activations);
        Tensor dinp = be().empty({c.N, c.IC}, dt, MemCategory::Activations);
        Tensor dw = up(dw0, {c.OC, c.IC}, gt, MemCategory::Gradients);
        Tensor db = c.bias ? up(db0, {c.OC}, gt, MemCategory::Gradients) : Tensor();
        be().linear_backward(st(), dinp, dw, db, tdout, tx, tw);
        Vec gx, gw, gb;
        ref::linear_backward(gx, gw, gb, to_double(dout), to_double(x), to_double(w), c.N, c.IC, c.OC);
        // Against the whole accumulated value: its rounding is relative to dw0 + gw.
        Vec want_w(gw.size()), want_b(gb.size());
        for (size_t i = 0; i < gw.size(); ++i) want_w[i] = dw0[i] + gw[i];
        for (size_t i = 0; i < gb.size(); ++i) want_b[i] = db0[i] + gb[i];
        const double grad_tol = gt == DType::F32 ? 1e-5 : out_tol;
        EXPECT_TRUE(near_by_norm("linear_backward dinp " + what, down(dinp), gx, out_tol)) << what;
        EXPECT_TRUE(near_by_norm("linear_backward dweight (+=) " + what, down(dw), want_w, grad_tol)) << what;
        if (c.bias) {
          EXPECT_TRUE(near_by_norm("linear_backward dbias (+=) " + what, down(db), want_b, grad_tol)) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
