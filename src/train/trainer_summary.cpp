// The run's summaries, printed at its end: the data-parallel communication (busy,
// exposed, per collective), the tensor-parallel traffic measured against its formula and
// the pipeline's bubble per stage.
#include "train/trainer.h"

#include "comm/ledger.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln {

void Trainer::summarize_communication(TrainResult& r, int64_t timed_steps) {
  // Statistics of the dp x cp group's communicator over the whole run, scaled to the
  // timed steps (the first step is warm-up) by the share they make.
  const Communicator& dp_cp = mesh_->dp_cp_comm();
  const CommStats st = dp_cp.stats();
  const int64_t steps = step_ - r.first_step;
  const double share = steps > 0 ? static_cast<double>(timed_steps) / static_cast<double>(steps) : 0.0;
  std::string table = fmt::format("{:<15} {:>7} {:>12} {:>10} {:>12} {:>12}\n", "collective",
                                  "calls", "MB/step", "ms/step", "algbw GB/s", "busbw GB/s");
  double busy = 0.0;
  for (int c = 0; c < kNumCollectives; ++c) {
    const CollectiveStats& s = st.per[static_cast<size_t>(c)];
    if (s.count == 0) continue;
    busy += s.seconds;
    const auto coll = static_cast<Collective>(c);
    table += fmt::format("{:<15} {:>7} {:>12.2f} {:>10.2f} {:>12.2f} {:>12.2f}\n",
                         collective_name(coll), s.count, s.bytes / 1e6 / std::max<int64_t>(steps, 1),
                         1e3 * s.seconds / std::max<int64_t>(steps, 1),
                         algorithm_bandwidth(s.bytes, s.seconds) / 1e9,
                         bus_bandwidth(coll, dp_cp.size(), s.bytes, s.seconds) / 1e9);
  }
  r.comm_busy_s = busy * share;
  r.comm_hidden_fraction =
      r.comm_busy_s > 0 ? std::clamp(1.0 - r.comm_exposed_s / r.comm_busy_s, 0.0, 1.0) : 0.0;
  r.comm_table = table;
  if (!options_.verbose) return;
  // Exposed is the time the step waited for its collectives; that includes waiting for a
  // slower rank to arrive, so it can exceed the communication itself.
  const bool waited_for_ranks = r.comm_exposed_s > r.comm_busy_s;
  fmt::print("kiln: data-parallel communication over {} ranks{} (ZeRO stage {}):\n{}"
             "kiln: communication {:.1f} ms/step, exposed {:.1f} ms/step: {:.0f}% hidden under "
             "computation{}\n",
             dp_cp.size(), mesh_->cp() > 1 ? " (dp x cp)" : "", config_.parallel.zero_stage,
             table,
             1e3 * r.comm_busy_s / std::max<int64_t>(timed_steps, 1),
             1e3 * r.comm_exposed_s / std::max<int64_t>(timed_steps, 1),
             100.0 * r.comm_hidden_fraction,
             waited_for_ranks ? " (the exposed time, the step's wait for its collectives, exceeds "
                                "the communication: the ranks waited for each other, e.g. on "
                                "shared cores)"
                              : "");
}

void Trainer::summarize_tp_traffic(TrainResult& r, int64_t steps) {
  // The formula (parallel/tp_traffic.h) is a decoder language model's.
  Model& model = one_step_->model();
  const LanguageModel* lm = model.language_model();
  if (!lm) return;
  TpTrafficShape s;
  // This rank's parts (a pipeline stage holds some): blocks, and whether the two ends.
  const int n_parts = config_.model.n_layer + 2;
  s.has_embedding = s.has_head = false;
  s.n_layer = 0;
  for (const ModelPart& part : model.parts()) {
    if (part.global_index == 0) s.has_embedding = true;
    else if (part.global_index == n_parts - 1) s.has_head = true;
    else ++s.n_layer;
  }
  s.rows = int64_t{config_.train.micro_batch} * config_.train.seq_len / mesh_->cp();  // this rank's tokens
  s.n_embd = config_.model.n_embd;
  s.padded_vocab = lm->padded_vocab_size();
  s.classifier_chunk_mb = config_.train.classifier_chunk_mb;
  s.tp = mesh_->tp();
  s.sequence_parallel = config_.parallel.sequence_parallel;
  s.full_recompute = config_.train.activation_checkpointing == "full";
  s.act_bytes = static_cast<int64_t>(dtype_size(model.dtype()));
  s.grad_bytes = static_cast<int64_t>(dtype_size(model.grad_dtype()));
  for (const AdamWSegment& seg : one_step_->data_parallel().optimizer_segments()) {
    if (!seg.spec.tp_partial_grad || seg.size() == 0) continue;
    ++s.partial_grad_params;
    s.partial_grad_elems += seg.size();
  }
  r.tp_formula = tp_update_traffic(s, one_step_->grad_accum_steps());
  for (size_t c = 0; c < r.tp_measured.calls.size(); ++c) {
    r.tp_measured.calls[c] /= std::max<int64_t>(steps, 1);
    r.tp_measured.bytes[c] /= std::max<int64_t>(steps, 1);
  }
  if (!options_.verbose) return;
  fmt::print("kiln: tensor-parallel traffic per update over {} ranks{} (rank 0; formula: "
             "parallel/tp_traffic.h):\n{:<15} {:>7} {:>9} {:>12} {:>12}\n", s.tp,
             s.sequence_parallel ? " with sequence parallelism" : "", "collective", "calls",
             "formula", "MB", "formula MB");
  for (int c = 0; c < kNumCollectives; ++c) {
    const auto i = static_cast<size_t>(c);
    if (r.tp_measured.calls[i] == 0 && r.tp_formula.calls[i] == 0) continue;
    fmt::print("{:<15} {:>7} {:>9} {:>12.3f} {:>12.3f}\n", collective_name(static_cast<Collective>(c)),
               r.tp_measured.calls[i], r.tp_formula.calls[i], r.tp_measured.bytes[i] / 1e6,
               r.tp_formula.bytes[i] / 1e6);
  }
}

