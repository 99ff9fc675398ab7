#include "nn/moe.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace kiln::nn {

int64_t moe_capacity(double capacity_factor, int64_t N, int64_t k, int64_t E) {
  if (capacity_factor <= 0.0) return 0;
  const double per_expert = static_cast<double>(N * k) / static_cast<double>(E);
  const double capacity = std::ceil(per_expert * capacity_factor);
  // An expert takes at most N slots (a token's choices are distinct experts): a capacity of
  // N drops nothing, and capping there keeps a huge factor from overflowing int64.
  if (capacity >= static_cast<double>(N)) return std::max<int64_t>(N, 1);
  return std::max<int64_t>(1, static_cast<int64_t>(capacity));
}

MoeMlp::MoeMlp(const std::string& prefix, int64_t C, const MoeSpec& spec, float init_std,
               float proj_init_std)
    : router(prefix + ".router.weight", Shape{spec.num_experts, C}, Init::normal(init_std), true),
      gate_up(prefix + ".experts.gate_up_proj.weight",
              Shape{spec.num_experts, 2 * spec.expert_hidden, C}, Init::normal(init_std), true),
      down(prefix + ".experts.down_proj.weight", Shape{spec.num_experts, C, spec.expert_hidden},
           Init::normal(proj_init_std), true),
      gate_up_lora(prefix + ".experts.gate_up_proj", spec.num_experts, 2 * spec.expert_hidden, C,
                   {{"gate", spec.expert_hidden}, {"up", spec.expert_hidden}}),
      down_lora(prefix + ".experts.down_proj", spec.num_experts, C, spec.expert_hidden, {}),
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

void MoeMlp::shard(const MlpPlacement& placement) {
  if (!column_row_split(placement.fc, placement.proj, gate_up.name)) return;
  // Each expert as a dense SwiGLU Mlp: its gate and up rows split separately (a rank
  // holds [gate_r; up_r] of every expert), its down projection's columns.
  const TpGroup& g = *placement.fc.group;
  const int64_t F = spec_.expert_hidden;
  KILN_CHECK(F % g.size() == 0, "{}: each expert's {} hidden units do not divide over tp = {}",
             gate_up.name, F, g.size());
  // The tp cut of the hidden units; an ep cut of the experts stays.
  gate_up.slice.dim = 1;
  gate_up.slice.pieces = {F, F};
  down.slice.dim = 2;
  for (Param* p : {&gate_up, &down}) {
    p->slice.parts = g.size();
    p->slice.index = g.rank();
  }
  gate_up.slice.check(gate_up.shape, gate_up.name);
  down.slice.check(down.shape, down.name);
  gate_up_lora.slice(gate_up.slice);
  down_lora.slice(down.slice);
  if (shared_) shared_->shard(placement);
  placement_ = placement.fc;
}

void MoeMlp::set_expert_parallel(EpGroup& group) {
  if (group.size() == 1) return;
  KILN_CHECK(spec_.num_experts % group.size() == 0,
             "{}: the {} experts do not divide over parallel.ep = {}", prefix_, spec_.num_experts,
             group.size());
  for (Param* p : {&gate_up, &down}) {
    p->slice.ep_parts = group.size();
    p->slice.ep_index = group.rank();
    p->slice.check(p->shape, p->name);
  }
  gate_up_lora.slice(gate_up.slice);
  down_lora.slice(down.slice);
  ep_ = &group;
}

std::vector<SavedSpec> MoeMlp::saved_specs(int64_t B, int64_t T, DType dtype) const {
  const int64_t N = B * T, E = spec_.num_experts, k = spec_.top_k, M = N * k;
  const int64_t F = local_hidden();
  // Under expert parallelism the expert side's rows vary: kept per call (ep_saved_).
  const int64_t Mx = expert_parallel() ? 0 : M;
  const std::string& n = router.name;
  std::vector<SavedSpec> out = {
      {n + ":logits", Shape{N, E}, DType::F32, Recompute::WithBlock},
      {n + ":scores", Shape{N, E}, DType::F32, Recompute::WithBlock},
      {n + ":expert_idx", Shape{N, k}, DType::I32, Recompute::WithBlock},
      {n + ":expert_weight", Shape{N, k}, DType::F32, Recompute::WithBlock},
      {n + ":rows", Shape{N, k}, DType::I32, Recompute::WithBlock},
      {n + ":offsets", Shape{E + 1}, DType::I32, Recompute::WithBlock},
      {gate_up.name + ":in", Shape{Mx, C_}, dtype, Recompute::Cheap},
      {gate_up.name + ":out", Shape{Mx, 2 * F}, dtype, Recompute::WithBlock},
      {down.name + ":in", Shape{Mx, F}, dtype, Recompute::Cheap},
      {down.name + ":out", Shape{M, C_}, dtype, Recompute::WithBlock}};
  if (shared_)
    for (auto& sp : shared_->saved_specs(B, T, dtype)) out.push_back(sp);
  return out;
}

