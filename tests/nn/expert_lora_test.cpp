// LoRA adapters on a MoE layer's experts (nn/expert_lora.h) against the layer whose expert
// weights hold the adapters merged, W_e + scale B_e A_e (fp32, on fresh random values at
// awkward sizes): the same output and input gradient, and adapter gradients equal to the
// chain rule through the merged weight's gradient dW_e (computed in double on the host):
//   dB_e = scale dW_e[rows] A_e^T,   dA_e = scale B_e^T dW_e[rows].
// Cases: pieces (gate, up) and the whole gate_up, the down projection, rsLoRA, top-1 and
// top-2, with and without shared experts, dropless and with token dropping.
#include "backend/registry.h"
#include "nn/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kiln::nn {
namespace {

constexpr int64_t kB = 2, kT = 7, kN = kB * kT, kC = 9, kE = 3, kF = 5, kFs = 3, kR = 2;

struct Case {
  std::vector<int> gate_up_pieces;  // -1: whole; 0 gate; 1 up
  bool down = true;
  int k = 2;
  bool shared = false;
  bool rslora = false;
  double capacity_factor = 0.0;
  std::string what() const {
    std::string s = "gate_up pieces";
    for (int p : gate_up_pieces) s += " " + std::to_string(p);
    return s + " down=" + std::to_string(down) + " k=" + std::to_string(k) +
           " shared=" + std::to_string(shared) + " rslora=" + std::to_string(rslora) +
           " capacity_factor=" + std::to_string(capacity_factor);
  }
};

MoeSpec spec_of(const Case& c) {
  MoeSpec s;
  s.num_experts = kE;
  s.top_k = c.k;
  s.expert_hidden = kF;
  s.shared_hidden = c.shared ? kFs : 0;
  s.capacity_factor = c.capacity_factor;
  return s;
}

// A layer with its parameters bound to fp32 buffers of their own.
struct Bound {
  MoeMlp layer;
  std::vector<Param*> params;
  std::vector<Tensor> keep;
  explicit Bound(const Case& c) : layer("m.mlp", kC, spec_of(c), 0.4f, 0.4f) {}
  void bind(Backend& be) {
    params.clear();
    layer.collect(params);
    for (Param* p : params) {
      p->value = be.empty(p->shape, DType::F32, MemCategory::Parameters);
      keep.push_back(p->value);
      if (p->trainable) {
        p->grad = be.empty(p->shape, DType::F32, MemCategory::Gradients);
        be.fill(be.default_stream(), p->grad, 0.f);
      }
    }
  }
  Param& named(const std::string& name) {
    for (Param* p : params)
      if (p->name == name) return *p;
    ADD_FAILURE() << "no " << name;
    return *params[0];
  }
  struct Result {
    std::vector<float> out, dinp;
  };
  Result run(Backend& be, const Tensor& x, const Tensor& dout) {
    const Stream s = be.default_stream();
    std::vector<Tensor> saved;
    for (const SavedSpec& sp : layer.saved_specs(kB, kT, DType::F32))
      saved.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
    const MoeScratch w = layer.make_scratch(be, kB, kT, DType::F32);
    const Tensor out = be.empty(x.shape(), DType::F32, MemCategory::Activations);
    const Tensor dinp = be.empty(x.shape(), DType::F32, MemCategory::Activations);
    layer.forward(be, s, saved, out, x, w, MoeBalancePass{}, false);
    layer.backward(be, s, saved, dinp, dout, x, w, MoeBalancePass{});
    return {download_f32(be, out), download_f32(be, dinp)};
  }
};

std::vector<float> randn(std::mt19937& g, int64_t n, float std) {
  std::normal_distribution<float> nd(0.f, std);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(g);
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) e += std::pow(got[i] - want[i], 2), n += want[i] * want[i];
  return std::sqrt(e / std::max(n, 1e-30));
}