void Trainer::summarize_ep_traffic(TrainResult& r) {
  // This rank's MoE layers: each holds two ep-cut tensors (gate_up and down) besides any
  // LoRA adapters of its experts.
  int64_t ep_tensors = 0;
  for (const ParamSpec& p : one_step_->model().params())
    ep_tensors += p.slice.ep_sharded() && !p.adapter ? 1 : 0;
  const auto key = [&](const char* k) { return static_cast<int64_t>(config_.model.family.at(k)); };
  r.ep_formula = ep_update_traffic(
      ep_tensors / 2, one_step_->grad_accum_steps(),
      int64_t{config_.train.micro_batch} * config_.train.seq_len / mesh_->cp(),
      static_cast<int>(key("moe.top_k")), key("moe.num_experts"), config_.model.n_embd,
      static_cast<int64_t>(dtype_size(one_step_->model().dtype())),
      config_.train.activation_checkpointing == "full");
  if (!options_.verbose) return;
  if (ep_tensors == 0) {  // a pipeline stage of dense blocks only
    fmt::print("kiln: expert-parallel all_to_all: rank 0's pipeline stage holds no MoE layer "
               "(its ep group moves nothing; the stages with MoE layers do)\n");
    return;
  }
  const double steps = static_cast<double>(std::max<int64_t>(r.timed_steps, 1));
  const double busy = r.ep_measured.seconds;
  fmt::print("kiln: expert-parallel all_to_all per update over {} ranks (rank 0; formula: "
             "parallel/expert_parallel.h, balanced routing): {:.0f} calls (formula {}), "
             "{:.3f} MB (formula {:.3f}), {:.1f} ms, exposed {:.1f} ms: {:.0f}% hidden under "
             "the experts\n",
             mesh_->ep(), r.ep_measured.count / steps, r.ep_formula.calls,
             r.ep_measured.bytes / steps / 1e6, r.ep_formula.bytes / 1e6, 1e3 * busy / steps,
             1e3 * r.ep_exposed_s / steps,
             busy > 0 ? 100.0 * std::clamp(1.0 - r.ep_exposed_s / busy, 0.0, 1.0) : 0.0);
}

void Trainer::summarize_pipeline(TrainResult& r, double busy, double span) {
  const pp::Schedule& s = one_step_->pipeline().schedule();
  r.pp_bubble_simulated = one_step_->pipeline().simulated().bubble_fraction;
  r.pp_bubble_theory = pp::theoretical_bubble(s.kind, s.pp, s.virtual_stages, s.micro_batches);
  const int W = world_->size();
  std::vector<double> v(static_cast<size_t>(2 * W), 0.0);  // [busy, span] per rank
  v[static_cast<size_t>(2 * world_->rank())] = busy;
  v[static_cast<size_t>(2 * world_->rank() + 1)] = span;
  const CommSite site("summary.sum pipeline busy times");
  world_->all_reduce_sum(v);
  double longest = 0.0;
  for (int k = 0; k < W; ++k) longest = std::max(longest, v[static_cast<size_t>(2 * k + 1)]);
  std::vector<double> sum(static_cast<size_t>(s.pp), 0.0);
  std::vector<int> n(static_cast<size_t>(s.pp), 0);
  for (int k = 0; k < W; ++k) {
    const auto stage = static_cast<size_t>(mesh_->coord(k)[Axis::PP]);
    sum[stage] += longest > 0 ? 1.0 - v[static_cast<size_t>(2 * k)] / longest : 0.0;
    ++n[stage];
  }
  r.pp_bubble_measured.clear();
  std::string per;
  for (size_t stage = 0; stage < sum.size(); ++stage) {
    r.pp_bubble_measured.push_back(sum[stage] / std::max(n[stage], 1));
    per += fmt::format("{}{:.1f}%", per.empty() ? "" : ", ", 100.0 * r.pp_bubble_measured.back());
  }
  if (options_.verbose)
    fmt::print("kiln: pipeline bubble per stage (measured, host clock): {}; schedule {:.1f}% "
               "(simulated), {:.1f}% (theory)\n", per, 100.0 * r.pp_bubble_simulated,
               100.0 * r.pp_bubble_theory);
}

}  // namespace kiln