MoeScratch MoeMlp::make_scratch(Backend& be, int64_t B, int64_t T, DType dtype) const {
  const int64_t N = B * T, E = spec_.num_experts, k = spec_.top_k;
  const int64_t wide = std::max(C_, 2 * local_hidden());
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
  if (sequence_parallel()) w.gathered = act({N, C_}, dtype);
  return w;
}

Tensor MoeMlp::whole_input(Backend& be, Stream s, const Tensor& inp, const MoeScratch& w) const {
  if (!sequence_parallel()) return rows_of(inp);
  tp_forward(TpComm::GatherFromSp, *placement_.group, be, s, w.gathered, rows_of(inp));
  return w.gathered;
}

void MoeMlp::reduce_output(Backend& be, Stream s, const Tensor& out, const Tensor& y) const {
  if (sequence_parallel())
    tp_forward(TpComm::ReduceScatterToSp, *placement_.group, be, s, rows_of(out), y);
  else if (split())
    tp_forward(TpComm::ReduceFromTp, *placement_.group, be, s, y, y);
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
  run(be, s, saved, out, inp, w, balance, recomputing, /*dropless=*/false);
}

void MoeMlp::run(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& out,
                 const Tensor& inp, const MoeScratch& w, const MoeBalancePass& balance,
                 bool recomputing, bool dropless) const {
  const Tensor x = whole_input(be, s, inp, w);
  // The routed output: partial sums over tp when split, reduced below.
  const Tensor y = sequence_parallel() ? w.tokens : out.reshape(x.shape());
  // The capacity of the whole micro-batch (gathered under sequence parallelism).
  const int64_t capacity =
      dropless ? 0
               : moe_capacity(spec_.capacity_factor, x.size(0), spec_.top_k, spec_.num_experts);
  route(be, s, saved, x, w, capacity);
  if (!recomputing && (balance.load || balance.prob || balance.z))
    be.moe_balance_stats(s, balance.load, balance.prob, balance.z, saved[kLogits],
                         saved[kExpertIdx], spec_.scoring, balance.prob_scale, balance.z_scale);
  if (expert_parallel()) {
    const Tensor permuted = w.a.view_at(0, saved[kExpertOut].shape());  // [M, C]
    ep_experts_forward(be, s, saved[kExpertOut], permuted, x, saved);
  } else {
    be.moe_permute(s, saved[kPermuted], x, saved[kRows]);
    experts_forward(be, s, saved[kExpertOut], saved[kHidden], saved[kAct], saved[kPermuted],
                    saved[kOffsets], /*ragged=*/capacity > 0);
  }
  be.moe_unpermute(s, y, saved[kExpertOut], saved[kExpertWeight], saved[kRows]);
  reduce_output(be, s, out, y);
  if (!shared_) return;
  // w.tokens and w.gathered are free again: the shared output and its Linears' scratch.
  const Tensor sh = w.tokens.view_at(0, inp.shape());
  shared_->forward(be, s, shared_saved(saved), sh, inp, w.gathered);
  be.add(s, out, out, sh);
}

void MoeMlp::experts_forward(Backend& be, Stream s, const Tensor& out, const Tensor& hidden,
                             const Tensor& act, const Tensor& in, const Tensor& offsets,
                             bool ragged) const {
  // With dropping, the grouped linears write rows [0, M_kept) only: the gate/up output's
  // rest is zeroed so that the SwiGLU over all rows (and its gradient) stays finite.
  if (ragged) be.fill(s, hidden, 0.f);
  be.grouped_linear_forward(s, hidden, in, gate_up.v(), offsets);
  gate_up_lora.forward(be, s, hidden, in, offsets, ragged);
  be.swiglu_forward(s, act, hidden);
  be.grouped_linear_forward(s, out, act, down.v(), offsets);
  down_lora.forward(be, s, out, act, offsets, ragged);
}

