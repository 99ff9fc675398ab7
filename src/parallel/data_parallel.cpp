#include "parallel/data_parallel.h"

#include "comm/ledger.h"
#include "core/error.h"
#include "parallel/tp_grads.h"

#include <algorithm>
#include <chrono>

namespace kiln {

ModelStorage zero_model_storage(int zero_stage, int world, DType dtype, DType grad_dtype) {
  KILN_CHECK(zero_stage >= 0 && zero_stage <= 3, "parallel.zero_stage must be 0..3, got {}",
             zero_stage);
  ModelStorage s;
  s.dtype = dtype;
  s.grad_dtype = grad_dtype;
  s.part_alignment = zero_stage == 0 ? 1 : world;
  s.allocate_grads = zero_stage <= 1;
  s.allocate_params = zero_stage <= 2;
  return s;
}

namespace {
using Clock = std::chrono::steady_clock;
}

DataParallel::DataParallel(Model& model, Communicator& comm, int zero_stage, double bucket_mb,
                           Communicator* tp, Communicator* expert)
    : model_(model), comm_(comm), tp_(tp && tp->size() > 1 ? tp : nullptr),
      backend_(model.backend()), stage_(zero_stage),
      rank_(comm.rank()), world_(comm.size()),
      bucket_elems_(std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4))) {
  const ModelStorage want = zero_model_storage(zero_stage, world_, model.dtype(), model.grad_dtype());
  // A rank whose parameters are all frozen (a pipeline stage) has no trainable or gradient
  // buffer, and one without frozen parameters no frozen buffer.
  const bool trainable = model.flat_size() > 0, frozen = model.frozen_flat_size() > 0;
  const bool as_wanted =
      (static_cast<bool>(model.grad_buffer()) == want.allocate_grads || !trainable) &&
      (static_cast<bool>(model.param_buffer()) == want.allocate_params || !trainable) &&
      (static_cast<bool>(model.frozen_buffer()) == want.allocate_params || !frozen);
  KILN_CHECK(as_wanted,
             "DataParallel: the model was not built with zero_model_storage({}, {})", zero_stage,
             world_);
  for (const ParamSpec& p : model.params())
    KILN_CHECK(!p.slice.ep_sharded() ||
               (expert && expert->size() * p.slice.ep_parts == world_),
               "DataParallel: {} is split over {} expert-parallel ranks, but the "
               "expert-data-parallel group has {} of the {} data-parallel ranks", p.name,
               p.slice.ep_parts, expert ? expert->size() : 0, world_);
  int64_t shard = 0, frozen_shard = 0;
  for (const ModelPart& mp : model.parts()) {
    Part part;
    part.index = mp.index;
    part.resident = mp.resident;
    part.begin = mp.begin;
    part.padded = mp.padded_size();
    part.frozen_begin = mp.frozen_begin;
    part.frozen_size = mp.frozen_size;
    const int64_t frozen_dense = mp.frozen_size - mp.frozen_expert_size;
    add_region(part, RegionKind::Dense, comm_, mp.begin, mp.dense_size(), shard);
    if (mp.expert_size > 0)  // `expert` exists: checked above
      add_region(part, RegionKind::Expert, *expert, mp.expert_begin(), mp.expert_size, shard);
    add_region(part, RegionKind::Frozen, comm_, mp.frozen_begin, frozen_dense, frozen_shard);
    if (mp.frozen_expert_size > 0)  // `expert` exists: checked above
      add_region(part, RegionKind::FrozenExpert, *expert, mp.frozen_begin + frozen_dense,
                 mp.frozen_expert_size, frozen_shard);
    for (const Region& r : part.regions)
      KILN_CHECK(stage_ == 0 || r.size % r.world == 0, "part {} ({}) is not aligned to {} ranks",
                 mp.index, mp.name, r.world);
    part.has_expert = mp.expert_size > 0;
    has_expert_ = has_expert_ || part.has_expert;
    parts_.push_back(part);
  }
  const Stream s = backend_.default_stream();
  if (stage_ >= 2) {
    grad_shard_ = backend_.empty(Shape{shard}, model.grad_dtype(), MemCategory::Gradients);
    backend_.fill(s, grad_shard_, 0.f);
  }
  if (stage_ == 3) {
    param_shard_ = backend_.empty(Shape{shard}, model.trainable_dtype(), MemCategory::Parameters);
    frozen_shard_ = backend_.empty(Shape{frozen_shard}, model.dtype(), MemCategory::Parameters);
    for (const Tensor* t : {&param_shard_, &frozen_shard_})
      if (*t) backend_.fill(s, *t, 0.f);  // either may be empty
  }
  if (stage_ == 0) {  // buckets of whole parts in the order backward completes them
    std::vector<int> current;
    int64_t size = 0;
    for (int p = static_cast<int>(parts_.size()) - 1; p >= 0; --p) {
      // A frozen part has nothing to reduce; one with an expert region is reduced alone
      // (and ends the bucket, whose parts must be adjacent).
      const bool alone = part_at(p).has_expert;
      if (part_at(p).padded > 0 && !alone) current.push_back(p);
      if (!alone) size += part_at(p).padded;
      if ((size >= bucket_elems_ || p == 0 || alone) && !current.empty()) {
        buckets_.push_back(current);
        current.clear();
        size = 0;
      }
    }
  }
  model_.set_hooks(this);
}

