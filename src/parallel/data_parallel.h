// Data parallelism with ZeRO stages 0-3 (Rajbhandari et al. 2020, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models"; stage 3 as PyTorch FSDP).
//
// The model's parameters are grouped in parts (models/model.h; FSDP calls them units:
// GPT-2's embeddings, each block, the head), each padded to a multiple of the
// data-parallel world size W, so a part of padded size W*S splits into W equal slices;
// rank r owns slice r of EVERY part (FSDP's flat-parameter-per-unit layout). Padding is
// zero and never reaches norms, updates or checkpoints (segments cover real elements
// only).
//
//   stage 0  gradients all-reduced in buckets of parts (parallel.bucket_mb) as soon as
//            the last micro-step's backward completes them; every rank updates all.
//   stage 1  gradients reduce-scattered per part on the last micro-step; each rank
//            updates its slices (optimizer state 1/W), then parameters are all-gathered.
//   stage 2  as 1, but gradients live only as slices: each part's gradient exists whole
//            only from its backward until its reduce-scatter, done on EVERY micro-step
//            (as DeepSpeed ZeRO-2 and FSDP; stages 0/1 communicate only on the last).
//   stage 3  as 2, and parameters live only as slices: a part is all-gathered before its
//            forward and again before its backward and freed after, the next part's
//            gather prefetched. A resident part (ModelPart::resident: GPT-2's embeddings, whose
//            wte is also the head's output projection) stays gathered from its forward
//            to its backward, and its gradient exists from the start of forward.
//
// Frozen parameters (ParamSpec::trainable false) sit in the model's frozen buffer, a part
// its range there (models/model.h, ModelPart), beside its range of the trainable buffer:
// each region splits into W slices of its own (S trainable elements per rank, Sf frozen),
// so a part's gradient (the trainable range) is reduced, sharded and summed into norms
// without any frozen element, the optimizer sees trainable slices only, and the frozen
// slices are only ever gathered (stage 3), never all-gathered after an update (stages
// 1-2: they do not change). The two buffers may differ in dtype (a LoRA fine-tune's fp32
// adapters over a bf16 base), so each has shards of its own.
//
// Expert parallelism (parallel/expert_parallel.h; Megatron-core's rule): each ep rank holds
// other experts, so a part's trainable expert-parallel parameters (ParamSlice::ep_sharded)
// sit in a region of their own between its dense and frozen ones (ModelPart::expert_size),
// which is reduced, sharded and gathered over the expert-data-parallel group (We = W / ep
// ranks that hold the same experts; DeviceMesh::edp_comm) instead of the dp x cp group:
// each rank owns slice (edp rank) of it, Se = expert_size / We elements. Its frozen
// expert-parallel parameters (LoRA's frozen experts) close its frozen region in a region
// of their own (ModelPart::frozen_expert_size), sharded (stage 3) and gathered over the
// same group. A part is thus a list of regions (dense, expert, frozen, frozen expert; the
// empty ones left out), each with its group, rank, world and slice length, and every
// operation above runs per region. Stage 0
// all-reduces a part with an expert region on its own (its regions over their groups),
// not in a bucket.
//
// Composed with tensor parallelism (parallel/tp_plan.h), the model holds one tp rank's
// slices, laid out alike on every tp rank, and ZeRO shards that layout over the dp x cp
// group of the tp slice (Megatron-LM's distributed optimizer over its data-parallel group
// with context parallel; parallel/mesh.h); the tp communicator adds the partial-gradient
// reduction and the norm's sum over tp.
//
// Communication runs on the communicator's own thread (MpiCommunicator) or stream
// (NcclCommunicator), overlapping the backward pass; the trainer waits in
// finish_gradients(). Every collective is given the backend's default stream, so that
// on a GPU it starts after the kernels that produced its buffer.
#pragma once

#include "comm/communicator.h"
#include "models/model.h"
#include "optim/adamw.h"

#include <deque>
#include <functional>
#include <memory>
#include <vector>

