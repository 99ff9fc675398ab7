// Ring attention (nn/context_parallel.h) over the world as one cp group (run under mpirun
// with 2 and 4 ranks) against full attention of the whole sequence: every rank computes
// the backend's attention on the whole (seeded, identical) qkv, then the ring on its
// chunks, and compares its rows of the output, the lse and every gradient (fp32: 1e-5
// relative to the largest element; bf16 loosely). Causal and bidirectional, multi-head and
// grouped-query, several chunk sizes; with random documents packed into the sequences
// (cu_seqlens: documents spanning chunks and ranks, one-token ones) against the whole
// sequence's varlen attention.
#include "backend/registry.h"
#include "mpi_test_main.h"
#include "world_test_util.h"
#include "parallel/context_parallel.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

namespace kiln {
namespace {

using testing::randn;

using testing::cpu_backend;

// rows [b, t, w] of `full` [B, T, W] at the positions `pos` (in local order).
std::vector<float> rows_at(const std::vector<float>& full, int64_t B, int64_t T, int64_t W,
                           const std::vector<int32_t>& pos) {
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (int32_t t : pos)
      out.insert(out.end(), full.begin() + (b * T + t) * W, full.begin() + (b * T + t + 1) * W);
  return out;
}

// lse [B, NH, T] at `pos` in its last dimension.
std::vector<float> lse_at(const std::vector<float>& full, int64_t B, int64_t NH, int64_t T,
                          const std::vector<int32_t>& pos) {
  std::vector<float> out;
  for (int64_t bh = 0; bh < B * NH; ++bh)
    for (int32_t t : pos) out.push_back(full[static_cast<size_t>(bh * T + t)]);
  return out;
}

// max |got - want| <= rel * max(1, max |want|).
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double rel) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  double scale = 1.0, worst = 0.0;
  size_t at = 0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= worst)) worst = e, at = i;
  }
  if (worst <= rel * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << " want "
                                       << want[at] << " (error " << worst / scale << " > " << rel
                                       << ")";
}

struct Case {
  int B, Tc, NH, NKV, HD;
  bool causal;
  DType dtype = DType::F32;
  bool documents = false;
};

// cu_seqlens of random documents over N tokens (the same on every rank: seeded).
std::vector<int32_t> random_documents(int64_t N, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> cu{0, static_cast<int32_t>(N)};
  const int cuts = static_cast<int>(gen() % static_cast<uint32_t>(N));
  for (int i = 0; i < cuts; ++i) cu.push_back(static_cast<int32_t>(gen() % static_cast<uint32_t>(N)));
  std::sort(cu.begin(), cu.end());
  return cu;
}

