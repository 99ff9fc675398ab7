// The planner's time model (docs/plan.md, "The time model"): the time of one training
// step of a planned layout on each rank, from named inputs that each say where they came
// from (a calibration file that `kiln bench --calibrate` measured, a documented default,
// or a flag), split into compute, the pipeline bubble, and the communication each axis
// exposes.
//
//   compute  = the layout's training FLOPs per rank (Model::flops_per_token, 6 N +
//              attention, over tp x cp x pp, plus recomputation): attention's (12 T C per
//              token per block) at the calibration's attention rate for seq_len, the rest
//              at the GEMM rate of the layout's shape class (Calibration's gemm_rate at the
//              MLP up-projection of one micro-batch: M = micro_batch x seq_len / cp, N =
//              4 C / tp, K = C); without a calibration, all at the flat peak;
//   bubble   = compute x f / (1 - f), f the idle fraction of the pipeline schedule
//              simulator (parallel/pipeline_schedule.h) for pp, virtual stages and
//              grad_accum_steps micro-batches, forward 1 and backward 2 per chunk;
//   tp, cp, pp, dp = alpha-beta time of the dry run's collectives on the link class of
//              the axis's group (intra-node when the group's ranks lie on one node, by the
//              mesh's rank order: tp innermost, then cp, dp, pp), less what overlaps:
//              tp all exposed; cp's ring sends hidden under the attention share of the
//              compute; pp's activation and gradient sends (one each way per micro-batch
//              and chunk) all exposed; dp's forward gathers under forward compute, its
//              backward reductions under backward compute, the optimizer-phase ones
//              exposed;
//   step     = compute + bubble + the exposed communication.
#pragma once

#include "plan/calibration.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::plan {

struct MemPlan;

/// One input of the time model and where its value came from.
struct Input {
  double value = 0;
  std::string source;  // e.g. "measured: kiln bench --calibrate (FILE, AMD EPYC ..., 2026-12-06)"
};

/// A link class: bus bandwidth (bytes/s, as nccl-tests' busbw) and latency per
/// collective (seconds).
struct Link {
  Input bandwidth;
  Input latency;
  /// Measured bus bandwidth by message bytes (a calibration's link); when given, a
  /// collective of B bytes runs at its interpolation at B instead of `bandwidth`.
  std::vector<std::pair<int64_t, double>> busbw_by_bytes;
  double busbw(double bytes) const;
};

struct CostModel {
  Input peak_flops;     // FLOP/s per rank: MFU's denominator, and the rate without a calibration
  Input mem_bandwidth;  // bytes/s, for the memory-bound recompute (selective: GELU)
  Link intra;           // within a node (NVLink; CPU ranks: shared memory)
  Link inter;           // between nodes (InfiniBand)
  int ranks_per_node = 0;  // 0: every rank on one node
  /// Whether communication runs beside compute (GPUs: NCCL on its own SMs and copy
  /// engines). false on CPU ranks, whose communication thread and MPI copies take the
  /// same cores as the compute: every collective is then exposed.
  Input overlap{1, "default: communication overlaps compute"};
  /// Measured GEMM rates by size; none: peak_flops for every GEMM.
  std::optional<Calibration> calibration;
  std::string calibration_file;  // where it was read from, for the inputs' sources
};

/// Step time of a planned layout (seconds), split as above.
struct StepTime {
  double gemm_rate = 0;      // FLOP/s the GEMMs are priced at (the shape class's rate)
  double attention_rate = 0; // FLOP/s attention is priced at (the calibration's at seq_len, else gemm_rate)
  double compute = 0;        // forward + backward + recompute
  double recompute = 0;      // the part of `compute` that recomputes (and GELU's memory time)
  double bubble = 0;         // pipeline idle time
  double bubble_fraction = 0;
  double tp = 0, cp = 0, pp = 0, dp = 0;  // exposed communication per axis
  double comm_total = 0;     // every collective of the step, alpha-beta
  double comm_exposed = 0;   // tp + cp + pp + dp
  double step = 0;           // compute + bubble + comm_exposed
  double tokens_per_s = 0;   // global tokens per second
  double mfu = 0;            // model FLOPs (no recompute) per second per rank / peak_flops
};

/// The time of one step of `plan` (its rank 0's collectives) under `cost`.
StepTime estimate_step_time(const MemPlan& plan, const CostModel& cost);

/// Whether a group of `size` ranks `stride` apart (mesh order) lies on one node.
bool group_within_node(int stride, int size, int ranks_per_node);

}  // namespace kiln::plan