namespace kiln {

/// How the model must store its parameters for a ZeRO stage over `world` ranks, with
/// parameters/activations in `dtype` and gradients in `grad_dtype`.
ModelStorage zero_model_storage(int zero_stage, int world, DType dtype = DType::F32,
                               DType grad_dtype = DType::F32);

class DataParallel final : public ModelHooks {
 public:
  /// `comm`: the dp x cp group (DeviceMesh::dp_cp_comm). `model` must have been built with
  /// zero_model_storage(zero_stage, comm.size(), ...).
  /// `tp`: the tensor-parallel group of a model split by the tp plan (nullptr, or one
  /// rank, for none); not owned.
  /// `expert`: the expert-data-parallel group (DeviceMesh::edp_comm) of a model split by
  /// the ep plan (nullptr without one); not owned. Installs itself as the model's hooks.
  /// Throws kiln::Error on a bad stage, or when the model has expert-parallel parameters
  /// and `expert` is missing or not comm.size() / ep ranks.
  DataParallel(Model& model, Communicator& comm, int zero_stage, double bucket_mb,
               Communicator* tp = nullptr, Communicator* expert = nullptr);
  ~DataParallel() override;

  int zero_stage() const { return stage_; }
  int rank() const { return rank_; }
  int world() const { return world_; }

  /// Optimizer segments for this rank (every trainable parameter for stage 0, its slices
  /// else); frozen parameters have none.
  std::vector<AdamWSegment> optimizer_segments() const;
  /// Parameter segments (no gradient) of the frozen parameters this rank holds: whole
  /// for stages 0-2, its slices for stage 3. A checkpoint saves them beside the optimizer's.
  std::vector<AdamWSegment> frozen_segments() const;
  /// Parameter segments this rank loads (every parameter for stages 0-2, whose
  /// replicas are complete; its slices for stage 3, frozen ones included), in the
  /// order of Model::params().
  std::vector<AdamWSegment> load_segments() const;

  /// The model's initial values (Model::init_values), computed on the host for the
  /// elements this rank holds.
  void init_weights(uint64_t seed);

  /// Before the micro-steps of an update: zero gradients. `micro_steps` = accumulation.
  void begin_step(int micro_steps);
  /// Before micro-step k's forward (0-based), and (pipeline schedules, whose forwards
  /// and backwards of several micro-batches interleave) before micro-batch k's backward
  /// too: a part's reduction starts after its backward of the last micro-batch.
  void begin_micro_step(int k);
  /// Parts (local indices) whose gradient stays whole on this rank for the whole step
  /// and is reduced only in finish_gradients (pipeline stages: a tied parameter's
  /// gradient, summed over its stages first; a resident part's, written by several
  /// micro-batches in flight). Stages 0-2; throws kiln::Error for stage 3.
  void defer_reduction(const std::vector<int>& parts);
  /// After the last backward: waits for every reduction, calls `before_deferred` (the
  /// gradients of deferred parts are then complete on this rank), reduces the deferred
  /// parts, then the tp-partial gradients over tp (tp_grads.h). Gradients are then final.
  void finish_gradients(const std::function<void()>& before_deferred = {});
  /// acc fp64 [1] (on the device) <- the sum of squares of the whole model's gradient,
  /// each element counted once over all ranks of dp x cp x tp (the clipping norm's
  /// square; expert-parallel ranks hold other experts), the same on every rank; nothing
  /// is read back. Collective.
  void grad_sum_squares(const Tensor& acc);
  /// After the optimizer step: all-gather updated slices (stages 1-2).
  void after_optimizer_step();
  /// Stage 3: gathers every part into full storage (for sampling, export); undone by
  /// release_full_params(). No-op for stages 0-2.
  void gather_full_params();
  void release_full_params();
  /// Releases parts a forward-only pass (evaluation) left gathered.
  void end_forward_only();

  /// Stages 0-2 keep a full replica of the parameters on every rank: a hash of its
  /// bytes but the expert regions', to check that the replicas are bitwise identical over
  /// the dp x cp group. "" for stage 3.
  std::string replica_hash() const;
  /// Likewise for the expert regions, replicated over the expert-data-parallel group
  /// (the same on its ranks); "" for stage 3 or a model without expert-parallel parameters.
  std::string expert_replica_hash() const;
  /// A hash of the parameters this rank updates that tensor parallelism replicates (not
  /// tp-sharded): the same on every rank of a tp group while its replicas agree bitwise.
  std::string tp_replica_hash() const;

  /// Seconds spent waiting for communication since the last call (exposed, not hidden).
  double take_wait_seconds();

  // ModelHooks
  void before_forward(int index) override;
  void after_forward(int index) override;
  void before_backward(int index) override;
  void after_backward(int index) override;

