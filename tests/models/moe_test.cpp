// The mixture-of-experts layer (nn::MoeMlp) and its balancing losses (MoeBalance) on the
// CPU backend against a double-precision reference written here from issue 38's design
// sheet: two MoE layers in a row at awkward sizes (N = 15 tokens, C = 7, E = 5, F = 6, k
// = 2, shared width 4), both scorings, renormalisation on and off, shared experts on and
// off, both auxiliary-loss forms and the z-loss; an expert that receives no token and
// every token sent to one expert (k = 1). The loss sum(out * R) + aux + z: its value and
// every gradient (inputs and all parameters) against central differences of the double
// reference. Token dropping (capacity factor > 0): the reference drops each expert's slots
// past the first `capacity` in token order; the output, the dropped count, every gradient
// as above, a token dropped by all its experts getting its shared experts' output alone,
// and decode staying dropless. Then a MoE block's three checkpointing policies giving
// bitwise the same gradients (dropless and dropping); a bf16 layer's router logits in
// fp32. The Llama wiring (keys, names, counts, errors) is in llama_test.cpp.
#include "backend/registry.h"
#include "core/dtype.h"
#include "core/error.h"
#include "models/moe_balance.h"
#include "nn/block.h"
#include "nn/moe.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace kiln {
namespace {

using Vec = std::vector<double>;

// ---- the double reference (the design sheet's math) ------------------------------------

struct RefLayer {
  int C, E, k, F, Fs;
  bool sigmoid, renorm;
  Vec router, gu, down, sgu, sdown;  // [E,C], [E,2F,C], [E,C,F], [2Fs,C], [C,Fs]
  Vec bias;  // [E] the selection bias (DeepSeek-V3's), or empty
  int capacity = 0;  // slots each expert keeps, the first in token order; 0: dropless
};
struct RefOut {
  Vec out;                  // [N,C]
  Vec p, lse;               // [N,E] balancing probabilities, [N]
  std::vector<double> c;    // [E] slots per expert (the choice, before dropping)
  double dropped = 0;       // slots dropped past the capacity
  std::vector<bool> all_dropped;  // [N] tokens that lost every expert
};

double silu(double v) { return v / (1 + std::exp(-v)); }

// SwiGLU of one token: down (silu(gate x) * up x), rows of w13 [2F, C] and w2 [C, F].
void swiglu_add(double* y, double scale, const double* x, const double* w13, const double* w2,
                int C, int F) {
  for (int f = 0; f < F; ++f) {
    double g = 0, u = 0;
    for (int c = 0; c < C; ++c) g += w13[f * C + c] * x[c], u += w13[(F + f) * C + c] * x[c];
    const double a = silu(g) * u;
    for (int c = 0; c < C; ++c) y[c] += scale * w2[c * F + f] * a;
  }
}

RefOut ref_forward(const RefLayer& L, const Vec& x, int N) {
  const int C = L.C, E = L.E, k = L.k;
  RefOut r{Vec(static_cast<size_t>(N) * C, 0.0), Vec(static_cast<size_t>(N) * E),
           Vec(static_cast<size_t>(N)), std::vector<double>(E, 0.0), 0.0,
           std::vector<bool>(static_cast<size_t>(N), false)};
  std::vector<int> taken(E, 0);  // slots each expert kept so far, in token order
  for (int n = 0; n < N; ++n) {
    const double* xn = &x[n * C];
    Vec l(E), s(E);
    for (int e = 0; e < E; ++e) {
      l[e] = 0;
      for (int c = 0; c < C; ++c) l[e] += L.router[e * C + c] * xn[c];
    }
    const double mx = *std::max_element(l.begin(), l.end());
    double se = 0, ss = 0;
    for (int e = 0; e < E; ++e) se += std::exp(l[e] - mx);
    r.lse[n] = mx + std::log(se);
    for (int e = 0; e < E; ++e) s[e] = L.sigmoid ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - r.lse[n]);
    for (int e = 0; e < E; ++e) ss += s[e];
    for (int e = 0; e < E; ++e) r.p[n * E + e] = L.sigmoid ? s[e] / ss : s[e];
    // Top k of the scores (+ the bias), ties to the lower index.
    Vec key = s;
    for (size_t e = 0; e < L.bias.size(); ++e) key[e] += L.bias[e];
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key[a] > key[b]; });
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += s[idx[j]];
    int kept = 0;
    for (int j = 0; j < k; ++j) {
      const int e = idx[j];
      r.c[e] += 1;
      if (L.capacity > 0 && taken[e]++ >= L.capacity) {  // dropped: adds nothing
        r.dropped += 1;
        continue;
      }
      ++kept;
      const double w = L.renorm ? s[e] / (sum + 1e-20) : s[e];  // not renormalised
      swiglu_add(&r.out[n * C], w, xn, &L.gu[static_cast<size_t>(e) * 2 * L.F * C],
                 &L.down[static_cast<size_t>(e) * C * L.F], C, L.F);
    }
    r.all_dropped[static_cast<size_t>(n)] = kept == 0;
    if (L.Fs > 0) swiglu_add(&r.out[n * C], 1.0, xn, L.sgu.data(), L.sdown.data(), C, L.Fs);
  }
  return r;
}

