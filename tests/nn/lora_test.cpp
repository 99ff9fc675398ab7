// LoRA adapters on a Linear (nn/lora.h) on the CPU backend, against a double-precision
// reference at awkward sizes: adapters on pieces of a fused output (q and v of a qkv
// projection) and on a whole output, with alpha / r and rsLoRA's alpha / sqrt(r); the base
// frozen (no weight gradient) or not; dropout on the adapter input (the mask replayed from
// Philox in backward); a fresh adapter (B = 0) leaving the output bitwise unchanged; the
// initial values (A uniform within 1 / sqrt(in), B zero); and the errors of add_lora.
#include "backend/registry.h"
#include "nn/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kiln::nn {
namespace {

struct Rig {
  std::unique_ptr<Backend> be = make_backend("cpu");
  Stream s = be->default_stream();
  Tensor up(const std::vector<float>& v, const Shape& shape) {
    Tensor t = be->empty(shape, DType::F32, MemCategory::Activations);
    upload_f32(*be, t, v.data());
    return t;
  }
  Tensor zeros(const Shape& shape) {
    Tensor t = be->empty(shape, DType::F32, MemCategory::Activations);
    be->fill(s, t, 0.f);
    return t;
  }
  std::vector<float> down(const Tensor& t) { return download_f32(*be, t); }
};

std::vector<float> randn(int64_t n, unsigned seed, float std = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, std);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

// Binds `p` to fresh values (random, or `values`) and, when it trains, a zero gradient.
void bind(Rig& r, Param& p, unsigned seed) {
  p.value = r.up(randn(p.shape.numel(), seed, 0.5f), p.shape);
  if (p.trainable) p.grad = r.zeros(p.shape);
}

double at(const std::vector<float>& v, int64_t i) { return v[static_cast<size_t>(i)]; }

// The double reference of y = x W^T + b + sum over adapters of scale * mask(x) A^T B^T
// on the adapter's rows, and of the gradients of L = sum(y * R).
struct Reference {
  int64_t N, in, out;
  std::vector<double> y, dx, dW;
  std::vector<std::vector<double>> dA, dB;
};

Reference reference(const Linear& l, Rig& r, const std::vector<float>& x,
                    const std::vector<float>& R, const std::vector<float>& keep) {
  Reference ref{static_cast<int64_t>(x.size()) / l.in(), l.in(), l.out(), {}, {}, {}, {}, {}};
  const int64_t N = ref.N, in = l.in(), out = l.out();
  const auto W = r.down(l.weight.value);
  const auto b = l.has_bias() ? r.down(l.bias.value) : std::vector<float>(static_cast<size_t>(out), 0.f);
  ref.y.assign(static_cast<size_t>(N * out), 0.0);
  ref.dx.assign(static_cast<size_t>(N * in), 0.0);
  ref.dW.assign(static_cast<size_t>(out * in), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < out; ++j) {
      double acc = at(b, j);
      for (int64_t c = 0; c < in; ++c) {
        acc += at(W, j * in + c) * at(x, n * in + c);
        ref.dx[static_cast<size_t>(n * in + c)] += at(R, n * out + j) * at(W, j * in + c);
        ref.dW[static_cast<size_t>(j * in + c)] += at(R, n * out + j) * at(x, n * in + c);
      }
      ref.y[static_cast<size_t>(n * out + j)] = acc;
    }
  for (const LoraAdapter& a : l.lora()) {
    const auto A = r.down(a.A.value), B = r.down(a.B.value);
    const int64_t k = a.spec.rank;
    const double scale = a.spec.alpha / (a.spec.rslora ? std::sqrt(double(k)) : double(k));
    std::vector<double> dA(static_cast<size_t>(k * in)), dB(static_cast<size_t>(a.rows * k));
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> xd(static_cast<size_t>(in)), h(static_cast<size_t>(k)), g(static_cast<size_t>(k));
      for (int64_t c = 0; c < in; ++c)
        xd[static_cast<size_t>(c)] = at(x, n * in + c) * (keep.empty() ? 1.0 : at(keep, n * in + c));
      for (int64_t q = 0; q < k; ++q)
        for (int64_t c = 0; c < in; ++c) h[static_cast<size_t>(q)] += at(A, q * in + c) * xd[static_cast<size_t>(c)];
      for (int64_t jj = 0; jj < a.rows; ++jj) {
        const double Rj = at(R, n * out + a.row0 + jj);
        for (int64_t q = 0; q < k; ++q) {
          ref.y[static_cast<size_t>(n * out + a.row0 + jj)] += scale * at(B, jj * k + q) * h[static_cast<size_t>(q)];
          dB[static_cast<size_t>(jj * k + q)] += scale * Rj * h[static_cast<size_t>(q)];
          g[static_cast<size_t>(q)] += scale * Rj * at(B, jj * k + q);
        }
      }
      for (int64_t q = 0; q < k; ++q)
        for (int64_t c = 0; c < in; ++c) {
          dA[static_cast<size_t>(q * in + c)] += g[static_cast<size_t>(q)] * xd[static_cast<size_t>(c)];
          const double m = keep.empty() ? 1.0 : at(keep, n * in + c);
          ref.dx[static_cast<size_t>(n * in + c)] += g[static_cast<size_t>(q)] * at(A, q * in + c) * m;
        }
    }
    ref.dA.push_back(std::move(dA));
    ref.dB.push_back(std::move(dB));
  }
  return ref;
}