DataParallel::~DataParallel() {
  try {
    drain(true);
  } catch (...) {
  }
  model_.set_hooks(nullptr);
}

void DataParallel::add_region(Part& part, RegionKind kind, Communicator& group, int64_t begin,
                              int64_t size, int64_t& shard) {
  if (size == 0) return;
  Region r;
  r.kind = kind;
  r.comm = &group;
  r.rank = group.rank();
  r.world = group.size();
  r.begin = begin;
  r.size = size;
  r.S = stage_ == 0 ? size : size / r.world;
  r.shard_offset = shard;
  shard += r.S;
  part.regions.push_back(r);
}

const Tensor& DataParallel::buffer_of(const ParamSpec& p) const {
  return p.trainable ? model_.param_buffer() : model_.frozen_buffer();
}

const Tensor& DataParallel::shard_of(const Region& r) const {
  return r.trainable() ? param_shard_ : frozen_shard_;
}

const DataParallel::Region& DataParallel::region_of(const ParamSpec& p) const {
  const bool experts = p.slice.ep_sharded();
  const RegionKind kind = p.trainable ? (experts ? RegionKind::Expert : RegionKind::Dense)
                                      : (experts ? RegionKind::FrozenExpert : RegionKind::Frozen);
  for (const Region& r : parts_[static_cast<size_t>(p.part)].regions)
    if (r.kind == kind) return r;
  KILN_FAIL("DataParallel: {} lies in no region of part {}", p.name, p.part);
}

void DataParallel::add_slice(const ParamSpec& p, std::vector<AdamWSegment>& out) const {
  const Region& r = region_of(p);
  const int64_t s0 = r.slice_begin(), s1 = s0 + r.S;
  const int64_t a = std::max(s0, p.offset), b = std::min(s1, p.offset + p.local_shape().numel());
  if (a >= b) return;
  AdamWSegment seg;
  seg.spec = p;
  seg.begin = a - p.offset;
  seg.end = b - p.offset;
  const Shape n{b - a};
  seg.param = stage_ == 3 ? shard_of(r).view_at(r.shard_offset + (a - s0), n)
                          : buffer_of(p).view_at(a, n);
  if (p.trainable)
    seg.grad = stage_ >= 2 ? grad_shard_.view_at(r.shard_offset + (a - s0), n)
                           : model_.grad_buffer().view_at(a, n);
  out.push_back(seg);
}

std::vector<AdamWSegment> DataParallel::optimizer_segments() const {
  if (stage_ == 0) return whole_segments(model_.params(), model_.param_buffer(), model_.grad_buffer());
  std::vector<AdamWSegment> out;
  for (const ParamSpec& p : model_.params())
    if (p.trainable) add_slice(p, out);
  return out;
}

std::vector<AdamWSegment> DataParallel::frozen_segments() const {
  std::vector<AdamWSegment> out;
  for (AdamWSegment& seg : load_segments())
    if (!seg.spec.trainable) out.push_back(std::move(seg));
  return out;
}

std::vector<AdamWSegment> DataParallel::load_segments() const {
  std::vector<AdamWSegment> out;
  for (const ParamSpec& p : model_.params()) {
    if (stage_ == 3) {
      add_slice(p, out);
      continue;
    }
    const int64_t n = p.local_shape().numel();
    out.push_back({p, 0, n, buffer_of(p).view_at(p.offset, Shape{n}), Tensor()});
  }
  return out;
}