struct RefLoss {
  double task, aux, z;
};
// sum(out2 * R) of two layers in a row, and the design sheet's aux and z over both.
RefLoss ref_loss(const RefLayer& a, const RefLayer& b, const Vec& x, const Vec& R, int N,
                 double aux_coef, bool hf, double z_coef) {
  const RefOut o1 = ref_forward(a, x, N), o2 = ref_forward(b, o1.out, N);
  RefLoss l{0, 0, 0};
  for (size_t i = 0; i < R.size(); ++i) l.task += o2.out[i] * R[i];
  const int E = a.E, Lm = 2;
  std::vector<double> Ct(E, 0.0), St(E, 0.0);
  for (const RefOut* o : {&o1, &o2}) {
    double layer = 0;
    for (int e = 0; e < E; ++e) {
      double P = 0;
      for (int n = 0; n < N; ++n) P += o->p[n * E + e];
      layer += o->c[e] * P / N;
      Ct[e] += o->c[e], St[e] += P;
    }
    if (!hf) l.aux += aux_coef * E / (double(N) * a.k) * layer;
    for (int n = 0; n < N; ++n) l.z += z_coef * o->lse[n] * o->lse[n] / N;
  }
  if (hf)
    for (int e = 0; e < E; ++e) l.aux += aux_coef * E * (Ct[e] / (Lm * N)) * (St[e] / (Lm * N));
  return l;
}

// ---- kiln's side -------------------------------------------------------------------------

struct Case {
  bool sigmoid = false, renorm = true, shared = true, hf = false;
  int k = 2;
  int route = 0;  // 0: random; 1: expert 3 gets no token; 2: every token to expert 2
  double aux = 0.5, z = 0.05;
  bool task = true;  // false: R = 0, the balancing losses alone
  bool bias = false;  // a random selection bias on each layer (auxiliary-loss-free)
  double capacity_factor = 0;  // token dropping; 0: dropless
  std::string what() const {
    return fmt::format("{} renorm={} shared={} aux={} k={} route={} task={} bias={} "
                       "capacity_factor={}", sigmoid ? "sigmoid" : "softmax", renorm, shared,
                       hf ? "hf" : "per_layer", k, route, task, bias, capacity_factor);
  }
};

constexpr int kB = 3, kT = 5, kN = kB * kT, kC = 7, kE = 5, kF = 6, kFs = 4;

nn::MoeSpec spec_of(const Case& c) {
  nn::MoeSpec s;
  s.num_experts = kE;
  s.top_k = c.k;
  s.expert_hidden = kF;
  s.shared_hidden = c.shared ? kFs : 0;
  s.scoring = c.sigmoid ? MoeScoring::Sigmoid : MoeScoring::Softmax;
  s.norm_topk_prob = c.renorm;
  s.capacity_factor = c.capacity_factor;
  return s;
}

