// Attention over documents packed into the sequences (Backend::attention_varlen_forward):
// random cu_seqlens at awkward sizes (one-token documents, documents longer than a CPU
// row block or a CUDA tile, a document cut by a sequence's end, empty documents padding
// cu_seqlens), forward and backward against the double reference run on each document
// alone (fp32, and bf16 where the backend runs it: on CUDA the tensor-core kernels); and
// the dropout mask of one document per sequence, which must be the whole-sequence op's.
// The tile ops with documents are in op_test_attention_tiles.cpp.
#include "core/dtype.h"
#include "op_harness.h"

#include <algorithm>
#include <sstream>

namespace kiln::test {
namespace {

struct VarlenCfg {
  int B, T, NH, NKV, HD;
  bool causal;
  std::vector<int32_t> cu;  // empty: random
};

// Bounds by norm of one dtype's run: out, lse, dqkv.
struct Bounds {
  double out, lse, dqkv;
};

class AttentionVarlenTest : public OpTest {
 protected:
  // 0, `cuts` random points of (0, B*T) (repeats: empty documents), B*T, then `pad` more
  // B*T (a fixed-size cu_seqlens).
  std::vector<int32_t> random_documents(int64_t total, int cuts, int pad) {
    std::vector<int32_t> cu{0};
    for (int i = 0; i < cuts; ++i) cu.push_back(randint(1, static_cast<int>(total) - 1));
    std::sort(cu.begin(), cu.end());
    for (int i = 0; i <= pad; ++i) cu.push_back(static_cast<int32_t>(total));
    return cu;
  }
  // x rounded to bf16 (in place: the reference then sees the backend's inputs) on the device.
  Tensor upload_bf16(std::vector<float>& x, const Shape& shape) {
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
    Tensor t = be().empty(shape, DType::BF16, MemCategory::Activations);
    be().copy(st(), t, upload(x, shape));
    return t;
  }
  Tensor poisoned_bf16(const Shape& shape) {
    Tensor t = be().empty(shape, DType::BF16, MemCategory::Activations);
    be().copy(st(), t, poisoned(shape));
    return t;
  }
  std::vector<float> download_bf16(const Tensor& t) {
    Tensor f = be().empty(t.shape(), DType::F32, MemCategory::Activations);
    be().copy(st(), f, t);
    return download(f);
  }
  // The tensors of dtype dt (fp32 or bf16; bf16 rounds x in place first).
  Tensor upload_as(DType dt, std::vector<float>& x, const Shape& shape) {
    return dt == DType::BF16 ? upload_bf16(x, shape) : upload(x, shape);
  }
  Tensor poisoned_as(DType dt, const Shape& shape) {
    return dt == DType::BF16 ? poisoned_bf16(shape) : poisoned(shape);
  }
  std::vector<float> download_as(const Tensor& t) {
    return t.dtype() == DType::BF16 ? download_bf16(t) : download(t);
  }

