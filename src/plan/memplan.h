// The memory planner: what a training run will allocate on each rank, by category, and
// which layouts of a config fit a device (`kiln memplan`, docs/memplan.md).
//
// Method: a dry run. The planner builds the trainer's own step object (TrainStep,
// train/train_step.h: the model of model.arch with zero_model_storage(stage, dp), its
// activation checkpointing, the tensor-parallel plan over a SimulatedCommunicator of the
// tp group when parallel.tp > 1, DataParallel over a SimulatedCommunicator of the dp x cp group,
// AdamW, the token and target tensors) and (when log.peak_tflops is 0 on the CPU) the
// start-up GEMM probe on a MetaBackend, whose allocator counts bytes by category and
// whose ops do nothing, and runs one TrainStep::run. The allocator's per-category and total peaks are the
// prediction. What no backend call shows (library scratch space) comes from a
// MetaScratchModel (plan/scratch_models.h). Evaluation, sampling and checkpoint writing
// are not part of the step and not planned.
#pragma once

#include "comm/communicator.h"
#include "comm/simulated_communicator.h"
#include "core/allocator.h"
#include "config/config.h"
#include "plan/scratch_models.h"
#include "plan/time_model.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::plan {

struct MemPlanOptions {
  int world_size = 1;
  /// Whose scratch to add: "cpu" (oneDNN scratchpad; what `kiln train` runs today),
  /// "cuda" (cuBLASLt workspace and op scratch) or "none".
  std::string backend = "cpu";
  /// OpenMP threads per rank for the oneDNN scratchpad query (0 = this process's).
  int cpu_threads = 0;
  /// SimulatedCommunicator completion: polls before a collective counts as done (see
  /// comm/simulated_communicator.h): 1 = communication keeps pace with compute, INT_MAX =
  /// only waits complete collectives. -1 = by backend: INT_MAX for "cpu" (what MPI's
  /// communication thread does on CPU ranks whose compute threads own the cores: kiln's
  /// tests measure exactly this), 1 for "cuda" and "none". A world of one always
  /// completes at once (kiln uses the LocalCommunicator there).
  int completion_polls = -1;
  /// Also run rank 0 with collectives that complete only when waited for (MemPlan::upper).
  bool upper_bound = true;
  /// A mixture-of-experts model: how its tokens spread over the experts, for the scratch
  /// that depends on it (plan/scratch_models.h, MoeRouting; the activations do not).
  MoeRouting moe_routing = MoeRouting::Worst;
  /// A mixture-of-experts model: also run rank 0 under the other routing (MemPlan::moe_other).
  bool compare_routing = true;
  /// Ranks to simulate; empty = every rank when world_size <= 16, else 0, 1, the middle
  /// rank and the last two (ranks differ only in the zero padding of the last slices).
  std::vector<int> ranks;
};

/// Bytes of one rank: per-category peaks, the peak of the total, and what is left
/// allocated at the end of the step.
struct RankMemory {
  int rank = 0;
  std::array<int64_t, kNumMemCategories> peak{};
  std::array<int64_t, kNumMemCategories> end{};
  int64_t peak_total = 0;
  int64_t peak_of(MemCategory c) const { return peak[static_cast<size_t>(c)]; }
};

struct MemPlan {
  TrainConfig config;   // resolved (vocab_size, global_batch filled in)
  std::string model;             // Model::describe() of the planned model
  double flops_per_token = 0;    // Model::flops_per_token(train.seq_len): training FLOPs
  int world_size = 1, dp = 1, cp = 1, tp = 1, pp = 1, accum = 1;
  std::string scratch_model;        // MetaScratchModel::name()
  /// Mixture of experts (model.moe.num_experts > 0): E, k and the routing planned;
  /// moe_other is rank 0 under the other routing (when options.compare_routing).
  int64_t moe_experts = 0;
  int moe_top_k = 0;
  MoeRouting moe_routing = MoeRouting::Worst;
  std::optional<RankMemory> moe_other;
  std::string comm_model;           // "keeps pace" or "falls behind" (completion_polls)
  std::vector<RankMemory> ranks;    // the simulated ranks, rank 0 first
  /// Rank 0 when no collective completes before it is waited for: the most that
  /// ZeRO-2/3's gradient buffers (freed when their reduce-scatter completes) can pile up
  /// when communication falls behind. Equal to rank0() for stages 0-1 and one rank.
  RankMemory upper;
  std::vector<SimulatedCommunicator::Call> comm_calls;  // rank 0's data-parallel ones, in order
  std::vector<SimulatedCommunicator::Call> tp_calls;    // rank 0's tensor-parallel ones
  std::vector<SimulatedCommunicator::Call> cp_calls;    // rank 0's ring-attention shifts
  const RankMemory& rank0() const { return ranks.front(); }
  /// The simulated rank with the highest total peak.
  const RankMemory& max_rank() const;
  bool ranks_differ() const;
};

