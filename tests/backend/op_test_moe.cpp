// The mixture-of-experts ops (router, permutation plan, permute / unpermute, grouped
// linear) against double references on fresh random inputs, at sizes that are multiples
// of nothing (N = 37 tokens, C = 19 channels, E = 5 experts; k = 1, 2 and E; and past
// the CUDA kernels' tiles: N = 300 x k = 3 slots of E = 40 experts, E = 70 routers,
// C = 300 channels), with an
// expert that receives no token and every token sent to one expert; both scorings,
// renormalisation and the balancing bias on and off, equal scores choosing the lower
// expert index; gradients against the references' analytic ones, which central
// differences check in turn. Token dropping: the plan, permutations and grouped linear at
// capacities that leave some experts over and some under (capacity 10 of 19 / 37 / 6
// slots), capacity 1, and a capacity above every count; dropped slots (row -1) add and
// receive nothing, and the rows past the kept ones stay untouched. Last, an expert MLP
// composed of the ops (gate/up fused as [E, 2F, C], SwiGLU on the permuted rows, down)
// against the per-token double reference, dropless and with dropping (the unwritten rows
// NaN: they must not reach the output).
// Every case runs on each backend of the build: the CUDA one too when a GPU is visible
// (the harness prints "[  SKIPPED ] cuda: ..." otherwise); it runs the family in fp32 and
// bf16, so its fp16 cases skip. An expert id out of range throws on the CPU and, on the
// CUDA backend (no host synchronisation to throw), drops the slot.
//
// Bounds: fp32 results within 1e-5 of the double reference by norm (the router's scores
// and weights 1e-6); bf16 / fp16 permutations and grouped linears of rounded inputs within
// 4e-3 / 1e-3 (one rounding of the output, as op_test_linear_lowp.cpp).
#include "op_harness.h"

#include "core/dtype.h"
#include "support/error_of.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace kiln::test {
namespace {

// x rounded to dtype and back (round to nearest even, as the backend's copy).
std::vector<float> rounded(const std::vector<float>& x, DType dt) {
  if (dt == DType::F32) return x;
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    r[i] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
  return r;
}

// Expert ids [N,k]: k distinct experts per token drawn at random from `allowed`.
std::vector<int32_t> random_choice(std::mt19937_64& rng, int N, int k, std::vector<int32_t> allowed) {
  std::vector<int32_t> idx;
  for (int n = 0; n < N; ++n) {
    std::shuffle(allowed.begin(), allowed.end(), rng);
    idx.insert(idx.end(), allowed.begin(), allowed.begin() + k);
  }
  return idx;
}

// Expert ids [37,2] of E = 5 skewed on purpose: even tokens take (1, 0), odd ones (1, 2 +
// n % 3): expert 0 gets 19 slots, expert 1 all 37, experts 2-4 6 each.
std::vector<int32_t> skewed_choice() {
  std::vector<int32_t> idx;
  for (int n = 0; n < 37; ++n) {
    idx.push_back(1);
    idx.push_back(n % 2 == 0 ? 0 : 2 + n % 3);
  }
  return idx;
}

// The routings the permutation and grouped-linear tests run: N tokens, k choices, E
// experts, the expert ids, what the case is, and the capacity per expert (0: dropless).
struct Routing {
  int N, k, E;
  std::vector<int32_t> idx;
  std::string what;
  int capacity = 0;
};
std::vector<Routing> routings(std::mt19937_64& rng) {
  std::vector<Routing> v;
  v.push_back({37, 2, 5, random_choice(rng, 37, 2, {0, 1, 2, 4}), "N=37 k=2 E=5, expert 3 empty"});
  v.push_back({37, 1, 5, std::vector<int32_t>(37, 2), "N=37 k=1 E=5, all to expert 2"});
  v.push_back({37, 5, 5, random_choice(rng, 37, 5, {0, 1, 2, 3, 4}), "N=37 k=E=5"});
  v.push_back({11, 3, 7, random_choice(rng, 11, 3, {0, 1, 2, 3, 4, 5, 6}), "N=11 k=3 E=7"});
  v.push_back({1, 1, 1, {0}, "N=1 k=1 E=1"});
  v.push_back({37, 2, 5, skewed_choice(), "N=37 k=2 E=5 skewed, capacity 10", 10});
  v.push_back({11, 3, 7, random_choice(rng, 11, 3, {0, 1, 2, 3, 4, 5, 6}),
               "N=11 k=3 E=7, capacity 1", 1});
  v.push_back({37, 1, 5, std::vector<int32_t>(37, 2), "N=37 k=1 E=5 all to expert 2, capacity 5",
               5});
  v.push_back({37, 2, 5, random_choice(rng, 37, 2, {0, 1, 2, 4}),
               "N=37 k=2 E=5, capacity 38 (above every count)", 38});
  // More slots than a GPU plan's chunk of 256 and more experts than a warp's lanes.
  std::vector<int32_t> forty(40);
  std::iota(forty.begin(), forty.end(), 0);
  v.push_back({300, 3, 40, random_choice(rng, 300, 3, forty), "N=300 k=3 E=40"});
  v.push_back({300, 3, 40, random_choice(rng, 300, 3, forty), "N=300 k=3 E=40, capacity 20", 20});
  return v;
}

struct RouterCfg {
  int N, E, k;
};

class MoeTest : public OpTest {
 protected:
  // The plan of r on the backend: offsets [E+1] and rows [N,k].
  std::pair<Tensor, Tensor> plan(const Routing& r) {
    Tensor offsets = upload_i32(std::vector<int32_t>(r.E + 1, -7), {r.E + 1});
    Tensor rows = upload_i32(std::vector<int32_t>(r.idx.size(), -7), {r.N, r.k});
    be().moe_permute_plan(st(), offsets, rows, upload_i32(r.idx, {r.N, r.k}), r.capacity);
    return {offsets, rows};
  }
  bool runs(DType dt) { return be().supports(OpFamily::MoE, dt); }

