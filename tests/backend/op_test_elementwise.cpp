// Memory ops (transfers, copy, fill), add, add_columns, gelu and dropout (sum_squares:
// op_test_step_stats).
#include "core/dtype.h"
#include "core/rng.h"
#include "op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace kiln::test {
namespace {

const std::vector<int64_t> kAwkwardSizes = {1, 3, 7, 8, 13, 31, 64, 1023, 4097, 100003};

TEST_P(OpTest, SupportsFp32) {
  for (OpFamily f : {OpFamily::Embedding, OpFamily::LayerNorm, OpFamily::Linear,
                     OpFamily::Attention, OpFamily::Gelu, OpFamily::Add, OpFamily::Dropout,
                     OpFamily::SoftmaxCrossEntropy, OpFamily::AdamW})
    EXPECT_TRUE(be().supports(f, DType::F32)) << family_name(f);
}

// An op given a dtype it does not support throws kiln::Error (checked where supports()
// says no; a backend that supports bf16/fp16 is not checked here).
TEST_P(OpTest, UnsupportedDtypeThrows) {
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor a = be().empty({4, 8}, dt, MemCategory::Activations);
    Tensor b = be().empty({4, 8}, dt, MemCategory::Activations);
    Tensor o = be().empty({4, 8}, dt, MemCategory::Activations);
    const std::vector<uint16_t> ones(32, dt == DType::BF16 ? f32_to_bf16(1.f) : f32_to_f16(1.f));
    be().copy_from_host(st(), a, ones.data());
    be().copy_from_host(st(), b, ones.data());
    if (!be().supports(OpFamily::Gelu, dt)) {
      EXPECT_THROW(be().gelu_forward(st(), o, a), Error) << dtype_name(dt);
      EXPECT_THROW(be().gelu_backward(st(), o, a, b), Error) << dtype_name(dt);
    }
    if (!be().supports(OpFamily::Add, dt)) {
      EXPECT_THROW(be().add(st(), o, a, b), Error) << dtype_name(dt);
    }
    if (!be().supports(OpFamily::Dropout, dt)) {
      EXPECT_THROW(be().dropout_forward(st(), o, a, DropoutSpec{0.5f, 1, 2}), Error) << dtype_name(dt);
    }
    if (!be().supports(OpFamily::Linear, dt)) {
      Tensor w = be().empty({8, 8}, dt, MemCategory::Parameters);
      const std::vector<uint16_t> zeros(64, 0);
      be().copy_from_host(st(), w, zeros.data());
      EXPECT_THROW(be().linear_forward(st(), o, a, w, Tensor()), Error) << dtype_name(dt);
    }
  }
}

TEST_P(OpTest, HostTransfersRoundTrip) {
  for (int64_t n : kAwkwardSizes) {
    const std::vector<float> f = randn(n);
    EXPECT_TRUE(bitwise_equal("copy_from_host/copy_to_host fp32", download(upload(f, {n})), f));
    std::vector<int32_t> i(n);
    for (auto& x : i) x = static_cast<int32_t>(rng()());
    EXPECT_EQ(download_i32(upload_i32(i, {n})), i) << "int32 n=" << n;
    for (DType dt : {DType::BF16, DType::F16}) {
      std::vector<uint16_t> h(n), back(n, 0xdead);
      for (auto& x : h) x = static_cast<uint16_t>(rng()());
      Tensor t = be().empty({n}, dt, MemCategory::Activations);
      be().copy_from_host(st(), t, h.data());
      be().copy_to_host(st(), back.data(), t);
      EXPECT_EQ(back, h) << dtype_name(dt) << " n=" << n;
    }
  }
}

