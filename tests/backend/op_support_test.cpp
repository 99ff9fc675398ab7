// Backend::supports answers truthfully: every op of backend/op_list.h, on every backend
// that computes here (each of available_backends(), the Profiling backend wrapping the
// CPU), with fp32, bf16 and fp16: supports() is true exactly where the op, called on tiny
// valid arguments of that dtype, does not throw. The Meta backend answers as the backend
// it stands for, and runs every op that backend supports (its ops only check arguments:
// a plan may go where the kernels do not yet, e.g. `kiln memplan`'s context-parallel
// layouts on CUDA). The CUDA backend's answers, which a machine without a GPU cannot
// run, are checked as a table: fp32 and bf16 for every op (ring attention's tile ops
// among them); fp16 too for the ops whose tensors have fixed dtypes (the
// mixture-of-experts router and plan among them) and for copy_columns, a copy.
//
// The ops come from op_list.h: a new op without its tiny call below fails to compile.
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/meta/meta_backend.h"
#include "backend/op_list.h"
#include "backend/registry.h"
#include "core/error.h"
#include "profile/profiling_backend.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kiln {
namespace {

constexpr DType kFloats[] = {DType::F32, DType::BF16, DType::F16};
constexpr DType kOthers[] = {DType::I32, DType::F64};

// Tiny valid arguments: B = 1 sequence of T = 2 tokens, C = 4 channels in NH = 2 heads of
// HD = 2, a vocabulary of V = 4; activations and parameters in `dt`, statistics in their
// fixed dtypes. Values are small constants (0.1), token ids and targets 0.
struct Tiny {
  static constexpr int64_t B = 1, T = 2, N = B * T, C = 4, NH = 2, V = 4;
  Backend& be;
  DType dt;
  Stream s = be.default_stream();
  AttentionShape shape = AttentionShape::mha(NH, C);