  // Case c in dtype dt (cu_seqlens random with up to max_cuts documents when c has none)
  // forward and backward against the double reference run on each document alone.
  void check_documents(const VarlenCfg& c, DType dt, int max_cuts, const Bounds& tol) {
    const int64_t N = int64_t{c.B} * c.T;
    const std::vector<int32_t> cu =
        c.cu.empty() ? random_documents(N, randint(1, max_cuts), randint(0, 3)) : c.cu;
    std::ostringstream os;
    os << dtype_name(dt) << " B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV
       << " HD=" << c.HD << (c.causal ? " causal" : " bidirectional") << " cu_seqlens=";
    for (const int32_t x : cu) os << x << ' ';
    const std::string what = os.str(), tag = std::string(dtype_name(dt)) + " ";
    const int C = c.NH * c.HD, W = (c.NH + 2 * c.NKV) * c.HD;
    const AttentionShape shape{c.NH, c.NKV, c.HD, c.causal};
    const ref::Attn ra{c.B, c.T, c.NH, c.NKV, c.HD, c.causal};

    std::vector<float> qkv = randn(N * W, 1.3f);
    const Tensor tq = upload_as(dt, qkv, {c.B, c.T, W});
    const Tensor tcu = upload_i32(cu, {static_cast<int64_t>(cu.size())});
    Tensor out = poisoned_as(dt, {c.B, c.T, C}), lse = poisoned({c.B, c.NH, c.T});
    be().attention_varlen_forward(st(), out, lse, tq, tcu, shape, DropoutSpec{});
    Vec rout, rlse;
    ref::attention_documents_forward(rout, rlse, to_double(qkv), ra, cu);
    EXPECT_TRUE(near_by_norm(tag + "attention_varlen_forward out", download_as(out), rout, tol.out))
        << what;
    EXPECT_TRUE(near_by_norm(tag + "attention_varlen_forward lse", download(lse), rlse, tol.lse))
        << what;

    std::vector<float> dout = randn(N * C);
    const Tensor tdout = upload_as(dt, dout, {c.B, c.T, C});
    Tensor dqkv = poisoned_as(dt, {c.B, c.T, W});
    be().attention_varlen_backward(st(), dqkv, tdout, tq, out, lse, tcu, shape, DropoutSpec{});
    const Vec rd = ref::attention_documents_backward(to_double(dout), to_double(qkv), ra, cu);
    EXPECT_TRUE(near_by_norm(tag + "attention_varlen_backward dqkv", download_as(dqkv), rd,
                             tol.dqkv))
        << what;
  }
};


TEST_P(AttentionVarlenTest, MatchesEachDocumentAlone) {
  if (!be().supports(OpFamily::VarlenAttention, DType::F32))
    GTEST_SKIP() << be().name() << " has no varlen attention";
  const std::vector<VarlenCfg> cfgs{
      {1, 1, 1, 1, 1, true, {0, 1}},
      {2, 7, 2, 1, 5, true, {}},
      {1, 150, 2, 2, 8, true, {0, 3, 4, 144, 145, 150}},  // 140 tokens: many blocks and tiles
      {3, 20, 4, 2, 6, true, {}},
      {2, 9, 4, 4, 3, false, {}},
      {1, 70, 3, 1, 16, false, {0, 1, 2, 69, 70}},
      {2, 33, 2, 2, 4, true, {0, 33, 66}},  // one document per sequence
  };
  for (const VarlenCfg& c : cfgs)
    check_documents(c, DType::F32, std::max(1, c.B * c.T / 2), {1e-5, 1e-5, 1e-5});
}

// bf16 in and out (lse fp32), against the double reference on the bf16-rounded inputs.
// On CUDA, head sizes 32/64/128 run the tensor-core kernels (document windows across
// their 64-row tiles, a tile cut by a document inside it), other sizes the CUDA-core ones
// at D = 16, 64 and 128. Bounds: out and dqkv are rounded to bf16 (2^-9 relative each)
// and the tensor-core kernels also round P and dS to bf16 as mma operands, a few 1e-3 by
// norm in all; lse is fp32 over exact products of bf16 operands.
TEST_P(AttentionVarlenTest, Bf16MatchesEachDocumentAlone) {
  if (!be().supports(OpFamily::VarlenAttention, DType::BF16))
    GTEST_SKIP() << be().name() << " has no bf16 varlen attention";
  const std::vector<VarlenCfg> cfgs{
      {2, 150, 4, 2, 64, true, {}},
      {1, 200, 2, 2, 128, false, {0, 1, 70, 130, 131, 200, 200}},
      {2, 96, 2, 1, 32, true, {0, 96, 192}},  // one document per sequence
      {2, 70, 2, 2, 64, true, {0, 5, 64, 65, 140}},  // a document across both sequences
      {1, 90, 2, 1, 16, true, {}},
      {1, 130, 2, 1, 100, true, {}},  // CUDA-core kernels at D = 128 (their smaller tiles)
      {2, 50, 2, 2, 48, false, {}},
  };
  for (const VarlenCfg& c : cfgs) check_documents(c, DType::BF16, 8, {1e-2, 1e-4, 2e-2});
}

// One document per sequence is the whole-sequence attention, dropout mask included.
TEST_P(AttentionVarlenTest, OneDocumentPerSequenceIsTheWholeSequenceOp) {
  if (!be().supports(OpFamily::VarlenAttention, DType::F32))
    GTEST_SKIP() << be().name() << " has no varlen attention";
  const int B = 2, T = 19, NH = 2, NKV = 1, HD = 4, C = NH * HD, W = (NH + 2 * NKV) * HD;
  const AttentionShape shape{NH, NKV, HD, true};
  const DropoutSpec drop{.p = 0.3f, .seed = 7, .stream = 3, .offset = 11};
  const Tensor tq = upload(randn(int64_t{B} * T * W), {B, T, W});
  const Tensor tcu = upload_i32({0, T, 2 * T}, {3});
  Tensor out1 = poisoned({B, T, C}), lse1 = poisoned({B, NH, T});
  Tensor out2 = poisoned({B, T, C}), lse2 = poisoned({B, NH, T});
  be().attention_forward(st(), out1, lse1, tq, shape, drop);
  be().attention_varlen_forward(st(), out2, lse2, tq, tcu, shape, drop);
  EXPECT_TRUE(bitwise_equal("varlen out", download(out2), download(out1)));
  EXPECT_TRUE(bitwise_equal("varlen lse", download(lse2), download(lse1)));
  const Tensor dout = upload(randn(int64_t{B} * T * C), {B, T, C});
  Tensor d1 = poisoned({B, T, W}), d2 = poisoned({B, T, W});
  be().attention_backward(st(), d1, dout, tq, out1, lse1, shape, drop);
  be().attention_varlen_backward(st(), d2, dout, tq, out1, lse1, tcu, shape, drop);
  EXPECT_TRUE(bitwise_equal("varlen dqkv", download(d2), download(d1)));
}

TEST_P(AttentionVarlenTest, RejectsBadDocuments) {
  if (be().name() != "cpu") GTEST_SKIP() << "only the CPU backend reads cu_seqlens on the host";
  const int B = 1, T = 6, W = 3 * 2;
  const AttentionShape shape{1, 1, 2, true};
  const Tensor tq = upload(randn(T * W), {B, T, W});
  Tensor out = poisoned({B, T, 2}), lse = poisoned({B, 1, T});
  for (const std::vector<int32_t>& cu : std::vector<std::vector<int32_t>>{{0, 5}, {1, 6}, {0, 4, 3, 6}}) {
    const Tensor tcu = upload_i32(cu, {static_cast<int64_t>(cu.size())});
    EXPECT_THROW(be().attention_varlen_forward(st(), out, lse, tq, tcu, shape, DropoutSpec{}),
                 Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionVarlenTest, ::testing::ValuesIn(backend_names()),
                         param_name);

}  // namespace
}  // namespace kiln::test
