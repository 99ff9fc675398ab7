// Image layout ops: patchify and unpatchify against index-by-index references at awkward
// sizes (odd patch counts, several channels, a class-token row left alone or unread), in
// fp32 and bf16 (fp16 where supported), and their round trips bitwise.
#include "core/dtype.h"
#include "op_harness.h"

#include <cmath>
#include <cstring>

namespace kiln::test {
namespace {

// out[b, (py*pw+px), (c*P+dy)*P+dx] = images[b, py*P+dy, px*P+dx, c], written as the
// reference spells it out (not as the kernels loop).
std::vector<float> patchify_ref(const std::vector<float>& img, int B, int H, int W, int C, int P,
                                int T, float untouched) {
  const int pw = W / P, D = C * P * P;
  std::vector<float> out(static_cast<size_t>(B) * T * D, untouched);
  for (int b = 0; b < B; ++b)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        for (int c = 0; c < C; ++c) {
          const int row = (y / P) * pw + x / P, e = c * P * P + (y % P) * P + x % P;
          out[(static_cast<size_t>(b) * T + row) * D + e] =
              img[((static_cast<size_t>(b) * H + y) * W + x) * C + c];
        }
  return out;
}

TEST_P(OpTest, Patchify) {
  struct Cfg { int B, H, W, C, P, extra_rows; };
  for (const Cfg& c : {Cfg{1, 1, 1, 1, 1, 0}, Cfg{2, 28, 28, 1, 7, 1}, Cfg{3, 6, 10, 3, 2, 2},
                       Cfg{2, 28, 28, 1, 4, 1}, Cfg{1, 15, 9, 2, 3, 0}}) {
    const std::string what = sizes({{"B", c.B}, {"H", c.H}, {"W", c.W}, {"C", c.C}, {"P", c.P},
                                    {"extra_rows", c.extra_rows}});
    const int N = (c.H / c.P) * (c.W / c.P), T = N + c.extra_rows, D = c.C * c.P * c.P;
    const auto img = randn(int64_t{c.B} * c.H * c.W * c.C);
    Tensor ti = upload(img, {c.B, c.H, c.W, c.C});
    Tensor out = poisoned({c.B, T, D});  // rows N..T-1 must stay NaN
    be().patchify(st(), out, ti, c.P);
    const auto want = patchify_ref(img, c.B, c.H, c.W, c.C, c.P, T, std::nanf(""));
    const auto got = download(out);
    ASSERT_EQ(got.size(), want.size()) << what;
    // A permutation: bitwise, NaN where nothing may be written.
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << what << " wrote row element " << i;
      } else {
        ASSERT_EQ(got[i], want[i]) << what << " element " << i;
      }
    }
    // bf16 out: each value rounded once (round to nearest even).
    if (be().supports(OpFamily::Patchify, DType::BF16)) {
      Tensor ob = be().empty(Shape{c.B, T, D}, DType::BF16, MemCategory::Activations);
      be().fill(st(), ob, 0.f);
      be().patchify(st(), ob, ti, c.P);
      std::vector<uint16_t> bits(static_cast<size_t>(ob.numel()));
      be().copy_to_host(st(), bits.data(), ob);
      be().synchronize(st());
      for (size_t i = 0; i < bits.size(); ++i) {
        const uint16_t expect = std::isnan(want[i]) ? f32_to_bf16(0.f) : f32_to_bf16(want[i]);
        ASSERT_EQ(bits[i], expect) << what << " bf16 element " << i;
      }
    }
  }
}

TEST_P(OpTest, PatchifyRejectsBadShapes) {
  Tensor img = upload(randn(2 * 6 * 6), {2, 6, 6, 1});
  EXPECT_THROW(be().patchify(st(), poisoned({2, 4, 4}), img, 4), Error);   // 6 % 4
  EXPECT_THROW(be().patchify(st(), poisoned({2, 3, 9}), img, 3), Error);   // T < N = 4
  EXPECT_THROW(be().patchify(st(), poisoned({2, 4, 8}), img, 3), Error);   // D = 9
  EXPECT_THROW(be().patchify(st(), poisoned({2, 4, 9}), upload_i32(std::vector<int32_t>(72, 0), {2, 6, 6, 1}), 3), Error);
  be().patchify(st(), poisoned({2, 4, 9}), img, 3);  // the valid call
}

// images[b, y, x, c] = patches[b, (y/P)*pw + x/P, c*P*P + (y%P)*P + x%P], spelled from the
// image side (the kernels loop over patches).
std::vector<float> unpatchify_ref(const std::vector<float>& patches, int B, int H, int W, int C,
                                  int P, int T) {
  const int pw = W / P, D = C * P * P;
  std::vector<float> img(static_cast<size_t>(B) * H * W * C);
  for (int b = 0; b < B; ++b)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        for (int c = 0; c < C; ++c) {
          const int row = (y / P) * pw + x / P, e = c * P * P + (y % P) * P + x % P;
          img[((static_cast<size_t>(b) * H + y) * W + x) * C + c] =
              patches[(static_cast<size_t>(b) * T + row) * D + e];
        }
  return img;
}

// Values rounded to dt on the host (round to nearest even), as fp32.
std::vector<float> rounded(const std::vector<float>& v, DType dt) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(v[i]))
           : dt == DType::F16 ? f16_to_f32(f32_to_f16(v[i]))
                              : v[i];
  return r;
}