void expect_near(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 2e-5 * std::max(1.0, std::abs(want[i]))) << what << " [" << i << "]";
}

// A qkv-like Linear of 9 inputs and pieces q 6, k 4, v 4 over N = 7 rows.
Linear fused(bool bias) { return Linear("l", 9, 14, bias, 0.02f, {{"q", 6}, {"k", 4}, {"v", 4}}); }

// Forward and backward of `l` (adapters added, base frozen or not) against the reference;
// `dropout` > 0 turns the adapters' dropout on (its mask read back from the backend).
// The rig outlives the layer, whose parameters it allocated.
void check(Rig& r, Linear& l, bool frozen_base, float dropout = 0.f) {
  const int64_t N = 7, in = l.in(), out = l.out();
  l.weight.trainable = !frozen_base;
  if (l.has_bias()) l.bias.trainable = !frozen_base;
  bind(r, l.weight, 1);
  if (l.has_bias()) bind(r, l.bias, 2);
  LoraDropout pass{dropout > 0.f, 99, 3 * N};
  unsigned seed = 10;
  for (LoraAdapter& a : l.lora()) {
    bind(r, a.A, seed++);
    bind(r, a.B, seed++);  // nonzero B: the adapter's output matters
    a.spec.dropout = dropout;
    a.dropout = &pass;
    a.dropout_stream = seed;
  }
  const auto x = randn(N * in, 3), R = randn(N * out, 4);
  // The mask each adapter applies: dropout of ones on its stream (one adapter here when
  // dropout is on, so one mask).
  std::vector<float> keep;
  if (dropout > 0.f) {
    ASSERT_EQ(l.lora().size(), 1u);
    const LoraAdapter& a = l.lora()[0];
    DropoutSpec d{dropout, pass.seed, a.dropout_stream, pass.first_row * static_cast<uint64_t>(in)};
    Tensor ones = r.up(std::vector<float>(static_cast<size_t>(N * in), 1.f), Shape{N, in});
    r.be->dropout_forward(r.s, ones, ones, d);
    keep = r.down(ones);
  }
  const Reference ref = reference(l, r, x, R, keep);
  const Tensor xt = r.up(x, Shape{N, in}), y = r.zeros(Shape{N, out}), dx = r.zeros(Shape{N, in});
  l.forward(*r.be, r.s, y, xt);
  expect_near(r.down(y), ref.y, "y");
  l.backward(*r.be, r.s, dx, r.up(R, Shape{N, out}), xt);
  expect_near(r.down(dx), ref.dx, "dinp");
  if (frozen_base)
    EXPECT_FALSE(l.weight.grad) << "a frozen base has no gradient";
  else
    expect_near(r.down(l.weight.grad), ref.dW, "dweight");
  for (size_t i = 0; i < l.lora().size(); ++i) {
    expect_near(r.down(l.lora()[i].A.grad), ref.dA[i], "dA");
    expect_near(r.down(l.lora()[i].B.grad), ref.dB[i], "dB");
  }
}