  void router_case(const RouterCfg& c, bool sigmoid, bool renormalize, bool with_bias, int step);
  void permutation_case(const Routing& r, int C, DType dt);
  void grouped_case(const Routing& r, int I, int O, DType dt, DType gt);
  void expert_mlp_case(int capacity);
};

// Router forward and backward for one case (rows 0 and 1 of the logits hold ties).
void MoeTest::router_case(const RouterCfg& c, bool sigmoid, bool renormalize, bool with_bias,
                          int step) {
  std::ostringstream os;
  os << "N=" << c.N << " E=" << c.E << " k=" << c.k << (sigmoid ? " sigmoid" : " softmax")
     << (renormalize ? " renormalized" : "") << (with_bias ? " bias" : "");
  const std::string what = os.str();
  const MoeRouterSpec spec{sigmoid ? MoeScoring::Sigmoid : MoeScoring::Softmax, c.k, renormalize};
  std::vector<float> logits = randn(int64_t{c.N} * c.E, 1.5f);
  // Ties: row 0 all equal (the lowest k indices win), row 1 equal in pairs.
  std::fill(logits.begin(), logits.begin() + c.E, 0.3f);
  if (c.N > 1)
    for (int e = 0; e < c.E; ++e) logits[c.E + e] = static_cast<float>((c.E - e) / 2);
  const std::vector<float> bias = with_bias ? randn(c.E, 0.5f) : std::vector<float>{};
  Tensor tl = upload(logits, {c.N, c.E});
  Tensor tb = with_bias ? upload(bias, {c.E}) : Tensor();
  Tensor scores = poisoned({c.N, c.E}), weight = poisoned({c.N, c.k});
  Tensor idx = upload_i32(std::vector<int32_t>(static_cast<size_t>(c.N) * c.k, -1), {c.N, c.k});
  be().moe_router_forward(st(), scores, idx, weight, tl, tb, spec);

  const Vec want_s = ref::moe_scores(to_double(logits), c.N, c.E, sigmoid);
  const std::vector<float> got_s = download(scores);
  EXPECT_TRUE(near_by_norm("moe_router_forward scores " + what, got_s, want_s, 1e-6)) << what;
  // The choice, from the op's own fp32 scores plus the bias as fp32 sums (the documented
  // comparison): exact.
  Vec key(got_s.size());
  for (size_t i = 0; i < key.size(); ++i)
    key[i] = with_bias ? static_cast<float>(got_s[i] + bias[i % c.E]) : got_s[i];
  const std::vector<int32_t> want_idx = ref::moe_top_k(key, c.N, c.E, c.k);
  const std::vector<int32_t> got_idx = download_i32(idx);
  EXPECT_EQ(got_idx, want_idx) << "moe_router_forward expert_idx " << what;
  if (!with_bias) {
    for (int j = 0; j < c.k; ++j) EXPECT_EQ(got_idx[j], j) << "equal logits pick the lower index";
  }
  const Vec want_w = ref::moe_weights(want_s, want_idx, c.N, c.E, c.k, renormalize);
  EXPECT_TRUE(near_by_norm("moe_router_forward expert_weight " + what, download(weight), want_w,
                           1e-6)) << what;

  // Backward, with the extra score gradient on every other case.
  const bool with_dscores = step % 2 == 0;
  const std::vector<float> dw = randn(int64_t{c.N} * c.k);
  const std::vector<float> dsc = with_dscores ? randn(int64_t{c.N} * c.E) : std::vector<float>{};
  Tensor dlogits = poisoned({c.N, c.E});
  be().moe_router_backward(st(), dlogits, upload(dw, {c.N, c.k}),
                         with_dscores ? upload(dsc, {c.N, c.E}) : Tensor(), scores, idx, spec);
  const Vec want_dl = ref::moe_router_backward(to_double(dw), to_double(dsc), want_s, want_idx,
                                               c.N, c.E, c.k, sigmoid, renormalize);
  const std::vector<float> got_dl = download(dlogits);
  // Where the exact gradient vanishes (k = 1 renormalised: every weight is 1), errors are
  // measured against the unit scale of the weights' gradient.
  EXPECT_TRUE(near_by_norm("moe_router_backward dlogits " + what, got_dl, want_dl, 1e-5, 1.0))
      << what;
  // The reference's gradient against central differences of the weights and scores of the
  // logits, the choice held fixed.
  const Forward f = [&](const Inputs& x) {
    const Vec sc = ref::moe_scores(x[0], c.N, c.E, sigmoid);
    Vec out = ref::moe_weights(sc, want_idx, c.N, c.E, c.k, renormalize);
    if (with_dscores) out.insert(out.end(), sc.begin(), sc.end());
    return out;
  };
  Vec wts = to_double(dw);
  if (with_dscores) wts.insert(wts.end(), dsc.begin(), dsc.end());
  EXPECT_TRUE(check_fd("moe_router_backward dlogits " + what, f, {to_double(logits)}, wts, 0,
                       want_dl, to_double(got_dl), rng(), 8, 1e-4, 0.1));
}

TEST_P(MoeTest, RouterScoresChoosesAndWeighs) {
  if (!runs(DType::F32)) GTEST_SKIP() << "no MoE ops on " << be().name();
  int step = 0;
  for (const RouterCfg& c : {RouterCfg{37, 5, 2}, RouterCfg{37, 5, 1}, RouterCfg{37, 5, 5},
                             RouterCfg{13, 8, 3}, RouterCfg{1, 1, 1}, RouterCfg{67, 70, 6}})
    for (bool sigmoid : {false, true})
      for (bool renormalize : {false, true})
        for (bool bias : {false, true})
          router_case(c, sigmoid, renormalize, bias, step++);
}

// A large bias on one expert takes every token there (k = 1), and weighs by the score
// alone; a bad k is refused naming the op.
TEST_P(MoeTest, RouterBiasChoosesOnly) {
  if (!runs(DType::F32)) GTEST_SKIP() << "no MoE ops on " << be().name();
  const int N = 37, E = 5;
  const std::vector<float> logits = randn(N * E);
  std::vector<float> bias(E, 0.f);
  bias[3] = 10.f;
  Tensor scores = poisoned({N, E}), weight = poisoned({N, 1});
  Tensor idx = upload_i32(std::vector<int32_t>(N, -1), {N, 1});
  be().moe_router_forward(st(), scores, idx, weight, upload(logits, {N, E}), upload(bias, {E}),
                          MoeRouterSpec{MoeScoring::Softmax, 1, false});
  const std::vector<float> s = download(scores), w = download(weight);
  const std::vector<int32_t> got = download_i32(idx);
  for (int n = 0; n < N; ++n) {
    EXPECT_EQ(got[n], 3) << "token " << n;
    EXPECT_EQ(w[n], s[n * E + 3]) << "token " << n;
  }
  const std::string error = testing::error_of([&] {
    be().moe_router_forward(st(), scores, upload_i32(std::vector<int32_t>(N * 6, 0), {N, 6}),
                            poisoned({N, 6}), upload(logits, {N, E}), Tensor(),
                            MoeRouterSpec{MoeScoring::Softmax, 6, false});
  });
  EXPECT_NE(error.find("moe_router_forward: k = 6 must be in [1, E = 5]"), std::string::npos)
      << "k = 6 > E = 5: " << error;
}

TEST_P(MoeTest, PlanIsAStableCountingSort) {
  if (!runs(DType::F32)) GTEST_SKIP() << "no MoE ops on " << be().name();
  for (const Routing& r : routings(rng())) {
    auto [offsets, rows] = plan(r);
    std::vector<int32_t> want_off, want_rows;
    ref::moe_plan(want_off, want_rows, r.idx, r.N, r.k, r.E, r.capacity);
    EXPECT_EQ(download_i32(offsets), want_off) << r.what;
    EXPECT_EQ(download_i32(rows), want_rows) << r.what;
  }
  // The skewed case by hand: capacity 10 keeps 10 of expert 0's 19 and of expert 1's 37,
  // all 6 of experts 2-4; the first in token order: expert 1 keeps tokens 0..9.
  Routing skewed{37, 2, 5, skewed_choice(), "skewed", 10};
  auto [offsets, rows] = plan(skewed);
  EXPECT_EQ(download_i32(offsets), (std::vector<int32_t>{0, 10, 20, 26, 32, 38}));
  const std::vector<int32_t> got = download_i32(rows);
  for (int n = 0; n < 37; ++n) EXPECT_EQ(got[n * 2], n < 10 ? 10 + n : -1) << "token " << n;
  EXPECT_EQ(got[2 * 18 + 1], 9) << "token 18, expert 0's 10th slot: kept";
  EXPECT_EQ(got[2 * 20 + 1], -1) << "token 20, expert 0's 11th slot: dropped";
  std::vector<int32_t> bad(10, 1);
  bad[7] = 5;
  if (be().device().is_cpu()) {
    const std::string error = testing::error_of([&] { plan(Routing{5, 2, 5, bad, "bad"}); });
    EXPECT_NE(error.find("moe_permute_plan: expert_idx[3, 1] = 5 is outside"), std::string::npos)
        << "expert id 5 of 5 experts: " << error;
  } else {
    // Slot (3, 1) dropped and counted nowhere: expert 1 keeps the other 9 in order.
    auto [bad_offsets, bad_rows] = plan(Routing{5, 2, 5, bad, "bad"});
    EXPECT_EQ(download_i32(bad_offsets), (std::vector<int32_t>{0, 0, 9, 9, 9, 9}));
    EXPECT_EQ(download_i32(bad_rows), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, -1, 7, 8}));
  }
  const std::string negative = testing::error_of([&] {
    plan(Routing{5, 2, 5, std::vector<int32_t>(10, 1), "negative capacity", -1});
  });
  EXPECT_NE(negative.find("moe_permute_plan: capacity -1 must be >= 0"), std::string::npos)
      << negative;
}

