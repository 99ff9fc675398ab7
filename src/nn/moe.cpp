#include "nn/moe.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace kiln::nn {

int64_t moe_capacity(double capacity_factor, int64_t N, int64_t k, int64_t E) {
  if (capacity_factor <= 0.0) return 0;
  const double per_expert = static_cast<double>(N * k) / static_cast<double>(E);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(per_expert * capacity_factor)));
}

MoeMlp::MoeMlp(const std::string& prefix, int64_t C, const MoeSpec& spec, float init_std,
               float proj_init_std)
    : router(prefix + ".router.weight", Shape{spec.num_experts, C}, Init::normal(init_std), true),
      gate_up(prefix + ".experts.gate_up_proj.weight",
              Shape{spec.num_experts, 2 * spec.expert_hidden, C}, Init::normal(init_std), true),
      down(prefix + ".experts.down_proj.weight", Shape{spec.num_experts, C, spec.expert_hidden},
           Init::normal(proj_init_std), true),
      prefix_(prefix), spec_(spec), C_(C) {
  KILN_CHECK(spec.num_experts > 0 && spec.top_k >= 1 && spec.top_k <= spec.num_experts &&
                 spec.expert_hidden > 0 && C > 0,
             "{}: a MoE layer needs E > 0 experts, 1 <= k <= E and F > 0 (E = {}, k = {}, F = {})",
             prefix, spec.num_experts, spec.top_k, spec.expert_hidden);
  KILN_CHECK(spec.capacity_factor >= 0.0 && std::isfinite(spec.capacity_factor),
             "{}: the MoE capacity factor ({}) must be >= 0 (0: dropless)", prefix,
             spec.capacity_factor);
  if (spec.shared_hidden > 0)
    shared_.emplace(MlpKind::SwiGLU, prefix + ".shared_experts.gate_up_proj",
                    prefix + ".shared_experts.down_proj", C, spec.shared_hidden, /*bias=*/false,
                    init_std, proj_init_std);
}

std::vector<SavedSpec> MoeMlp::saved_specs(int64_t B, int64_t T, DType dtype) const {
  const int64_t N = B * T, E = spec_.num_experts, k = spec_.top_k, M = N * k;
  const int64_t F = spec_.expert_hidden;
  const std::string& n = router.name;
  std::vector<SavedSpec> out = {
      {n + ":logits", Shape{N, E}, DType::F32, Recompute::WithBlock},
      {n + ":scores", Shape{N, E}, DType::F32, Recompute::WithBlock},
      {n + ":expert_idx", Shape{N, k}, DType::I32, Recompute::WithBlock},
      {n + ":expert_weight", Shape{N, k}, DType::F32, Recompute::WithBlock},
      {n + ":rows", Shape{N, k}, DType::I32, Recompute::WithBlock},
      {n + ":offsets", Shape{E + 1}, DType::I32, Recompute::WithBlock},
      {gate_up.name + ":in", Shape{M, C_}, dtype, Recompute::Cheap},
      {gate_up.name + ":out", Shape{M, 2 * F}, dtype, Recompute::WithBlock},
      {down.name + ":in", Shape{M, F}, dtype, Recompute::Cheap},
      {down.name + ":out", Shape{M, C_}, dtype, Recompute::WithBlock}};
  if (shared_)
    for (auto& sp : shared_->saved_specs(B, T, dtype)) out.push_back(sp);
  return out;
}

MoeScratch MoeMlp::make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const {
  const int64_t N = B * T, E = spec_.num_experts, k = spec_.top_k;
  const int64_t wide = std::max(C_, 2 * spec_.expert_hidden);
  auto act = [&](Shape s, DType dt) { return be.empty(s, dt, MemCategory::Activations); };
  MoeScratch w;
  if (dtype != DType::F32) {
    w.x32 = act({N, C_}, DType::F32);
    w.w32 = act({E, C_}, DType::F32);
    w.dw32 = act({E, C_}, DType::F32);
    w.wtmp = act({E, C_}, dtype);
  }
  w.dlogits = act({N, E}, DType::F32);
  w.dweight = act({N, k}, DType::F32);
  w.a = act({N * k, wide}, dtype);
  w.b = act({N * k, wide}, dtype);
  w.tokens = act({N, C_}, dtype);
  if (shared_) {
    w.shared_dfc = act({B, T, shared_->fc_width()}, dtype);
    w.shared_dact = act({B, T, shared_->hidden()}, dtype);
  }
  return w;
}

