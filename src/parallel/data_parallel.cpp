#include "parallel/data_parallel.h"

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
  // A rank whose parameters are all frozen (a pipeline stage) has no gradient buffer.
  const bool grads_as_wanted = static_cast<bool>(model.grad_buffer()) == want.allocate_grads ||
                               model.grad_flat_size() == 0;
  KILN_CHECK(static_cast<bool>(model.param_buffer()) == want.allocate_params && grads_as_wanted,
             "DataParallel: the model was not built with zero_model_storage({}, {})", zero_stage,
             world_);
  int64_t shard = 0, grad_shard = 0;
  for (const ModelPart& mp : model.parts()) {
    Part part;
    part.index = mp.index;
    part.resident = mp.resident;
    part.begin = mp.begin;
    part.padded = mp.padded_size();
    part.grad_begin = mp.grad_begin();
    part.T = mp.grad_size();
    KILN_CHECK(stage_ == 0 || (part.T % world_ == 0 && mp.frozen_size % world_ == 0),
               "part {} ({}) is not aligned to {} ranks", mp.index, mp.name, world_);
    part.S = stage_ == 0 ? part.T : part.T / world_;
    part.Sf = stage_ == 0 ? mp.frozen_size : mp.frozen_size / world_;
    part.shard_offset = shard;
    part.grad_shard_offset = grad_shard;
    shard += part.S + part.Sf;
    grad_shard += part.S;
    parts_.push_back(part);
  }
  if (stage_ >= 2) {
    grad_shard_ = backend_.empty(Shape{grad_shard}, model.grad_dtype(), MemCategory::Gradients);
    backend_.fill(backend_.default_stream(), grad_shard_, 0.f);
  }
  if (stage_ == 3) {
    param_shard_ = backend_.empty(Shape{shard}, model.dtype(), MemCategory::Parameters);
    backend_.fill(backend_.default_stream(), param_shard_, 0.f);
  }
  if (stage_ == 0) {  // buckets of whole parts in the order backward completes them
    std::vector<int> current;
    int64_t size = 0;
    for (int p = static_cast<int>(parts_.size()) - 1; p >= 0; --p) {
      if (part_at(p).T > 0) current.push_back(p);  // a frozen part has nothing to reduce
      size += part_at(p).T;
      if ((size >= bucket_elems_ || p == 0) && !current.empty()) {
        buckets_.push_back(current);
        current.clear();
        size = 0;
      }
    }
  }
  for (const ParamSpec& p : model.params())
    KILN_CHECK(!p.slice.ep_sharded() || expert == nullptr || expert->size() == world_,
               "DataParallel: {} is split over expert-parallel ranks, which data parallelism "
               "does not reduce yet", p.name);
  model_.set_hooks(this);
}

DataParallel::~DataParallel() {
  try {
    drain(true);
  } catch (...) {
  }
  model_.set_hooks(nullptr);
}

void DataParallel::add_slice(const ParamSpec& p, std::vector<AdamWSegment>& out) const {
  const Part& part = parts_[static_cast<size_t>(p.part)];
  const int64_t s0 = p.trainable ? part.slice_begin(rank_) : part.frozen_slice_begin(rank_);
  const int64_t s1 = s0 + (p.trainable ? part.S : part.Sf);
  const int64_t a = std::max(s0, p.offset), b = std::min(s1, p.offset + p.local_shape().numel());
  if (a >= b) return;
  AdamWSegment seg;
  seg.spec = p;
  seg.begin = a - p.offset;
  seg.end = b - p.offset;
  const Shape n{b - a};
  const int64_t in_shard = part.shard_offset + (p.trainable ? 0 : part.S) + (a - s0);
  seg.param = stage_ == 3 ? param_shard_.view_at(in_shard, n) : model_.param_buffer().view_at(a, n);
  if (p.trainable)
    seg.grad = stage_ >= 2 ? grad_shard_.view_at(part.grad_shard_offset + (a - s0), n)
                           : model_.grad_buffer().view_at(a - p.frozen_before, n);
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
    out.push_back({p, 0, n, model_.param_buffer().view_at(p.offset, Shape{n}), Tensor()});
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
  if (part.T == 0) return;  // every parameter frozen: no gradient
  part.grads = backend_.empty(Shape{part.T}, model_.grad_dtype(), MemCategory::Gradients);
  backend_.fill(backend_.default_stream(), part.grads, 0.f);
  model_.bind_grads(part.index, part.grads);
}

// ---- stage 3 parameter gathering ----------------------------------------------------

