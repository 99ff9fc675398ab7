// Tensor-parallel layers against their unsharded selves, on every rank of the job (run
// under mpirun with 2 and 4 ranks; alone it is a world of one, where nothing is split).
// Each rank computes the unsharded layer on the whole (seeded, identical) inputs, then
// its shard, and compares its slice of every output and gradient (fp32, 1e-5 relative).
// The conjugate pairs are checked against values computed from every rank's inputs.
#include "backend/registry.h"
#include "models/decoder_model.h"
#include "mpi_test_main.h"
#include "world_test_util.h"
#include "nn/block.h"
#include "nn/classifier.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "parallel/fp8_plan.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

namespace kiln {
namespace {

using nn::TpComm;
using nn::ParamSlice;
using nn::TpStyle;

using testing::randn;

std::vector<float> pick(const std::vector<float>& global, const std::vector<int64_t>& idx) {
  std::vector<float> out;
  out.reserve(idx.size());
  for (int64_t i : idx) out.push_back(global[static_cast<size_t>(i)]);
  return out;
}

// |got - want| <= rel * max(1, max |want|) per element; with `own_scale`, relative to the
// slice's own largest element instead (however small).
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what, double rel = 1e-5, bool own_scale = false) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  if (!own_scale) scale = std::max(1.0, scale);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * scale) << what << " element " << i;
  }
}

using testing::cpu_backend;