TEST(RingAttention, MatchesFullAttention) {
  Communicator& world = testing::world();
  CommCpGroup ring(world);
  const int cp = world.size();
  Backend& be = *cpu_backend();
  const Stream s = be.default_stream();
  auto upload = [&](const std::vector<float>& v, const Shape& sh, DType dt) {
    Tensor t = be.empty(sh, dt, MemCategory::Activations);
    upload_f32(be, t, v.data());
    return t;
  };
  auto down = [&](const Tensor& t) { return download_f32(be, t); };
  uint32_t seed = 1234;
  for (const Case& c : {Case{1, 1, 1, 1, 4, true}, Case{2, 3, 4, 2, 8, true},
                        Case{1, 5, 3, 3, 6, true}, Case{2, 4, 2, 1, 16, false},
                        Case{1, 7, 4, 4, 5, false}, Case{2, 6, 4, 2, 8, true, DType::BF16},
                        Case{2, 3, 4, 2, 8, true, DType::F32, true},
                        Case{1, 5, 2, 1, 4, false, DType::F32, true},
                        Case{3, 4, 2, 2, 6, true, DType::F32, true},
                        Case{2, 6, 4, 2, 8, true, DType::BF16, true}}) {
    const int64_t T = int64_t{2} * cp * c.Tc, C = int64_t{c.NH} * c.HD;
    const AttentionShape shape{c.NH, c.NKV, c.HD, c.causal};
    const int64_t W = shape.qkv_width();
    std::ostringstream os;
    os << "cp=" << cp << " B=" << c.B << " T=" << T << " NH=" << c.NH << " NKV=" << c.NKV
       << " HD=" << c.HD << (c.causal ? " causal" : " bidirectional") << " "
       << dtype_name(c.dtype);
    const std::vector<int32_t> cu = c.documents ? random_documents(c.B * T, seed++)
                                                : std::vector<int32_t>{};
    if (c.documents) os << " cu_seqlens " << fmt::format("{}", fmt::join(cu, " "));
    SCOPED_TRACE(os.str());
    Tensor tcu;
    if (c.documents) {
      tcu = be.empty({static_cast<int64_t>(cu.size())}, DType::I32, MemCategory::Activations);
      be.copy_from_host(s, tcu, cu.data());
    }
    const double tol = c.dtype == DType::F32 ? 1e-5 : 3e-2;
    const std::vector<float> qkv = randn(static_cast<size_t>(c.B * T * W), seed++);
    const std::vector<float> dout = randn(static_cast<size_t>(c.B * T * C), seed++);
    // The whole sequence, on every rank.
    const Tensor fq = upload(qkv, {c.B, T, W}, c.dtype);
    Tensor fout = be.empty({c.B, T, C}, c.dtype, MemCategory::Activations);
    Tensor flse = be.empty({c.B, c.NH, T}, DType::F32, MemCategory::Activations);
    Tensor fdq = be.empty({c.B, T, W}, c.dtype, MemCategory::Activations);
    const Tensor fdout = upload(dout, {c.B, T, C}, c.dtype);
    if (c.documents) {
      be.attention_varlen_forward(s, fout, flse, fq, tcu, shape, DropoutSpec{});
      be.attention_varlen_backward(s, fdq, fdout, fq, fout, flse, tcu, shape, DropoutSpec{});
    } else {
      be.attention_forward(s, fout, flse, fq, shape, DropoutSpec{});
      be.attention_backward(s, fdq, fdout, fq, fout, flse, shape, DropoutSpec{});
    }
    // This rank's chunks, through the ring.
    const std::vector<int32_t> pos = nn::cp_positions(T, cp, world.rank());
    const int64_t Tl = T / cp;
    const Tensor lq = upload(rows_at(qkv, c.B, T, W, pos), {c.B, Tl, W}, c.dtype);
    Tensor out = be.empty({c.B, Tl, C}, c.dtype, MemCategory::Activations);
    Tensor lse = be.empty({c.B, c.NH, Tl}, DType::F32, MemCategory::Activations);
    Tensor dq = be.empty({c.B, Tl, W}, c.dtype, MemCategory::Activations);
    nn::ring_attention_forward(be, s, ring, out, lse, lq, tcu, shape);
    EXPECT_TRUE(close(down(out), rows_at(down(fout), c.B, T, C, pos), tol)) << "out";
    EXPECT_TRUE(close(down(lse), lse_at(down(flse), c.B, c.NH, T, pos), tol)) << "lse";
    nn::ring_attention_backward(be, s, ring, dq,
                                upload(rows_at(dout, c.B, T, C, pos), {c.B, Tl, C}, c.dtype), lq,
                                out, lse, tcu, shape);
    EXPECT_TRUE(close(down(dq), rows_at(down(fdq), c.B, T, W, pos), tol)) << "dqkv";
  }
}

TEST(RingAttention, ChunksAreBalancedAndCoverTheSequence) {
  const int cp = testing::world().size();
  const int64_t T = 4 * cp;
  std::vector<int> seen(static_cast<size_t>(T), 0);
  for (int r = 0; r < cp; ++r) {
    const std::vector<int32_t> pos = nn::cp_positions(T, cp, r);
    ASSERT_EQ(static_cast<int64_t>(pos.size()), T / cp);
    EXPECT_EQ(pos.front(), 2 * r);                        // chunk r
    EXPECT_EQ(pos.back(), T - 1 - 2 * r);                 // chunk 2cp-1-r
    for (int32_t p : pos) ++seen[static_cast<size_t>(p)];
    // Causal work: the pairs a rank's queries see, the same on every rank.
    int64_t pairs = 0;
    for (int32_t p : pos) pairs += p + 1;
    EXPECT_EQ(pairs, (T / cp) * (T + 1) / 2) << "rank " << r;
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  try {
    nn::cp_positions(2 * cp + 1, cp, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "context parallelism: sequence length " +
                                         std::to_string(2 * cp + 1) +
                                         " is not a multiple of 2 x cp = " + std::to_string(2 * cp));
  }
}

}  // namespace
}  // namespace kiln