// permute, unpermute and their gradients in `dt` for one routing of C channels.
void MoeTest::permutation_case(const Routing& r, int C, DType dt) {
  const std::string what = r.what + " C=" + std::to_string(C) + " " + std::string(dtype_name(dt));
  const double tol = dt == DType::BF16 ? 4e-3 : dt == DType::F16 ? 1e-3 : 1e-6;
  const int N = r.N, k = r.k, M = N * k;
  auto [offsets, rows] = plan(r);
  const std::vector<int32_t> rw = download_i32(rows);
  const std::vector<float> x = rounded(randn(int64_t{N} * C), dt);
  // Rows [M_kept, M) of the expert-row outputs keep the 9 they were filled with.
  Tensor out = up(std::vector<float>(static_cast<size_t>(M) * C, 9.f), {M, C}, dt);
  be().moe_permute(st(), out, up(x, {N, C}, dt), rows);
  std::vector<float> want(static_cast<size_t>(M) * C, 9.f);
  for (int i = 0; i < M; ++i)
    if (rw[i] >= 0)
      std::copy_n(x.begin() + (i / k) * C, C, want.begin() + static_cast<size_t>(rw[i]) * C);
  EXPECT_TRUE(bitwise_equal("moe_permute " + what, down(out), want)) << what;

  // permute_backward: dinp[n] = sum over the kept j of dout[rows[n,j]].
  const std::vector<float> dy = rounded(randn(int64_t{M} * C), dt);
  Tensor dinp = up(std::vector<float>(static_cast<size_t>(N) * C, 9.f), {N, C}, dt);
  be().moe_permute_backward(st(), dinp, up(dy, {M, C}, dt), rows);
  Vec want_dx(static_cast<size_t>(N) * C, 0.0);
  for (int i = 0; i < M; ++i)
    for (int c = 0; c < C && rw[i] >= 0; ++c)
      want_dx[(i / k) * C + c] += dy[static_cast<size_t>(rw[i]) * C + c];
  EXPECT_TRUE(near_by_norm("moe_permute_backward " + what, down(dinp), want_dx, tol)) << what;

  // unpermute: out[n] = sum_j w[n,j] eo[rows[n,j]], and its gradients.
  const std::vector<float> eo = rounded(randn(int64_t{M} * C), dt), w = randu(M, 0.f, 1.f);
  const std::vector<float> dout = rounded(randn(int64_t{N} * C), dt);
  Tensor teo = up(eo, {M, C}, dt), tw = upload(w, {N, k});
  Tensor comb = up(std::vector<float>(static_cast<size_t>(N) * C, 9.f), {N, C}, dt);
  be().moe_unpermute(st(), comb, teo, tw, rows);
  const Forward f = [&](const Inputs& in) {
    Vec o(static_cast<size_t>(N) * C, 0.0);
    for (int i = 0; i < M; ++i)
      for (int c = 0; c < C && rw[i] >= 0; ++c)
        o[(i / k) * C + c] += in[1][i] * in[0][static_cast<size_t>(rw[i]) * C + c];
    return o;
  };
  const Inputs in{to_double(eo), to_double(w)};
  EXPECT_TRUE(near_by_norm("moe_unpermute " + what, down(comb), f(in), tol)) << what;
  Tensor deo = up(std::vector<float>(static_cast<size_t>(M) * C, 9.f), {M, C}, dt);
  Tensor dw = poisoned({N, k});
  be().moe_unpermute_backward(st(), deo, dw, up(dout, {N, C}, dt), teo, tw, rows);
  Vec want_deo(static_cast<size_t>(M) * C), want_dw(static_cast<size_t>(M), 0.0);
  std::vector<float> dw_terms(static_cast<size_t>(M), 0.f);  // sum |dout eo|: the dot's scale
  for (int i = 0; i < M; ++i)
    for (int c = 0; c < C && rw[i] >= 0; ++c) {
      const size_t row = static_cast<size_t>(rw[i]) * C + c;
      want_deo[row] = double(w[i]) * dout[(i / k) * C + c];
      want_dw[i] += double(dout[(i / k) * C + c]) * eo[row];
      dw_terms[static_cast<size_t>(i)] += std::abs(float(double(dout[(i / k) * C + c]) * eo[row]));
    }
  std::vector<float> got_deo = down(deo);
  const std::vector<float> got_dw = download(dw);
  // Rows [M_kept, M) of dexpert_out are left as they were (9); below, 0 as the reference's.
  const auto tail = got_deo.begin() + static_cast<ptrdiff_t>(M - std::count(rw.begin(), rw.end(), -1)) * C;
  EXPECT_TRUE(std::all_of(tail, got_deo.end(), [](float v) { return v == 9.f; }))
      << "moe_unpermute_backward wrote past the kept rows: " << what;
  std::fill(tail, got_deo.end(), 0.f);
  EXPECT_TRUE(near_by_norm("moe_unpermute_backward dexpert_out " + what, got_deo, want_deo, tol));
  // fp32 dots that cancel are checked against the rounding of their terms' sum.
  const double dw_tol = dt == DType::F32 ? 1e-5 : tol;
  EXPECT_TRUE(near_by_norm("moe_unpermute_backward dexpert_weight " + what, got_dw, want_dw,
                           dw_tol, accumulated_min_norm(dw_terms, dw_tol)));
  if (dt != DType::F32) return;
  const Vec wts = to_double(dout);
  EXPECT_TRUE(check_fd("moe_unpermute dexpert_out " + what, f, in, wts, 0, want_deo,
                       to_double(got_deo), rng()));
  EXPECT_TRUE(check_fd("moe_unpermute dexpert_weight " + what, f, in, wts, 1, want_dw,
                       to_double(got_dw), rng()));
}