struct Fixture {
  Backend* be = cpu_backend();
  Stream s = be->default_stream();
  Tensor upload(const std::vector<float>& v, const Shape& shape) {
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

TEST(TpComm, ConjugatePairs) {
  EXPECT_EQ(nn::conjugate(TpComm::CopyToTp), TpComm::ReduceFromTp);
  EXPECT_EQ(nn::conjugate(TpComm::ReduceFromTp), TpComm::CopyToTp);
  EXPECT_EQ(nn::conjugate(TpComm::GatherFromSp), TpComm::ReduceScatterToSp);
  EXPECT_EQ(nn::conjugate(TpComm::ReduceScatterToSp), TpComm::GatherFromSp);
}

TEST(TpComm, ForwardAndBackwardOfEachOp) {
  Fixture f;
  CommTpGroup g(testing::world());
  const int n = g.size(), r = g.rank();
  const int64_t rows = 3, C = 5;
  // Every rank's input, known to all: rank q's is randn(.., 100 + q).
  auto input = [&](int q, int64_t m) { return randn(static_cast<size_t>(m * C), 100 + q); };
  std::vector<float> sum(rows * n * C, 0.f);
  for (int q = 0; q < n; ++q) {
    auto v = input(q, rows * n);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  // all_reduce: ReduceFromTp forward, CopyToTp backward.
  for (TpComm c : {TpComm::ReduceFromTp, TpComm::CopyToTp}) {
    Tensor x = f.upload(input(r, rows * n), Shape{rows * n, C});
    Tensor y = f.zeros(Shape{rows * n, C});
    if (c == TpComm::ReduceFromTp) {
      nn::tp_forward(c, g, *f.be, f.s, y, x);
    } else {
      nn::tp_backward(c, g, *f.be, f.s, y, x);
    }
    expect_close(f.down(y), sum, nn::tp_comm_name(c));
    // ... and the identity of the other direction.
    Tensor z = f.zeros(Shape{rows * n, C});
    if (c == TpComm::ReduceFromTp) {
      nn::tp_backward(c, g, *f.be, f.s, z, x);
    } else {
      nn::tp_forward(c, g, *f.be, f.s, z, x);
    }
    expect_close(f.down(z), input(r, rows * n), std::string(nn::tp_comm_name(c)) + " identity");
  }
  // all_gather rows: GatherFromSp forward, ReduceScatterToSp backward.
  std::vector<float> gathered;
  for (int q = 0; q < n; ++q) {
    auto v = input(q, rows);
    gathered.insert(gathered.end(), v.begin(), v.end());
  }
  std::vector<float> my_rows(sum.begin() + r * rows * C, sum.begin() + (r + 1) * rows * C);
  {
    Tensor x = f.upload(input(r, rows), Shape{rows, C});
    Tensor y = f.zeros(Shape{rows * n, C});
    nn::tp_forward(TpComm::GatherFromSp, g, *f.be, f.s, y, x);
    expect_close(f.down(y), gathered, "gather_from_sp forward");
    Tensor x2 = f.zeros(Shape{rows, C});
    nn::tp_backward(TpComm::ReduceScatterToSp, g, *f.be, f.s, y, x);
    expect_close(f.down(y), gathered, "reduce_scatter_to_sp backward");
    Tensor full = f.upload(input(r, rows * n), Shape{rows * n, C});
    nn::tp_forward(TpComm::ReduceScatterToSp, g, *f.be, f.s, x2, full);
    expect_close(f.down(x2), my_rows, "reduce_scatter_to_sp forward");
    Tensor x3 = f.zeros(Shape{rows, C});
    nn::tp_backward(TpComm::GatherFromSp, g, *f.be, f.s, x3, full);
    expect_close(f.down(x3), my_rows, "gather_from_sp backward");
  }
  Tensor bad = f.zeros(Shape{rows, C});
  if (n > 1) {
    EXPECT_THROW(nn::tp_forward(TpComm::GatherFromSp, g, *f.be, f.s, bad, bad), Error);
  }
}

TEST(ParamSlice, RangesAndIndices) {
  // A fused [q; k; v] of rows {4, 2, 2}, 3 columns, split over 2: rank 1 holds q rows 2-3,
  // k row 5, v row 7.
  ParamSlice s{0, {4, 2, 2}, 2, 1};
  const Shape g{8, 3};
  EXPECT_EQ(s.local_shape(g), (Shape{4, 3}));
  auto r = s.ranges(g);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{5, 6}));
  EXPECT_EQ(r[2], (std::pair<int64_t, int64_t>{7, 8}));
  auto idx = s.global_indices(g);
  std::vector<int64_t> want = {6, 7, 8, 9, 10, 11, 15, 16, 17, 21, 22, 23};
  EXPECT_EQ(idx, want);
  ParamSlice cols{1, {}, 3, 2};  // columns [4, 6) of [2, 6]
  EXPECT_EQ(cols.global_indices(Shape{2, 6}), (std::vector<int64_t>{4, 5, 10, 11}));
  EXPECT_THROW((ParamSlice{0, {3, 5}, 2, 0}.check(g, "w")), Error);  // 3 rows over 2
  EXPECT_THROW((ParamSlice{0, {4, 2}, 2, 0}.check(g, "w")), Error);  // pieces sum to 6
  EXPECT_NO_THROW(s.check(g, "w"));
  // Every local sub-range maps to the global indices of its elements, run by run.
  for (int64_t b = 0; b <= 12; ++b) {
    for (int64_t e = b; e <= 12; ++e) {
      std::vector<int64_t> got;
      int64_t local = b;
      for (const auto& run : s.global_runs(g, b, e)) {
        EXPECT_EQ(run.local_begin, local);
        EXPECT_LT(run.global_begin, run.global_end);
        for (int64_t i = run.global_begin; i < run.global_end; ++i) got.push_back(i);
        local += run.global_end - run.global_begin;
      }
      EXPECT_EQ(got, std::vector<int64_t>(want.begin() + b, want.begin() + e)) << b << ", " << e;
    }
  }
  EXPECT_THROW(s.global_runs(g, 3, 13), Error);
}

// The expert cut composed with a tp cut: every rank's elements, by brute force over the
// global coordinates, for each pair of cuts of a stacked [E = 6, 2F = 4, C = 3] tensor.
TEST(ParamSlice, ExpertCut) {
  const Shape g{6, 4, 3};
  for (int ep : {1, 2, 3, 6}) {
    for (int tp : {1, 2}) {
      std::vector<int> hits(static_cast<size_t>(g.numel()), 0);
      for (int er = 0; er < ep; ++er) {
        for (int tr = 0; tr < tp; ++tr) {
          // SwiGLU's gate and up pieces of 2 rows each, cut over tp within each expert.
          const ParamSlice s{1, {2, 2}, tp, tr, ep, er};
          ASSERT_NO_THROW(s.check(g, "w"));
          const Shape local = s.local_shape(g);
          EXPECT_EQ(local, (Shape{6 / ep, 4 / tp, 3}));
          std::vector<int64_t> want;
          const int64_t half = 2 / tp;
          for (int64_t e = 0; e < local[0]; ++e)
            for (int64_t i = 0; i < local[1]; ++i)
              for (int64_t c = 0; c < 3; ++c) {
                const int64_t ge = er * local[0] + e;
                const int64_t piece = i / half, gi = piece * 2 + tr * half + i % half;
                want.push_back((ge * 4 + gi) * 3 + c);
              }
          EXPECT_EQ(s.global_indices(g), want) << "ep " << er << "/" << ep << " tp " << tr;
          for (int64_t i : want) ++hits[static_cast<size_t>(i)];
          // A ZeRO-like sub-range maps run by run to the same indices.
          std::vector<int64_t> got;
          for (const auto& run : s.global_runs(g, 1, local.numel() - 1))
            for (int64_t i = run.global_begin; i < run.global_end; ++i) got.push_back(i);
          EXPECT_EQ(got, std::vector<int64_t>(want.begin() + 1, want.end() - 1));
        }
      }
      EXPECT_EQ(hits, std::vector<int>(hits.size(), 1)) << "ep " << ep << " tp " << tp;
    }
  }
  EXPECT_THROW((ParamSlice{0, {}, 1, 0, 4, 0}.check(g, "w")), Error);  // 6 experts over 4
  EXPECT_THROW((ParamSlice{0, {}, 2, 0, 2, 0}.check(g, "w")), Error);  // both cuts on dim 0
  EXPECT_THROW((ParamSlice{1, {}, 1, 0, 2, 2}.check(g, "w")), Error);  // ep index out of range
}

// fp8: the later half of each dimension of `v` [rows, cols] scaled by 2^-20, so that a
// rank's slice can have a far smaller amax than the whole tensor: at the whole tensor's
// scale its values fall below E4M3's smallest subnormal (they quantize to 0), at its own
// they would keep 4 bits. A shard that did not reduce its amaxes over the group fails the
// comparison (made relative to each slice's own size).
std::vector<float> uneven(std::vector<float> v, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      v[static_cast<size_t>(i * cols + j)] *= (2 * i >= rows ? 0x1p-20f : 1.f) * (2 * j >= cols ? 0x1p-20f : 1.f);
  return v;
}

// One Linear, unsharded and as `style`, compared slice by slice; with `fp8` both run their
// GEMMs in fp8 (nn/fp8.h), the shard reducing its amaxes over the group; with `lora` both
// carry LoRA adapters (nn/lora.h) on a frozen base: on the first and last piece of a fused
// output (kLoraPieces), or on the whole output (kLoraWhole), their partial gradients summed
// over the group.
enum LoraMode { kNoLora, kLoraPieces, kLoraWhole };
void check_linear(TpStyle style, bool sp, std::vector<int64_t> pieces, bool bias,
                  bool fp8 = false, LoraMode lora = kNoLora) {
  Fixture f;
  CommTpGroup g(testing::world());
  const int n = g.size(), r = g.rank();
  const int64_t N = 4 * 3, in = 8, out = 16;  // N and the features divide by 1, 2, 4
  SCOPED_TRACE(fmt::format("{} sp={} bias={} fp8={} lora={} tp={}", nn::tp_style_name(style), sp,
                           bias, fp8, static_cast<int>(lora), n));
  std::vector<nn::LinearPiece> named;
  for (int64_t rows : pieces) named.push_back({fmt::format("p{}", named.size()), rows});
  // Adapters (rank 3, scale 5/3) with random A and B, the base frozen.
  auto adapt = [&](nn::Linear& l) {
    if (lora == kNoLora) return;
    const int last = static_cast<int>(pieces.size()) - 1;
    for (int piece : lora == kLoraWhole || pieces.empty() ? std::vector<int>{-1} : std::vector<int>{0, last})
      l.add_lora(piece, nn::LoraSpec{3, 5.f, false, 0.f});
    l.weight.trainable = false;
    if (bias) l.bias.trainable = false;
  };
  auto bind_adapters = [&](nn::Linear& l) {
    unsigned seed = 20;
    for (nn::LoraAdapter& a : l.lora())
      for (nn::Param* p : {&a.A, &a.B}) {
        const Shape local = p->local_shape();
        p->value = f.upload(pick(randn(p->shape.numel(), seed++), p->slice.global_indices(p->shape)), local);
        p->grad = f.zeros(local);
      }
  };
  auto W = randn(out * in, 1), b = randn(out, 2), x = randn(N * in, 3), dy = randn(N * out, 4);
  if (fp8) W = uneven(W, out, in), x = uneven(x, N, in), dy = uneven(dy, N, out);
  CommAmaxGroup amax_group({&testing::world()});
  auto fp8_on = [&](nn::Linear& l, nn::AmaxGroup* group) {
    if (fp8) l.set_fp8({f.zeros(Shape{3}), Tensor(), nullptr, group});
  };
  // The unsharded layer.
  nn::Linear full("l", in, out, bias, 0.02f, named);
  fp8_on(full, nullptr);
  adapt(full);
  bind_adapters(full);
  full.weight.value = f.upload(W, Shape{out, in});
  full.weight.grad = f.zeros(Shape{out, in});
  if (bias) full.bias.value = f.upload(b, Shape{out}), full.bias.grad = f.zeros(Shape{out});
  Tensor y = f.zeros(Shape{N, out}), dx = f.zeros(Shape{N, in});
  full.forward(*f.be, f.s, y, f.upload(x, Shape{N, in}));
  full.backward(*f.be, f.s, dx, f.upload(dy, Shape{N, out}), f.upload(x, Shape{N, in}));
  const auto Y = f.down(y), DX = f.down(dx);
  const auto DW = lora != kNoLora ? std::vector<float>() : f.down(full.weight.grad);
  const auto DB = bias && lora == kNoLora ? f.down(full.bias.grad) : std::vector<float>();

  // The shard (adapters added before shard(), which slices them).
  nn::Linear part("l", in, out, bias, 0.02f, named);
  adapt(part);
  part.shard(nn::TpPlacement{style, &g, sp});
  fp8_on(part, &amax_group);
  bind_adapters(part);
  const Shape wl = part.weight.local_shape();
  part.weight.value = f.upload(pick(W, part.weight.slice.global_indices(Shape{out, in})), wl);
  part.weight.grad = lora != kNoLora ? Tensor() : f.zeros(wl);
  if (bias) {
    const Shape bl = part.bias.local_shape();
    part.bias.value = f.upload(pick(b, part.bias.slice.global_indices(Shape{out})), bl);
    if (lora == kNoLora) part.bias.grad = f.zeros(bl);
  }
  const bool column = style == TpStyle::Column;
  // Which rows and columns of x / y this rank sees.
  const ParamSlice rows{0, {}, sp ? n : 1, sp ? r : 0};
  const ParamSlice x_cols = column ? ParamSlice{} : ParamSlice{1, {}, n, r};
  const ParamSlice y_cols = column ? ParamSlice{1, pieces, n, r} : ParamSlice{};
  auto sel = [&](const std::vector<float>& v, int64_t cols, const ParamSlice& rs, const ParamSlice& cs) {
    auto by_col = pick(v, cs.global_indices(Shape{N, cols}));
    return pick(by_col, rs.global_indices(Shape{N, cs.local_shape(Shape{N, cols})[1]}));
  };
  const ParamSlice in_rows = column ? rows : ParamSlice{};   // row-parallel input is never SP
  const ParamSlice out_rows = column ? ParamSlice{} : rows;  // column-parallel output neither
  const int64_t x_n = in_rows.local_shape(Shape{N, 1})[0], y_n = out_rows.local_shape(Shape{N, 1})[0];
  const int64_t x_c = x_cols.local_shape(Shape{N, in})[1], y_c = y_cols.local_shape(Shape{N, out})[1];
  Tensor xl = f.upload(sel(x, in, in_rows, x_cols), Shape{x_n, x_c});
  Tensor yl = f.zeros(Shape{y_n, y_c}), dxl = f.zeros(Shape{x_n, x_c});
  Tensor work = part.work_width() ? f.zeros(Shape{N, part.work_width()}) : Tensor();
  EXPECT_EQ(part.work_width(), sp && n > 1 ? (column ? in : out) : 0);
  part.forward(*f.be, f.s, yl, xl, work);
  expect_close(f.down(yl), sel(Y, out, out_rows, y_cols), "forward", 1e-5, fp8);
  part.backward(*f.be, f.s, dxl, f.upload(sel(dy, out, out_rows, y_cols), Shape{y_n, y_c}), xl, work);
  expect_close(f.down(dxl), sel(DX, in, in_rows, x_cols), "dinp", 1e-5, fp8);
  for (size_t i = 0; i < part.lora().size(); ++i) {
    const nn::LoraAdapter &a = part.lora()[i], &whole = full.lora()[i];
    for (const auto& [p, q] : {std::pair{&a.A, &whole.A}, std::pair{&a.B, &whole.B}}) {
      if (p->tp_partial_grad) testing::world().all_reduce(p->grad, ReduceOp::Sum);
      expect_close(f.down(p->grad), pick(f.down(q->grad), p->slice.global_indices(p->shape)), p->name);
    }
  }
  if (lora != kNoLora) return;  // a frozen base
  expect_close(f.down(part.weight.grad), pick(DW, part.weight.slice.global_indices(Shape{out, in})),
               "dweight", 1e-5, fp8);
  if (bias) {
    expect_close(f.down(part.bias.grad), pick(DB, part.bias.slice.global_indices(Shape{out})),
                 "dbias", 1e-5, fp8);
  }
}

TEST(TpLinear, Column) { check_linear(TpStyle::Column, false, {}, true); }
TEST(TpLinear, ColumnSequenceParallel) { check_linear(TpStyle::Column, true, {}, true); }
TEST(TpLinear, ColumnFusedPieces) { check_linear(TpStyle::Column, false, {8, 4, 4}, true); }
TEST(TpLinear, ColumnFusedPiecesSequenceParallel) { check_linear(TpStyle::Column, true, {8, 4, 4}, false); }
TEST(TpLinear, Row) { check_linear(TpStyle::Row, false, {}, true); }
TEST(TpLinear, RowSequenceParallel) { check_linear(TpStyle::Row, true, {}, true); }
TEST(TpLinear, RowNoBias) { check_linear(TpStyle::Row, true, {}, false); }
TEST(TpLinear, Fp8Column) { check_linear(TpStyle::Column, false, {}, true, true); }
TEST(TpLinear, Fp8ColumnSequenceParallel) { check_linear(TpStyle::Column, true, {}, true, true); }
TEST(TpLinear, Fp8Row) { check_linear(TpStyle::Row, false, {}, true, true); }
TEST(TpLinear, Fp8RowSequenceParallel) { check_linear(TpStyle::Row, true, {}, false, true); }
TEST(TpLinear, LoraColumnFusedPieces) { check_linear(TpStyle::Column, false, {8, 4, 4}, true, false, kLoraPieces); }
TEST(TpLinear, LoraColumnSequenceParallel) { check_linear(TpStyle::Column, true, {8, 4, 4}, false, false, kLoraPieces); }
TEST(TpLinear, LoraColumnWholeFusedOutput) { check_linear(TpStyle::Column, true, {8, 4, 4}, true, false, kLoraWhole); }
TEST(TpLinear, LoraRow) { check_linear(TpStyle::Row, false, {}, true, false, kLoraWhole); }
TEST(TpLinear, LoraRowSequenceParallel) { check_linear(TpStyle::Row, true, {}, false, false, kLoraWhole); }

// fp8 with the micro-batch's rows cut over the ranks, as context parallelism cuts each
// sequence: a replicated Linear whose amaxes are reduced over the group (the cp group in
// training: train_step.cpp) computes on each rank the unsharded layer's rows, and the
// ranks' partial weight gradients sum to its weight gradient. The rows are uneven (the
// later half 2^-20 smaller), so a rank that scaled its chunk by its own amax would differ.
TEST(Fp8Linear, RowsCutOverRanksTakeTheWholeAmax) {
  Fixture f;
  Communicator& world = testing::world();
  const int n = world.size(), r = world.rank();
  const int64_t N = 4 * 3, in = 16, out = 8, rows = N / n;
  const auto W = randn(out * in, 1);  // no bias: it would hide the small rows' outputs
  const auto x = uneven(randn(N * in, 3), N, in), dy = uneven(randn(N * out, 4), N, out);
  CommAmaxGroup group({&world});
  auto layer = [&](nn::Linear& l, nn::AmaxGroup* g) {
    l.weight.value = f.upload(W, Shape{out, in}), l.weight.grad = f.zeros(Shape{out, in});
    l.set_fp8({f.zeros(Shape{3}), Tensor(), nullptr, g});
  };
  auto mine = [&](const std::vector<float>& v, int64_t cols) {
    return std::vector<float>(v.begin() + r * rows * cols, v.begin() + (r + 1) * rows * cols);
  };
  nn::Linear full("l", in, out, false, 0.02f), part("l", in, out, false, 0.02f);
  layer(full, nullptr);
  layer(part, &group);
  Tensor y = f.zeros(Shape{N, out}), dx = f.zeros(Shape{N, in});
  full.forward(*f.be, f.s, y, f.upload(x, Shape{N, in}));
  full.backward(*f.be, f.s, dx, f.upload(dy, Shape{N, out}), f.upload(x, Shape{N, in}));
  Tensor yl = f.zeros(Shape{rows, out}), dxl = f.zeros(Shape{rows, in});
  const Tensor xl = f.upload(mine(x, in), Shape{rows, in});
  part.forward(*f.be, f.s, yl, xl);
  part.backward(*f.be, f.s, dxl, f.upload(mine(dy, out), Shape{rows, out}), xl);
  expect_close(f.down(yl), mine(f.down(y), out), "forward", 1e-5, true);
  expect_close(f.down(dxl), mine(f.down(dx), in), "dinp", 1e-5, true);
  world.all_reduce(part.weight.grad, ReduceOp::Sum);
  expect_close(f.down(part.weight.grad), f.down(full.weight.grad), "dweight (summed)", 1e-5, true);
}

TEST(TpLinear, IndivisibleSplitIsAnError) {
  CommTpGroup g(testing::world());
  if (g.size() == 1) GTEST_SKIP() << "nothing is split on one rank";
  nn::Linear l("h.0.attn.c_attn", 8, 3 * 5 * g.size() + 3, true, 0.02f);
  EXPECT_THROW(l.shard(nn::TpPlacement{TpStyle::Column, &g, false}), Error);
  nn::Linear ok("h.0.attn.c_attn", 8, 6 * g.size(), true, 0.02f);
  EXPECT_THROW(ok.shard(nn::TpPlacement{TpStyle::Vocab, &g, false}), Error);
}

// Rows of the flattened [N, C] a rank holds with sequence parallelism (all without).
std::vector<float> my_rows(const std::vector<float>& v, int64_t N, int64_t C, bool sp, int n, int r) {
  return pick(v, ParamSlice{0, {}, sp ? n : 1, sp ? r : 0}.global_indices(Shape{N, C}));
}

void check_embedding(bool sp, bool explicit_positions) {
  Fixture f;
  CommTpGroup g(testing::world());
  const int n = g.size(), r = g.rank();
  const int64_t B = 2, T = 6, C = 5, V = 13, Vp = 16, maxT = 8, N = B * T;
  SCOPED_TRACE(fmt::format("sp={} positions={} tp={}", sp, explicit_positions, n));
  std::vector<int32_t> tok(N), pos(N);
  std::mt19937 gen(7);
  for (auto& t : tok) t = static_cast<int32_t>(gen() % V);
  tok[0] = 0, tok[1] = static_cast<int32_t>(V - 1);
  for (int64_t i = 0; i < N; ++i) pos[i] = static_cast<int32_t>((i * 5 + 3) % maxT);
  const auto wte = randn(Vp * C, 11), wpe = randn(maxT * C, 12), dout = randn(N * C, 13);
  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    Tensor t = f.be->empty(Shape{B, T}, DType::I32, MemCategory::Activations);
    f.be->copy_from_host(f.s, t, v.data());
    return t;
  };
  Tensor ttok = upload_i32(tok), tpos = explicit_positions ? upload_i32(pos) : Tensor();
  nn::TokenPositionEmbedding full("wte", "wpe", V, Vp, maxT, C, 0.02f);
  full.wte.value = f.upload(wte, Shape{Vp, C}), full.wte.grad = f.zeros(Shape{Vp, C});
  full.wpe.value = f.upload(wpe, Shape{maxT, C}), full.wpe.grad = f.zeros(Shape{maxT, C});
  Tensor y = f.zeros(Shape{B, T, C});
  full.forward(*f.be, f.s, y, ttok, tpos);
  full.backward(*f.be, f.s, f.upload(dout, Shape{B, T, C}), ttok, tpos);