void MoeMlp::experts_backward(Backend& be, Stream s, const Tensor& din, const Tensor& dh,
                              const Tensor& dact, const Tensor& dout, const Tensor& in,
                              const Tensor& hidden, const Tensor& act, const Tensor& offsets,
                              bool ragged) const {
  // Dropping (rows [M_kept, M) unwritten below): the SwiGLU gradient over all rows reads
  // zeros there, as forward's zeroed gate/up output.
  if (ragged) be.fill(s, dact, 0.f);
  be.grouped_linear_backward(s, dact, down.trainable_grad(), dout, act, down.v(), offsets);
  down_lora.backward(be, s, dact, dout, act, offsets, ragged);
  be.swiglu_backward(s, dh, dact, hidden);
  be.grouped_linear_backward(s, din, gate_up.trainable_grad(), dh, in, gate_up.v(), offsets);
  gate_up_lora.backward(be, s, din, dh, in, offsets, ragged);
}

void MoeMlp::ep_experts_forward(Backend& be, Stream s, const Tensor& expert_out,
                                const Tensor& permuted, const Tensor& x,
                                std::span<const Tensor> saved) const {
  const DType dt = permuted.dtype();
  ep_saved_.erase(expert_out.raw());  // a re-run's (full checkpointing) or an evaluation's
  EpSaved st;
  st.exchange = ep_exchange(be, s, *ep_, saved[kOffsets], MemCategory::Activations);
  ep_chunk_rows(be, s, st.exchange, saved[kRows]);  // the slots laid out by chunk
  be.moe_permute(s, permuted, x, saved[kRows]);
  const int64_t F = local_hidden();
  std::array<EpTransfer, kEpChunks> there, back;
  for (int c = 0; c < kEpChunks; ++c) there[c] = ep_dispatch_start(be, s, *ep_, st.exchange, c, permuted);
  // Chunk c's experts run while chunk c+1 arrives and chunk c-1 returns.
  for (int c = 0; c < kEpChunks; ++c) {
    const int64_t R = st.exchange.chunks[static_cast<size_t>(c)].plan.received();
    auto act = [&](int64_t width) { return be.empty(Shape{R, width}, dt, MemCategory::Activations); };
    EpSaved::Chunk& k = st.chunks[static_cast<size_t>(c)];
    k.in = act(C_);
    k.hidden = act(2 * F);
    k.act = act(F);
    ep_dispatch_finish(be, s, st.exchange, c, there[c], k.in);
    const Tensor out = be.empty(Shape{R, C_}, dt, MemCategory::Temporaries);
    const Tensor& offsets = st.exchange.chunks[static_cast<size_t>(c)].offsets;
    if (R > 0) experts_forward(be, s, out, k.hidden, k.act, k.in, offsets, /*ragged=*/false);
    back[c] = ep_combine_start(be, s, *ep_, st.exchange, c, expert_out, out);
  }
  for (EpTransfer& t : back) t.transfer->wait();
  ep_saved_.emplace(expert_out.raw(), std::move(st));
}

void MoeMlp::ep_experts_backward(Backend& be, Stream s, const Tensor& dxp, const Tensor& dexp,
                                 const Tensor& expert_out) const {
  const auto it = ep_saved_.find(expert_out.raw());
  KILN_CHECK(it != ep_saved_.end(), "{}: backward without its forward's expert dispatch",
             prefix_);
  const EpSaved& st = it->second;
  const DType dt = dexp.dtype();
  const int64_t F = local_hidden();
  std::array<EpTransfer, kEpChunks> there, back;
  for (int c = 0; c < kEpChunks; ++c) there[c] = ep_dispatch_start(be, s, *ep_, st.exchange, c, dexp);
  for (int c = 0; c < kEpChunks; ++c) {
    const int64_t R = st.exchange.chunks[static_cast<size_t>(c)].plan.received();
    auto tmp = [&](int64_t width) { return be.empty(Shape{R, width}, dt, MemCategory::Temporaries); };
    const Tensor dout = tmp(C_), dact = tmp(F), dh = tmp(2 * F), din = tmp(C_);
    ep_dispatch_finish(be, s, st.exchange, c, there[c], dout);
    const EpSaved::Chunk& k = st.chunks[static_cast<size_t>(c)];
    const Tensor& offsets = st.exchange.chunks[static_cast<size_t>(c)].offsets;
    if (R > 0)
      experts_backward(be, s, din, dh, dact, dout, k.in, k.hidden, k.act, offsets,
                       /*ragged=*/false);
    back[c] = ep_combine_start(be, s, *ep_, st.exchange, c, dxp, din);
  }
  for (EpTransfer& t : back) t.transfer->wait();
  ep_saved_.erase(it);
}