void DataParallel::gather(int index, bool wait) {
  if (index < 0 || index >= static_cast<int>(parts_.size())) return;
  Part& part = part_at(index);
  if (!part.params) {
    part.params = backend_.empty(Shape{part.padded}, model_.dtype(), MemCategory::Parameters);
    const Stream s = backend_.default_stream();
    if (part.S > 0)  // the trainable region, then the frozen one
      part.gather_works.push_back(comm_.all_gather_async(
          part.params.view_at(0, Shape{part.T}),
          param_shard_.view_at(part.shard_offset, Shape{part.S}), s));
    if (part.Sf > 0)
      part.gather_works.push_back(comm_.all_gather_async(
          part.params.view_at(part.T, Shape{part.padded - part.T}),
          param_shard_.view_at(part.shard_offset + part.S, Shape{part.Sf}), s));
  }
  if (wait && !part.gather_works.empty()) {
    const auto t0 = Clock::now();
    for (auto& w : part.gather_works) w->wait();
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    part.gather_works.clear();
    model_.bind_params(index, part.params);
  }
}

void DataParallel::release(int index) {
  Part& part = part_at(index);
  for (auto& w : part.gather_works) w->wait();
  part.gather_works.clear();
  model_.bind_params(index, Tensor());
  part.params = Tensor();
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
      if (part.params) release(part.index);
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
  if (part.T == 0) return;  // every parameter frozen: no gradient
  if (stage_ >= 2) {
    // Reduce-scatter in place; this rank's slice is then added to its gradient shard.
    const Tensor whole = part.grads;
    const Tensor mine = whole.view_at(static_cast<int64_t>(rank_) * part.S, Shape{part.S});
    Pending p;
    p.work = comm_.reduce_scatter_async(mine, whole, backend_.default_stream());
    p.keep = whole;
    p.src = mine;
    p.dst = grad_shard_.view_at(part.grad_shard_offset, Shape{part.S});
    pending_.push_back(std::move(p));
    model_.bind_grads(index, Tensor());
    part.grads = Tensor();
    return;
  }
  if (!last_micro_ || world_ == 1) return;  // stages 0-1: only the last micro-step talks
  const Tensor grads = model_.grad_buffer();
  if (stage_ == 1) {
    const Tensor whole = grads.view_at(part.grad_begin, Shape{part.T});
    Pending p;
    p.work = comm_.reduce_scatter_async(
        whole.view_at(static_cast<int64_t>(rank_) * part.S, Shape{part.S}), whole,
        backend_.default_stream());
    pending_.push_back(std::move(p));
    return;
  }
  part.done = true;  // stage 0: all-reduce a bucket once all of its parts are done
  for (const auto& bucket : buckets_) {
    if (std::find(bucket.begin(), bucket.end(), index) == bucket.end()) continue;
    for (int q : bucket)
      if (!part_at(q).done) return;
    const Part& first = part_at(bucket.back());  // lowest flat offset
    const Part& last = part_at(bucket.front());
    Pending p;
    p.work = comm_.all_reduce_async(
        grads.view_at(first.grad_begin, Shape{last.grad_begin + last.T - first.grad_begin}),
        ReduceOp::Sum, backend_.default_stream());
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
  if (tp_) {
    // Each tp rank's share (replicated tensors on tp rank 0 only).
    tp_share_sum_squares(segs, backend_, tp_->rank(), acc);
  } else if (copies) {
    add_sum_squares(segs, backend_, acc);
  } else if (stage_ == 0) {
    backend_.sum_squares(s, acc, model_.grad_buffer());  // the whole buffer in one call
  } else if (stage_ == 1) {
    for (const auto& part : parts_)
      if (part.S > 0)
        backend_.sum_squares(s, acc, model_.grad_buffer().view_at(
                                         part.grad_begin + rank_ * part.S, Shape{part.S}));
  } else {
    backend_.sum_squares(s, acc, grad_shard_);
  }
  // Below stage 1 every dp rank holds the whole reduced gradient: the sum runs over tp
  // alone. Summed in double on the device (rank order on MPI): every rank the same bits.
  if (stage_ > 0 && world_ > 1) comm_.all_reduce(acc, ReduceOp::Sum, s);
  if (tp_) tp_->all_reduce(acc, ReduceOp::Sum, s);
}

void DataParallel::after_optimizer_step() {
  if (stage_ == 0 || stage_ == 3 || world_ == 1) return;
  const Stream s = backend_.default_stream();
  std::vector<std::shared_ptr<Work>> works;
  for (const auto& part : parts_) {
    if (part.S == 0) continue;  // frozen parameters do not change
    const Tensor whole = model_.param_buffer().view_at(part.begin, Shape{part.T});
    works.push_back(comm_.all_gather_async(
        whole, whole.view_at(static_cast<int64_t>(rank_) * part.S, Shape{part.S}), s));
  }
  const auto t0 = Clock::now();
  for (auto& w : works) w->wait();
  wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string DataParallel::replica_hash() const {
  if (stage_ == 3) return "";
  return fmt::format("{:016x}", hash_bytes(backend_, model_.param_buffer()));
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