  nn::TokenPositionEmbedding part("wte", "wpe", V, Vp, maxT, C, 0.02f);
  part.shard(nn::TpPlacement{TpStyle::Vocab, &g, sp});
  const Shape wl = part.wte.local_shape();
  part.wte.value = f.upload(pick(wte, part.wte.slice.global_indices(Shape{Vp, C})), wl);
  part.wte.grad = f.zeros(wl);
  part.wpe.value = f.upload(wpe, Shape{maxT, C}), part.wpe.grad = f.zeros(Shape{maxT, C});
  const bool split = sp && n > 1;
  const int64_t rows = split ? N / n : N;
  Tensor yl = f.zeros(Shape{rows, C}), work = split ? f.zeros(Shape{B, T, C}) : Tensor();
  part.forward(*f.be, f.s, split ? yl : yl.reshape(Shape{B, T, C}), ttok, tpos, 0, work);
  expect_close(f.down(yl), my_rows(f.down(y), N, C, split, n, r), "forward");
  part.backward(*f.be, f.s, f.upload(my_rows(dout, N, C, split, n, r), split ? Shape{rows, C} : Shape{B, T, C}),
                ttok, tpos, work);
  expect_close(f.down(part.wte.grad), pick(f.down(full.wte.grad), part.wte.slice.global_indices(Shape{Vp, C})),
               "dwte");
  expect_close(f.down(part.wpe.grad), f.down(full.wpe.grad), "dwpe");
}