TEST_P(OpTest, Unpatchify) {
  struct Cfg { int B, H, W, C, P, extra_rows; };
  for (const Cfg& c : {Cfg{1, 1, 1, 1, 1, 0}, Cfg{2, 28, 28, 1, 7, 1}, Cfg{3, 6, 10, 3, 2, 2},
                       Cfg{2, 28, 28, 4, 4, 1}, Cfg{1, 15, 9, 2, 3, 0}, Cfg{2, 32, 32, 4, 2, 3}}) {
    const std::string what = sizes({{"B", c.B}, {"H", c.H}, {"W", c.W}, {"C", c.C}, {"P", c.P},
                                    {"extra_rows", c.extra_rows}});
    const int N = (c.H / c.P) * (c.W / c.P), T = N + c.extra_rows, D = c.C * c.P * c.P;
    const Shape img_shape{c.B, c.H, c.W, c.C}, rows_shape{c.B, T, D};
    std::vector<float> patches = randn(int64_t{c.B} * T * D);
    for (int b = 0; b < c.B; ++b)  // rows N..T-1 must not be read
      for (int64_t i = int64_t{N} * D; i < int64_t{T} * D; ++i)
        patches[static_cast<size_t>(b * int64_t{T} * D + i)] = std::nanf("");
    Tensor images = poisoned(img_shape);
    be().unpatchify(st(), images, upload(patches, rows_shape), c.P);
    const auto want = unpatchify_ref(patches, c.B, c.H, c.W, c.C, c.P, T);
    // A permutation: bitwise, every element written (none NaN).
    EXPECT_TRUE(bitwise_equal("unpatchify " + what, download(images), want));

    // unpatchify(patchify(x)) == x and patchify(unpatchify(p)) == p (rows < N), bitwise.
    const auto img = randn(int64_t{c.B} * c.H * c.W * c.C);
    Tensor rows = poisoned(rows_shape), back = poisoned(img_shape);
    be().patchify(st(), rows, upload(img, img_shape), c.P);
    be().unpatchify(st(), back, rows, c.P);
    EXPECT_TRUE(bitwise_equal("unpatchify(patchify(x)) " + what, download(back), img));
    Tensor rows2 = poisoned(rows_shape);
    be().patchify(st(), rows2, images, c.P);
    const auto got_rows = download(rows2);
    for (size_t i = 0; i < got_rows.size(); ++i) {
      if (std::isnan(patches[i])) {
        ASSERT_TRUE(std::isnan(got_rows[i])) << what << " patchify wrote row element " << i;
      } else {
        ASSERT_EQ(got_rows[i], patches[i]) << what << " patchify(unpatchify(p)) element " << i;
      }
    }

    // Low-precision patches: each value converted exactly to fp32.
    for (DType dt : {DType::BF16, DType::F16}) {
      if (!be().supports(OpFamily::Unpatchify, dt)) continue;
      Tensor pl = be().empty(rows_shape, dt, MemCategory::Activations);
      upload_f32(be(), pl, patches.data());
      Tensor il = poisoned(img_shape);
      be().unpatchify(st(), il, pl, c.P);
      const auto want_l = unpatchify_ref(rounded(patches, dt), c.B, c.H, c.W, c.C, c.P, T);
      EXPECT_TRUE(bitwise_equal(std::string("unpatchify ") + std::string(dtype_name(dt)) + " " +
                                    what, download(il), want_l));
      // The round trip through low-precision rows gives the rounded images.
      if (be().supports(OpFamily::Patchify, dt)) {
        Tensor rl = be().empty(rows_shape, dt, MemCategory::Activations);
        be().fill(st(), rl, 0.f);
        be().patchify(st(), rl, upload(img, img_shape), c.P);
        Tensor bl = poisoned(img_shape);
        be().unpatchify(st(), bl, rl, c.P);
        EXPECT_TRUE(bitwise_equal(std::string("unpatchify(patchify(x)) ") +
                                      std::string(dtype_name(dt)) + " " + what,
                                  download(bl), rounded(img, dt)));
      }
    }
  }
}

TEST_P(OpTest, UnpatchifyRejectsBadShapes) {
  Tensor rows = upload(randn(2 * 4 * 9), {2, 4, 9});
  EXPECT_THROW(be().unpatchify(st(), poisoned({2, 6, 6, 1}), rows, 4), Error);  // 6 % 4
  EXPECT_THROW(be().unpatchify(st(), poisoned({2, 6, 6, 1}), upload(randn(2 * 3 * 9), {2, 3, 9}), 3),
               Error);                                                           // T < N = 4
  EXPECT_THROW(be().unpatchify(st(), poisoned({2, 6, 6, 1}), upload(randn(2 * 4 * 8), {2, 4, 8}), 3),
               Error);                                                           // D = 9
  EXPECT_THROW(be().unpatchify(st(), poisoned({3, 6, 6, 1}), rows, 3), Error);   // B differs
  EXPECT_THROW(be().unpatchify(st(), poisoned({2, 6, 6}), rows, 3), Error);      // not [B,H,W,C]
  EXPECT_THROW(be().unpatchify(st(), poisoned({2, 6, 6, 1}), rows, 0), Error);   // patch 0
  EXPECT_THROW(be().unpatchify(st(), upload_i32(std::vector<int32_t>(72, 0), {2, 6, 6, 1}), rows, 3),
               Error);                                                           // int32 images
  EXPECT_THROW(be().unpatchify(st(), poisoned({2, 6, 6, 1}),
                               upload_i32(std::vector<int32_t>(72, 0), {2, 4, 9}), 3),
               Error);                                                           // int32 patches
  be().unpatchify(st(), poisoned({2, 6, 6, 1}), rows, 3);  // the valid call
}

}  // namespace
}  // namespace kiln::test