void DataParallel::init_weights(uint64_t seed) {
  if (stage_ < 3) {
    model_.init_weights(seed);
    return;
  }
  // Only this rank's elements, by their global coordinates (a tp slice's in runs).
  const auto segs = load_segments();
  size_t k = 0;
  for (size_t i = 0; i < model_.params().size(); ++i) {
    const ParamSpec& p = model_.params()[i];
    for (; k < segs.size() && segs[k].spec.name == p.name; ++k) {
      std::vector<float> host;
      for (const auto& run : p.slice.global_runs(p.shape, segs[k].begin, segs[k].end)) {
        const auto values = model_.init_values(i, seed, run.global_begin, run.global_end);
        host.insert(host.end(), values.begin(), values.end());
      }
      upload_f32(backend_, segs[k].param, host.data());
    }
  }
}

void DataParallel::begin_step(int micro_steps) {
  micro_steps_ = micro_steps;
  for (auto& part : parts_) part.done = false;
  if (stage_ <= 1) model_.zero_grad();
  if (stage_ >= 2) backend_.fill(backend_.default_stream(), grad_shard_, 0.f);
  if (stage_ == 2)
    for (auto& part : parts_)
      if (part.deferred) bind_whole_grads(part);
}

void DataParallel::begin_micro_step(int k) {
  micro_step_ = k;
  last_micro_ = k == micro_steps_ - 1;
}

void DataParallel::defer_reduction(const std::vector<int>& parts) {
  KILN_CHECK(stage_ <= 2, "DataParallel: deferred reductions need ZeRO stage 0-2, not {}", stage_);
  for (int p : parts) part_at(p).deferred = true;
}

void DataParallel::bind_whole_grads(Part& part) {
  if (part.padded == 0) return;  // every parameter frozen: no gradient
  part.grads = backend_.empty(Shape{part.padded}, model_.grad_dtype(), MemCategory::Gradients);
  backend_.fill(backend_.default_stream(), part.grads, 0.f);
  model_.bind_grads(part.index, part.grads);
}

// ---- stage 3 parameter gathering ----------------------------------------------------

void DataParallel::gather(int index, bool wait) {
  if (index < 0 || index >= static_cast<int>(parts_.size())) return;
  Part& part = part_at(index);
  if (!part.gathered) {
    part.gathered = true;
    part.params =
        backend_.empty(Shape{part.padded}, model_.trainable_dtype(), MemCategory::Parameters);
    part.frozen = backend_.empty(Shape{part.frozen_size}, model_.dtype(), MemCategory::Parameters);
    const Stream s = backend_.default_stream();
    const CommSite site("dp.all_gather params part {}", index);
    for (const Region& r : part.regions) {
      const Tensor whole =
          r.trainable() ? part.params.view_at(r.begin - part.begin, Shape{r.size})
                        : part.frozen.view_at(r.begin - part.frozen_begin, Shape{r.size});
      part.gather_works.push_back(
          r.comm->all_gather_async(whole, shard_of(r).view_at(r.shard_offset, Shape{r.S}), s));
    }
  }
  if (wait && !part.gather_works.empty()) {
    const auto t0 = Clock::now();
    for (auto& w : part.gather_works) w->wait();
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    part.gather_works.clear();
    model_.bind_params(index, part.params, part.frozen);
  }
}

void DataParallel::release(int index) {
  Part& part = part_at(index);
  for (auto& w : part.gather_works) w->wait();
  part.gather_works.clear();
  model_.bind_params(index, Tensor(), Tensor());
  part.params = part.frozen = Tensor();
  part.gathered = false;
}

void DataParallel::gather_full_params() {
  if (stage_ < 3 || full_gathered_) return;
  for (const auto& part : parts_) gather(part.index, false);
  for (const auto& part : parts_) gather(part.index, true);
  full_gathered_ = true;
}

void DataParallel::release_full_params() {
  if (!full_gathered_) return;
  for (const auto& part : parts_) release(part.index);
  full_gathered_ = false;
}

void DataParallel::end_forward_only() {
  if (full_gathered_) return;
  if (stage_ == 3) {
    for (const auto& part : parts_)
      if (part.gathered) release(part.index);
  }
  if (stage_ >= 2) {
    for (auto& part : parts_) {
      if (!part.resident || !part.grads) continue;
      model_.bind_grads(part.index, Tensor());
      part.grads = Tensor();
    }
  }
}

// ---- hooks ------------------------------------------------------------------------

void DataParallel::before_forward(int index) {
  Part& part = part_at(index);
  if (stage_ >= 2 && part.resident && !part.deferred) {
    // A resident parameter (GPT-2's wte) receives gradient from a later part during
    // forward (the head's loss gradient): its part's gradient must exist from here.
    bind_whole_grads(part);
  }
  if (stage_ == 3 && !full_gathered_) {
    gather(index, true);
    gather(index + 1, false);  // prefetch the next part
  }
  drain(false);
}