// Two MoE layers bound to one fp32 value and gradient buffer each, their saved tensors and
// scratch, and the balancing losses over both.
struct Rig {
  Case cs;
  std::unique_ptr<Backend> be = make_backend("cpu");
  nn::MoeMlp l1, l2;
  std::vector<nn::Param*> params;
  Tensor values, grads;
  std::vector<int64_t> offsets;
  std::vector<Tensor> saved1, saved2;
  nn::MoeScratch w;
  std::unique_ptr<MoeBalance> balance;
  Tensor x, h, out, dout, dh, dx;

  explicit Rig(const Case& c)
      : cs(c), l1("a.mlp", kC, spec_of(c), 0.5f, 0.5f), l2("b.mlp", kC, spec_of(c), 0.5f, 0.5f) {
    l1.collect(params);
    l2.collect(params);
    int64_t n = 0;
    for (nn::Param* p : params) offsets.push_back(n), n += p->shape.numel();
    values = be->empty(Shape{n}, DType::F32, MemCategory::Parameters);
    grads = be->empty(Shape{n}, DType::F32, MemCategory::Gradients);
    for (size_t i = 0; i < params.size(); ++i) {
      params[i]->value = values.view_at(offsets[i], params[i]->shape);
      params[i]->grad = grads.view_at(offsets[i], params[i]->shape);
    }
    for (const auto& sp : l1.saved_specs(kB, kT, DType::F32))
      saved1.push_back(be->empty(sp.shape, sp.dtype, MemCategory::Activations));
    for (const auto& sp : l2.saved_specs(kB, kT, DType::F32))
      saved2.push_back(be->empty(sp.shape, sp.dtype, MemCategory::Activations));
    w = l1.make_scratch(*be, kB, kT, DType::F32);
    MoeBalanceSpec bs{static_cast<float>(c.aux), c.hf ? MoeBalanceSpec::AuxType::Hf
                                                       : MoeBalanceSpec::AuxType::PerLayer,
                      static_cast<float>(c.z)};
    bs.expert_bias = c.bias;
    bs.bias_update_rate = 1e-3f;
    balance = std::make_unique<MoeBalance>(*be, bs, std::vector<nn::MoeMlp*>{&l1, &l2});
    auto act = [&] { return be->empty(Shape{kB, kT, kC}, DType::F32, MemCategory::Activations); };
    x = act(), h = act(), out = act(), dout = act(), dh = act(), dx = act();
  }
  // Forward, then backward of sum(out * R) + aux + z; returns {dx, parameter gradients}.
  std::pair<std::vector<float>, std::vector<float>> run(const std::vector<float>& R) {
    const Stream s = be->default_stream();
    be->fill(s, grads, 0.f);
    MoeMicroStats mb = balance->micro_stats();
    balance->begin_forward(mb, kN, 0, 2, true);
    l1.forward(*be, s, saved1, h, x, w, balance->pass(mb, 0), false);
    l2.forward(*be, s, saved2, out, h, w, balance->pass(mb, 1), false);
    balance->end_forward(mb);
    upload_f32(*be, dout, R.data());
    l2.backward(*be, s, saved2, dh, dout, h, w, balance->pass(mb, 1));
    l1.backward(*be, s, saved1, dx, dh, x, w, balance->pass(mb, 0));
    return {download_f32(*be, dx), download_f32(*be, grads)};
  }
  RefLayer ref_layer(const std::vector<float>& v, size_t first) const {
    auto get = [&](size_t i) {
      const auto b = v.begin() + offsets[i];
      return Vec(b, b + params[i]->shape.numel());
    };
    RefLayer r{kC, kE, cs.k, kF, cs.shared ? kFs : 0, cs.sigmoid, cs.renorm,
               get(first), get(first + 1), get(first + 2), {}, {}};
    r.capacity = static_cast<int>(nn::moe_capacity(cs.capacity_factor, kN, cs.k, kE));
    if (cs.shared) r.sgu = get(first + 3), r.sdown = get(first + 4);
    const Tensor& bias = (first == 0 ? l1 : l2).expert_bias;
    if (bias) {
      const std::vector<float> b = download_f32(*be, bias);
      r.bias.assign(b.begin(), b.end());
    }
    return r;
  }
  size_t per_layer() const { return cs.shared ? 5 : 3; }
};