void MoeMlp::route(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& x,
                   const MoeScratch& w, int64_t capacity) const {
  if (x.dtype() == DType::F32) {
    be.linear_forward(s, saved[kLogits], x, router.v(), Tensor());
  } else {
    be.copy(s, w.x32, x);
    be.copy(s, w.w32, router.v());
    be.linear_forward(s, saved[kLogits], w.x32, w.w32, Tensor());
  }
  be.moe_router_forward(s, saved[kScores], saved[kExpertIdx], saved[kExpertWeight],
                        saved[kLogits], expert_bias, spec_.router());
  be.moe_permute_plan(s, saved[kOffsets], saved[kRows], saved[kExpertIdx], capacity);
}

void MoeMlp::forward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
                     const Tensor& inp, const MoeScratch& w, const MoeBalancePass& balance,
                     bool recomputing) const {
  const int64_t N = inp.numel() / C_;
  run(be, s, saved, out, inp, w, balance, recomputing,
      moe_capacity(spec_.capacity_factor, N, spec_.top_k, spec_.num_experts));
}

void MoeMlp::run(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
                 const Tensor& inp, const MoeScratch& w, const MoeBalancePass& balance,
                 bool recomputing, int64_t capacity) const {
  const int64_t N = inp.numel() / C_;
  const Tensor x = inp.reshape(Shape{N, C_}), y = out.reshape(Shape{N, C_});
  route(be, s, saved, x, w, capacity);
  if (!recomputing && (balance.load || balance.prob || balance.z))
    be.moe_balance_stats(s, balance.load, balance.prob, balance.z, saved[kLogits],
                         saved[kExpertIdx], spec_.scoring, balance.prob_scale, balance.z_scale);
  be.moe_permute(s, saved[kPermuted], x, saved[kRows]);
  // With dropping, the grouped linears write rows [0, M_kept) only: the gate/up output's
  // rest is zeroed so that the SwiGLU over all M rows (and its gradient) stays finite there.
  if (capacity > 0) be.fill(s, saved[kHidden], 0.f);
  be.grouped_linear_forward(s, saved[kHidden], saved[kPermuted], gate_up.v(), saved[kOffsets]);
  be.swiglu_forward(s, saved[kAct], saved[kHidden]);
  be.grouped_linear_forward(s, saved[kExpertOut], saved[kAct], down.v(), saved[kOffsets]);
  be.moe_unpermute(s, y, saved[kExpertOut], saved[kExpertWeight], saved[kRows]);
  if (!shared_) return;
  const Tensor sh = w.tokens.reshape(inp.shape());
  shared_->forward(be, s, shared_saved(saved), sh, inp);
  be.add(s, out, out, sh);
}

void MoeMlp::recompute(Backend& be, Stream s, std::span<const Tensor> saved,
                       const Tensor& inp) const {
  be.moe_permute(s, saved[kPermuted], inp.reshape(Shape{inp.numel() / C_, C_}), saved[kRows]);
  be.swiglu_forward(s, saved[kAct], saved[kHidden]);
  if (shared_) shared_->recompute(be, s, shared_saved(saved));
}

