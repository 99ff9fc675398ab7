// Image layout ops: patchify against an index-by-index reference at awkward sizes (odd
// patch counts, several channels, a class-token row left alone), in fp32 and bf16.
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
    if (be().supports(Op::Patchify, DType::BF16)) {
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

}  // namespace
}  // namespace kiln::test