/// Fills what a dry run needs that training would take from elsewhere: model.vocab_size
/// (from data.dir's meta.json when it exists; an error naming the key otherwise),
/// train.global_batch (micro_batch * dp when 0). Checks the model shape and that cp x tp
/// x pp divides the world (dp = world / (cp tp pp)). Throws kiln::Error.
TrainConfig resolve_for_planning(TrainConfig config, int world_size);

/// The dry run of one training step of `config` on every rank in options.ranks.
MemPlan plan_memory(const TrainConfig& config, const MemPlanOptions& options);

// ---- layouts that fit, fastest first ---------------------------------------------------

struct Layout {
  int dp = 1;
  int cp = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int pp = 1;
  int virtual_stages = 1;
  std::string pp_schedule;  // parallel.pp_schedule (pp > 1)
  int zero_stage = 0;
  std::string checkpointing;
  int micro_batch = 1, accum = 1;
  int64_t global_batch = 0;    // train.global_batch, as planned
  double flops_per_token = 0;  // Model::flops_per_token(seq_len): 6 N + attention
  int64_t peak_bytes = 0;  // the highest simulated rank's (`memory`)
  RankMemory memory;       // that rank's per-category peaks
  bool fits = false;
  StepTime time;
  /// The config keys that select this layout, as `kiln train --set` takes them.
  std::vector<std::string> sets() const;
};

/// Layouts whose predicted step times lie within this fraction of the fastest that fits
/// count as tied: the time model's error is larger (docs/plan.md, "Validation"). Among
/// them search_layouts puts the simplest first (`simplicity`).
inline constexpr double kTieFraction = 0.02;
/// Lexicographic, smaller first: recomputation (none, selective, full), ZeRO stage, model
/// parallel ranks cp x tp x pp x virtual stages, sequence parallelism, then the larger
/// micro batch.
std::array<int, 5> simplicity(const Layout& l);

/// What search_layouts varies beyond cp, tp, sequence parallelism, ZeRO, checkpointing
/// and the micro-batch.
struct SearchSpace {
  /// Also pp (powers of two dividing the world, up to the layers; the first rank of every
  /// stage simulated) and, for pp > 1, virtual stages 1 (parallel.pp_schedule, 1f1b when
  /// it is interleaved) and 2 (interleaved) where the layers split evenly.
  /// false: the configured pp, schedule and virtual stages, rank 0 simulated.
  bool vary_pp = false;
};

/// Every layout over cp and tp (the powers of two that divide the world size over pp, tp
/// also the query and key/value heads, 2 cp also train.seq_len; cp and tp > 1 only for
/// models that run on such layouts (ModelArch::single_layout_reason, per axis); cp > 1
/// only for models with ring attention and without dropout; with sequence parallelism on
/// and off when tp > 1), pp as `space` says, zero stages 0-3 (0-2 with pp),
/// checkpointing none/selective/full and micro_batch halvings of config's (keeping the
/// global batch), with its predicted peak and step time; `fits` when peak <=
/// usable_bytes. A combination the trainer refuses (its config check throws) is left
/// out, the first such error kept in `refusal` when given. Sorted: fitting first,
/// fastest first, except that the layouts within kTieFraction of the fastest that fits
/// come simplest first.
std::vector<Layout> search_layouts(const TrainConfig& config, const MemPlanOptions& options,
                                   const CostModel& cost, int64_t usable_bytes,
                                   const SearchSpace& space = {}, std::string* refusal = nullptr);

}  // namespace kiln::plan