void MoeMlp::router_backward(Backend& be, Stream s, const Tensor& dx, const Tensor& dlogits,
                             const Tensor& x, const MoeScratch& w) const {
  const Tensor dweight = router.trainable_grad();
  if (x.dtype() == DType::F32) {
    be.linear_backward(s, dx, dweight, Tensor(), dlogits, x, router.v());
    return;
  }
  // In fp32, as forward: the weight's gradient through an fp32 buffer when the gradient
  // is kept in the low precision, dx converted back to the model dtype.
  be.copy(s, w.x32, x);
  be.copy(s, w.w32, router.v());
  if (dweight && dweight.dtype() == DType::F32) {
    be.linear_backward(s, Tensor(), dweight, Tensor(), dlogits, w.x32, w.w32);
  } else if (dweight) {
    be.fill(s, w.dw32, 0.f);
    be.linear_backward(s, Tensor(), w.dw32, Tensor(), dlogits, w.x32, w.w32);
    be.copy(s, w.wtmp, w.dw32);
    be.add(s, dweight, dweight, w.wtmp);
  }
  be.linear_backward(s, w.x32, Tensor(), Tensor(), dlogits, w.x32, w.w32);  // reads no inp
  be.copy(s, dx, w.x32);
}

void MoeMlp::backward(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& dinp,
                      const Tensor& dout, const Tensor& inp, const MoeScratch& w,
                      const MoeBalancePass& balance) const {
  const int64_t N = inp.numel() / C_, M = N * spec_.top_k, F = spec_.expert_hidden;
  const Tensor x = inp.reshape(Shape{N, C_}), dx = dinp.reshape(Shape{N, C_});
  const Tensor dy = dout.reshape(Shape{N, C_});
  // The experts, in reverse: unpermute, down, SwiGLU, gate/up, permute.
  const Tensor dexp = w.a.view_at(0, Shape{M, C_}), dact = w.b.view_at(0, Shape{M, F});
  const Tensor dh = w.a.view_at(0, Shape{M, 2 * F}), dxp = w.b.view_at(0, Shape{M, C_});
  be.moe_unpermute_backward(s, dexp, w.dweight, dy, saved[kExpertOut], saved[kExpertWeight],
                            saved[kRows]);
  // Dropping (rows [M_kept, M) unwritten below): the SwiGLU gradient over all M rows reads
  // zeros there, as forward's zeroed gate/up output.
  if (spec_.capacity_factor > 0.0) be.fill(s, dact, 0.f);
  be.grouped_linear_backward(s, dact, down.trainable_grad(), dexp, saved[kAct], down.v(),
                             saved[kOffsets]);
  be.swiglu_backward(s, dh, dact, saved[kHidden]);
  be.grouped_linear_backward(s, dxp, gate_up.trainable_grad(), dh, saved[kPermuted],
                             gate_up.v(), saved[kOffsets]);
  be.moe_permute_backward(s, dx, dxp, saved[kRows]);
  // The router: through the weights, the balancing losses, then its linear.
  be.moe_router_backward(s, w.dlogits, w.dweight, Tensor(), saved[kScores], saved[kExpertIdx],
                         spec_.router());
  if (balance.grad_load || balance.z_grad_scale != 0.f)
    be.moe_balance_backward(s, w.dlogits, saved[kLogits], balance.grad_load, spec_.scoring,
                            balance.aux_grad_scale, balance.z_grad_scale);
  router_backward(be, s, w.tokens, w.dlogits, x, w);
  be.add(s, dx, dx, w.tokens);
  if (!shared_) return;
  const Tensor dsh = w.tokens.reshape(inp.shape());
  shared_->backward(be, s, shared_saved(saved), dsh, dout, inp, w.shared_dfc, w.shared_dact);
  be.add(s, dinp, dinp, dsh);
}

void MoeMlp::decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const {
  const int64_t B = inp.size(0), Tq = inp.size(1);
  std::vector<Tensor> saved;
  for (const SavedSpec& sp : saved_specs(B, Tq, inp.dtype()))
    saved.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Temporaries));
  run(be, s, saved, out, inp, make_scratch(be, B, Tq, inp.dtype()), MoeBalancePass{},
      /*recomputing=*/true, /*capacity=*/0);
}

void MoeMlp::collect(std::vector<Param*>& out) {
  out.push_back(&router);
  out.push_back(&gate_up);
  out.push_back(&down);
  if (shared_) shared_->collect(out);
}

}  // namespace kiln::nn