// Random values; the router's channel 0 (x's channel 0 is 1 for every token) steers the
// routing: route 1 keeps expert 3 empty, route 2 sends every token to expert 2.
void fill_inputs(Rig& rig, std::vector<float>& xv, std::vector<float>& pv, std::mt19937& g) {
  std::normal_distribution<float> nd(0.f, 1.f);
  xv.resize(kN * kC);
  for (float& v : xv) v = nd(g);
  for (int n = 0; n < kN; ++n) xv[n * kC] = 1.f;
  pv.resize(static_cast<size_t>(rig.values.numel()));
  for (float& v : pv) v = 0.5f * nd(g);
  for (size_t first : {size_t{0}, rig.per_layer()}) {
    float* router = pv.data() + rig.offsets[first];
    if (rig.cs.route == 1) router[3 * kC] = -30.f;
    if (rig.cs.route == 2) router[2 * kC] = 30.f;
  }
  // A bias as large as the scores' spread, so that it changes choices.
  for (const ModelBuffer& b : rig.balance->buffers()) {
    std::vector<float> bias(static_cast<size_t>(kE));
    for (float& v : bias) v = 0.3f * nd(g);
    upload_f32(*rig.be, b.value, bias.data());
  }
}

// Token dropping's own figures: the dropped count (the reference's, > 0 and below all
// slots), a token that lost every expert of layer 1 getting its shared experts' output
// alone (x's residual is the block's, outside the layer), and decode dropless.
void check_dropping(Rig& rig, const Case& c, const std::vector<float>& xv,
                    const std::vector<float>& pv, const RefOut& o1, const RefOut& o2,
                    const MoeStats& stats) {
  ASSERT_TRUE(stats.dropped_slots) << c.what();
  EXPECT_EQ(*stats.dropped_slots, o1.dropped + o2.dropped) << c.what();
  EXPECT_GT(*stats.dropped_slots, 0.0) << c.what() << ": nothing dropped";
  EXPECT_LT(*stats.dropped_slots, 2.0 * kN * c.k) << c.what() << ": everything dropped";
  const std::vector<float> h = download_f32(*rig.be, rig.h);
  const RefLayer a = rig.ref_layer(pv, 0);
  int lost = 0;
  for (int n = 0; n < kN; ++n) {
    if (!o1.all_dropped[static_cast<size_t>(n)]) continue;
    ++lost;
    Vec want(kC, 0.0), x(xv.begin() + n * kC, xv.begin() + (n + 1) * kC);
    if (a.Fs > 0) swiglu_add(want.data(), 1.0, x.data(), a.sgu.data(), a.sdown.data(), kC, a.Fs);
    for (int ch = 0; ch < kC; ++ch)
      EXPECT_NEAR(h[n * kC + ch], want[ch], 1e-5 * (1 + std::abs(want[ch])))
          << c.what() << ": token " << n << " lost every expert";
  }
  if (c.route == 2) EXPECT_GT(lost, 0) << c.what() << ": no token lost every expert";
  // Decode: dropless whatever the capacity.
  rig.l1.decode(*rig.be, rig.be->default_stream(), rig.dh, rig.x);
  RefLayer dropless = a;
  dropless.capacity = 0;
  const RefOut d = ref_forward(dropless, Vec(xv.begin(), xv.end()), kN);
  const std::vector<float> got = download_f32(*rig.be, rig.dh);
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) err += std::pow(got[i] - d.out[i], 2), norm += d.out[i] * d.out[i];
  EXPECT_LT(std::sqrt(err / norm), 1e-5) << c.what() << ": decode is dropless";
}