  Tensor make(const Shape& shape, DType dtype, float value) {
    Tensor t = be.empty(shape, dtype, MemCategory::Activations);
    be.fill(s, t, value);
    return t;
  }
  Tensor act(const Shape& shape) { return make(shape, dt, 0.1f); }
  Tensor f32(const Shape& shape, float value = 0.1f) { return make(shape, DType::F32, value); }
  Tensor f64(const Shape& shape) { return make(shape, DType::F64, 0.f); }
  Tensor ids(const Shape& shape) { return make(shape, DType::I32, 0.f); }
  Tensor ids(const Shape& shape, const std::vector<int32_t>& values) {
    Tensor t = be.empty(shape, DType::I32, MemCategory::Activations);
    be.copy_from_host(s, t, values.data());
    return t;
  }
  // MoE: the N tokens' k = 2 slots in expert order (a permutation of [0, 2N)), and the
  // offsets of 2N rows over two experts (3 rows and 1).
  Tensor moe_rows() { return ids({N, 2}, {0, 1, 2, 3}); }
  Tensor moe_offsets() { return ids({3}, {0, 3, 4}); }
  // cu_seqlens of two one-token documents.
  Tensor documents() { return ids({3}, {0, 1, 2}); }
};

// One call of each op on Tiny's arguments, named after the Backend method.
namespace tiny {
using S = Tiny;

void embedding_forward(S& t) {
  t.be.embedding_forward(t.s, t.act({S::B, S::T, S::C}), t.ids({S::B, S::T}), Tensor(),
                         t.act({S::V, S::C}), t.act({S::T, S::C}));
}
void embedding_backward(S& t) {
  t.be.embedding_backward(t.s, t.act({S::V, S::C}), t.act({S::T, S::C}),
                          t.act({S::B, S::T, S::C}), t.ids({S::B, S::T}), Tensor());
}
void layernorm_forward(S& t) {
  t.be.layernorm_forward(t.s, t.act({S::N, S::C}), t.f32({S::N}), t.f32({S::N}),
                         t.act({S::N, S::C}), t.act({S::C}), t.act({S::C}), 1e-5f);
}
void layernorm_backward(S& t) {
  t.be.layernorm_backward(t.s, t.act({S::N, S::C}), t.act({S::C}), t.act({S::C}),
                          t.act({S::N, S::C}), t.act({S::N, S::C}), t.act({S::C}),
                          t.f32({S::N}), t.f32({S::N}, 1.f));
}
void rmsnorm_forward(S& t) {
  t.be.rmsnorm_forward(t.s, t.act({S::N, S::C}), t.f32({S::N}), t.act({S::N, S::C}),
                       t.act({S::C}), 1e-5f);
}
void rmsnorm_backward(S& t) {
  t.be.rmsnorm_backward(t.s, t.act({S::N, S::C}), t.act({S::C}), t.act({S::N, S::C}),
                        t.act({S::N, S::C}), t.act({S::C}), t.f32({S::N}, 1.f));
}
void linear_forward(S& t) {
  t.be.linear_forward(t.s, t.act({S::N, S::V}), t.act({S::N, S::C}), t.act({S::V, S::C}),
                      t.act({S::V}));
}
void linear_backward(S& t) {
  t.be.linear_backward(t.s, t.act({S::N, S::C}), t.act({S::V, S::C}), t.act({S::V}),
                       t.act({S::N, S::V}), t.act({S::N, S::C}), t.act({S::V, S::C}));
}
void fp8_amax(S& t) { t.be.fp8_amax(t.s, t.f32({1}), t.act({S::N, S::C})); }
void fp8_amax_history(S& t) {
  t.be.fp8_amax_history(t.s, t.f32({2, 3}), t.f32({2, 4, 3}), t.f32({2, 3}), 1, false);
}
void fp8_linear_forward(S& t) {
  t.be.fp8_linear_forward(t.s, t.act({S::N, S::V}), t.act({S::N, S::C}), t.act({S::V, S::C}),
                          t.act({S::V}), t.f32({3}));
}
void fp8_linear_backward(S& t) {
  t.be.fp8_linear_backward(t.s, t.act({S::N, S::C}), t.act({S::V, S::C}), t.act({S::V}),
                           t.act({S::N, S::V}), t.act({S::N, S::C}), t.act({S::V, S::C}),
                           t.f32({3}));
}
void attention_forward(S& t) {
  t.be.attention_forward(t.s, t.act({S::B, S::T, S::C}), t.f32({S::B, S::NH, S::T}),
                         t.act({S::B, S::T, 3 * S::C}), t.shape, DropoutSpec{});
}
void attention_backward(S& t) {
  t.be.attention_backward(t.s, t.act({S::B, S::T, 3 * S::C}), t.act({S::B, S::T, S::C}),
                          t.act({S::B, S::T, 3 * S::C}), t.act({S::B, S::T, S::C}),
                          t.f32({S::B, S::NH, S::T}), t.shape, DropoutSpec{});
}
void attention_varlen_forward(S& t) {
  t.be.attention_varlen_forward(t.s, t.act({S::B, S::T, S::C}), t.f32({S::B, S::NH, S::T}),
                                t.act({S::B, S::T, 3 * S::C}), t.documents(), t.shape,
                                DropoutSpec{});
}
void attention_varlen_backward(S& t) {
  t.be.attention_varlen_backward(t.s, t.act({S::B, S::T, 3 * S::C}), t.act({S::B, S::T, S::C}),
                                 t.act({S::B, S::T, 3 * S::C}), t.act({S::B, S::T, S::C}),
                                 t.f32({S::B, S::NH, S::T}), t.documents(), t.shape,
                                 DropoutSpec{});
}
AttentionTile diagonal_tile() { return AttentionTile{0, S::T, 0, S::T, true}; }
void attention_tile_forward(S& t) {
  t.be.attention_tile_forward(t.s, t.f32({S::B, S::T, S::C}), t.f32({S::B, S::NH, S::T}),
                              t.act({S::B, S::T, 3 * S::C}), t.act({S::B, S::T, 2 * S::C}),
                              Tensor(), t.shape, diagonal_tile());
}
void attention_tile_backward(S& t) {
  t.be.attention_tile_backward(t.s, t.f32({S::B, S::T, S::C}), t.f32({S::B, S::T, 2 * S::C}),
                               t.act({S::B, S::T, S::C}), t.act({S::B, S::T, 3 * S::C}),
                               t.act({S::B, S::T, 2 * S::C}), t.act({S::B, S::T, S::C}),
                               t.f32({S::B, S::NH, S::T}), Tensor(), t.shape, diagonal_tile());
}
void copy_columns(S& t) {
  t.be.copy_columns(t.s, t.act({S::N, 2 * S::C}), t.act({S::N, 3 * S::C}), 0, S::C, 2 * S::C);
}
void attention_decode(S& t) {
  t.be.attention_decode(t.s, t.act({S::B, 1, S::C}), t.act({S::B, S::T, S::C}),
                        t.act({S::B, S::T, S::C}), t.act({S::B, 1, 3 * S::C}), 0, t.shape);
}
void rope_forward(S& t) {
  t.be.rope_forward(t.s, t.act({S::B, S::T, 3 * S::C}), Tensor(), t.shape, RopeSpec{});
}
void rope_backward(S& t) {
  t.be.rope_backward(t.s, t.act({S::B, S::T, 3 * S::C}), Tensor(), t.shape, RopeSpec{});
}
void gelu_forward(S& t) { t.be.gelu_forward(t.s, t.act({S::N, S::C}), t.act({S::N, S::C})); }
void gelu_backward(S& t) {
  t.be.gelu_backward(t.s, t.act({S::N, S::C}), t.act({S::N, S::C}), t.act({S::N, S::C}));
}
void silu_forward(S& t) { t.be.silu_forward(t.s, t.act({S::N, S::C}), t.act({S::N, S::C})); }
void silu_backward(S& t) {
  t.be.silu_backward(t.s, t.act({S::N, S::C}), t.act({S::N, S::C}), t.act({S::N, S::C}));
}
void swiglu_forward(S& t) {
  t.be.swiglu_forward(t.s, t.act({S::N, S::C}), t.act({S::N, 2 * S::C}));
}
void swiglu_backward(S& t) {
  t.be.swiglu_backward(t.s, t.act({S::N, 2 * S::C}), t.act({S::N, S::C}),
                       t.act({S::N, 2 * S::C}));
}
void add(S& t) { t.be.add(t.s, t.act({S::N, S::C}), t.act({S::N, S::C}), t.act({S::N, S::C})); }
void add_columns(S& t) {
  t.be.add_columns(t.s, t.act({S::N, 3 * S::C}), t.act({S::N, S::C}), S::C, 0.5f);
}
void modulate(S& t) {
  t.be.modulate(t.s, t.act({S::B, S::T, S::C}), t.act({S::B, S::T, S::C}),
                t.act({S::B, 2, S::C}), 0, 1, 1.f);
}
void modulate_backward(S& t) {
  t.be.modulate_backward(t.s, t.act({S::B, S::T, S::C}), t.act({S::B, 2, S::C}),
                         t.act({S::B, S::T, S::C}), t.act({S::B, S::T, S::C}),
                         t.act({S::B, 2, S::C}), 0, 1, 1.f);
}
DropoutSpec half_dropout() { return DropoutSpec{0.5f, 1, 2}; }
void dropout_forward(S& t) {
  t.be.dropout_forward(t.s, t.act({S::N, S::C}), t.act({S::N, S::C}), half_dropout());
}
void dropout_backward(S& t) {
  t.be.dropout_backward(t.s, t.act({S::N, S::C}), t.act({S::N, S::C}), half_dropout());
}
void softmax_cross_entropy(S& t) {
  t.be.softmax_cross_entropy(t.s, t.f32({S::N}), t.act({S::N, S::V}), t.act({S::N, S::V}),
                             t.ids({S::N}), S::V, -1, 1.f);
}
void cross_entropy_shard_stats(S& t) {
  t.be.cross_entropy_shard_stats(t.s, t.f32({S::N, 3}), t.act({S::N, S::V}), t.ids({S::N}), 0,
                                 S::V);
}
void cross_entropy_shard_backward(S& t) {
  t.be.cross_entropy_shard_backward(t.s, t.act({S::N, S::V}), t.act({S::N, S::V}),
                                    t.ids({S::N}), t.f32({S::N}), 0, S::V, -1, 1.f);
}
void shard_ids(S& t) { t.be.shard_ids(t.s, t.ids({S::N}), t.ids({S::N}), 0, S::V); }
// 4 x 4 one-channel images in patches of 2: 4 patches of 4 elements.
void patchify(S& t) { t.be.patchify(t.s, t.act({S::B, 4, 4}), t.f32({S::B, 4, 4, 1}), 2); }
void unpatchify(S& t) { t.be.unpatchify(t.s, t.f32({S::B, 4, 4, 1}), t.act({S::B, 4, 4}), 2); }
void rectified_flow_inputs(S& t) {
  t.be.rectified_flow_inputs(t.s, t.f32({S::B, S::C}), t.f32({S::B, S::C}), t.f32({S::B, S::C}),
                             t.f32({S::B, S::C}), t.f32({S::B}, 0.5f));
}
void mse_loss(S& t) {
  t.be.mse_loss(t.s, t.f32({S::B}), t.act({S::B, S::C}), t.act({S::B, S::C}),
                t.f32({S::B, S::C}), 1.f);
}
void accumulate_loss(S& t) {
  t.be.accumulate_loss(t.s, t.f64({2}), t.f32({S::N}), t.ids({S::N}));
}
void cross_entropy_shard_combine(S& t) {
  t.be.cross_entropy_shard_combine(t.s, t.f32({S::N}), t.f64({2}), t.f32({S::N, 3}, 1.f),
                                   t.ids({S::N}));
}
void sum_squares(S& t) { t.be.sum_squares(t.s, t.f64({1}), t.act({S::C})); }
void clip_coefficient(S& t) {
  t.be.clip_coefficient(t.s, t.f32({1}), t.f64({1}), t.f64({1}), 1.0, 1.f);
}
void adamw_step(S& t) {
  t.be.adamw_step(t.s, t.act({S::C}), t.act({S::C}), t.f32({S::C}), t.f32({S::C}), Tensor(),
                  AdamWParams{});
}
// Low-precision parameters with their fp32 master weights, as the trainer keeps them.
void adamw_multi_step(S& t) {
  AdamWTensor x;
  x.param = t.act({S::C});
  if (t.dt != DType::F32) x.master = t.f32({S::C});
  x.grad = t.act({S::C});
  x.m = t.f32({S::C});
  x.v = t.f32({S::C});
  const AdamWTensor tensors[] = {x};
  t.be.adamw_multi_step(t.s, tensors, Tensor(), AdamWParams{});
}
void ema_update(S& t) { t.be.ema_update(t.s, t.f32({S::C}), t.act({S::C}), 0.9f); }
// A router of V = 4 experts, k = 2; its tensors have fixed dtypes (fp32 logits, int32 ids).
MoeRouterSpec moe_spec() { return MoeRouterSpec{MoeScoring::Softmax, 2, true}; }
void moe_router_forward(S& t) {
  t.be.moe_router_forward(t.s, t.f32({S::N, S::V}), t.ids({S::N, 2}), t.f32({S::N, 2}),
                          t.f32({S::N, S::V}), t.f32({S::V}), moe_spec());
}
void moe_router_backward(S& t) {
  t.be.moe_router_backward(t.s, t.f32({S::N, S::V}), t.f32({S::N, 2}), t.f32({S::N, S::V}),
                           t.f32({S::N, S::V}), t.moe_rows(), moe_spec());
}
void moe_balance_stats(S& t) {
  t.be.moe_balance_stats(t.s, t.f32({S::V}), t.f32({S::V}), t.f32({1}), t.f32({S::N, S::V}),
                         t.moe_rows(), MoeScoring::Softmax, 0.5f, 0.25f);
}
void moe_balance_backward(S& t) {
  t.be.moe_balance_backward(t.s, t.f32({S::N, S::V}), t.f32({S::N, S::V}), t.f32({S::V}),
                            MoeScoring::Sigmoid, 0.5f, 0.25f);
}
void moe_permute_plan(S& t) {
  t.be.moe_permute_plan(t.s, t.ids({S::V + 1}), t.ids({S::N, 2}), t.ids({S::N, 2}), 0);
}
void moe_permute(S& t) {
  t.be.moe_permute(t.s, t.act({2 * S::N, S::C}), t.act({S::N, S::C}), t.moe_rows());
}
void moe_permute_backward(S& t) {
  t.be.moe_permute_backward(t.s, t.act({S::N, S::C}), t.act({2 * S::N, S::C}), t.moe_rows());
}
void moe_unpermute(S& t) {
  t.be.moe_unpermute(t.s, t.act({S::N, S::C}), t.act({2 * S::N, S::C}), t.f32({S::N, 2}),
                     t.moe_rows());
}
void moe_unpermute_backward(S& t) {
  t.be.moe_unpermute_backward(t.s, t.act({2 * S::N, S::C}), t.f32({S::N, 2}),
                              t.act({S::N, S::C}), t.act({2 * S::N, S::C}), t.f32({S::N, 2}),
                              t.moe_rows());
}
void grouped_linear_forward(S& t) {
  t.be.grouped_linear_forward(t.s, t.act({2 * S::N, S::V}), t.act({2 * S::N, S::C}),
                              t.act({2, S::V, S::C}), t.moe_offsets());
}
void grouped_linear_backward(S& t) {
  t.be.grouped_linear_backward(t.s, t.act({2 * S::N, S::C}), t.act({2, S::V, S::C}),
                               t.act({2 * S::N, S::V}), t.act({2 * S::N, S::C}),
                               t.act({2, S::V, S::C}), t.moe_offsets());
}

}  // namespace tiny

std::unique_ptr<Backend> meta_for(Device device) {
  MetaBackendOptions o;
  o.device = device;
  return make_meta_backend(o);
}

void call_tiny(Backend& be, Op op, DType dt) {
  Tiny t{be, dt};
  switch (op) {
#define KILN_TINY_CALL(Call, method, family, category, params, args) \
  case Op::Call:                                                     \
    tiny::method(t);                                                 \
    break;
    KILN_BACKEND_OPS(KILN_TINY_CALL)
#undef KILN_TINY_CALL
  }
  be.synchronize(t.s);
}

// A backend under test: `exact`, supports() is true exactly where the op runs; otherwise
// (the Meta backend) only where it is true must the op run.
struct Subject {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
  bool exact = true;
};

std::vector<Subject> subjects() {
  std::vector<Subject> v;
  for (const auto& be : available_backends()) {
    const std::string name = be->name() == "cuda" ? "cuda:0" : be->name();
    v.push_back({name, [name] { return make_backend(name); }});
  }
  v.push_back({"profiling over the cpu",
               [] { return std::make_unique<profile::ProfilingBackend>(make_backend("cpu")); }});
  v.push_back({"meta (standing for the cpu)", [] { return make_meta_backend(); }, false});
  v.push_back({"meta (standing for cuda)", [] { return meta_for(Device::cuda(0)); }, false});
  return v;
}

// The error op(dt) throws on tiny arguments, or "" when it runs.
std::string tiny_error(Backend& be, Op op, DType dt) {
  try {
    call_tiny(be, op, dt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OpSupport, TrueExactlyWhereTheOpRuns) {
  for (const Subject& subject : subjects()) {
    const std::unique_ptr<Backend> be = subject.make();
    for (Op op : kAllOps) {
      for (DType dt : kFloats) {
        const std::string error = tiny_error(*be, op, dt);
        const bool says = be->supports(op, dt);
        if (!subject.exact && !says) continue;
        EXPECT_EQ(says, error.empty())
            << subject.name << ": " << op_name(op) << " in " << dtype_name(dt)
            << ": supports() says " << (says ? "yes" : "no")
            << (error.empty() ? ", but it runs" : ", but it throws: " + error);
      }
      for (DType dt : kOthers)
        EXPECT_FALSE(be->supports(op, dt)) << subject.name << ": " << op_name(op) << " in "
                                           << dtype_name(dt);
    }
  }
}

// On CUDA in fp16, ring attention's copy_columns runs but its tiles do not: the family
// does not, and the first op that does not is named.
TEST(OpSupport, AFamilyIsSupportedWhenEachOfItsOpsIs) {
  const std::unique_ptr<Backend> meta = meta_for(Device::cuda(0));
  EXPECT_TRUE(meta->supports(Op::CopyColumns, DType::F16));
  EXPECT_FALSE(meta->supports(OpFamily::RingAttention, DType::F16));
  ASSERT_TRUE(meta->unsupported_op(OpFamily::RingAttention, DType::F16).has_value());
  EXPECT_EQ(*meta->unsupported_op(OpFamily::RingAttention, DType::F16),
            Op::AttentionTileForward);
  EXPECT_TRUE(meta->supports(OpFamily::RingAttention, DType::BF16));
  EXPECT_TRUE(meta->supports(OpFamily::Linear, DType::BF16));
  EXPECT_FALSE(meta->unsupported_op(OpFamily::Linear, DType::BF16).has_value());
  EXPECT_FALSE(meta->supports(OpFamily::Linear, DType::F16));
  for (Op op : kAllOps) EXPECT_STRNE(family_name(op_family(op)), "?") << op_name(op);
}

// A feature's refusal names the op, the backend and the key (the trainer's parallel.cp).
TEST(OpSupport, RequireOpsNamesTheOpTheBackendAndTheKey) {
  const std::unique_ptr<Backend> meta = meta_for(Device::cuda(0));
  try {
    require_ops(*meta, OpFamily::RingAttention, DType::F16, "run.toml: parallel.cp = 2");
    FAIL() << "require_ops accepted fp16 ring attention on a backend standing for cuda";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "run.toml: parallel.cp = 2 needs attention_tile_forward, which the "
                           "meta backend does not run with fp16");
  }
  EXPECT_NO_THROW(require_ops(*meta, OpFamily::RingAttention, DType::BF16, "parallel.cp"));
  EXPECT_NO_THROW(require_ops(*meta, OpFamily::Attention, DType::BF16, "attention"));
}

// The CUDA backend's table, without a GPU: the kernels (the varlen attention's and ring
// attention's tiles among them) run fp32 and bf16, and the ops whose tensors have fixed
// dtypes (the MoE router and plan among them) and copy_columns any float dtype.
static_assert(cuda_supports(Op::AttentionTileForward, DType::F32));
static_assert(cuda_supports(Op::AttentionVarlenForward, DType::BF16));
static_assert(!cuda_supports(Op::AttentionVarlenBackward, DType::F16));
static_assert(cuda_supports(Op::GroupedLinearForward, DType::BF16));
static_assert(!cuda_supports(Op::GroupedLinearBackward, DType::F16));
static_assert(!cuda_supports(Op::MoeUnpermute, DType::F16));
static_assert(cuda_supports(Op::MoeRouterForward, DType::F32));
static_assert(cuda_supports(Op::MoePermutePlan, DType::F16));  // fixed dtypes: every float
static_assert(cpu_supports(Op::GroupedLinearBackward, DType::BF16));
static_assert(cpu_supports(Op::MoeRouterForward, DType::F16));  // fixed dtypes: every float
static_assert(cuda_supports(Op::AttentionTileBackward, DType::BF16));
static_assert(!cuda_supports(Op::AttentionTileBackward, DType::F16));
static_assert(cuda_supports(Op::CopyColumns, DType::F32));
static_assert(cuda_supports(Op::CopyColumns, DType::F16));  // a copy: every float
static_assert(cuda_supports(Op::AttentionForward, DType::BF16));
static_assert(!cuda_supports(Op::LinearForward, DType::F16));
static_assert(cuda_supports(Op::AddColumns, DType::BF16));
static_assert(!cuda_supports(Op::AddColumns, DType::F16));  // as add: fp32 and bf16
static_assert(cpu_supports(Op::AddColumns, DType::F16));
static_assert(cpu_supports(Op::AttentionTileForward, DType::F16));
static_assert(!cpu_supports(Op::AdamW, DType::BF16));  // fp32 parameters only

TEST(OpSupport, CudaTable) {
  for (Op op : kAllOps) {
    for (DType dt : {DType::F32, DType::BF16})
      EXPECT_TRUE(cuda_supports(op, dt)) << op_name(op) << " in " << dtype_name(dt);
    for (DType dt : kOthers) EXPECT_FALSE(cuda_supports(op, dt)) << op_name(op);
  }
  EXPECT_TRUE(cuda_supports(Op::CopyColumns, DType::F16));
  EXPECT_FALSE(cuda_supports(Op::AttentionTileForward, DType::F16));
  EXPECT_FALSE(cuda_supports(Op::AttentionTileBackward, DType::F16));
  // The MoE family: the router, its statistics and the plan (fp32 and int32 tensors)
  // for every float dtype; the permutations and the grouped linear not in fp16.
  for (Op op : kAllOps) {
    if (op_family(op) != OpFamily::MoE) continue;
    const bool fixed = op == Op::MoeRouterForward || op == Op::MoeRouterBackward ||
                       op == Op::MoeBalanceStats || op == Op::MoeBalanceBackward ||
                       op == Op::MoePermutePlan;
    EXPECT_EQ(cuda_supports(op, DType::F16), fixed) << op_name(op) << " in fp16";
  }
}

// The Meta backend answers as the backend of its device.
TEST(OpSupport, MetaAnswersAsTheBackendItStandsFor) {
  const std::unique_ptr<Backend> as_cuda = meta_for(Device::cuda(0));
  const std::unique_ptr<Backend> as_cpu = make_meta_backend();
  for (Op op : kAllOps)
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::F64}) {
      EXPECT_EQ(as_cuda->supports(op, dt), cuda_supports(op, dt)) << op_name(op);
      EXPECT_EQ(as_cpu->supports(op, dt), cpu_supports(op, dt)) << op_name(op);
    }
}

}  // namespace
}  // namespace kiln
