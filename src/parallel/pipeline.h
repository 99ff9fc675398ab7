// PipelineExecutor: runs one pipeline rank's action list (pipeline_schedule.h) on the
// model's chunks, with the pipeline group's send/recv for the activations and gradients
// between stages (Narayanan et al. 2021). pp = 1 is the trivial schedule (F0 B0 F1 B1
// ...), so one training step serves every layout.
//
// Chunk c holds the model's parts [boundaries[c], boundaries[c+1]) and runs on pipeline
// rank c % pp. Each (chunk, micro-batch) in flight uses its own slot of the model's saved
// activations (Model::forward_stage): slot j % k for a chunk with at most k micro-batches
// in flight on this rank (forwards and backwards of a chunk both run in micro-batch
// order, checked here, so the micro-batches in flight are consecutive).
//
// Messages: the activation out of F(c, j) goes to rank (c+1) % pp, the gradient out of
// B(c, j) to (c-1) % pp, each in a buffer of its own (Model::stage_activation_shape, the
// model dtype), tagged by (kind, chunk, micro-batch). After each pass its sends and the
// receives of the next pass are posted together, as one group (Communicator::group_start:
// NCCL group calls, as Megatron-LM's batched send_forward_recv_backward), so a receive is
// posted before the pass that needs it starts and never ordered against a send to the
// same peer; send buffers are freed once matched, the rest waited for at the end of the
// step. Between chunks on the same rank nothing is sent: the tensor is handed over in
// memory.
#pragma once

#include "comm/communicator.h"
#include "core/trace_sink.h"
#include "models/model.h"
#include "parallel/pipeline_schedule.h"

#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace kiln::pp {

/// What the executor asks of its caller (the training step) for micro-batch j.
class MicroBatches {
 public:
  virtual ~MicroBatches() = default;
  /// The device micro-batch j, valid until the step ends (the first call may upload it).
  virtual Batch batch(int j) = 0;
  /// Before every forward (or backward) pass of micro-batch j on any chunk: dropout keys,
  /// the data-parallel micro-step.
  virtual void before_pass(int j, bool forward) = 0;
};

class PipelineExecutor {
 public:
  /// `comm`: the pipeline group (its size is schedule.pp, its rank this stage's; nullptr
  /// when pp = 1). `boundaries`: the first part (global index) of each of the
  /// schedule's chunks (split_stages), then the whole model's part count. Micro-batches are B x T. Not
  /// owned. Throws kiln::Error when the model does not run as stages (and pp > 1), the
  /// boundaries do not fit, the schedule's simulation fails, or a chunk's passes are not
  /// in micro-batch order.
  PipelineExecutor(Model& model, Communicator* comm, Schedule schedule, std::vector<int> boundaries,
                   int B, int T);

  /// Runs this rank's list of one step with the loss gradient scaled by grad_scale;
  /// returns the loss sum of the rank's chunks (non-zero only where the last chunk runs).
  LossSum run(MicroBatches& micro_batches, float grad_scale);
  /// Forward only (evaluation) of micro-batch 0: each rank's chunks in order, slot 0.
  LossSum forward_only(MicroBatches& micro_batches);

  const Schedule& schedule() const { return schedule_; }
  /// The schedule's simulation (run by the constructor: no deadlock, every message matched).
  const SimResult& simulated() const { return sim_; }
  int rank() const { return rank_; }
  /// The global parts [first, end) of chunk c.
  std::pair<int, int> chunk_parts(int chunk) const;
  /// Micro-batches in flight at most on this rank for chunk c (its slots).
  int slots(int chunk) const;
  /// Host seconds since the last call: computing passes (busy) and running the schedule,
  /// run() start to end (span), waits included. A stage's measured bubble is 1 - busy /
  /// the longest span over the stages (on a CPU, where passes are synchronous).
  struct Timing {
    double busy = 0.0, span = 0.0;
  };
  Timing take_timing();
  /// Where the passes are reported for a trace (spans "forward" and "backward");
  /// nullptr: nowhere. Not owned.
  void set_tracer(TraceSink* tracer) { tracer_ = tracer; }

 private:
  enum Kind { kActivation = 0, kGradient = 1 };
  using Key = std::tuple<int, int, int>;  // (kind, producing chunk, micro-batch), as Action
  struct Inbox {
    std::shared_ptr<Work> work;  // null: handed over in memory
    Tensor data;
  };
  int tag(Kind kind, int chunk, int mb) const;
  /// The ledger's call sites (comm/ledger.h): "activation", "stage 1 -> 2 micro-batch 3".
  static const char* kind_name(Kind kind);
  std::string route(int from, int to, int chunk, int mb) const;
  Tensor message_buffer() const;
  void post_recv(const Action& a);
  /// The sends and receives from list index i up to the next pass, as one group; i ends
  /// at that pass.
  void post_messages(const std::vector<Action>& list, size_t& i);
  Tensor take(Kind kind, int chunk, int mb);
  /// Posts the send of the outbox's (kind, chunk, mb) to peer.
  void send(Kind kind, int chunk, int mb, int peer);
  void forward(const Action& a, MicroBatches& mbs, float grad_scale, LossSum& loss);
  void backward(const Action& a, MicroBatches& mbs);
  void finish_sends();

  Model& model_;
  Communicator* comm_;
  Schedule schedule_;
  SimResult sim_;
  std::vector<int> boundaries_;  // [chunks + 1]: chunk c is parts [b[c], b[c+1])
  int rank_ = 0, B_ = 0, T_ = 0;
  std::vector<int> local_chunks_;
  std::vector<int> slots_;  // per global chunk (0 where not local)
  std::map<Key, Inbox> inbox_;
  std::map<Key, Tensor> outbox_;  // computed, its send not yet posted
  std::vector<std::pair<std::shared_ptr<Work>, Tensor>> sends_;
  Timing timing_;
  TraceSink* tracer_ = nullptr;
};

}  // namespace kiln::pp