void check_case(const Case& c, uint32_t seed) {
  auto be = make_backend("cpu");
  std::mt19937 g(seed);
  LoraSpec spec{kR, 3.f, c.rslora, 0.f};
  const float scale = spec.scale();
  Bound lora(c), merged(c);
  for (int p : c.gate_up_pieces) lora.layer.gate_up_lora.add_lora(p, spec);
  if (c.down) lora.layer.down_lora.add_lora(-1, spec);
  lora.layer.gate_up.trainable = lora.layer.down.trainable = false;  // the frozen base
  lora.bind(*be);
  merged.bind(*be);
  // The same router, base and shared experts in both; random A and nonzero B.
  for (Param* p : lora.params) {
    const std::vector<float> v = randn(g, p->shape.numel(), 0.5f);
    upload_f32(*be, p->value, v.data());
    if (!p->adapter) upload_f32(*be, merged.named(p->name).value, v.data());
  }
  // Merged weights: W_e[row0 + i, :] += scale * B_e A_e.
  auto merge = [&](ExpertLora& adapters, Param& weight) {
    std::vector<float> W = download_f32(*be, weight.value);
    const int64_t O = weight.shape[1], I = weight.shape[2];
    for (const LoraAdapter& a : adapters.lora()) {
      const std::vector<float> A = download_f32(*be, a.A.value), B = download_f32(*be, a.B.value);
      for (int64_t e = 0; e < kE; ++e)
        for (int64_t i = 0; i < a.rows; ++i)
          for (int64_t j = 0; j < I; ++j) {
            double d = 0;
            for (int64_t k = 0; k < kR; ++k)
              d += double{B[static_cast<size_t>((e * a.rows + i) * kR + k)]} *
                   A[static_cast<size_t>((e * kR + k) * I + j)];
            float& w = W[static_cast<size_t>((e * O + a.row0 + i) * I + j)];
            w = static_cast<float>(w + scale * d);
          }
    }
    upload_f32(*be, merged.named(weight.name).value, W.data());
  };
  merge(lora.layer.gate_up_lora, lora.layer.gate_up);
  merge(lora.layer.down_lora, lora.layer.down);

  const Tensor x = be->empty(Shape{kB, kT, kC}, DType::F32, MemCategory::Activations);
  const Tensor dout = be->empty(Shape{kB, kT, kC}, DType::F32, MemCategory::Activations);
  const std::vector<float> xv = randn(g, kN * kC, 1.f), dv = randn(g, kN * kC, 1.f);
  upload_f32(*be, x, xv.data());
  upload_f32(*be, dout, dv.data());
  const Bound::Result got = lora.run(*be, x, dout), want = merged.run(*be, x, dout);
  auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  EXPECT_LT(rel_err(got.out, as_double(want.out)), 1e-5) << c.what() << ": output";
  EXPECT_LT(rel_err(got.dinp, as_double(want.dinp)), 1e-5) << c.what() << ": input gradient";
  // The frozen experts have no gradient; the router and shared experts (trainable in
  // both) the merged layer's.
  EXPECT_FALSE(lora.layer.gate_up.grad);
  EXPECT_FALSE(lora.layer.down.grad);
  for (Param* p : lora.params)
    if (p->trainable && !p->adapter)
      EXPECT_LT(rel_err(download_f32(*be, p->grad),
                        as_double(download_f32(*be, merged.named(p->name).grad))), 1e-5)
          << c.what() << ": " << p->name;
  // The adapters' gradients through the merged weight's.
  auto check_adapters = [&](ExpertLora& adapters, const Param& weight) {
    const std::vector<float> dW = download_f32(*be, merged.named(weight.name).grad);
    const int64_t O = weight.shape[1], I = weight.shape[2];
    for (const LoraAdapter& a : adapters.lora()) {
      const std::vector<float> A = download_f32(*be, a.A.value), B = download_f32(*be, a.B.value);
      std::vector<double> dA(A.size(), 0.0), dB(B.size(), 0.0);
      for (int64_t e = 0; e < kE; ++e)
        for (int64_t i = 0; i < a.rows; ++i)
          for (int64_t j = 0; j < I; ++j) {
            const double gw = dW[static_cast<size_t>((e * O + a.row0 + i) * I + j)];
            for (int64_t k = 0; k < kR; ++k) {
              dB[static_cast<size_t>((e * a.rows + i) * kR + k)] +=
                  scale * gw * A[static_cast<size_t>((e * kR + k) * I + j)];
              dA[static_cast<size_t>((e * kR + k) * I + j)] +=
                  scale * gw * B[static_cast<size_t>((e * a.rows + i) * kR + k)];
            }
          }
      EXPECT_LT(rel_err(download_f32(*be, a.A.grad), dA), 1e-5) << c.what() << ": " << a.A.name;
      EXPECT_LT(rel_err(download_f32(*be, a.B.grad), dB), 1e-5) << c.what() << ": " << a.B.name;
    }
  };
  check_adapters(lora.layer.gate_up_lora, lora.layer.gate_up);
  check_adapters(lora.layer.down_lora, lora.layer.down);
}

TEST(ExpertLora, MatchesTheMergedExpertsInOutputAndEveryGradient) {
  uint32_t seed = 1;
  check_case({{0, 1}, true, 2, false, false, 0.0}, seed++);
  check_case({{-1}, true, 2, true, true, 0.0}, seed++);
  check_case({{1}, false, 1, true, false, 0.0}, seed++);
  check_case({{0}, true, 2, false, false, 0.5}, seed++);  // token dropping: ragged rows
  check_case({{0, 1}, true, 1, true, true, 0.7}, seed++);
}

TEST(ExpertLora, ShapesInitAndErrors) {
  MoeMlp layer("m.mlp", kC, spec_of(Case{}), 0.4f, 0.4f);
  const LoraSpec spec{4, 8.f, false, 0.f};
  layer.gate_up_lora.add_lora(0, spec);
  layer.down_lora.add_lora(-1, spec);
  const LoraAdapter& g = layer.gate_up_lora.lora()[0];
  EXPECT_EQ(g.name, "m.mlp.experts.gate_up_proj.gate");
  EXPECT_EQ(g.A.shape, (Shape{kE, 4, kC}));
  EXPECT_EQ(g.B.shape, (Shape{kE, kF, 4}));
  EXPECT_EQ(layer.down_lora.lora()[0].A.shape, (Shape{kE, 4, kF}));
  EXPECT_EQ(layer.down_lora.lora()[0].B.shape, (Shape{kE, kC, 4}));
  EXPECT_EQ(g.A.init.kind, Init::Kind::Uniform);
  EXPECT_FLOAT_EQ(g.A.init.std, static_cast<float>(1.0 / std::sqrt(double{kC})));
  EXPECT_EQ(g.B.init.kind, Init::Kind::Zeros);
  EXPECT_THROW(layer.gate_up_lora.add_lora(-1, spec), Error);  // whole and gate
  EXPECT_THROW(layer.gate_up_lora.add_lora(0, spec), Error);   // gate twice
  EXPECT_THROW(layer.gate_up_lora.add_lora(2, spec), Error);   // no piece 2
  std::vector<Param*> params;
  layer.collect(params);
  EXPECT_EQ(params.size(), 7u);  // router, gate_up, down, 2 adapters' A and B
}

}  // namespace
}  // namespace kiln::nn
