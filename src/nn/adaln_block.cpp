#include "nn/adaln_block.h"

#include <algorithm>

namespace kiln::nn {

namespace {

AdaLNStreamSpec stream_spec(const AdaLNBlockSpec& spec) {
  AdaLNStreamSpec s;
  s.n_embd = spec.n_embd;
  s.norm_eps = spec.norm_eps;
  s.mlp_hidden = spec.mlp_hidden;
  s.init_std = spec.init_std;
  return s;
}

}  // namespace

AdaLNBlock::AdaLNBlock(const std::string& prefix, const AdaLNBlockSpec& spec)
    : spec_(spec),
      stream_(prefix, stream_spec(spec)),
      attn_(prefix + "attn.qkv", prefix + "attn.proj", spec.n_embd, spec.attention,
            /*bias=*/true, spec.init_std, spec.init_std) {
  KILN_CHECK(spec.attention.q_width() == spec.n_embd,
             "adaLN block {}: attention width {} x {} must equal n_embd {}", prefix,
             spec.attention.n_head, spec.attention.head_dim, spec.n_embd);
  KILN_CHECK(!spec.attention.qk_norm, "adaLN block {}: no QK-norm (its scratch has none)", prefix);
  kAttn = stream_.num_pre_saved();
  kPost = kAttn + attn_.num_saved();
  kNumSaved = kPost + stream_.num_post_saved();
}

std::vector<SavedSpec> AdaLNBlock::saved_specs(int64_t B, int64_t T, DType dtype) const {
  std::vector<SavedSpec> out = stream_.pre_saved_specs(B, T, dtype);
  for (auto& sp : attn_.saved_specs(B, T, dtype)) out.push_back(sp);
  for (auto& sp : stream_.post_saved_specs(B, T, dtype)) out.push_back(sp);
  KILN_CHECK(out.size() == kNumSaved, "adaLN block: {} saved tensors, expected {}", out.size(),
             kNumSaved);
  return out;
}

AdaLNScratch AdaLNBlock::make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const {
  const int64_t C = spec_.n_embd;
  const int64_t big = std::max(stream_.mlp_width(), attn_.local_spec().qkv_width());
  auto act = [&](Shape s) { return be.empty(s, dtype, MemCategory::Activations); };
  return {act({B, T, C}), act({B, T, C}),   act({B, T, C}), act({B, T, attn_.local_spec().q_width()}),
          act({B, T, big}), act({B, 6, C}), act({B, C})};
}

void AdaLNBlock::forward(const AdaLNPass& p, const Tensor& x, const Tensor& out) const {
  const auto pre = p.saved.subspan(0, kAttn);
  const auto at = p.saved.subspan(kAttn, attn_.num_saved());
  const auto post = p.saved.subspan(kPost, stream_.num_post_saved());
  const AdaLNStreamPass sp = stream_pass(p);
  stream_.pre_forward(sp, pre, x);
  attn_.forward(p.be, p.s, at, stream_.attention_output(post), stream_.attention_input(pre),
                Tensor(), Tensor(), DropoutSpec{});
  stream_.post_forward(sp, pre, post, x, out, p.scratch.tmp.view_at(0, x.shape()));
}

void AdaLNBlock::backward(const AdaLNPass& p, const Tensor& dres, const Tensor& x,
                          const Tensor& out) const {
  const auto pre = p.saved.subspan(0, kAttn);
  const auto at = p.saved.subspan(kAttn, attn_.num_saved());
  const auto post = p.saved.subspan(kPost, stream_.num_post_saved());
  const AdaLNStreamPass sp = stream_pass(p);
  const AdaLNScratch& w = p.scratch;
  // Recompute what forward did not keep (the same kernels on the same inputs, bitwise).
  if (p.rerun) {
    forward(p, x, out);
  } else if (p.recompute_cheap) {
    stream_.recompute_cheap(sp, post);
  }
  const int64_t B = x.size(0), T = x.size(1);
  const Tensor d1 = w.dtmp.view_at(0, x.shape()), d2 = w.dtmp2.view_at(0, x.shape());
  stream_.post_backward(sp, pre, post, dres, d1, d1, d2,
                        w.dbig.view_at(0, Shape{B, T, stream_.mlp_width()}), w.dmod);
  // d1 = dL/d(attention output); d2 = dL/d(attention input)
  attn_.backward(p.be, p.s, at, d2, d1, stream_.attention_input(pre), w.dattn,
                 w.dbig.view_at(0, Shape{B, T, attn_.local_spec().qkv_width()}), Tensor(),
                 Tensor(), DropoutSpec{});
  stream_.pre_backward(sp, pre, dres, d2, x, w.dmod, w.dcond);
}

void AdaLNBlock::collect(std::vector<Param*>& out) {
  attn_.collect(out);
  stream_.collect(out);
}

double AdaLNBlock::matmul_weights() const {
  const double C = static_cast<double>(spec_.n_embd);
  return 4.0 * C * C + stream_.matmul_weights();
}

}  // namespace kiln::nn