TEST_P(OpTest, Copy) {
  for (int64_t n : kAwkwardSizes) {
    const std::vector<float> f = randn(n);
    Tensor src = upload(f, {n});
    Tensor dst = poisoned({n});
    be().copy(st(), dst, src);
    EXPECT_TRUE(bitwise_equal("copy fp32", download(dst), f));
    std::vector<uint16_t> h(n), back(n);
    for (auto& x : h) x = static_cast<uint16_t>(rng()());
    Tensor s16 = be().empty({n}, DType::BF16, MemCategory::Activations);
    Tensor d16 = be().empty({n}, DType::BF16, MemCategory::Activations);
    be().copy_from_host(st(), s16, h.data());
    be().copy(st(), d16, s16);
    be().copy_to_host(st(), back.data(), d16);
    EXPECT_EQ(back, h) << "copy bf16 n=" << n;
  }
  // Into a row slice: the rest stays untouched.
  const std::vector<float> base = randn(7 * 5), rows = randn(3 * 5);
  Tensor big = upload(base, {7, 5});
  be().copy(st(), big.slice_rows(2, 5), upload(rows, {3, 5}));
  std::vector<float> want = base;
  std::copy(rows.begin(), rows.end(), want.begin() + 10);
  EXPECT_TRUE(bitwise_equal("copy into slice_rows(2, 5)", download(big), want));
}

TEST_P(OpTest, Fill) {
  for (int64_t n : kAwkwardSizes) {
    for (float value : {0.f, -0.f, 1.f, -3.25f, 1e-3f, 65504.f, 1e30f}) {
      Tensor t = poisoned({n});
      be().fill(st(), t, value);
      EXPECT_TRUE(bitwise_equal("fill fp32", download(t), std::vector<float>(n, value)))
          << "value " << value;
    }
    Tensor nan = upload(randn(n), {n});
    be().fill(st(), nan, NAN);
    for (float x : download(nan)) ASSERT_TRUE(std::isnan(x)) << "fill with NaN, n=" << n;
  }
  // A slice: only those rows.
  const std::vector<float> base = randn(6 * 3);
  Tensor big = upload(base, {6, 3});
  be().fill(st(), big.slice_rows(1, 4), 2.f);
  std::vector<float> want = base;
  std::fill(want.begin() + 3, want.begin() + 12, 2.f);
  EXPECT_TRUE(bitwise_equal("fill slice_rows(1, 4)", download(big), want));
}

// fill on the other dtypes: "every element of t set to value (converted to t's dtype)".
// A backend that refuses a dtype with kiln::Error is reported as skipped (visibly); a
// wrong value fails.
TEST_P(OpTest, FillOtherDtypes) {
  std::vector<std::string> refused;
  for (int64_t n : kAwkwardSizes) {
    for (DType dt : {DType::BF16, DType::F16}) {
      for (float value : {1.f, -3.3f, 0.1f, 1e5f}) {
        Tensor t = be().empty({n}, dt, MemCategory::Activations);
        std::vector<uint16_t> back(n, 0x7fff);
        be().copy_from_host(st(), t, back.data());
        try {
          be().fill(st(), t, value);
        } catch (const Error& e) {
          refused.push_back(std::string(dtype_name(dt)) + ": " + e.what());
          break;
        }
        be().copy_to_host(st(), back.data(), t);
        const uint16_t want = dt == DType::BF16 ? f32_to_bf16(value) : f32_to_f16(value);
        EXPECT_EQ(back, std::vector<uint16_t>(n, want)) << dtype_name(dt) << " value " << value;
      }
    }
    Tensor ti = be().empty({n}, DType::I32, MemCategory::Activations);
    try {
      be().fill(st(), ti, 7.f);
      EXPECT_EQ(download_i32(ti), std::vector<int32_t>(n, 7)) << "fill int32 n=" << n;
      be().fill(st(), ti, -3.f);
      EXPECT_EQ(download_i32(ti), std::vector<int32_t>(n, -3)) << "fill int32 n=" << n;
    } catch (const Error& e) {
      refused.push_back(std::string("int32: ") + e.what());
    }
  }
  if (!refused.empty()) GTEST_SKIP() << "fill refused: " << refused.front() << " (and " << refused.size() - 1 << " more)";
}