TEST_P(MoeTest, PermuteAndUnpermute) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    if (!runs(dt)) continue;
    for (const Routing& r : routings(rng())) permutation_case(r, 19, dt);
    permutation_case(routings(rng())[0], 300, dt);  // more channels than a GPU block's threads
  }
}

// grouped_linear forward and backward in `dt` (gradients in `gt`) for one routing.
void MoeTest::grouped_case(const Routing& r, int I, int O, DType dt, DType gt) {
  std::ostringstream os;
  os << r.what << " I=" << I << " O=" << O << " " << dtype_name(dt) << " grads " << dtype_name(gt);
  const std::string what = os.str();
  const double tol = dt == DType::BF16 ? 4e-3 : dt == DType::F16 ? 1e-3 : 1e-5;
  const int M = r.N * r.k, E = r.E;
  auto [offsets, rows] = plan(r);
  const std::vector<int32_t> off = download_i32(offsets);
  const std::vector<float> x = rounded(randn(int64_t{M} * I), dt),
                           w = rounded(randn(int64_t{E} * O * I, 0.3f), dt);
  Tensor tx = up(x, {M, I}, dt), tw = up(w, {E, O, I}, dt, MemCategory::Parameters);
  Tensor out = up(std::vector<float>(static_cast<size_t>(M) * O, 9.f), {M, O}, dt);
  be().grouped_linear_forward(st(), out, tx, tw, offsets);
  // The reference: expert e's rows through its weight, one linear each; rows [M_kept, M)
  // of out and dinp keep the 9 they were filled with.
  Vec want(static_cast<size_t>(M) * O), gx(static_cast<size_t>(M) * I), gw(w.size(), 0.0);
  std::fill(want.begin() + static_cast<size_t>(off[E]) * O, want.end(), 9.0);
  std::fill(gx.begin() + static_cast<size_t>(off[E]) * I, gx.end(), 9.0);
  const std::vector<float> dy = rounded(randn(int64_t{M} * O), dt);
  const Vec xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
  for (int e = 0; e < E; ++e) {
    const int m = off[e + 1] - off[e];
    if (m == 0) continue;
    auto rows_of = [&](const Vec& v, int width) {
      return Vec(v.begin() + static_cast<size_t>(off[e]) * width,
                 v.begin() + static_cast<size_t>(off[e + 1]) * width);
    };
    const Vec we(wd.begin() + static_cast<size_t>(e) * O * I, wd.begin() + static_cast<size_t>(e + 1) * O * I);
    const Vec o = ref::linear_forward(rows_of(xd, I), we, {}, m, I, O);
    std::copy(o.begin(), o.end(), want.begin() + static_cast<size_t>(off[e]) * O);
    Vec dxe, dwe, dbe;
    ref::linear_backward(dxe, dwe, dbe, rows_of(dyd, O), rows_of(xd, I), we, m, I, O);
    std::copy(dxe.begin(), dxe.end(), gx.begin() + static_cast<size_t>(off[e]) * I);
    std::copy(dwe.begin(), dwe.end(), gw.begin() + static_cast<size_t>(e) * O * I);
  }
  EXPECT_TRUE(near_by_norm("grouped_linear_forward " + what, down(out), want, tol)) << what;

  // Backward: dinp overwritten, dweight accumulated into a pre-filled buffer.
  const std::vector<float> dw0 = rounded(randn(int64_t{E} * O * I, 0.1f), dt);
  Tensor dinp = up(std::vector<float>(static_cast<size_t>(M) * I, 9.f), {M, I}, dt);
  Tensor dw = up(dw0, {E, O, I}, gt, MemCategory::Gradients);
  be().grouped_linear_backward(st(), dinp, dw, up(dy, {M, O}, dt), tx, tw, offsets);
  Vec want_w(gw.size());
  for (size_t i = 0; i < gw.size(); ++i) want_w[i] = dw0[i] + gw[i];
  const std::vector<float> got_w = down(dw);
  EXPECT_TRUE(near_by_norm("grouped_linear_backward dinp " + what, down(dinp), gx, tol)) << what;
  EXPECT_TRUE(near_by_norm("grouped_linear_backward dweight (+=) " + what, got_w, want_w,
                           gt == DType::F32 ? 1e-5 : tol)) << what;
  // An expert without rows keeps its gradient bit for bit.
  for (int e = 0; e < E; ++e)
    if (off[e] == off[e + 1]) {
      const size_t a = static_cast<size_t>(e) * O * I, b = a + static_cast<size_t>(O) * I;
      EXPECT_TRUE(bitwise_equal("grouped_linear_backward empty expert " + what,
                                std::vector<float>(got_w.begin() + a, got_w.begin() + b),
                                std::vector<float>(dw0.begin() + a, dw0.begin() + b)));
    }
}

