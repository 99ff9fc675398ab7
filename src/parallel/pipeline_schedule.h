// Pipeline-parallel schedules as data (issue "Pipeline parallelism"): which forward and
// backward passes of which (chunk, micro-batch) each pipeline rank runs, in which order,
// and the activation and gradient messages between them; and a simulator that runs every
// rank's list without a model.
//
// The model's parts are cut into C = pp * v contiguous chunks (virtual stages; v =
// parallel.virtual_stages); chunk c runs on pipeline rank c % pp, so with v > 1 each rank
// holds v chunks, pp apart (Narayanan et al. 2021, section 2.2). Micro-batch j enters
// chunk 0 and leaves chunk C-1, where its loss is computed; its backward runs the chunks
// in reverse. Schedules (Huang et al. 2019; Narayanan et al. 2021):
//
//   gpipe        every forward, then every backward (v = 1; m micro-batches in flight)
//   1f1b         stage s runs min(pp - s - 1, m) warm-up forwards, then alternates one
//                forward and one backward, then the remaining backwards (v = 1; at most
//                pp - s micro-batches in flight on stage s)
//   interleaved  1F1B over the rank's v chunks: forwards visit the local chunks in groups
//                of pp micro-batches, chunk by chunk; warm-up (pp - s - 1) * 2 + (v - 1) * pp
//                forwards (Megatron-LM's order); needs v > 1 and m a multiple of pp
//
// Messages: after F(c, j) a SendActivation to rank (c+1) % pp, before it a RecvActivation
// from rank (c-1) % pp; after B(c, j) a SendGradient to (c-1) % pp, before it a
// RecvGradient from (c+1) % pp; none between chunks on the same rank. Sends are posted
// and never block (the executor posts receives early and groups each send with the
// matching receive); a receive waits for its message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::pp {

enum class ScheduleKind : uint8_t { GPipe, OneFOneB, Interleaved };
/// "gpipe", "1f1b", "interleaved"; parse throws kiln::Error naming parallel.pp_schedule.
const char* schedule_kind_name(ScheduleKind k);
ScheduleKind parse_schedule_kind(const std::string& name);

enum class ActionKind : uint8_t {
  Forward, Backward, SendActivation, RecvActivation, SendGradient, RecvGradient
};
const char* action_kind_name(ActionKind k);

struct Action {
  ActionKind kind = ActionKind::Forward;
  int chunk = 0;        // the global chunk computed, or whose output / input gradient moves
  int micro_batch = 0;
  int peer = -1;        // the other pipeline rank of a send or receive
  bool operator==(const Action&) const = default;
  std::string str() const;  // "F(c=1,mb=0)", "send_act(c=1,mb=0)->2"
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int pp = 1, virtual_stages = 1, micro_batches = 1;
  std::vector<std::vector<Action>> ranks;  // [pp] action lists
  int chunks() const { return pp * virtual_stages; }
  static int rank_of_chunk(int chunk, int pp) { return chunk % pp; }
};

/// The schedule of `kind` for pp ranks, v virtual stages per rank and m micro-batches.
/// Throws kiln::Error naming the key (parallel.pp, parallel.virtual_stages,
/// parallel.pp_schedule, train.grad_accum_steps) when the combination is not allowed:
/// pp, v, m >= 1; gpipe and 1f1b need v = 1; interleaved needs v > 1 and m % pp == 0.
Schedule make_schedule(ScheduleKind kind, int pp, int virtual_stages, int micro_batches);

/// What running every rank's list shows, with a forward costing `forward_cost` and a
/// backward `backward_cost` time units per chunk (messages arrive at once).
struct SimResult {
  int64_t makespan = 0;                  // time units until the last rank finishes
  std::vector<int64_t> busy;             // per rank: time computing
  std::vector<int> peak_in_flight;       // per rank: most micro-batches forwarded, not yet
                                         // backwarded, over all its chunks
  double bubble_fraction = 0.0;          // idle time / (pp * makespan)
};

/// Runs the schedule. Throws kiln::Error with the blocked ranks and what each waits for
/// when it deadlocks, or naming the action when a message is unmatched, sent twice, a
/// backward precedes its forward, or a (chunk, micro-batch) pass is missing or repeated.
SimResult simulate(const Schedule& s, int64_t forward_cost = 1, int64_t backward_cost = 2);

/// The idle fraction of a pipeline with equal stages by theory: (pp-1)/(m+pp-1) for
/// gpipe and 1f1b, (pp-1)/(v*m+pp-1) interleaved (Narayanan et al. 2021, section 2.2).
double theoretical_bubble(ScheduleKind kind, int pp, int virtual_stages, int micro_batches);

/// Cuts parts of relative cost `costs` (ModelPart::cost, in model order) into `stages`
/// contiguous non-empty groups minimising the largest group's cost; returns the first
/// part of each group (boundaries[0] = 0). `split` (parallel.pp_split: the first part of
/// each stage after the first, increasing) overrides the balance when not empty. Throws
/// kiln::Error naming parallel.pp_split when it is malformed, or when there are fewer
/// parts than stages.
std::vector<int> split_stages(const std::vector<double>& costs, int stages,
                              const std::vector<int64_t>& split = {});

}  // namespace kiln::pp