void check_case(const Case& c, uint64_t seed) {
  Rig rig(c);
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::vector<float> xv, pv, R(kN * kC);
  fill_inputs(rig, xv, pv, g);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : R) v = c.task ? nd(g) : 0.f;
  upload_f32(*rig.be, rig.x, xv.data());
  upload_f32(*rig.be, rig.values, pv.data());
  const auto [dx, dw] = rig.run(R);
  const std::vector<float> out = download_f32(*rig.be, rig.out);
  const MoeStats stats = rig.balance->take();

  const Vec Rd(R.begin(), R.end());
  auto loss = [&](const Vec& x, const std::vector<float>& p) {
    return ref_loss(rig.ref_layer(p, 0), rig.ref_layer(p, rig.per_layer()), x, Rd, kN, c.aux,
                    c.hf, c.z);
  };
  const Vec x0(xv.begin(), xv.end());
  // Forward: the output and the balancing figures.
  const RefOut o1 = ref_forward(rig.ref_layer(pv, 0), x0, kN);
  const RefOut o2 = ref_forward(rig.ref_layer(pv, rig.per_layer()), o1.out, kN);
  double err = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) err += std::pow(out[i] - o2.out[i], 2), norm += o2.out[i] * o2.out[i];
  EXPECT_LT(std::sqrt(err / norm), 1e-5) << c.what() << ": output";
  const RefLoss l0 = loss(x0, pv);
  EXPECT_NEAR(stats.aux_loss, l0.aux, 1e-5 * std::max(1.0, std::abs(l0.aux))) << c.what();
  EXPECT_NEAR(stats.z_loss, l0.z, 1e-5 * std::max(1.0, std::abs(l0.z))) << c.what();
  ASSERT_EQ(stats.tokens_per_expert.size(), 2u);
  for (int e = 0; e < kE; ++e) {
    EXPECT_EQ(stats.tokens_per_expert[0][e], o1.c[e]) << c.what() << " expert " << e;
    EXPECT_EQ(stats.tokens_per_expert[1][e], o2.c[e]) << c.what() << " expert " << e;
  }
  if (c.route == 1) {
    EXPECT_EQ(o1.c[3], 0.0) << "expert 3 must receive no token";
  }
  if (c.route == 2) {
    EXPECT_EQ(o1.c[2], double(kN)) << "every token to expert 2";
  }
  if (c.capacity_factor > 0) check_dropping(rig, c, xv, pv, o1, o2, stats);
  else EXPECT_FALSE(stats.dropped_slots) << "dropless: no dropped count";

  // Gradients: central differences of the double reference, every coordinate.
  auto total = [](const RefLoss& l) { return l.task + l.aux + l.z; };
  const double h = 1e-5;
  auto check = [&](double got, double fd, double scale, const std::string& what) {
    EXPECT_LE(std::abs(got - fd), 2e-4 * scale + 1e-5) << c.what() << ": " << what
                                                       << " backward " << got << " fd " << fd;
  };
  std::vector<double> fdx(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    Vec xp = x0, xm = x0;
    xp[i] += h, xm[i] -= h;
    fdx[i] = (total(loss(xp, pv)) - total(loss(xm, pv))) / (2 * h);
  }
  double sx = 0;
  for (double v : fdx) sx = std::max(sx, std::abs(v));
  for (size_t i = 0; i < xv.size(); ++i) check(dx[i], fdx[i], sx, fmt::format("dx[{}]", i));
  for (size_t k = 0; k < rig.params.size(); ++k) {
    std::vector<double> fd;
    double scale = 0;
    const int64_t n = rig.params[k]->shape.numel();
    for (int64_t j = 0; j < n; ++j) {
      // The fp32 values perturbed in double: the reference reads them as doubles.
      auto at = [&](double d) {
        RefLayer a = rig.ref_layer(pv, 0), b = rig.ref_layer(pv, rig.per_layer());
        RefLayer& t = k < rig.per_layer() ? a : b;
        Vec* v[] = {&t.router, &t.gu, &t.down, &t.sgu, &t.sdown};
        (*v[k % rig.per_layer()])[static_cast<size_t>(j)] += d;
        return total(ref_loss(a, b, x0, Rd, kN, c.aux, c.hf, c.z));
      };
      fd.push_back((at(h) - at(-h)) / (2 * h));
      scale = std::max(scale, std::abs(fd.back()));
    }
    for (int64_t j = 0; j < n; ++j)
      check(dw[static_cast<size_t>(rig.offsets[k] + j)], fd[static_cast<size_t>(j)], scale,
            fmt::format("{}[{}]", rig.params[k]->name, j));
  }
}