TEST_P(MoeTest, GroupedLinear) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    if (!runs(dt)) continue;
    const std::vector<DType> grads =
        dt == DType::F32 ? std::vector<DType>{dt} : std::vector<DType>{DType::F32, dt};
    for (DType gt : grads)
      for (const Routing& r : routings(rng())) grouped_case(r, 19, 23, dt, gt);
  }
  if (!runs(DType::F32)) return;
  // Offsets that do not rise from 0 to at most M are refused.
  const std::string error = testing::error_of([&] {
    be().grouped_linear_forward(st(), poisoned({4, 3}), poisoned({4, 2}), poisoned({2, 3, 2}),
                                upload_i32({0, 3, 5}, {3}));
  });
  EXPECT_NE(error.find("grouped_linear_forward: offsets must run from 0 to at most M = 4"),
            std::string::npos) << "offsets 0, 3, 5 for M = 4: " << error;
  const std::string falling = testing::error_of([&] {
    be().grouped_linear_forward(st(), poisoned({4, 3}), poisoned({4, 2}), poisoned({2, 3, 2}),
                                upload_i32({0, 3, 2}, {3}));
  });
  EXPECT_NE(falling.find("grouped_linear_forward: offsets[1] = 3 > offsets[2] = 2"),
            std::string::npos) << "offsets 0, 3, 2: " << falling;
}