TEST(TpEmbedding, Vocab) { check_embedding(false, false); }
TEST(TpEmbedding, VocabSequenceParallel) { check_embedding(true, false); }
TEST(TpEmbedding, VocabExplicitPositions) { check_embedding(false, true); }
TEST(TpEmbedding, VocabSequenceParallelExplicitPositions) { check_embedding(true, true); }

void check_cross_entropy(bool sp) {
  Fixture f;
  CommTpGroup g(testing::world());
  const int n = g.size(), r = g.rank();
  const int64_t N = 12, C = 6, V = 13, Vp = 16, R = 5;  // chunks of 5, 5 and 2 rows
  SCOPED_TRACE(fmt::format("sp={} tp={}", sp, n));
  const auto x = randn(N * C, 21), wte = randn(Vp * C, 22);
  std::vector<int32_t> tgt(N);
  for (int64_t i = 0; i < N; ++i) tgt[i] = static_cast<int32_t>((i * 7 + 1) % V);
  tgt[3] = -1, tgt[10] = -1, tgt[11] = static_cast<int32_t>(V - 1);
  Tensor tt = f.be->empty(Shape{N}, DType::I32, MemCategory::Activations);
  f.be->copy_from_host(f.s, tt, tgt.data());
  const float scale = 1.f / 10.f;
  // Unsharded.
  Tensor dx = f.zeros(Shape{N, C}), dwte = f.zeros(Shape{Vp, C});
  auto sums = [&] {
    Tensor t = f.be->empty(Shape{2}, DType::F64, MemCategory::Activations);
    f.be->fill(f.s, t, 0.f);
    return t;
  };
  auto read = [&](const Tensor& t) {
    double v[2];
    f.be->copy_to_host(f.s, v, t);
    return std::pair<double, double>{v[0], v[1]};
  };
  const Tensor want_acc = sums(), got_acc = sums();
  nn::classifier_cross_entropy(*f.be, f.s, f.upload(x, Shape{N, C}), f.upload(wte, Shape{Vp, C}), tt,
                               static_cast<int>(V), scale, dx, dwte, f.zeros(Shape{R, Vp}),
                               f.zeros(Shape{R}), want_acc);
  // Vocab-parallel.
  const ParamSlice rows_of_wte{0, {}, n, r};
  const bool split = sp && n > 1;
  const int64_t rows = split ? N / n : N;
  nn::VocabParallelScratch scratch{f.zeros(Shape{(n + 1) * R, 3}), split ? f.zeros(Shape{N, C}) : Tensor(),
                                   split ? f.zeros(Shape{N, C}) : Tensor()};
  Tensor dxl = f.zeros(Shape{rows, C}), dwl = f.zeros(Shape{Vp / n, C});
  nn::vocab_parallel_cross_entropy(
      *f.be, f.s, nn::TpPlacement{TpStyle::Vocab, &g, split}, f.upload(my_rows(x, N, C, split, n, r), Shape{rows, C}),
      f.upload(pick(wte, rows_of_wte.global_indices(Shape{Vp, C})), Shape{Vp / n, C}), tt, static_cast<int>(V),
      scale, dxl, dwl, f.zeros(Shape{R, Vp / n}), f.zeros(Shape{R}), scratch, got_acc);
  const auto [want_sum, want_n] = read(want_acc);
  const auto [got_sum, got_n] = read(got_acc);
  EXPECT_EQ(want_n, 10.0);  // 12 rows, 2 ignored
  EXPECT_EQ(got_n, want_n);
  EXPECT_NEAR(got_sum, want_sum, 1e-5 * std::fabs(want_sum));
  expect_close(f.down(dxl), my_rows(f.down(dx), N, C, split, n, r), "dx");
  expect_close(f.down(dwl), pick(f.down(dwte), rows_of_wte.global_indices(Shape{Vp, C})), "dwte");
}