TEST(Lora, PiecesOfAFusedOutputMatchADoubleReference) {
  Rig r;
  Linear l = fused(/*bias=*/true);
  l.add_lora(0, LoraSpec{3, 5.f, false, 0.f});  // q
  l.add_lora(2, LoraSpec{3, 5.f, false, 0.f});  // v
  ASSERT_EQ(l.lora().size(), 2u);
  EXPECT_EQ(l.lora()[1].name, "l.v");
  EXPECT_EQ(l.lora()[1].A.name, "l.v.lora_A.weight");
  EXPECT_EQ(l.lora()[1].B.shape, (Shape{4, 3}));
  EXPECT_EQ(l.lora()[1].row0, 10);
  check(r, l, /*frozen_base=*/true);
}

TEST(Lora, WholeOutputWithRsLoraAndATrainedBase) {
  Rig r;
  Linear l("l", 13, 5, /*bias=*/false, 0.02f);
  l.add_lora(-1, LoraSpec{4, 3.f, /*rslora=*/true, 0.f});
  EXPECT_FLOAT_EQ(l.lora()[0].spec.scale(), 1.5f);  // 3 / sqrt(4)
  check(r, l, /*frozen_base=*/false);
}

TEST(Lora, DropoutOnTheAdapterInputIsReplayedInBackward) {
  Rig r;
  Linear l = fused(/*bias=*/false);
  l.add_lora(1, LoraSpec{2, 4.f, false, 0.f});  // k
  check(r, l, /*frozen_base=*/true, /*dropout=*/0.3f);
}

TEST(Lora, AFreshAdapterChangesNothingAndStartsAsPeft) {
  Rig r;
  Linear plain = fused(true), adapted = fused(true);
  adapted.add_lora(-1, LoraSpec{});
  const LoraAdapter& a = adapted.lora()[0];
  // PEFT: A kaiming_uniform_(a = sqrt(5)) = U(+-1/sqrt(in)), B zeros.
  const auto A0 = init_values(a.A, 5, 7, 0, a.A.shape.numel());
  const double bound = 1.0 / std::sqrt(9.0);
  double lo = 1, hi = -1;
  for (float v : A0) lo = std::min(lo, double(v)), hi = std::max(hi, double(v));
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.8 * bound) << "spread over the whole range";
  EXPECT_GT(hi, 0.8 * bound);
  for (float v : init_values(a.B, 5, 8, 0, a.B.shape.numel())) EXPECT_EQ(v, 0.f);
  for (Linear* l : {&plain, &adapted}) {
    bind(r, l->weight, 1);
    bind(r, l->bias, 2);
  }
  LoraAdapter& fresh = adapted.lora()[0];
  fresh.A.value = r.up(A0, fresh.A.shape);
  fresh.B.value = r.zeros(fresh.B.shape);
  const Tensor x = r.up(randn(5 * 9, 3), Shape{5, 9});
  const Tensor y0 = r.zeros(Shape{5, 14}), y1 = r.zeros(Shape{5, 14});
  plain.forward(*r.be, r.s, y0, x);
  adapted.forward(*r.be, r.s, y1, x);
  EXPECT_EQ(r.down(y0), r.down(y1));
}

TEST(Lora, AddLoraErrors) {
  Linear l = fused(false);
  EXPECT_THROW(l.add_lora(3, LoraSpec{}), Error);   // no piece 3
  EXPECT_THROW(l.add_lora(0, LoraSpec{0}), Error);  // rank 0
  l.add_lora(0, LoraSpec{});
  EXPECT_THROW(l.add_lora(0, LoraSpec{}), Error);   // q twice
  EXPECT_THROW(l.add_lora(-1, LoraSpec{}), Error);  // whole and a piece
  Linear w("w", 4, 4, false, 0.02f);
  w.add_lora(-1, LoraSpec{});
  EXPECT_THROW(w.add_lora(-1, LoraSpec{}), Error);
}

}  // namespace
}  // namespace kiln::nn