TEST_P(OpTest, Add) {
  for (int64_t n : kAwkwardSizes) {
    const std::vector<float> a = randn(n), b = randn(n, 3.f);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];  // one IEEE rounding: exact answer
    const Shape shape = n % 2 == 0 ? Shape{2, n / 2} : Shape{n};
    Tensor ta = upload(a, shape), tb = upload(b, shape), out = poisoned(shape);
    be().add(st(), out, ta, tb);
    EXPECT_TRUE(bitwise_equal("add", download(out), want)) << "n=" << n;
    EXPECT_TRUE(bitwise_equal("add left operand unchanged", download(ta), a));
    // out aliases a, then b.
    be().add(st(), ta, ta, tb);
    EXPECT_TRUE(bitwise_equal("add (out aliases a)", download(ta), want)) << "n=" << n;
    Tensor ta2 = upload(a, shape);
    be().add(st(), tb, ta2, tb);
    EXPECT_TRUE(bitwise_equal("add (out aliases b)", download(tb), want)) << "n=" << n;
    // out = a + a in place.
    std::vector<float> twice(n);
    for (int64_t i = 0; i < n; ++i) twice[i] = a[i] + a[i];
    be().add(st(), ta2, ta2, ta2);
    EXPECT_TRUE(bitwise_equal("add (out = a = b)", download(ta2), twice)) << "n=" << n;
  }
}

// x in `dt` (fp32, bf16, fp16) and back: the value a tensor of dt holds.
float round_to(DType dt, float x) {
  if (dt == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
  if (dt == DType::F16) return f16_to_f32(f32_to_f16(x));
  return x;
}

// Against a double reference at awkward sizes: out's columns [out_col, out_col + Ws) get
// alpha * src added, each the exact sum rounded once: fp32 within half an ulp of the
// double sum (and equal to std::fma, which rounds the exact sum once); bf16 and fp16 the
// sum in fp32 (std::fma: the exact one rounded once) rounded once to the dtype. out's other
// columns and src are left as they were. Also out with leading dims ([3, 11, Wo]: N = 33
// rows) and a row slice of a larger tensor.
TEST_P(OpTest, AddColumns) {
  struct Widths { int64_t Wo, Ws; };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    if (!be().supports(Op::AddColumns, dt)) {
      Tensor o = be().empty({2, 5}, dt, MemCategory::Activations);
      Tensor x = be().empty({2, 3}, dt, MemCategory::Activations);
      EXPECT_THROW(be().add_columns(st(), o, x, 1, 1.f), Error) << dtype_name(dt);
      continue;
    }
    for (int64_t N : {1, 7, 33}) {
      for (const Widths w : {Widths{5, 2}, Widths{19, 7}, Widths{130, 64}, Widths{19, 1},
                             Widths{5, 5}}) {
        for (int64_t out_col : {int64_t{0}, (w.Wo - w.Ws) / 2, w.Wo - w.Ws}) {
          for (float alpha : {1.f, -0.37f, 8.5f}) {
            const std::string what = std::string(dtype_name(dt)) + " " +
                                     sizes({{"N", N}, {"Wo", w.Wo}, {"Ws", w.Ws},
                                            {"out_col", out_col}}) +
                                     "alpha=" + std::to_string(alpha);
            std::vector<float> base = randn(N * w.Wo), add = randn(N * w.Ws, 2.f);
            for (float& v : base) v = round_to(dt, v);
            for (float& v : add) v = round_to(dt, v);
            std::vector<float> want = base;
            Vec exact(want.size());
            for (size_t i = 0; i < want.size(); ++i) exact[i] = base[i];
            for (int64_t n = 0; n < N; ++n)
              for (int64_t j = 0; j < w.Ws; ++j) {
                const size_t o = static_cast<size_t>(n * w.Wo + out_col + j);
                const float x = add[static_cast<size_t>(n * w.Ws + j)];
                exact[o] = static_cast<double>(base[o]) + static_cast<double>(alpha) * x;
                want[o] = round_to(dt, std::fma(alpha, x, base[o]));
              }
            const Shape out_shape = N == 33 ? Shape{3, 11, w.Wo} : Shape{N, w.Wo};
            Tensor out = up(base, out_shape, dt), src = up(add, {N, w.Ws}, dt);
            be().add_columns(st(), out, src, out_col, alpha);
            const std::vector<float> got = down(out);
            EXPECT_TRUE(bitwise_equal("add_columns", got, want)) << what;
            EXPECT_TRUE(bitwise_equal("add_columns src unchanged", down(src), add)) << what;
            if (dt == DType::F32) {
              double worst = 0;  // in ulps of the fp32 result
              for (size_t i = 0; i < got.size(); ++i) {
                const float g = std::fabs(got[i]);
                const double ulp = std::nextafter(g, INFINITY) - g;
                worst = std::max(worst, std::fabs(got[i] - exact[i]) / ulp);
              }
              EXPECT_LE(worst, 0.5 + 1e-6) << "add_columns fp32 against double, " << what;
            }
          }
        }
      }
    }
    // Into a row slice of a larger tensor: rows outside it untouched.
    const std::vector<float> big = randn(6 * 9), rows = randn(3 * 4);
    std::vector<float> want(big.size());
    for (size_t i = 0; i < big.size(); ++i) want[i] = round_to(dt, big[i]);
    std::vector<float> rows_dt(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) rows_dt[i] = round_to(dt, rows[i]);
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t j = 0; j < 4; ++j) {
        float& o = want[static_cast<size_t>((2 + n) * 9 + 5 + j)];
        o = round_to(dt, std::fma(-2.f, rows_dt[static_cast<size_t>(n * 4 + j)], o));
      }
    Tensor tbig = up(big, {6, 9}, dt);
    be().add_columns(st(), tbig.slice_rows(2, 5), up(rows, {3, 4}, dt), 5, -2.f);
    EXPECT_TRUE(bitwise_equal("add_columns into slice_rows(2, 5)", down(tbig), want))
        << dtype_name(dt);
  }
}