TEST(TpCrossEntropy, Vocab) { check_cross_entropy(false); }
TEST(TpCrossEntropy, VocabSequenceParallel) { check_cross_entropy(true); }

// A whole transformer block, unsharded and split over tp (with and without sequence
// parallelism, with and without re-running forward in backward), GPT-2's and Llama's
// shapes, Llama's also with a mixture of experts (4 experts, top-2, shared experts; the
// balancing statistics and their gradients on; selective recomputation). Every parameter
// gradient is compared by global element, partial ones (the norms' under SP) after their
// one reduction over tp; the balancing statistics are the single process's (not tp times).
struct BlockCase {
  bool llama, sp, rerun;
  float resid_dropout, probs_dropout = 0.f;
  bool moe = false, recompute_cheap = false;
};

// A MoE block's balancing buffers (nn::MoeBalancePass): statistics zeroed, the aux and z
// gradients on.
struct Balance {
  Tensor load, prob, z, grad_load;
  nn::MoeBalancePass pass() const {
    return {load, prob, z, 0.25f, 0.125f, grad_load, 0.1f, 0.01f};
  }
};

void check_block(const BlockCase& c) {
  Fixture f;
  CommTpGroup g(testing::world());
  const int n = g.size(), r = g.rank();
  const int64_t B = 2, T = 6, N = B * T;
  nn::BlockSpec spec;
  if (c.llama) {
    spec.n_embd = 32;
    spec.norm = nn::NormSpec{nn::NormKind::RMSNorm, 1e-5f, true, false};
    spec.attention.n_head = 8, spec.attention.n_kv_head = 4, spec.attention.head_dim = 4;
    spec.attention.rotary = true;
    spec.mlp = nn::MlpKind::SwiGLU, spec.mlp_hidden = 24, spec.bias = false;
    if (c.moe) spec.moe = nn::MoeSpec{.num_experts = 4, .top_k = 2, .expert_hidden = 8, .shared_hidden = 8};
  } else {
    spec.n_embd = 16;
    spec.attention.n_head = 4, spec.attention.n_kv_head = 4, spec.attention.head_dim = 4;
    spec.mlp_hidden = 32;
  }
  const int64_t C = spec.n_embd;
  SCOPED_TRACE(fmt::format("{}{} sp={} rerun={} cheap={} dropout={}/{} tp={}",
                           c.llama ? "llama" : "gpt2", c.moe ? " moe" : "", c.sp, c.rerun,
                           c.recompute_cheap, c.resid_dropout, c.probs_dropout, n));
  const auto x = randn(N * C, 31), dy = randn(N * C, 32);
  // Masks by global element: the split heads and rows must draw the single process's.
  const DropoutSpec drop_p{c.probs_dropout, 5, 1}, drop_a{c.resid_dropout, 5, 2},
      drop_m{c.resid_dropout, 5, 3};
  struct Run {
    nn::TransformerBlock block;
    std::vector<nn::Param*> params;
    std::vector<Tensor> saved;
    nn::BlockScratch scratch;
    Balance balance;
  };
  const int64_t E = spec.moe.num_experts;
  auto make = [&](bool shard) {
    auto run = std::make_unique<Run>(Run{nn::TransformerBlock("h.0.", spec), {}, {}, {}, {}});
    if (c.moe)
      run->balance = {f.zeros(Shape{E}), f.zeros(Shape{E}), f.zeros(Shape{1}),
                      f.upload(randn(static_cast<size_t>(E), 33), Shape{E})};
    if (shard) run->block.shard(block_placement(kDecoderParallelTables.tp.value(), g, c.sp));
    run->block.collect(run->params);
    for (size_t i = 0; i < run->params.size(); ++i) {
      nn::Param* p = run->params[i];
      const auto global = randn(static_cast<size_t>(p->shape.numel()), 200 + static_cast<uint32_t>(i));
      p->value = f.upload(pick(global, p->slice.global_indices(p->shape)), p->local_shape());
      p->grad = f.zeros(p->local_shape());
    }
    for (const auto& sp : run->block.saved_specs(B, T, DType::F32))  // a MoE's: int32 too
      run->saved.push_back(f.be->empty(sp.shape, sp.dtype, MemCategory::Activations));
    run->scratch = run->block.make_scratch(*f.be, B, T, DType::F32);
    return run;
  };
  auto pass = [&](Run& run) {
    return nn::BlockPass{*f.be, f.s, run.saved, run.scratch, drop_p, drop_a, drop_m,
                         c.rerun, c.recompute_cheap, Tensor(), Tensor(),
                         c.moe ? run.balance.pass() : nn::MoeBalancePass{}};
  };
  auto full = make(false);
  Tensor xf = f.upload(x, Shape{B, T, C}), yf = f.zeros(Shape{B, T, C});
  full->block.forward(pass(*full), xf, yf);
  Tensor dres = f.upload(dy, Shape{B, T, C});
  full->block.backward(pass(*full), dres, xf, yf);

  auto part = make(true);
  const bool split = c.sp && n > 1;
  const Shape local = split ? Shape{N / n, C} : Shape{B, T, C};
  Tensor xl = f.upload(my_rows(x, N, C, split, n, r), local), yl = f.zeros(local);
  part->block.forward(pass(*part), xl, yl);
  expect_close(f.down(yl), my_rows(f.down(yf), N, C, split, n, r), "block forward");
  if (c.moe) {  // every rank routes the whole micro-batch: the single process's statistics
    expect_close(f.down(part->balance.load), f.down(full->balance.load), "expert load");
    expect_close(f.down(part->balance.prob), f.down(full->balance.prob), "balancing probabilities");
    expect_close(f.down(part->balance.z), f.down(full->balance.z), "z statistic");
  }
  Tensor dl = f.upload(my_rows(dy, N, C, split, n, r), local);
  part->block.backward(pass(*part), dl, xl, yl);
  expect_close(f.down(dl), my_rows(f.down(dres), N, C, split, n, r), "block dx");
  ASSERT_EQ(part->params.size(), full->params.size());
  for (size_t i = 0; i < part->params.size(); ++i) {
    nn::Param* p = part->params[i];
    EXPECT_EQ(p->tp_partial_grad, split && p->name.find("ln_") != std::string::npos) << p->name;
    if (p->tp_partial_grad) g.all_reduce_sum(f.s, p->grad);
    expect_close(f.down(p->grad), pick(f.down(full->params[i]->grad), p->slice.global_indices(p->shape)),
                 "d" + p->name);
  }
}