TEST(MoeLayer, ForwardAndEveryGradientMatchTheDoubleReference) {
  uint64_t seed = 1;
  for (bool sigmoid : {false, true})
    for (bool renorm : {true, false})
      for (bool shared : {true, false}) {
        Case c;
        c.sigmoid = sigmoid, c.renorm = renorm, c.shared = shared;
        c.hf = !sigmoid && shared;  // hf with softmax only
        c.route = static_cast<int>(seed % 2);  // every other case: expert 3 empty
        check_case(c, seed++);
        c.task = false;  // the balancing losses' gradients alone
        check_case(c, seed++);
      }
  Case all_to_one;
  all_to_one.k = 1;
  all_to_one.route = 2;
  check_case(all_to_one, seed++);
  all_to_one.renorm = false;
  all_to_one.sigmoid = true;
  check_case(all_to_one, seed++);
  Case none;  // no balancing losses: the layer alone
  none.aux = 0, none.z = 0;
  check_case(none, seed++);
  Case dropping;  // capacity ceil(15 * 2 / 5 * 0.5) = 3 of 6 slots per expert on average
  dropping.capacity_factor = 0.5;
  check_case(dropping, seed++);
  dropping.sigmoid = true, dropping.renorm = false, dropping.shared = false;
  dropping.capacity_factor = 0.75;  // capacity 5
  check_case(dropping, seed++);
  Case lost = all_to_one;  // k = 1, all to expert 2, capacity 3: tokens 3.. lose it
  lost.sigmoid = false, lost.renorm = true, lost.capacity_factor = 1.0;
  check_case(lost, seed++);
  for (bool sigmoid : {false, true}) {  // a selection bias: the choice moves, the weights not
    Case biased;
    biased.bias = true, biased.sigmoid = sigmoid, biased.aux = sigmoid ? 0.0 : 0.5;
    check_case(biased, seed++);
  }
}

// The auxiliary-loss-free update: b_e += u sign(mean load - load_e), per layer, the moved
// bias reported; a choice that flips with the bias (DeepSeek-V3).
TEST(MoeLayer, ExpertBiasMovesTowardsTheMeanLoad) {
  Case c;
  c.bias = true;
  Rig rig(c);
  const std::vector<ModelBuffer> buffers = rig.balance->buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].name, "a.mlp.router.expert_bias");
  EXPECT_EQ(buffers[1].value.shape(), Shape({kE}));
  MoeStats step;
  step.tokens_per_expert = {{6, 6, 6, 6, 6}, {0, 12, 6, 9, 3}};  // means 6 and 6
  rig.balance->update_bias(step);
  rig.balance->update_bias(step);
  const std::vector<std::vector<float>> want = {{0, 0, 0, 0, 0}, {2e-3f, -2e-3f, 0, -2e-3f, 2e-3f}};
  EXPECT_EQ(step.expert_bias, want);
  EXPECT_EQ(download_f32(*rig.be, buffers[1].value), want[1]) << "the layer's bias moved";
  step.tokens_per_expert.pop_back();
  try {
    rig.balance->update_bias(step);
    ADD_FAILURE() << "counts of one layer for two: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("counts of 1 layers for 2 MoE layers"), std::string::npos)
        << e.what();
  }
}

// ---- a MoE block under the three checkpointing policies ---------------------------------