void DataParallel::after_forward(int index) {
  if (stage_ == 3 && !full_gathered_ && !part_at(index).resident) release(index);
}

void DataParallel::before_backward(int index) {
  Part& part = part_at(index);
  if (stage_ >= 2 && !part.resident && !part.deferred) bind_whole_grads(part);
  if (stage_ == 3 && !full_gathered_ && !part.resident) {
    gather(index, true);
    if (index - 1 >= 0 && !part_at(index - 1).resident) gather(index - 1, false);  // prefetch
  }
  drain(false);
}

void DataParallel::after_backward(int index) {
  if (stage_ == 3 && !full_gathered_) release(index);
  if (!part_at(index).deferred) reduce_part_grads(index);
  drain(false);
}

void DataParallel::reduce_part_grads(int index) {
  Part& part = part_at(index);
  if (part.padded == 0) return;  // every parameter frozen: no gradient
  const Stream s = backend_.default_stream();
  const CommSite site("dp.{} grads part {}", stage_ >= 1 ? "reduce_scatter" : "all_reduce", index);
  if (stage_ >= 2) {
    // Reduce-scatter each trainable region in place; this rank's slice is then added to
    // its gradient shard.
    for (const Region& r : part.regions) {
      if (!r.trainable()) continue;
      const Tensor whole = part.grads.view_at(r.begin - part.begin, Shape{r.size});
      const Tensor mine = whole.view_at(static_cast<int64_t>(r.rank) * r.S, Shape{r.S});
      Pending p;
      p.work = r.comm->reduce_scatter_async(mine, whole, s);
      p.keep = part.grads;
      p.src = mine;
      p.dst = grad_shard_.view_at(r.shard_offset, Shape{r.S});
      pending_.push_back(std::move(p));
    }
    model_.bind_grads(index, Tensor());
    part.grads = Tensor();
    return;
  }
  if (!last_micro_) return;  // stages 0-1: only the last micro-step talks
  const Tensor grads = model_.grad_buffer();
  if (stage_ == 1 || part.has_expert) {  // stage 0: all-reduce each region of such a part
    for (const Region& r : part.regions) {
      if (!r.trainable() || r.world == 1) continue;
      const Tensor whole = grads.view_at(r.begin, Shape{r.size});
      Pending p;
      p.work = stage_ == 1 ? r.comm->reduce_scatter_async(
                                 whole.view_at(static_cast<int64_t>(r.rank) * r.S, Shape{r.S}),
                                 whole, s)
                           : r.comm->all_reduce_async(whole, ReduceOp::Sum, s);
      pending_.push_back(std::move(p));
    }
    return;
  }
  if (world_ == 1) return;
  part.done = true;  // stage 0: all-reduce a bucket once all of its parts are done
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& bucket = buckets_[b];
    if (std::find(bucket.begin(), bucket.end(), index) == bucket.end()) continue;
    for (int q : bucket)
      if (!part_at(q).done) return;
    const CommSite bucket_site("dp.all_reduce grads bucket {}", b);
    const Part& first = part_at(bucket.back());  // lowest flat offset
    const Part& last = part_at(bucket.front());
    Pending p;
    p.work = comm_.all_reduce_async(
        grads.view_at(first.begin, Shape{last.begin + last.padded - first.begin}),
        ReduceOp::Sum, s);
    pending_.push_back(std::move(p));
    return;
  }
}

void DataParallel::drain(bool all) {
  // At most kMaxPending reductions in flight: beyond that the oldest is waited for, so
  // that transient gradient buffers (stages 2-3) cannot pile up when communication
  // falls behind computation, and the peak memory stays bounded and predictable.
  constexpr size_t kMaxPending = 2;
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    if (!all && pending_.size() <= kMaxPending && !p.work->is_completed()) return;
    const auto t0 = Clock::now();
    p.work->wait();
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    if (p.dst) backend_.add(backend_.default_stream(), p.dst, p.dst, p.src);
    pending_.pop_front();
  }
}

void DataParallel::finish_gradients(const std::function<void()>& before_deferred) {
  drain(true);
  if (before_deferred) before_deferred();
  last_micro_ = true;
  for (const auto& part : parts_)
    if (part.deferred) reduce_part_grads(part.index);
  drain(true);
  if (tp_) reduce_partial_grads(optimizer_segments(), backend_, *tp_);
}