TEST(TpBlock, Gpt2) { check_block({false, false, false, 0.f}); }
TEST(TpBlock, Gpt2ResidualDropout) { check_block({false, false, false, 0.25f}); }
TEST(TpBlock, Gpt2SequenceParallel) { check_block({false, true, false, 0.f}); }
TEST(TpBlock, Gpt2SequenceParallelRerun) { check_block({false, true, true, 0.f}); }
TEST(TpBlock, Gpt2AttentionDropout) { check_block({false, false, false, 0.f, 0.3f}); }
TEST(TpBlock, Gpt2SequenceParallelAllDropout) { check_block({false, true, false, 0.25f, 0.3f}); }
TEST(TpBlock, Gpt2SequenceParallelAllDropoutRerun) { check_block({false, true, true, 0.25f, 0.3f}); }
TEST(TpBlock, LlamaGqaSequenceParallelAllDropout) { check_block({true, true, false, 0.2f, 0.2f}); }
TEST(TpBlock, LlamaGqa) { check_block({true, false, false, 0.f}); }
TEST(TpBlock, LlamaGqaSequenceParallel) { check_block({true, true, false, 0.f}); }
TEST(TpBlock, LlamaGqaSequenceParallelRerun) { check_block({true, true, true, 0.f}); }
TEST(TpBlock, LlamaMoe) { check_block({true, false, false, 0.f, 0.f, true}); }
TEST(TpBlock, LlamaMoeSequenceParallel) { check_block({true, true, false, 0.f, 0.f, true}); }
TEST(TpBlock, LlamaMoeSequenceParallelRerun) { check_block({true, true, true, 0.f, 0.f, true}); }
TEST(TpBlock, LlamaMoeSequenceParallelSelective) {
  check_block({true, true, false, 0.2f, 0.f, true, true});
}
TEST(TpBlock, LlamaMoeSelective) { check_block({true, false, false, 0.f, 0.f, true, true}); }