std::pair<std::vector<float>, std::vector<float>> block_grads(nn::ActivationCheckpointing mode,
                                                               double capacity_factor = 0) {
  auto be = make_backend("cpu");
  nn::BlockSpec spec;
  spec.n_embd = kC + 1;
  spec.attention.n_head = 2;
  spec.attention.head_dim = 4;
  Case c;
  c.capacity_factor = capacity_factor;
  spec.moe = spec_of(c);
  spec.init_std = spec.residual_init_std = 0.4f;
  nn::TransformerBlock block("h.0.", spec);
  std::vector<nn::Param*> params;
  block.collect(params);
  int64_t n = 0;
  for (nn::Param* p : params) n += p->shape.numel();
  Tensor values = be->empty(Shape{n}, DType::F32, MemCategory::Parameters);
  Tensor grads = be->empty(Shape{n}, DType::F32, MemCategory::Gradients);
  n = 0;
  for (nn::Param* p : params) {
    p->value = values.view_at(n, p->shape);
    p->grad = grads.view_at(n, p->shape);
    n += p->shape.numel();
  }
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.f, 0.4f);
  std::vector<float> v(static_cast<size_t>(n)), xv(static_cast<size_t>(kN * spec.n_embd));
  for (float& f : v) f = nd(g);
  for (float& f : xv) f = nd(g);
  upload_f32(*be, values, v.data());
  be->fill(be->default_stream(), grads, 0.f);
  nn::SavedActivations saved;
  saved.reserve(*be, block.saved_specs(kB, kT, DType::F32), 1, mode);
  const nn::BlockScratch scratch = block.make_scratch(*be, kB, kT, DType::F32);
  MoeBalance balance(*be, MoeBalanceSpec{0.1f, MoeBalanceSpec::AuxType::PerLayer, 0.01f},
                     {block.moe()});
  auto act = [&] { return be->empty(Shape{kB, kT, spec.n_embd}, DType::F32, MemCategory::Activations); };
  Tensor x = act(), out = act(), dres = act();
  upload_f32(*be, x, xv.data());
  MoeMicroStats mb = balance.micro_stats();
  balance.begin_forward(mb, kN, 0, 1, true);
  const nn::BlockPass pass{*be, be->default_stream(), saved.block(0), scratch, {}, {}, {},
                           saved.rerun_block(), saved.recompute_cheap(), Tensor(), Tensor(),
                           balance.pass(mb, 0)};
  block.forward(pass, x, out);
  balance.end_forward(mb);
  be->copy(be->default_stream(), dres, out);  // L = sum(out^2) / 2
  block.backward(pass, dres, x, out);
  const MoeStats stats = balance.take();
  EXPECT_EQ(stats.micro_batches, 1) << "a re-run adds no statistics";
  if (capacity_factor > 0) EXPECT_GT(stats.dropped_slots.value_or(0.0), 0.0) << "nothing dropped";
  return {download_f32(*be, dres), download_f32(*be, grads)};
}

TEST(MoeLayer, CheckpointingPoliciesGiveBitwiseEqualGradients) {
  for (double capacity_factor : {0.0, 0.5}) {
    const auto ref = block_grads(nn::ActivationCheckpointing::None, capacity_factor);
    EXPECT_EQ(block_grads(nn::ActivationCheckpointing::Selective, capacity_factor), ref)
        << "capacity factor " << capacity_factor;
    EXPECT_EQ(block_grads(nn::ActivationCheckpointing::Full, capacity_factor), ref)
        << "capacity factor " << capacity_factor;
  }
}

