// The tiles of a blockwise (ring) attention: the sequence's keys cut into pieces at random
// points, every causal tile (query piece a over key piece b: whole for b < a, the diagonal
// for b == a) merged in a random order, against the double reference of the whole
// attention; backward accumulates the same tiles' gradients with the final out and lse.
// Then again with random documents packed into the sequences (the tiles' positions and
// cu_seqlens), against the double reference run on each document alone.
// Also copy_columns, which packs the keys and values of qkv for the ring. fp32, and bf16
// where the backend runs it (qkv, kv, out and dout in bf16; the accumulators fp32).
#include "core/dtype.h"
#include "op_harness.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace kiln::test {
namespace {

struct TileCfg {
  int B, T, NH, NKV, HD;
  bool causal;
  int pieces;
};

// Bounds by norm: the merged out and lse, the accumulated dq and dkv.
struct Bounds {
  double out, lse, grad;
};

class AttentionTileTest : public OpTest {
 protected:
  // x on the device in dt (fp32 or bf16; bf16 rounds x in place first, so that the
  // reference sees the backend's inputs).
  Tensor upload_as(DType dt, std::vector<float>& x, const Shape& shape) {
    if (dt == DType::F32) return upload(x, shape);
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
    Tensor t = be().empty(shape, dt, MemCategory::Activations);
    be().copy(st(), t, upload(x, shape));
    return t;
  }
  Tensor poisoned_as(DType dt, const Shape& shape) {
    if (dt == DType::F32) return poisoned(shape);
    Tensor t = be().empty(shape, dt, MemCategory::Activations);
    be().copy(st(), t, poisoned(shape));
    return t;
  }
  std::vector<float> download_f32(const Tensor& t) {
    if (t.dtype() == DType::F32) return download(t);
    Tensor f = be().empty(t.shape(), DType::F32, MemCategory::Activations);
    be().copy(st(), f, t);
    return download(f);
  }
  void check_tiles(const TileCfg& c, DType dt, const Bounds& tol);
};

// Case c with qkv, kv, out and dout in dt (the accumulators fp32), without and with
// documents, against the double reference on the inputs as the backend sees them.
void AttentionTileTest::check_tiles(const TileCfg& c, DType dt, const Bounds& tol) {
  std::ostringstream os;
  os << dtype_name(dt) << " B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV
     << " HD=" << c.HD << (c.causal ? " causal" : " bidirectional") << " pieces=" << c.pieces;
  const std::string base = os.str(), tag = std::string(dtype_name(dt)) + " ";
  const int C = c.NH * c.HD, KW = 2 * c.NKV * c.HD, W = C + KW;
  const int64_t N = int64_t{c.B} * c.T;
  const AttentionShape shape{c.NH, c.NKV, c.HD, c.causal};
  // Piece boundaries: 0 < cuts < T at random (pieces may be empty when T is small).
  std::vector<int64_t> cuts{0, c.T};
  for (int i = 1; i < c.pieces; ++i) cuts.push_back(randint(0, c.T));
  std::sort(cuts.begin(), cuts.end());
  std::vector<AttentionTile> tiles;
  for (size_t a = 0; a + 1 < cuts.size(); ++a)
    for (size_t b = 0; b + 1 < cuts.size(); ++b) {
      if (c.causal && b > a) continue;
      tiles.push_back({cuts[a], cuts[a + 1] - cuts[a], cuts[b], cuts[b + 1] - cuts[b],
                       c.causal && a == b, cuts[a], cuts[b], c.T});
    }
  std::shuffle(tiles.begin(), tiles.end(), rng());
  // Documents: 0, random cuts of (0, B*T) (repeats are empty documents), B*T.
  std::vector<int32_t> cu{0};
  for (int i = 0; i < c.pieces && N > 1; ++i) cu.push_back(randint(1, static_cast<int>(N) - 1));
  std::sort(cu.begin(), cu.end());
  cu.push_back(static_cast<int32_t>(N));
  for (const bool docs : {false, true}) {
    const std::string what = base + (docs ? " with documents" : "");
    const Tensor tcu = docs ? upload_i32(cu, {static_cast<int64_t>(cu.size())}) : Tensor();

    std::vector<float> qkv = randn(N * W, 1.3f);
    const Tensor tq = upload_as(dt, qkv, {c.B, c.T, W});
    const Tensor kv = poisoned_as(dt, {c.B, c.T, KW});
    be().copy_columns(st(), kv, tq, 0, C, KW);
    std::vector<float> want_kv;
    for (int64_t n = 0; n < N; ++n)
      want_kv.insert(want_kv.end(), qkv.begin() + n * W + C, qkv.begin() + (n + 1) * W);
    EXPECT_TRUE(bitwise_equal(tag + "copy_columns", download_f32(kv), want_kv)) << what;

    Tensor acc = upload(std::vector<float>(static_cast<size_t>(N * C), 0.f), {c.B, c.T, C});
    Tensor lse = upload(std::vector<float>(static_cast<size_t>(N * c.NH),
                                           -std::numeric_limits<float>::infinity()),
                        {c.B, c.NH, c.T});
    for (const AttentionTile& t : tiles)
      be().attention_tile_forward(st(), acc, lse, tq, kv, tcu, shape, t);
    Vec rout, rlse;
    const ref::Attn ra{c.B, c.T, c.NH, c.NKV, c.HD, c.causal};
    if (docs)
      ref::attention_documents_forward(rout, rlse, to_double(qkv), ra, cu);
    else
      ref::attention_forward(rout, rlse, to_double(qkv), ra, {}, 0.0);
    EXPECT_TRUE(near_by_norm(tag + "attention_tile_forward out", download(acc), rout, tol.out))
        << what;
    EXPECT_TRUE(near_by_norm(tag + "attention_tile_forward lse", download(lse), rlse, tol.lse))
        << what;

    // Backward from the reference's out (in dt) and lse; dq and dkv start from a random
    // fill (accumulation), which is subtracted: small, so that subtracting it loses no
    // digits of a small gradient (one key: dk is 0 but for rounding).
    std::vector<float> dout = randn(N * C), out = to_float(rout);
    const std::vector<float> dq0 = randn(N * C, 1e-3f), dkv0 = randn(N * KW, 1e-3f);
    Tensor dq = upload(dq0, {c.B, c.T, C}), dkv = upload(dkv0, {c.B, c.T, KW});
    const Tensor tdout = upload_as(dt, dout, {c.B, c.T, C});
    const Tensor tout = upload_as(dt, out, {c.B, c.T, C});
    const Tensor tlse = upload(to_float(rlse), {c.B, c.NH, c.T});
    for (const AttentionTile& t : tiles)
      be().attention_tile_backward(st(), dq, dkv, tdout, tq, kv, tout, tlse, tcu, shape, t);
    const Vec rd = docs ? ref::attention_documents_backward(to_double(dout), to_double(qkv), ra, cu)
                        : ref::attention_backward(to_double(dout), to_double(qkv), ra, {}, 0.0);
    Vec want_dq, want_dkv;
    for (int64_t n = 0; n < N; ++n) {
      want_dq.insert(want_dq.end(), rd.begin() + n * W, rd.begin() + n * W + C);
      want_dkv.insert(want_dkv.end(), rd.begin() + n * W + C, rd.begin() + (n + 1) * W);
    }
    EXPECT_TRUE(near_by_norm(tag + "attention_tile_backward dq",
                             to_float(minus(download(dq), dq0)), want_dq, tol.grad))
        << what;
    EXPECT_TRUE(near_by_norm(tag + "attention_tile_backward dkv",
                             to_float(minus(download(dkv), dkv0)), want_dkv, tol.grad))
        << what;

    // Back into a qkv-shaped gradient at a column offset, converted to bf16 and back.
    if (dt == DType::F32 && be().supports(Op::CopyColumns, DType::BF16)) {
      Tensor d16 = be().empty({c.B, c.T, W}, DType::BF16, MemCategory::Activations);
      be().fill(st(), d16, 0.f);
      be().copy_columns(st(), d16, kv, C, 0, KW);
      Tensor back = poisoned({c.B, c.T, KW});
      be().copy_columns(st(), back, d16, 0, C, KW);
      EXPECT_TRUE(near_by_norm("copy_columns bf16", download(back), to_double(want_kv), 4e-3))
          << what;
    }
    // A tile outside the buffers: an error, not a bad write.
    EXPECT_THROW(be().attention_tile_forward(st(), acc, lse, tq, kv, tcu, shape,
                                             AttentionTile{0, c.T, 1, c.T, false}),
                 Error)
        << what;
  }
}

TEST_P(AttentionTileTest, TilesMergeToTheWholeAttention) {
  if (!be().supports(OpFamily::RingAttention, DType::F32))
    GTEST_SKIP() << be().name() << " has no ring attention";
  for (const TileCfg& c : {TileCfg{1, 1, 1, 1, 1, true, 1}, TileCfg{2, 7, 2, 1, 5, true, 2},
                           TileCfg{1, 13, 3, 3, 8, true, 4}, TileCfg{2, 20, 4, 2, 6, true, 4},
                           TileCfg{1, 33, 2, 2, 16, true, 6}, TileCfg{2, 9, 4, 4, 3, false, 3},
                           TileCfg{1, 24, 6, 2, 8, false, 4},
                           TileCfg{1, 150, 2, 1, 40, true, 3}})  // tiles across CUDA blocks
    check_tiles(c, DType::F32, {1e-5, 1e-5, 1e-5});
}

// bf16 qkv, kv, out and dout (the accumulators fp32), against the double reference on the
// bf16-rounded inputs. On CUDA: D = 16, 64, 128 (HD 100: the smaller blocks of D = 128),
// tiles and documents across the kernels' blocks. Bounds: out and lse are fp32 sums of
// exact products of bf16 operands; the gradients see out rounded to bf16 (2^-9 relative
// in D_i = dO_i . O_i), as the varlen bf16 case.
TEST_P(AttentionTileTest, Bf16TilesMergeToTheWholeAttention) {
  if (!be().supports(OpFamily::RingAttention, DType::BF16))
    GTEST_SKIP() << be().name() << " has no bf16 ring attention";
  for (const TileCfg& c : {TileCfg{2, 150, 4, 2, 64, true, 3}, TileCfg{1, 130, 2, 1, 100, true, 2},
                           TileCfg{2, 50, 2, 2, 12, false, 3}})
    check_tiles(c, DType::BF16, {1e-4, 1e-4, 2e-2});
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionTileTest, ::testing::ValuesIn(backend_names()),
                         param_name);

}  // namespace
}  // namespace kiln::test