// An expert MLP as a MoE layer runs it: tokens permuted, gate and up in one grouped linear
// of weight [E, 2F, C] (gate rows first, as swiglu_forward reads its [M, 2F] input),
// SwiGLU on the permuted rows, down [E, C, F], weighted back; against the per-token double
// sum_j w_j W2_e (silu(W1_e x) * W3_e x).
TEST_P(MoeTest, ExpertMlpOfTheOps) {
  if (!runs(DType::F32)) GTEST_SKIP() << "no MoE ops on " << be().name();
  for (int capacity : {0, 12}) expert_mlp_case(capacity);
}

// With capacity > 0 a slot past its expert's first `capacity` (in token order) adds
// nothing; the rows the grouped linears leave unwritten stay NaN (poisoned) through the
// SwiGLU and must not reach the output.
void MoeTest::expert_mlp_case(int capacity) {
  const int N = 37, C = 19, E = 5, k = 2, F = 7, M = N * k;
  const Routing r{N, k, E, random_choice(rng(), N, k, {0, 1, 3, 4}), "mlp", capacity};
  auto [offsets, rows] = plan(r);
  const std::vector<float> x = randn(N * C), w13 = randn(E * 2 * F * C, 0.3f),
                           w2 = randn(E * C * F, 0.3f), wt = randu(M, 0.f, 1.f);
  Tensor xp = poisoned({M, C}), h = poisoned({M, 2 * F}), a = poisoned({M, F});
  Tensor y = poisoned({M, C}), out = poisoned({N, C});
  be().moe_permute(st(), xp, upload(x, {N, C}), rows);
  be().grouped_linear_forward(st(), h, xp, upload(w13, {E, 2 * F, C}), offsets);
  be().swiglu_forward(st(), a, h);
  be().grouped_linear_forward(st(), y, a, upload(w2, {E, C, F}), offsets);
  be().moe_unpermute(st(), out, y, upload(wt, {N, k}), rows);
  Vec want(static_cast<size_t>(N) * C, 0.0);
  std::vector<int> taken(E, 0);
  for (int i = 0; i < M; ++i) {
    const int n = i / k, e = r.idx[i];
    if (capacity > 0 && taken[e]++ >= capacity) continue;  // dropped
    for (int c = 0; c < C; ++c) {
      double sum = 0;
      for (int f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int cc = 0; cc < C; ++cc) {
          g += double(w13[(static_cast<size_t>(e) * 2 * F + f) * C + cc]) * x[n * C + cc];
          u += double(w13[(static_cast<size_t>(e) * 2 * F + F + f) * C + cc]) * x[n * C + cc];
        }
        sum += double(w2[(static_cast<size_t>(e) * C + c) * F + f]) * ref::silu(g) * u;
      }
      want[n * C + c] += wt[i] * sum;
    }
  }
  EXPECT_TRUE(near_by_norm("expert MLP of the MoE ops, capacity " + std::to_string(capacity),
                           download(out), want, 1e-5));
  if (capacity > 0)
    EXPECT_LT(download_i32(offsets)[E], M) << "capacity " << capacity << " dropped no slot";
}