// Switch's eq. 3 as Megatron-core's get_capacity: ceil(N k / E * f), at least 1; 0 dropless.
TEST(MoeLayer, CapacityPerExpert) {
  EXPECT_EQ(nn::moe_capacity(0.0, 15, 2, 5), 0);
  EXPECT_EQ(nn::moe_capacity(1.0, 15, 2, 5), 6);
  EXPECT_EQ(nn::moe_capacity(0.5, 15, 2, 5), 3);
  EXPECT_EQ(nn::moe_capacity(0.75, 15, 2, 5), 5);  // 4.5 up
  // At most N: a factor large enough to overflow int64 drops nothing (a fresh user's 1e30
  // kept one slot per expert).
  EXPECT_EQ(nn::moe_capacity(1e30, 15, 2, 5), 15);
  EXPECT_EQ(nn::moe_capacity(100.0, 15, 2, 5), 15);
  EXPECT_EQ(nn::moe_capacity(0.01, 15, 2, 5), 1);  // at least one
  EXPECT_EQ(nn::moe_capacity(1.25, 4096, 2, 8), 1280);
  EXPECT_EQ(nn::moe_capacity(2.0, 7, 1, 3), 5);  // 14 / 3 = 4.67 up
}

// ---- bf16: the router's logits in fp32 -------------------------------------------------

// A layer in `dt` (gradients in `gdt`) on the bf16-rounded values of one draw: its saved
// logits (fp32 in any dtype), output and router gradient.
struct LowpRun {
  std::vector<float> logits, out, drouter;
  DType logits_dtype;
};
LowpRun lowp_run(DType dt, DType gdt) {
  auto be = make_backend("cpu");
  nn::MoeMlp layer("m", kC, spec_of(Case{}), 0.5f, 0.5f);
  std::vector<nn::Param*> params;
  layer.collect(params);
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.f, 0.5f);
  const Stream s = be->default_stream();
  auto tensor = [&](Shape shape, DType t, bool random) {  // bf16-representable values
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (float& f : v) f = random ? bf16_to_f32(f32_to_bf16(nd(g))) : 0.f;
    Tensor f32 = be->empty(shape, DType::F32, MemCategory::Activations);
    upload_f32(*be, f32, v.data());
    Tensor out = be->empty(shape, t, MemCategory::Activations);
    be->copy(s, out, f32);
    return out;
  };
  for (nn::Param* p : params) {
    p->value = tensor(p->shape, dt, true);
    p->grad = tensor(p->shape, gdt, false);
  }
  std::vector<Tensor> saved;
  for (const auto& sp : layer.saved_specs(kB, kT, dt))
    saved.push_back(be->empty(sp.shape, sp.dtype, MemCategory::Activations));
  const nn::MoeScratch w = layer.make_scratch(*be, kB, kT, dt);
  const Tensor x = tensor(Shape{kB, kT, kC}, dt, true), dout = tensor(Shape{kB, kT, kC}, dt, true);
  const Tensor out = tensor(Shape{kB, kT, kC}, dt, false), dx = tensor(Shape{kB, kT, kC}, dt, false);
  const nn::MoeBalancePass none;
  layer.forward(*be, s, saved, out, x, w, none, false);
  layer.backward(*be, s, saved, dx, dout, x, w, none);
  auto f32 = [&](const Tensor& t) {
    Tensor f = be->empty(t.shape(), DType::F32, MemCategory::Activations);
    be->copy(s, f, t);
    return download_f32(*be, f);
  };
  return {f32(saved[0]), f32(out), f32(layer.router.grad), saved[0].dtype()};
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) e += std::pow(got[i] - want[i], 2), n += want[i] * want[i];
  return std::sqrt(e / n);
}

TEST(MoeLayer, Bf16RouterComputesFp32Logits) {
  const LowpRun ref = lowp_run(DType::F32, DType::F32);
  for (DType gdt : {DType::F32, DType::BF16}) {
    const LowpRun r = lowp_run(DType::BF16, gdt);
    EXPECT_EQ(r.logits_dtype, DType::F32);
    // The same bf16 inputs multiplied in fp32: the fp32 layer's logits up to summation order.
    EXPECT_LT(rel_err(r.logits, ref.logits), 1e-6);
    EXPECT_LT(rel_err(r.out, ref.out), 2e-2);  // the experts run in bf16
    EXPECT_LT(rel_err(r.drouter, ref.drouter), 5e-2) << "gradients in " << dtype_name(gdt);
  }
}

}  // namespace
}  // namespace kiln