 private:
  enum class RegionKind { Dense, Expert, Frozen, FrozenExpert };
  /// One region of a part (models/model.h, ModelPart): reduced, sharded and gathered over
  /// its group, of which this rank owns slice `rank`.
  struct Region {
    RegionKind kind = RegionKind::Dense;
    Communicator* comm = nullptr;  // dense, frozen: the dp x cp group; the experts': edp
    int rank = 0, world = 1;       // this rank's and the size of `comm`
    int64_t begin = 0, size = 0;   // in its flat layout (trainable, which is also the
                                   // gradient's, or frozen); size padded to the alignment
    int64_t S = 0;                 // slice length (size / world; size for stage 0)
    int64_t shard_offset = 0;      // of this rank's slice in param_shard_ and grad_shard_
                                   // (trainable) or frozen_shard_ (frozen)
    bool trainable() const { return kind == RegionKind::Dense || kind == RegionKind::Expert; }
    bool experts() const { return kind == RegionKind::Expert || kind == RegionKind::FrozenExpert; }
    int64_t slice_begin() const { return begin + rank * S; }  // flat; stages 1-3
  };
  struct Part {
    int index = 0;
    bool resident = false;
    int64_t begin = 0, padded = 0;  // its trainable range (and gradient): [begin,
                                    // begin + padded) of the trainable layout
    int64_t frozen_begin = 0, frozen_size = 0;  // its range of the frozen layout
    std::vector<Region> regions;    // the non-empty ones, in layout order
    bool has_expert = false;        // an expert region among them
    bool gathered = false;          // stage 3: params and frozen gathered (or under way)
    Tensor params, frozen;          // stage 3: gathered storage while resident
    std::vector<std::shared_ptr<Work>> gather_works;
    Tensor grads;  // stages 2-3: the whole part's gradient while it exists
    bool done = false;
    bool deferred = false;  // reduced in finish_gradients (defer_reduction)
  };
  struct Pending {
    std::shared_ptr<Work> work;
    Tensor keep;      // buffer the operation uses (freed on completion)
    Tensor src, dst;  // when dst is set: dst += src once the work completes
  };
  Part& part_at(int index) { return parts_[static_cast<size_t>(index)]; }
  /// Appends to `part` the region of `kind` at [begin, begin + size) of its flat layout
  /// over `group`, unless empty; `shard` is the length of its shard (param_shard_ when
  /// trainable, frozen_shard_ when frozen) so far, advanced past its slice.
  void add_region(Part& part, RegionKind kind, Communicator& group, int64_t begin,
                  int64_t size, int64_t& shard);
  /// The model's flat buffer (trainable or frozen) holding `p` (stages 0-2).
  const Tensor& buffer_of(const ParamSpec& p) const;
  /// Stage 3: the parameter shard holding `r`'s slice (param_shard_ or frozen_shard_).
  const Tensor& shard_of(const Region& r) const;
  /// The region of `p`'s part that holds it.
  const Region& region_of(const ParamSpec& p) const;
  /// The hash of the flat parameter ranges (trainable, then frozen) inside (`expert`) or
  /// outside the expert regions.
  std::string hash_regions(bool expert) const;
  /// Appends this rank's slice of `p` (stages 1-3; its frozen slice, without gradient,
  /// when `p` is frozen) to `out`, unless empty.
  void add_slice(const ParamSpec& p, std::vector<AdamWSegment>& out) const;
  void gather(int index, bool wait);
  void release(int index);
  void reduce_part_grads(int index);
  /// Stages 2-3: a zeroed whole-part gradient, bound to the model.
  void bind_whole_grads(Part& part);
  void drain(bool all);

  Model& model_;
  Communicator& comm_;
  Communicator* tp_;  // nullptr without tensor parallelism
  Backend& backend_;
  int stage_, rank_, world_;
  int64_t bucket_elems_;
  std::vector<Part> parts_;
  Tensor grad_shard_;    // stages 2-3: this rank's gradient slices, [sum of trainable S]
  Tensor param_shard_;   // stage 3: this rank's trainable parameter slices, likewise
  Tensor frozen_shard_;  // stage 3: this rank's frozen parameter slices, [sum of frozen S]
  std::deque<Pending> pending_;
  std::vector<std::vector<int>> buckets_;  // stage 0: parts per bucket, backward order
                                          // (a part with an expert region in none)
  bool has_expert_ = false;  // a part with an expert region
  int micro_step_ = 0, micro_steps_ = 1;
  bool last_micro_ = true;
  double wait_seconds_ = 0.0;
  bool full_gathered_ = false;
};

}  // namespace kiln
