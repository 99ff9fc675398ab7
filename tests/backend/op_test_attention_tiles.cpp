// The tiles of a blockwise (ring) attention: the sequence's keys cut into pieces at random
// points, every causal tile (query piece a over key piece b: whole for b < a, the diagonal
// for b == a) merged in a random order, against the double reference of the whole
// attention; backward accumulates the same tiles' gradients with the final out and lse.
// Then again with random documents packed into the sequences (the tiles' positions and
// cu_seqlens), against the double reference run on each document alone.
// Also copy_columns, which packs the keys and values of qkv for the ring.
#include "op_harness.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace kiln::test {
namespace {

class AttentionTileTest : public OpTest {};

struct TileCfg {
  int B, T, NH, NKV, HD;
  bool causal;
  int pieces;
};

TEST_P(AttentionTileTest, TilesMergeToTheWholeAttention) {
  if (be().name() == "cuda") GTEST_SKIP() << "attention tiles are not on the CUDA backend yet";
  for (const TileCfg& c : {TileCfg{1, 1, 1, 1, 1, true, 1}, TileCfg{2, 7, 2, 1, 5, true, 2},
                           TileCfg{1, 13, 3, 3, 8, true, 4}, TileCfg{2, 20, 4, 2, 6, true, 4},
                           TileCfg{1, 33, 2, 2, 16, true, 6}, TileCfg{2, 9, 4, 4, 3, false, 3},
                           TileCfg{1, 24, 6, 2, 8, false, 4}}) {
    std::ostringstream os;
    os << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV << " HD=" << c.HD
       << (c.causal ? " causal" : " bidirectional") << " pieces=" << c.pieces;
    const std::string base = os.str();
    const int C = c.NH * c.HD, KW = 2 * c.NKV * c.HD, W = C + KW;
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
    const int64_t N = int64_t{c.B} * c.T;
    for (int i = 0; i < c.pieces && N > 1; ++i) cu.push_back(randint(1, static_cast<int>(N) - 1));
    std::sort(cu.begin(), cu.end());
    cu.push_back(static_cast<int32_t>(N));
    for (const bool docs : {false, true}) {
    const std::string what = base + (docs ? " with documents" : "");
    const Tensor tcu = docs ? upload_i32(cu, {static_cast<int64_t>(cu.size())}) : Tensor();

    const std::vector<float> qkv = randn(int64_t{c.B} * c.T * W, 1.3f);
    Tensor tq = upload(qkv, {c.B, c.T, W});
    Tensor kv = poisoned({c.B, c.T, KW});
    be().copy_columns(st(), kv, tq, 0, C, KW);
    std::vector<float> want_kv;
    for (int64_t n = 0; n < int64_t{c.B} * c.T; ++n)
      want_kv.insert(want_kv.end(), qkv.begin() + n * W + C, qkv.begin() + (n + 1) * W);
    EXPECT_TRUE(bitwise_equal("copy_columns", download(kv), want_kv)) << what;

    Tensor acc = upload(std::vector<float>(static_cast<size_t>(c.B) * c.T * C, 0.f), {c.B, c.T, C});
    Tensor lse = upload(std::vector<float>(static_cast<size_t>(c.B) * c.NH * c.T,
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
    EXPECT_TRUE(near_by_norm("attention_tile_forward out", download(acc), rout, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("attention_tile_forward lse", download(lse), rlse, 1e-5)) << what;

    // Backward from the reference's out and lse; dq and dkv start from a random fill
    // (accumulation), which is subtracted: small, so that subtracting it loses no digits
    // of a small gradient (one key: dk is 0 but for rounding).
    const std::vector<float> dout = randn(int64_t{c.B} * c.T * C);
    const std::vector<float> dq0 = randn(int64_t{c.B} * c.T * C, 1e-3f),
                             dkv0 = randn(int64_t{c.B} * c.T * KW, 1e-3f);
    Tensor dq = upload(dq0, {c.B, c.T, C}), dkv = upload(dkv0, {c.B, c.T, KW});
    const Tensor tdout = upload(dout, {c.B, c.T, C}), tout = upload(to_float(rout), {c.B, c.T, C});
    const Tensor tlse = upload(to_float(rlse), {c.B, c.NH, c.T});
    for (const AttentionTile& t : tiles)
      be().attention_tile_backward(st(), dq, dkv, tdout, tq, kv, tout, tlse, tcu, shape, t);
    const Vec rd = docs ? ref::attention_documents_backward(to_double(dout), to_double(qkv), ra, cu)
                        : ref::attention_backward(to_double(dout), to_double(qkv), ra, {}, 0.0);
    Vec want_dq, want_dkv;
    for (int64_t n = 0; n < int64_t{c.B} * c.T; ++n) {
      want_dq.insert(want_dq.end(), rd.begin() + n * W, rd.begin() + n * W + C);
      want_dkv.insert(want_dkv.end(), rd.begin() + n * W + C, rd.begin() + (n + 1) * W);
    }
    EXPECT_TRUE(near_by_norm("attention_tile_backward dq", to_float(minus(download(dq), dq0)),
                             want_dq, 1e-5)) << what;
    EXPECT_TRUE(near_by_norm("attention_tile_backward dkv", to_float(minus(download(dkv), dkv0)),
                             want_dkv, 1e-5)) << what;

    // Back into a qkv-shaped gradient at a column offset, converted to bf16 and back.
    if (be().supports(OpFamily::Attention, DType::BF16)) {
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
                 Error) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionTileTest, ::testing::ValuesIn(backend_names()),
                         param_name);

}  // namespace
}  // namespace kiln::test