void DataParallel::grad_sum_squares(const Tensor& acc) {
  const Stream s = backend_.default_stream();
  backend_.fill(s, acc, 0.f);
  // A tied copy (its owner on another pipeline stage counts it) is left out.
  std::vector<AdamWSegment> segs = optimizer_segments();
  const bool copies = std::any_of(segs.begin(), segs.end(),
                                  [](const AdamWSegment& seg) { return seg.spec.tied_copy; });
  std::erase_if(segs, [](const AdamWSegment& seg) { return seg.spec.tied_copy; });
  // Below stage 1 every dp rank holds the whole reduced gradient, but expert-parallel
  // ranks hold other experts: with an expert region each replica counts on rank 0 of its
  // group (dp x cp, or edp for the experts) and the sum runs over dp x cp too. From stage
  // 1 the slices of the dp x cp ranks cover every element once.
  const bool replicas_once = stage_ == 0 && has_expert_;
  if (replicas_once)
    std::erase_if(segs, [&](const AdamWSegment& seg) { return region_of(seg.spec).rank != 0; });
  if (tp_) {
    // Each tp rank's share (replicated tensors on tp rank 0 only).
    tp_share_sum_squares(segs, backend_, tp_->rank(), acc);
  } else if (copies || replicas_once) {
    add_sum_squares(segs, backend_, acc);
  } else if (stage_ == 0) {
    backend_.sum_squares(s, acc, model_.grad_buffer());  // the whole buffer in one call
  } else if (stage_ == 1) {
    for (const auto& part : parts_)
      for (const Region& r : part.regions)
        if (r.trainable())
          backend_.sum_squares(s, acc, model_.grad_buffer().view_at(
                                           r.begin + r.rank * r.S, Shape{r.S}));
  } else {
    backend_.sum_squares(s, acc, grad_shard_);
  }
  // Summed in double on the device (rank order on MPI): every rank the same bits.
  if ((stage_ > 0 || replicas_once) && world_ > 1) {
    const CommSite site("dp.all_reduce grad norm");
    comm_.all_reduce(acc, ReduceOp::Sum, s);
  }
  if (tp_) {
    const CommSite site("tp.all_reduce grad norm");
    tp_->all_reduce(acc, ReduceOp::Sum, s);
  }
}

void DataParallel::after_optimizer_step() {
  if (stage_ == 0 || stage_ == 3) return;
  const Stream s = backend_.default_stream();
  const CommSite site("dp.all_gather params after the update");
  std::vector<std::shared_ptr<Work>> works;
  for (const auto& part : parts_) {
    for (const Region& r : part.regions) {
      if (!r.trainable() || r.world == 1) continue;  // frozen parameters do not change
      const Tensor whole = model_.param_buffer().view_at(r.begin, Shape{r.size});
      works.push_back(r.comm->all_gather_async(
          whole, whole.view_at(static_cast<int64_t>(r.rank) * r.S, Shape{r.S}), s));
    }
  }
  const auto t0 = Clock::now();
  for (auto& w : works) w->wait();
  wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string DataParallel::hash_regions(bool expert) const {
  // In each buffer, the flat ranges [from, to) outside its expert regions (the whole
  // buffer when there is none), or its expert regions, hashed in flat order.
  uint64_t h = 1469598103934665603ull;  // hash_bytes's start
  for (const bool trainable : {true, false}) {
    const Tensor& buffer = trainable ? model_.param_buffer() : model_.frozen_buffer();
    if (!buffer) continue;
    int64_t from = 0;
    auto add = [&](int64_t to) {
      if (to > from) h = hash_bytes(backend_, buffer.view_at(from, Shape{to - from}), h);
    };
    for (const Part& part : parts_)
      for (const Region& r : part.regions) {
        if (!r.experts() || r.trainable() != trainable) continue;
        if (expert) from = r.begin;
        add(expert ? r.begin + r.size : r.begin);
        from = r.begin + r.size;
      }
    if (!expert) add(buffer.numel());
  }
  return fmt::format("{:016x}", h);
}

std::string DataParallel::replica_hash() const {
  return stage_ == 3 ? "" : hash_regions(false);
}

std::string DataParallel::expert_replica_hash() const {
  return stage_ == 3 || !has_expert_ ? "" : hash_regions(true);
}

std::string DataParallel::tp_replica_hash() const {
  uint64_t h = 1469598103934665603ull;
  for (const AdamWSegment& seg : optimizer_segments())
    if (!seg.spec.slice.tp_sharded() && seg.size() > 0) h = hash_bytes(backend_, seg.param, h);
  return fmt::format("{:016x}", h);
}

double DataParallel::take_wait_seconds() {
  const double w = wait_seconds_;
  wait_seconds_ = 0.0;
  return w;
}

}  // namespace kiln