// add_columns refuses, with kiln::Error: dtypes that differ, row counts that differ, a
// column range that leaves out, and src overlapping out (aliasing is not allowed: it
// reads src while it writes out).
// copy_columns between every pair of float dtypes, at awkward widths and column offsets:
// each copied element the source's value rounded once to the destination's dtype (as
// core's conversion), every other element of dst untouched.
TEST_P(OpTest, CopyColumns) {
  struct Widths { int64_t Wd, Ws, ncols; };
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  for (DType dd : dtypes)
    for (DType ds : dtypes)
      for (int64_t N : {1, 7, 33})
        for (const Widths w : {Widths{5, 9, 2}, Widths{19, 7, 7}, Widths{130, 96, 64},
                               Widths{3, 40, 1}}) {
          const int64_t dst_col = (w.Wd - w.ncols) / 2, src_col = w.Ws - w.ncols;
          const std::string what =
              std::string(dtype_name(ds)) + " -> " + std::string(dtype_name(dd)) + " " +
              sizes({{"N", N}, {"Wd", w.Wd}, {"Ws", w.Ws}, {"ncols", w.ncols}});
          std::vector<float> base = randn(N * w.Wd), src = randn(N * w.Ws, 3.f);
          for (float& v : base) v = round_to(dd, v);
          for (float& v : src) v = round_to(ds, v);
          std::vector<float> want = base;
          for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < w.ncols; ++j)
              want[static_cast<size_t>(n * w.Wd + dst_col + j)] =
                  round_to(dd, src[static_cast<size_t>(n * w.Ws + src_col + j)]);
          Tensor dst = up(base, {N, w.Wd}, dd), from = up(src, {N, w.Ws}, ds);
          be().copy_columns(st(), dst, from, dst_col, src_col, w.ncols);
          EXPECT_TRUE(bitwise_equal("copy_columns", down(dst), want)) << what;
        }
}

TEST_P(OpTest, AddColumnsBadArgumentsThrow) {
  Tensor out = upload(randn(4 * 6), {4, 6});
  EXPECT_THROW(be().add_columns(st(), out, up(randn(4 * 2), {4, 2}, DType::BF16), 0, 1.f), Error);
  EXPECT_THROW(be().add_columns(st(), out, upload(randn(3 * 2), {3, 2}), 0, 1.f), Error);
  EXPECT_THROW(be().add_columns(st(), out, upload(randn(4 * 2), {4, 2}), 5, 1.f), Error);
  EXPECT_THROW(be().add_columns(st(), out, upload(randn(4 * 2), {4, 2}), -1, 1.f), Error);
  EXPECT_THROW(be().add_columns(st(), out, upload(randn(4 * 7), {4, 7}), 0, 1.f), Error);
  EXPECT_THROW(be().add_columns(st(), out, out, 0, 1.f), Error);
  Tensor big = upload(randn(8 * 6), {8, 6});
  EXPECT_THROW(be().add_columns(st(), big.slice_rows(0, 4), big.slice_rows(3, 7), 0, 1.f),
               Error);
  // Disjoint rows of one tensor are fine; the last columns exactly fit.
  EXPECT_NO_THROW(be().add_columns(st(), big.slice_rows(0, 4), big.slice_rows(4, 8), 0, 1.f));
  EXPECT_NO_THROW(be().add_columns(st(), out, upload(randn(4 * 2), {4, 2}), 4, 1.f));
  be().synchronize(st());
}