// The balancing statistics and their gradients (moe_balance_stats / _backward) against a
// double reference, at N = 37 E = 5 k = 2 (expert 3 empty), N = 37 E = 5 k = 1 (all to
// one expert) and N = 1 E = 1, both scorings; each output starts non-zero (the ops add).
// The reference's gradient is checked by central differences of its forward in turn.
struct BalanceRef {
  Vec p;           // [N,E] the balancing probabilities
  Vec lse;         // [N]
};
BalanceRef balance_ref(const Vec& l, int N, int E, bool sigmoid) {
  BalanceRef r{Vec(l.size()), Vec(static_cast<size_t>(N))};
  for (int n = 0; n < N; ++n) {
    double mx = l[n * E], sum = 0, S = 0;
    for (int e = 1; e < E; ++e) mx = std::max(mx, l[n * E + e]);
    for (int e = 0; e < E; ++e) sum += std::exp(l[n * E + e] - mx);
    r.lse[n] = mx + std::log(sum);
    for (int e = 0; e < E; ++e) S += 1 / (1 + std::exp(-l[n * E + e]));
    for (int e = 0; e < E; ++e)
      r.p[n * E + e] = sigmoid ? 1 / (1 + std::exp(-l[n * E + e])) / S
                               : std::exp(l[n * E + e] - r.lse[n]);
  }
  return r;
}

