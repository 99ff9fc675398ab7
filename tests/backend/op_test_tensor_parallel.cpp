// What tensor parallelism asks of the ops: cross_entropy_shard_stats / _backward over tp
// column shards, combined on the host as the layer combines them, against the
// double-precision softmax cross-entropy of the whole row; shard_ids; embedding rows of
// token -1; dropout at a global offset (a shard of rows draws the whole tensor's mask).
#include "op_harness.h"

#include <cmath>

namespace kiln::test {
namespace {

TEST_P(OpTest, CrossEntropyShards) {
  struct Cfg { int N, V, Vp, tp, ignore; };
  // Vp / tp columns per shard; the last shards of {5, 8, 4} are part and all padding.
  for (const Cfg& c : {Cfg{1, 3, 4, 2, -1}, Cfg{7, 37, 40, 2, -1}, Cfg{6, 5, 8, 4, -1},
                       Cfg{9, 100, 100, 4, -100}, Cfg{4, 1000, 1024, 4, -1}}) {
    const std::string what =
        sizes({{"N", c.N}, {"V", c.V}, {"Vp", c.Vp}, {"tp", c.tp}, {"ignore_index", c.ignore}});
    const int Vl = c.Vp / c.tp;
    std::vector<float> logits = randn(int64_t{c.N} * c.Vp, 2.f);
    for (int n = 0; n < c.N; ++n)  // padding: huge values that must never enter the softmax
      for (int v = c.V; v < c.Vp; ++v) logits[int64_t{n} * c.Vp + v] = 50.f + v;
    std::vector<int32_t> tgt(c.N);
    for (int n = 0; n < c.N; ++n) tgt[n] = randint(0, c.V - 1);
    if (c.N > 1) tgt[c.N / 2] = c.ignore;
    if (c.N > 2) tgt[c.N - 1] = c.V - 1;
    const float grad_scale = randu(1, 0.1f, 2.f)[0];
    Vec dref;
    const Vec lref = ref::cross_entropy(to_double(logits), tgt, c.N, c.V, c.Vp, c.ignore,
                                        grad_scale, &dref);
    Tensor tt = upload_i32(tgt, {c.N});
    // Each shard's logits [N, Vl] and its stats.
    std::vector<std::vector<float>> shard(c.tp), stats(c.tp);
    for (int r = 0; r < c.tp; ++r) {
      for (int n = 0; n < c.N; ++n)
        for (int j = 0; j < Vl; ++j) shard[r].push_back(logits[int64_t{n} * c.Vp + r * Vl + j]);
      const int valid = std::clamp(c.V - r * Vl, 0, Vl);
      Tensor ts = poisoned({c.N, 3});
      be().cross_entropy_shard_stats(st(), ts, upload(shard[r], {c.N, Vl}), tt, int64_t{r} * Vl, valid);
      stats[r] = download(ts);
      for (int n = 0; n < c.N; ++n) {  // each statistic against double
        double m = -INFINITY, s = 0, x = 0;
        for (int j = 0; j < valid; ++j) m = std::max(m, double(shard[r][n * Vl + j]));
        for (int j = 0; j < valid; ++j) s += std::exp(double(shard[r][n * Vl + j]) - m);
        const int t = tgt[n] - r * Vl;
        if (t >= 0 && t < valid) x = shard[r][n * Vl + t];
        if (valid == 0) {
          EXPECT_EQ(stats[r][3 * n], -INFINITY) << what;
        } else {
          EXPECT_NEAR(stats[r][3 * n], m, 1e-6 * std::max(1.0, std::fabs(m))) << what;
        }
        EXPECT_NEAR(stats[r][3 * n + 1], s, 1e-5 * std::max(1.0, s)) << what << " shard " << r;
        EXPECT_EQ(stats[r][3 * n + 2], static_cast<float>(x)) << what << " shard " << r;
      }
    }
    // The combination, as the vocab-parallel classifier does it.
    std::vector<float> lse(c.N), losses(c.N);
    for (int n = 0; n < c.N; ++n) {
      double M = -INFINITY, S = 0, X = 0;
      for (int r = 0; r < c.tp; ++r) M = std::max(M, double(stats[r][3 * n]));
      for (int r = 0; r < c.tp; ++r) {
        if (stats[r][3 * n + 1] > 0) S += stats[r][3 * n + 1] * std::exp(stats[r][3 * n] - M);
        X += stats[r][3 * n + 2];
      }
      lse[n] = static_cast<float>(M + std::log(S));
      losses[n] = tgt[n] == c.ignore ? 0.f : static_cast<float>(M + std::log(S) - X);
    }
    EXPECT_TRUE(near_by_norm("combined losses", losses, lref, 1e-5)) << what;
    // Gradients: into a separate buffer, and in place.
    Tensor tlse = upload(lse, {c.N});
    std::vector<float> dl(int64_t{c.N} * c.Vp), dl_inplace(dl.size());
    for (int r = 0; r < c.tp; ++r) {
      const int valid = std::clamp(c.V - r * Vl, 0, Vl);
      Tensor tl = upload(shard[r], {c.N, Vl}), td = poisoned({c.N, Vl});
      be().cross_entropy_shard_backward(st(), td, tl, tt, tlse, int64_t{r} * Vl, valid, c.ignore, grad_scale);
      EXPECT_TRUE(bitwise_equal("backward leaves logits", download(tl), shard[r])) << what;
      be().cross_entropy_shard_backward(st(), tl, tl, tt, tlse, int64_t{r} * Vl, valid, c.ignore, grad_scale);
      const auto got = download(td), got2 = download(tl);
      for (int n = 0; n < c.N; ++n)
        for (int j = 0; j < Vl; ++j) {
          dl[int64_t{n} * c.Vp + r * Vl + j] = got[n * Vl + j];
          dl_inplace[int64_t{n} * c.Vp + r * Vl + j] = got2[n * Vl + j];
        }
    }
    EXPECT_TRUE(near_by_norm("shard dlogits", dl, dref, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("shard dlogits (in place)", dl_inplace, dref, 1e-5)) << what;
    int64_t nonzero = 0;
    for (int n = 0; n < c.N; ++n)
      for (int v = 0; v < c.Vp; ++v)
        if ((v >= c.V || tgt[n] == c.ignore) && dl[int64_t{n} * c.Vp + v] != 0.f) ++nonzero;
    EXPECT_EQ(nonzero, 0) << "dlogits not exactly 0 in padding / ignored rows; " << what;
  }
  Tensor l = poisoned({2, 4});
  EXPECT_THROW(be().cross_entropy_shard_stats(st(), poisoned({2, 2}), l, upload_i32({0, 1}, {2}), 0, 4), Error);
  EXPECT_THROW(be().cross_entropy_shard_stats(st(), poisoned({2, 3}), l, upload_i32({0, 1}, {2}), 0, 5), Error);
}

TEST_P(OpTest, ShardIds) {
  std::vector<int32_t> ids = {0, 5, 6, 9, 10, 11, -1, 7, 3, 100};
  Tensor t = upload_i32(ids, {2, 5}), out = upload_i32(std::vector<int32_t>(10, 99), {2, 5});
  be().shard_ids(st(), out, t, 5, 5);  // rows [5, 10)
  EXPECT_EQ(download_i32(out), (std::vector<int32_t>{-1, 0, 1, 4, -1, -1, -1, 2, -1, -1}));
  be().shard_ids(st(), t, t, 0, 10);  // in place
  EXPECT_EQ(download_i32(t), (std::vector<int32_t>{0, 5, 6, 9, -1, -1, -1, 7, 3, -1}));
  EXPECT_THROW(be().shard_ids(st(), upload_i32({0}, {1}), t, 0, 3), Error);
}

// A token of -1 (held by another vocab-parallel rank) reads a zero wte row, with or
// without positions, and is skipped by backward.
TEST_P(OpTest, EmbeddingOfForeignToken) {
  const int B = 2, T = 3, C = 5, Vp = 4, maxT = 3;
  const std::vector<int32_t> tok = {1, -1, 3, -1, 0, -1};
  const auto wte = randn(Vp * C), wpe = randn(maxT * C);
  Tensor ttok = upload_i32(tok, {B, T}), twte = upload(wte, {Vp, C}), twpe = upload(wpe, {maxT, C});
  for (bool with_wpe : {false, true}) {
    Tensor out = poisoned({B, T, C});
    be().embedding_forward(st(), out, ttok, Tensor(), twte, with_wpe ? twpe : Tensor());
    Vec want(B * T * C, 0.0);
    for (int i = 0; i < B * T; ++i)
      for (int cc = 0; cc < C; ++cc) {
        if (tok[i] >= 0) want[i * C + cc] += wte[tok[i] * C + cc];
        if (with_wpe) want[i * C + cc] += wpe[(i % T) * C + cc];
      }
    EXPECT_TRUE(near_by_norm("embedding_forward of -1", download(out), want, 1e-6)) << with_wpe;
  }
  const auto dout = randn(B * T * C);
  Tensor dwte = upload(std::vector<float>(Vp * C, 0.f), {Vp, C});
  Tensor dwpe = upload(std::vector<float>(maxT * C, 0.f), {maxT, C});
  be().embedding_backward(st(), dwte, dwpe, upload(dout, {B, T, C}), ttok, Tensor());
  Vec gwte(Vp * C, 0.0), gwpe(maxT * C, 0.0);
  for (int i = 0; i < B * T; ++i)
    for (int cc = 0; cc < C; ++cc) {
      if (tok[i] >= 0) gwte[tok[i] * C + cc] += dout[i * C + cc];
      gwpe[(i % T) * C + cc] += dout[i * C + cc];
    }
  EXPECT_TRUE(near_by_norm("embedding_backward dwte skips -1", download(dwte), gwte, 1e-6));
  EXPECT_TRUE(near_by_norm("embedding_backward dwpe counts -1 rows", download(dwpe), gwpe, 1e-6));
}

TEST_P(OpTest, DropoutAtGlobalOffset) {
  const int64_t n = 1003;
  const auto x = randn(n);
  const DropoutSpec whole{0.3f, 17, 5};
  Tensor all = poisoned({n});
  be().dropout_forward(st(), all, upload(x, {n}), whole);
  const auto want = download(all);
  for (int64_t begin : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4}, int64_t{250}, int64_t{1001}}) {
    for (int64_t len : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{2}}) {
      if (begin + len > n) continue;
      DropoutSpec part = whole;
      part.offset = static_cast<uint64_t>(begin);
      const std::vector<float> xs(x.begin() + begin, x.begin() + begin + len);
      Tensor out = poisoned({len});
      be().dropout_forward(st(), out, upload(xs, {len}), part);
      const std::vector<float> ws(want.begin() + begin, want.begin() + begin + len);
      EXPECT_TRUE(bitwise_equal("dropout at an offset", download(out), ws)) << begin << "+" << len;
      Tensor back = poisoned({len});
      be().dropout_backward(st(), back, upload(xs, {len}), part);
      EXPECT_TRUE(bitwise_equal("dropout_backward at an offset", download(back), ws)) << begin;
    }
  }
}

}  // namespace
}  // namespace kiln::test