TEST_P(OpTest, Gelu) {
  for (int64_t n : kAwkwardSizes) {
    std::vector<float> x = randn(n, 3.f);
    const float specials[] = {0.f, -0.f, 10.f, -10.f, 20.f, -20.f, -3.f, 1e-4f, -5.5f};
    for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < n; ++i)
      x[(i * 7919) % n] = specials[i];
    const Shape shape = n % 3 == 0 ? Shape{3, n / 3} : Shape{n};
    Tensor tx = upload(x, shape), out = poisoned(shape);
    be().gelu_forward(st(), out, tx);
    Vec want(n), dwant(n);
    const std::vector<float> dout = randn(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = ref::gelu(x[i]);
      dwant[i] = dout[i] * ref::gelu_grad(x[i]);
    }
    EXPECT_TRUE(near_by_norm("gelu_forward", download(out), want, 1e-5)) << "n=" << n;

    Tensor dinp = poisoned(shape);
    be().gelu_backward(st(), dinp, upload(dout, shape), tx);
    const std::vector<float> got = download(dinp);
    EXPECT_TRUE(near_by_norm("gelu_backward dinp", got, dwant, 1e-5)) << "n=" << n;

    const Forward f = [](const Inputs& in) {
      Vec y(in[0].size());
      for (size_t i = 0; i < y.size(); ++i) y[i] = ref::gelu(in[0][i]);
      return y;
    };
    EXPECT_TRUE(check_fd("gelu_backward dinp", f, {to_double(x)}, to_double(dout), 0, dwant,
                         to_double(got), rng()));
  }
}

// keep_i = uniform_at(seed, stream, i) >= p (the documented mask).
std::vector<uint8_t> dropout_mask(const DropoutSpec& s, int64_t n) {
  std::vector<uint8_t> keep(n);
  for (int64_t i = 0; i < n; ++i)
    keep[i] = uniform_at(s.seed, s.stream, static_cast<uint64_t>(i)) >= s.p;
  return keep;
}