void MoeMlp::recompute(Backend& be, Stream s, std::span<const Tensor> saved, const Tensor& inp,
                       const MoeScratch& w) const {
  if (!expert_parallel()) {  // (expert parallel: the expert side is kept whole)
    be.moe_permute(s, saved[kPermuted], whole_input(be, s, inp, w), saved[kRows]);
    be.swiglu_forward(s, saved[kAct], saved[kHidden]);
  }
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
  const Tensor x = whole_input(be, s, inp, w);  // re-gathered under sequence parallelism
  const int64_t N = x.size(0), M = N * spec_.top_k, F = local_hidden();
  const bool sp = sequence_parallel();
  // dy [N, C]: dout, or every rank's rows of it (the reduce-scatter's backward).
  const Tensor dy = sp ? w.tokens : dout.reshape(x.shape());
  if (sp) tp_backward(TpComm::ReduceScatterToSp, *placement_.group, be, s, dy, rows_of(dout));
  // The experts, in reverse: unpermute, down, SwiGLU, gate/up, permute.
  const Tensor dexp = w.a.view_at(0, Shape{M, C_}), dact = w.b.view_at(0, Shape{M, F});
  const Tensor dh = w.a.view_at(0, Shape{M, 2 * F}), dxp = w.b.view_at(0, Shape{M, C_});
  be.moe_unpermute_backward(s, dexp, w.dweight, dy, saved[kExpertOut], saved[kExpertWeight],
                            saved[kRows]);
  // dout dotted with partial expert outputs: the weights' gradient is whole once summed.
  if (split()) placement_.group->all_reduce_sum(s, w.dweight);
  if (expert_parallel()) {
    ep_experts_backward(be, s, dxp, dexp, saved[kExpertOut]);
  } else {
    experts_backward(be, s, dxp, dh, dact, dexp, saved[kPermuted], saved[kHidden], saved[kAct],
                     saved[kOffsets], /*ragged=*/spec_.capacity_factor > 0.0);
  }
  const Tensor dx = sp ? w.tokens : dinp.reshape(x.shape());  // partial sums over tp when split
  be.moe_permute_backward(s, dx, dxp, saved[kRows]);
  // The router: through the weights, the balancing losses, then its linear.
  be.moe_router_backward(s, w.dlogits, w.dweight, Tensor(), saved[kScores], saved[kExpertIdx],
                         spec_.router());
  if (balance.grad_load || balance.z_grad_scale != 0.f)
    be.moe_balance_backward(s, w.dlogits, saved[kLogits], balance.grad_load, spec_.scoring,
                            balance.aux_grad_scale, balance.z_grad_scale);
  const Tensor drouter = w.a.view_at(0, x.shape());
  router_backward(be, s, drouter, w.dlogits, x, w);
  // The router's input gradient is whole on every rank: tp rank 0 adds it to the partials.
  if (!split() || placement_.group->rank() == 0) be.add(s, dx, dx, drouter);
  reduce_input_grad(be, s, dinp, dx);
  if (!shared_) return;
  const Tensor dsh = w.tokens.view_at(0, inp.shape());  // free again, as w.gathered
  shared_->backward(be, s, shared_saved(saved), dsh, dout, inp, w.shared_dfc, w.shared_dact,
                    w.gathered);
  be.add(s, dinp, dinp, dsh);
}

void MoeMlp::reduce_input_grad(Backend& be, Stream s, const Tensor& dinp, const Tensor& dx) const {
  if (sequence_parallel())
    tp_backward(TpComm::GatherFromSp, *placement_.group, be, s, rows_of(dinp), dx);
  else if (split())
    tp_backward(TpComm::CopyToTp, *placement_.group, be, s, dx, dx);
}

void MoeMlp::decode(Backend& be, Stream s, const Tensor& out, const Tensor& inp) const {
  const int64_t B = inp.size(0), Tq = inp.size(1);
  std::vector<Tensor> saved;
  for (const SavedSpec& sp : saved_specs(B, Tq, inp.dtype()))
    saved.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Temporaries));
  run(be, s, saved, out, inp, make_scratch(be, B, Tq, inp.dtype()), MoeBalancePass{},
      /*recomputing=*/true, /*dropless=*/true);
  ep_saved_.erase(saved[kExpertOut].raw());
}

void MoeMlp::collect(std::vector<Param*>& out) {
  out.push_back(&router);
  out.push_back(&gate_up);
  out.push_back(&down);
  gate_up_lora.collect(out);
  down_lora.collect(out);
  if (shared_) shared_->collect(out);
}

std::vector<std::pair<const char*, ExpertLora*>> MoeMlp::expert_projections() {
  return {{"mlp.fc", &gate_up_lora}, {"mlp.proj", &down_lora}};
}

std::vector<std::pair<const char*, Linear*>> MoeMlp::shared_linears() {
  if (!shared_) return {};
  return {{"mlp.fc", &shared_->fc}, {"mlp.proj", &shared_->proj}};
}

}  // namespace kiln::nn