TEST_P(MoeTest, BalanceStatisticsAndGradients) {
  if (!runs(DType::F32)) GTEST_SKIP() << "no MoE ops on " << be().name();
  std::mt19937_64 g(test_seed());
  const std::vector<Routing> cases = {routings(g)[0], routings(g)[1], routings(g)[4],
                                      routings(g)[9]};
  for (const Routing& r : cases)
    for (bool sigmoid : {false, true}) {
      const std::string what = r.what + (sigmoid ? " sigmoid" : " softmax");
      const MoeScoring sc = sigmoid ? MoeScoring::Sigmoid : MoeScoring::Softmax;
      const int N = r.N, E = r.E;
      const float ps = 0.37f, zs = 0.21f, as = 0.13f;
      const std::vector<float> logits = randn(int64_t{N} * E, 2.f);
      std::vector<float> load0(static_cast<size_t>(E)), prob0 = randn(E), z0 = randn(1);
      std::iota(load0.begin(), load0.end(), 1.f);  // counts stay exact in fp32
      Tensor load = upload(load0, {E}), prob = upload(prob0, {E}), z = upload(z0, {1});
      const Tensor tl = upload(logits, {N, E});
      be().moe_balance_stats(st(), load, prob, z, tl, upload_i32(r.idx, {N, r.k}), sc, ps, zs);
      const BalanceRef ref = balance_ref(to_double(logits), N, E, sigmoid);
      Vec want_load(E), want_prob(E), want_z{z0[0]};
      for (int e = 0; e < E; ++e) want_load[e] = load0[e], want_prob[e] = prob0[e];
      for (int32_t e : r.idx) want_load[e] += 1;
      for (int n = 0; n < N; ++n) {
        for (int e = 0; e < E; ++e) want_prob[e] += ps * ref.p[n * E + e];
        want_z[0] += zs * ref.lse[n] * ref.lse[n];
      }
      EXPECT_TRUE(near_by_norm("moe_balance_stats load " + what, download(load), want_load, 0));
      EXPECT_TRUE(near_by_norm("moe_balance_stats prob " + what, download(prob), want_prob, 1e-6));
      EXPECT_TRUE(near_by_norm("moe_balance_stats z " + what, download(z), want_z, 1e-6));

      // Backward on positive loads (as counts are), added to a random dlogits.
      std::vector<float> ld = randn(E);
      for (float& v : ld) v = std::abs(v) * 10.f;
      const std::vector<float> dl0 = randn(int64_t{N} * E);
      Tensor dl = upload(dl0, {N, E});
      be().moe_balance_backward(st(), dl, tl, upload(ld, {E}), sc, as, zs);
      const Forward f = [&](const Inputs& x) {
        const BalanceRef b = balance_ref(x[0], N, E, sigmoid);
        double aux = 0, zz = 0;
        for (int n = 0; n < N; ++n) {
          for (int e = 0; e < E; ++e) aux += double(as) * ld[e] * b.p[n * E + e];
          zz += double(zs) * b.lse[n] * b.lse[n];
        }
        return Vec{aux, zz};
      };
      // The analytic reference gradient.
      Vec want_dl(static_cast<size_t>(N) * E);
      for (int n = 0; n < N; ++n) {
        double gp = 0, S = 0;
        for (int e = 0; e < E; ++e) gp += double(as) * ld[e] * ref.p[n * E + e];
        for (int e = 0; e < E; ++e) S += 1 / (1 + std::exp(-double(logits[n * E + e])));
        for (int e = 0; e < E; ++e) {
          const double a = double(as) * ld[e] - gp, l = logits[n * E + e];
          const double s = 1 / (1 + std::exp(-l));
          want_dl[n * E + e] = (sigmoid ? s * (1 - s) * a / S : ref.p[n * E + e] * a) +
                               2 * zs * ref.lse[n] * std::exp(l - ref.lse[n]);
        }
      }
      const Vec got_dl = minus(download(dl), dl0);
      EXPECT_TRUE(near_by_norm("moe_balance_backward dlogits " + what, to_float(got_dl), want_dl,
                               1e-5, std::max(1e-3, accumulated_min_norm(dl0, 1e-5))));
      EXPECT_TRUE(check_fd("moe_balance_backward dlogits " + what, f, {to_double(logits)}, {1, 1},
                           0, want_dl, got_dl, rng(), 8, 1e-4, 1e-3));
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, MoeTest, ::testing::ValuesIn(backend_names()), param_name);

}  // namespace
}  // namespace kiln::test