TEST_P(OpTest, Dropout) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{4099}, int64_t{100003}}) {
    for (float p : {0.1f, 0.5f, 0.9f}) {
      const DropoutSpec spec{p, rng()(), rng()() % 1000};
      const std::vector<float> x = randn(n, 1.f, 0.5f);
      const std::vector<uint8_t> keep = dropout_mask(spec, n);
      Vec want(n);
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        want[i] = keep[i] ? static_cast<double>(x[i]) / (1.0 - p) : 0.0;
        kept += keep[i];
      }
      const Shape shape = n > 7 ? Shape{1, n} : Shape{n};
      Tensor tx = upload(x, shape), out = poisoned(shape);
      be().dropout_forward(st(), out, tx, spec);
      const std::vector<float> y = download(out);
      std::string label = "dropout_forward p=" + std::to_string(p);
      EXPECT_TRUE(near_by_norm("dropout_forward", y, want, 1e-6)) << label << " n=" << n;
      // Exactly the documented elements are dropped.
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += (y[i] == 0.f) != (keep[i] == 0);
      EXPECT_EQ(wrong, 0) << label << ": elements kept/dropped against the mask, n=" << n;
      if (n >= 4099) {
        const double rate = static_cast<double>(kept) / n;
        const double sd = std::sqrt(p * (1 - p) / n);
        EXPECT_NEAR(rate, 1.0 - p, 6 * sd) << "keep rate";
      }
      // Replay: the same spec gives bitwise the same output; in place too.
      Tensor out2 = poisoned(shape);
      be().dropout_forward(st(), out2, tx, spec);
      EXPECT_TRUE(bitwise_equal("dropout_forward replay", download(out2), y));
      be().dropout_forward(st(), tx, tx, spec);
      EXPECT_TRUE(bitwise_equal("dropout_forward in place", download(tx), y));
      // Another seed is another mask (n large enough that equal masks never happen).
      if (n >= 4099) {
        Tensor out3 = poisoned(shape);
        be().dropout_forward(st(), out3, upload(x, shape), DropoutSpec{p, spec.seed + 1, spec.stream});
        EXPECT_FALSE(bitwise_equal("other seed", download(out3), y)) << "mask ignores the seed";
      }

      // Backward: the same mask, same scale.
      const std::vector<float> dout = randn(n);
      Vec dwant(n);
      for (int64_t i = 0; i < n; ++i) dwant[i] = keep[i] ? static_cast<double>(dout[i]) / (1.0 - p) : 0.0;
      Tensor tdout = upload(dout, shape), dinp = poisoned(shape);
      be().dropout_backward(st(), dinp, tdout, spec);
      const std::vector<float> dx = download(dinp);
      EXPECT_TRUE(near_by_norm("dropout_backward", dx, dwant, 1e-6)) << label << " n=" << n;
      be().dropout_backward(st(), tdout, tdout, spec);
      EXPECT_TRUE(bitwise_equal("dropout_backward in place", download(tdout), dx));

      const Forward f = [keep, p](const Inputs& in) {
        Vec o(in[0].size());
        for (size_t i = 0; i < o.size(); ++i) o[i] = keep[i] ? in[0][i] / (1.0 - p) : 0.0;
        return o;
      };
      EXPECT_TRUE(check_fd("dropout_backward", f, {to_double(x)}, to_double(dout), 0, dwant,
                           to_double(dx), rng(), 4));
    }
  }
  // p = 0 disables: the identity.
  const std::vector<float> x = randn(1001);
  Tensor out = poisoned({1001});
  be().dropout_forward(st(), out, upload(x, {1001}), DropoutSpec{0.f, 5, 6});
  EXPECT_TRUE(bitwise_equal("dropout_forward p=0", download(out), x));
  Tensor dinp = poisoned({1001});
  be().dropout_backward(st(), dinp, upload(x, {1001}), DropoutSpec{0.f, 5, 6});
  EXPECT_TRUE(bitwise_equal("dropout_backward p=0", download(dinp), x));
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// Bad shapes are one clear kiln::Error, not a crash or a silent out-of-bounds access.
TEST_P(OpTest, BadShapesThrow) {
  auto t = [&](const Shape& s) { return poisoned(s); };
  auto tok = [&](int B, int T) { return upload_i32(std::vector<int32_t>(B * T, 0), {B, T}); };
  EXPECT_THROW(be().linear_forward(st(), t({4, 6}), t({4, 5}), t({6, 4}), Tensor()), Error);
  EXPECT_THROW(be().linear_forward(st(), t({4, 6}), t({4, 5}), t({6, 5}), t({7})), Error);
  EXPECT_THROW(be().layernorm_forward(st(), t({3, 5}), t({3}), t({3}), t({3, 5}), t({6}), t({5}), 1e-5f), Error);
  EXPECT_THROW(be().add(st(), t({8}), t({8}), t({9})), Error);
  EXPECT_THROW(be().gelu_forward(st(), t({8}), t({7})), Error);
  EXPECT_THROW(be().embedding_forward(st(), t({1, 9, 4}), tok(1, 9), Tensor(), t({10, 4}), t({8, 4})), Error);
  EXPECT_THROW(be().attention_forward(st(), t({1, 3, 6}), t({1, 4, 3}), t({1, 3, 18}), AttentionShape::mha(4, 6), DropoutSpec{}), Error);
  EXPECT_THROW(be().softmax_cross_entropy(st(), t({2}), Tensor(), t({2, 8}), tok(1, 2), 9, -100, 1.f), Error);
  EXPECT_THROW(be().adamw_step(st(), t({10}), t({10}), t({11}), t({10}), Tensor(), AdamWParams{}), Error);
}

}  // namespace
}  // namespace kiln::test