TEST(TpBlock, IndivisibleHeadsAreAnError) {
  CommTpGroup g(testing::world());
  if (g.size() == 1) GTEST_SKIP() << "nothing is split on one rank";
  nn::BlockSpec spec;
  spec.n_embd = 12, spec.mlp_hidden = 8 * g.size();
  spec.attention.n_head = 3, spec.attention.n_kv_head = 3, spec.attention.head_dim = 4;
  nn::TransformerBlock b("h.0.", spec);
  try {
    b.shard(block_placement(kDecoderParallelTables.tp.value(), g, false));
    FAIL() << "3 heads split over " << g.size();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.attn.c_attn.weight: 3 query heads"), std::string::npos) << e.what();
  }
}

TEST(TpBlock, IndivisibleExpertsAreAnError) {
  CommTpGroup g(testing::world());
  if (g.size() == 1) GTEST_SKIP() << "nothing is split on one rank";
  nn::BlockSpec spec;
  spec.n_embd = 16, spec.mlp = nn::MlpKind::SwiGLU, spec.bias = false;
  spec.attention.n_head = 4, spec.attention.n_kv_head = 4, spec.attention.head_dim = 4;
  for (const auto& [F, Fs, what] :
       {std::tuple{3 * g.size() + 1, 0, "h.0.mlp.experts.gate_up_proj.weight: each expert's"},
        std::tuple{4 * g.size(), 3, "h.0.mlp.shared_experts.gate_up_proj.weight: dimension 0"}}) {
    spec.moe = nn::MoeSpec{.num_experts = 2, .top_k = 1, .expert_hidden = F, .shared_hidden = Fs};
    nn::TransformerBlock b("h.0.", spec);
    try {
      b.shard(block_placement(kDecoderParallelTables.tp.value(), g, false));
      FAIL() << "F = " << F << ", Fs = " << Fs << " split over " << g.size();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln
