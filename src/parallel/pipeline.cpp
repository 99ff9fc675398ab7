#include "parallel/pipeline.h"

#include "comm/ledger.h"
#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace kiln::pp {

namespace {
using Clock = std::chrono::steady_clock;
bool is_compute(ActionKind k) { return k == ActionKind::Forward || k == ActionKind::Backward; }
}  // namespace

PipelineExecutor::PipelineExecutor(Model& model, Communicator* comm, Schedule schedule,
                                   std::vector<int> boundaries, int B, int T)
    : model_(model), comm_(comm), schedule_(std::move(schedule)),
      boundaries_(std::move(boundaries)), rank_(comm ? comm->rank() : 0), B_(B), T_(T) {
  const int pp = schedule_.pp, C = schedule_.chunks();
  KILN_CHECK((comm ? comm->size() : 1) == pp, "pipeline: the schedule is for {} ranks but the "
             "pipeline group has {}", pp, comm ? comm->size() : 1);
  KILN_CHECK(static_cast<int>(boundaries_.size()) == C + 1 && boundaries_.front() == 0 &&
                 std::is_sorted(boundaries_.begin(), boundaries_.end()),
             "pipeline: chunk boundaries must be {} increasing part indices from 0", C + 1);
  KILN_CHECK(pp == 1 || model_.stage_activation_shape(B_, T_), "{} does not run as pipeline "
             "stages (parallel.pp = {} needs a model that does)", model_.arch(), pp);
  sim_ = simulate(schedule_);  // throws on a deadlock or an unmatched message
  for (int c = 0; c < C; ++c)
    if (Schedule::rank_of_chunk(c, pp) == rank_) local_chunks_.push_back(c);
  // Slots: the most micro-batches in flight per chunk; passes in micro-batch order.
  slots_.assign(static_cast<size_t>(C), 0);
  std::vector<int> in_flight(static_cast<size_t>(C), 0), next_f(static_cast<size_t>(C), 0),
      next_b(static_cast<size_t>(C), 0);
  for (const Action& a : schedule_.ranks[static_cast<size_t>(rank_)]) {
    if (!is_compute(a.kind)) continue;
    const auto c = static_cast<size_t>(a.chunk);
    const bool fwd = a.kind == ActionKind::Forward;
    int& next = fwd ? next_f[c] : next_b[c];
    KILN_CHECK(a.micro_batch == next, "pipeline: {} out of micro-batch order on rank {}", a.str(),
               rank_);
    ++next;
    in_flight[c] += fwd ? 1 : -1;
    slots_[c] = std::max(slots_[c], in_flight[c]);
  }
}

std::pair<int, int> PipelineExecutor::chunk_parts(int chunk) const {
  return {boundaries_[static_cast<size_t>(chunk)], boundaries_[static_cast<size_t>(chunk) + 1]};
}

int PipelineExecutor::slots(int chunk) const { return slots_[static_cast<size_t>(chunk)]; }

PipelineExecutor::Timing PipelineExecutor::take_timing() { return std::exchange(timing_, Timing{}); }

int PipelineExecutor::tag(Kind kind, int chunk, int mb) const {
  return kind * 16384 + (chunk * schedule_.micro_batches + mb) % 16384;
}

const char* PipelineExecutor::kind_name(Kind kind) {
  return kind == kActivation ? "activation" : "gradient";
}

std::string PipelineExecutor::route(int from, int to, int chunk, int mb) const {
  if (schedule_.virtual_stages == 1) return fmt::format("stage {} -> {} micro-batch {}", from, to, mb);
  return fmt::format("stage {} -> {} chunk {} micro-batch {}", from, to, chunk, mb);
}

Tensor PipelineExecutor::message_buffer() const {
  return model_.backend().empty(*model_.stage_activation_shape(B_, T_), model_.dtype(),
                                MemCategory::Activations);
}

void PipelineExecutor::post_recv(const Action& a) {
  const Kind kind = a.kind == ActionKind::RecvActivation ? kActivation : kGradient;
  const Key key{kind, a.chunk, a.micro_batch};
  if (inbox_.count(key)) return;  // posted ahead
  Inbox in;
  in.data = message_buffer();
  const CommSite site("pp.recv {} {}", kind_name(kind), route(a.peer, rank_, a.chunk, a.micro_batch));
  in.work = comm_->recv_async(in.data, a.peer, tag(kind, a.chunk, a.micro_batch),
                              model_.backend().default_stream());
  inbox_.emplace(key, std::move(in));
}

Tensor PipelineExecutor::take(Kind kind, int chunk, int mb) {
  const auto it = inbox_.find({kind, chunk, mb});
  KILN_CHECK(it != inbox_.end(), "pipeline rank {}: the {} of chunk {}, micro-batch {} was never "
             "received (schedule and executor disagree)", rank_,
             kind == kActivation ? "activation" : "gradient", chunk, mb);
  Inbox in = std::move(it->second);
  inbox_.erase(it);
  if (in.work) in.work->wait();
  return in.data;
}

void PipelineExecutor::send(Kind kind, int chunk, int mb, int peer) {
  const auto it = outbox_.find({kind, chunk, mb});
  KILN_CHECK(it != outbox_.end(), "pipeline rank {}: the {} of chunk {}, micro-batch {} is sent "
             "before its pass", rank_, kind == kActivation ? "activation" : "gradient", chunk, mb);
  Tensor data = std::move(it->second);
  outbox_.erase(it);
  // Buffers of the sends already matched go now (the rest at the end of the step).
  std::erase_if(sends_, [](const auto& s) { return s.first->is_completed(); });
  const CommSite site("pp.send {} {}", kind_name(kind), route(rank_, peer, chunk, mb));
  auto work = comm_->send_async(data, peer, tag(kind, chunk, mb), model_.backend().default_stream());
  sends_.emplace_back(std::move(work), std::move(data));
}

void PipelineExecutor::forward(const Action& a, MicroBatches& mbs, float grad_scale, LossSum& loss) {
  const int C = schedule_.chunks(), c = a.chunk, j = a.micro_batch;
  const auto [first, end] = chunk_parts(c);
  StagePass p;
  p.first = first;
  p.end = end;
  p.slot = grad_scale > 0.f ? j % slots(c) : 0;
  p.batch = mbs.batch(j);
  if (c > 0) p.input = take(kActivation, c - 1, j);
  if (c < C - 1) p.output = message_buffer();
  mbs.before_pass(j, true);
  {
    TraceScope scope(tracer_, "forward");
    const auto t0 = Clock::now();
    const LossSum l = model_.forward_stage(p, grad_scale);
    timing_.busy += std::chrono::duration<double>(Clock::now() - t0).count();
    loss.sum += l.sum;
    loss.targets += l.targets;
    if (l.correct >= 0) loss.correct = std::max<int64_t>(loss.correct, 0) + l.correct;
  }
  if (c == C - 1) return;
  if (Schedule::rank_of_chunk(c + 1, schedule_.pp) == rank_)
    inbox_[{kActivation, c, j}] = Inbox{nullptr, p.output};
  else
    outbox_[{kActivation, c, j}] = p.output;
}

void PipelineExecutor::backward(const Action& a, MicroBatches& mbs) {
  const int C = schedule_.chunks(), c = a.chunk, j = a.micro_batch;
  const auto [first, end] = chunk_parts(c);
  StagePass p;
  p.first = first;
  p.end = end;
  p.slot = j % slots(c);
  p.batch = mbs.batch(j);
  if (c < C - 1) p.doutput = take(kGradient, c + 1, j);
  if (c > 0) p.dinput = message_buffer();
  mbs.before_pass(j, false);
  {
    TraceScope scope(tracer_, "backward");
    const auto t0 = Clock::now();
    model_.backward_stage(p);
    timing_.busy += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (c == 0) return;
  if (Schedule::rank_of_chunk(c - 1, schedule_.pp) == rank_)
    inbox_[{kGradient, c, j}] = Inbox{nullptr, p.dinput};
  else
    outbox_[{kGradient, c, j}] = p.dinput;
}

void PipelineExecutor::finish_sends() {
  for (auto& [work, data] : sends_) work->wait();
  sends_.clear();
  KILN_CHECK(inbox_.empty() && outbox_.empty(), "pipeline rank {}: {} messages received and {} "
             "computed but never used (schedule and executor disagree)", rank_, inbox_.size(),
             outbox_.size());
}

void PipelineExecutor::post_messages(const std::vector<Action>& list, size_t& i) {
  if (!comm_) return;
  comm_->group_start();
  for (; i < list.size() && !is_compute(list[i].kind); ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGradient) {
      post_recv(a);
      continue;
    }
    send(a.kind == ActionKind::SendActivation ? kActivation : kGradient, a.chunk, a.micro_batch,
         a.peer);
  }
  comm_->group_end();
}

LossSum PipelineExecutor::run(MicroBatches& mbs, float grad_scale) {
  const auto& list = schedule_.ranks[static_cast<size_t>(rank_)];
  const auto t0 = Clock::now();
  LossSum loss;
  // Each pass, then its sends and the next pass's receives as one group (Megatron's
  // send_forward_recv_backward): the receives are posted before the pass that needs them
  // starts, and a send and a receive between two ranks are never ordered against each
  // other on a stream.
  size_t i = 0;
  post_messages(list, i);
  while (i < list.size()) {
    const Action& a = list[i++];
    if (a.kind == ActionKind::Forward) forward(a, mbs, grad_scale, loss);
    else backward(a, mbs);
    post_messages(list, i);
  }
  finish_sends();
  timing_.span += std::chrono::duration<double>(Clock::now() - t0).count();
  return loss;
}

LossSum PipelineExecutor::forward_only(MicroBatches& mbs) {
  const int pp = schedule_.pp, C = schedule_.chunks();
  LossSum loss;
  for (int c : local_chunks_) {
    if (c > 0 && Schedule::rank_of_chunk(c - 1, pp) != rank_)
      post_recv(Action{ActionKind::RecvActivation, c - 1, 0, Schedule::rank_of_chunk(c - 1, pp)});
    forward(Action{ActionKind::Forward, c, 0, -1}, mbs, 0.f, loss);
    if (c < C - 1 && Schedule::rank_of_chunk(c + 1, pp) != rank_)
      send(kActivation, c, 0, Schedule::rank_of_chunk(c + 1, pp));
  }
  finish_sends();
  return loss;
}

}  // namespace kiln::pp
