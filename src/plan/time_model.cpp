#include "plan/time_model.h"

#include "comm/communicator.h"
#include "parallel/pipeline_schedule.h"
#include "plan/memplan.h"

#include <algorithm>

namespace kiln::plan {

double Link::busbw(double bytes) const {
  return busbw_by_bytes.empty() ? bandwidth.value : interpolate(busbw_by_bytes, bytes);
}

bool group_within_node(int stride, int size, int ranks_per_node) {
  return ranks_per_node <= 0 || size <= 1 || static_cast<int64_t>(stride) * size <= ranks_per_node;
}

namespace {

// The pipeline schedule's idle fraction: the simulator's, forward 1 and backward 2 per
// chunk (what parallel/pipeline.h costs them at).
double bubble_fraction(const TrainConfig& c, int pp, int accum) {
  if (pp <= 1) return 0.0;
  const pp::ScheduleKind kind = pp::parse_schedule_kind(c.parallel.pp_schedule);
  return pp::simulate(pp::make_schedule(kind, pp, c.parallel.virtual_stages, accum), 1, 2)
      .bubble_fraction;
}

}  // namespace

StepTime estimate_step_time(const MemPlan& p, const CostModel& cost) {
  const TrainConfig& c = p.config;
  const double T = c.train.seq_len;
  const double C = c.model.n_embd, L = c.model.n_layer, V = c.model.vocab_size;
  const double mb = c.train.micro_batch;
  // Per dp rank; its tp ranks split every matmul and attention head, its cp ranks the
  // tokens (the causal work balanced by the chunk split), its pp ranks the layers.
  const double tokens = mb * p.accum * T;
  const double split = static_cast<double>(p.tp) * p.cp * p.pp;
  const double per_token = p.flops_per_token / split;  // 6N + attention
  // Forward FLOPs of the blocks per token (what full recomputation repeats): a third of
  // the training FLOPs less the head's forward 2 V C.
  const double block_forward = std::max(0.0, p.flops_per_token / 3.0 - 2.0 * V * C) / split;
  const std::string& mode = c.train.activation_checkpointing;
  const double dsize = c.train.dtype == "fp32" ? 4.0 : 2.0;
  StepTime t;
  t.gemm_rate = cost.peak_flops.value;
  if (cost.calibration)
    t.gemm_rate = gemm_rate(*cost.calibration, c.train.dtype, mb * T / p.cp, 4.0 * C / p.tp, C);
  // Attention's FLOPs (12 T C per token per block, of 6 N + attention) at the calibration's
  // attention rate for seq_len when it has one, the rest at the GEMM rate; the time a
  // FLOP takes, averaged over a token's forward and backward:
  const double attn =
      p.flops_per_token > 0 ? std::min(1.0, 3.0 * L * 4.0 * T * C / p.flops_per_token) : 0.0;
  // (Under cp each rank's attention runs as tiles of T / cp queries against T / cp keys.)
  t.attention_rate =
      cost.calibration ? attention_rate(*cost.calibration, c.train.dtype, T / p.cp) : 0.0;
  if (t.attention_rate <= 0) t.attention_rate = t.gemm_rate;
  const double per_flop = (1.0 - attn) / t.gemm_rate + attn / t.attention_rate;
  const double fwd = tokens * per_token / 3.0 * per_flop;
  double bwd = tokens * per_token * 2.0 / 3.0 * per_flop;
  // Full recomputation repeats the blocks' forward: their attention (4 T C of 12) and the
  // rest at their rates.
  const double block_attn = 4.0 * L * T * C / split;
  if (mode == "full")
    t.recompute = tokens * (std::max(0.0, block_forward - block_attn) / t.gemm_rate +
                            std::min(block_attn, block_forward) / t.attention_rate);
  // Selective: GELU from its input again, memory-bound (read 4C, write 4C per token per
  // block); its FLOPs are negligible.
  if (mode == "selective" && cost.mem_bandwidth.value > 0)
    t.recompute = tokens * L * 2.0 * 4.0 * C * dsize / split / cost.mem_bandwidth.value;
  bwd += t.recompute;
  t.compute = fwd + bwd;
  t.bubble_fraction = bubble_fraction(c, p.pp, p.accum);
  t.bubble = t.compute * t.bubble_fraction / (1.0 - t.bubble_fraction);

  // Alpha-beta per collective with nccl-tests' ring factors (bus_bandwidth_factor), on
  // the link class of the group: mesh order tp (stride 1), cp (stride tp), dp (stride
  // tp cp), pp (stride tp cp dp).
  auto link = [&](int stride, int size) -> const Link& {
    return group_within_node(stride, size, cost.ranks_per_node) ? cost.intra : cost.inter;
  };
  auto price = [](const Link& l, Collective kind, int64_t bytes, int ranks) {
    if (ranks <= 1) return 0.0;
    const double b = static_cast<double>(bytes);
    return l.latency.value + b * bus_bandwidth_factor(kind, ranks) / l.busbw(b);
  };
  const bool overlap = cost.overlap.value != 0;
  // Tensor parallel: each layer waits for its reduction, all exposed.
  const Link& tp_link = link(1, p.tp);
  for (const auto& call : p.tp_calls) t.tp += price(tp_link, call.kind, call.bytes, p.tp);
  // Ring attention: each hop's send runs under that hop's attention tile, exposed only
  // past the step's attention time (4 T C per token per block of 6N + attention).
  const Link& cp_link = link(p.tp, p.cp);
  double cp_total = 0;
  for (const auto& call : p.cp_calls)
    if (call.kind == Collective::Send) cp_total += price(cp_link, call.kind, call.bytes, 2);
  t.cp = overlap ? std::max(0.0, cp_total - attn * (fwd + bwd)) : cp_total;
  // Pipeline: per micro-batch and chunk one activation send forward and one gradient
  // send backward, [micro_batch, T / cp, C] each, waited for by the next op.
  double pp_total = 0;
  if (p.pp > 1) {
    const int64_t bytes = static_cast<int64_t>(mb * T / p.cp * C * dsize);
    const Link& pp_link = link(p.tp * p.cp * p.dp, 2);
    pp_total = 2.0 * p.accum * c.parallel.virtual_stages * price(pp_link, Collective::Send, bytes, 2);
  }
  t.pp = pp_total;
  // Data parallel over dp x cp: forward gathers (ZeRO-3) under forward compute, backward
  // reductions and gathers under backward compute, on one communication thread; the
  // optimizer-phase collectives (norm, ZeRO-1/2 parameter all-gather) and the step's
  // small all-reduces (target count, loss, the trainer's stop flag) exposed.
  const int N = p.dp * p.cp;
  const Link& dp_link = link(p.tp, N);
  double dp_fwd = 0, dp_bwd = 0, dp_rest = 0;
  for (const auto& call : p.comm_calls) {
    const double x = price(dp_link, call.kind, call.bytes, N);
    if (call.phase == "forward") dp_fwd += x;
    else if (call.phase == "backward") dp_bwd += x;
    else dp_rest += x;
  }
  const Link& world_link = link(1, p.world_size);
  dp_rest += price(world_link, Collective::AllReduce, 4, p.world_size);
  t.dp = overlap ? std::max(0.0, dp_fwd - fwd) + std::max(0.0, dp_bwd - bwd) + dp_rest
                 : dp_fwd + dp_bwd + dp_rest;

  t.comm_total = dp_fwd + dp_bwd + dp_rest + t.tp + cp_total + pp_total;
  t.comm_exposed = t.tp + t.cp + t.pp + t.dp;
  t.step = t.compute + t.bubble + t.comm_exposed;
  t.tokens_per_s = t.step > 0 ? tokens * p.dp / t.step : 0.0;
  // Model FLOPs per rank per second (recomputation not counted) over the peak.
  t.mfu = t.step > 0 && cost.peak_flops.value > 0
              ? tokens * per_token / t.step / cost.peak_flops.value
              : 0.0;
  return t;
}

}  // namespace kiln::plan
