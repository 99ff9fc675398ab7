#include "parallel/pipeline_schedule.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace kiln::pp {

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (auto k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved})
    if (name == schedule_kind_name(k)) return k;
  KILN_FAIL("parallel.pp_schedule must be gpipe, 1f1b or interleaved, got '{}'", name);
}

const char* action_kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::SendActivation: return "send_act";
    case ActionKind::RecvActivation: return "recv_act";
    case ActionKind::SendGradient: return "send_grad";
    case ActionKind::RecvGradient: return "recv_grad";
  }
  return "?";
}

std::string Action::str() const {
  std::string s = fmt::format("{}(c={},mb={})", action_kind_name(kind), chunk, micro_batch);
  if (kind == ActionKind::SendActivation || kind == ActionKind::SendGradient) s += fmt::format("->{}", peer);
  if (kind == ActionKind::RecvActivation || kind == ActionKind::RecvGradient) s += fmt::format("<-{}", peer);
  return s;
}

namespace {

struct Pass {
  bool forward;
  int chunk, micro_batch;
};

// The compute passes of rank r, in order.
std::vector<Pass> passes_of(ScheduleKind kind, int pp, int v, int m, int r) {
  std::vector<Pass> out;
  if (kind == ScheduleKind::GPipe) {
    for (int j = 0; j < m; ++j) out.push_back({true, r, j});
    for (int j = 0; j < m; ++j) out.push_back({false, r, j});
    return out;
  }
  // 1F1B, plain (v = 1) or interleaved over the rank's v chunks. The k-th forward (and
  // k-th backward) of the rank, as Megatron-LM orders them: groups of pp micro-batches,
  // each group through one local chunk (forwards in chunk order, backwards reversed).
  const int total = v * m;
  auto nth = [&](int k, bool forward) {
    const int group = k / pp;
    const int local = forward ? group % v : v - 1 - group % v;
    const int mb = (k / (pp * v)) * pp + k % pp;
    return Pass{forward, local * pp + r, mb};
  };
  const int warmup = std::min(total, v == 1 ? pp - r - 1 : (pp - r - 1) * 2 + (v - 1) * pp);
  for (int k = 0; k < warmup; ++k) out.push_back(nth(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(nth(warmup + k, true));
    out.push_back(nth(k, false));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(nth(k, false));
  return out;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int pp, int v, int m) {
  KILN_CHECK(pp >= 1, "parallel.pp must be >= 1, got {}", pp);
  KILN_CHECK(v >= 1, "parallel.virtual_stages must be >= 1, got {}", v);
  KILN_CHECK(m >= 1, "a pipeline needs at least one micro-batch per update (grad_accum_steps = train.global_batch / (train.micro_batch x dp)), got {}", m);
  KILN_CHECK(kind == ScheduleKind::Interleaved || v == 1,
             "parallel.pp_schedule = \"{}\" runs one stage per rank: parallel.virtual_stages must "
             "be 1 (got {}; use \"interleaved\" for more)", schedule_kind_name(kind), v);
  KILN_CHECK(kind != ScheduleKind::Interleaved || v > 1,
             "parallel.pp_schedule = \"interleaved\" needs parallel.virtual_stages > 1");
  KILN_CHECK(kind != ScheduleKind::Interleaved || m % pp == 0,
             "parallel.pp_schedule = \"interleaved\" needs the micro-batches per update "
             "(grad_accum_steps = train.global_batch / (train.micro_batch x dp) = {}) to be a multiple of parallel.pp = {}", m, pp);
  Schedule s;
  s.kind = kind;
  s.pp = pp;
  s.virtual_stages = v;
  s.micro_batches = m;
  s.ranks.resize(static_cast<size_t>(pp));
  const int C = pp * v;
  for (int r = 0; r < pp; ++r) {
    auto& list = s.ranks[static_cast<size_t>(r)];
    for (const Pass& p : passes_of(kind, pp, v, m, r)) {
      const int c = p.chunk, j = p.micro_batch;
      if (p.forward) {
        if (c > 0 && Schedule::rank_of_chunk(c - 1, pp) != r)
          list.push_back({ActionKind::RecvActivation, c - 1, j, Schedule::rank_of_chunk(c - 1, pp)});
        list.push_back({ActionKind::Forward, c, j, -1});
        if (c < C - 1 && Schedule::rank_of_chunk(c + 1, pp) != r)
          list.push_back({ActionKind::SendActivation, c, j, Schedule::rank_of_chunk(c + 1, pp)});
      } else {
        if (c < C - 1 && Schedule::rank_of_chunk(c + 1, pp) != r)
          list.push_back({ActionKind::RecvGradient, c + 1, j, Schedule::rank_of_chunk(c + 1, pp)});
        list.push_back({ActionKind::Backward, c, j, -1});
        if (c > 0 && Schedule::rank_of_chunk(c - 1, pp) != r)
          list.push_back({ActionKind::SendGradient, c, j, Schedule::rank_of_chunk(c - 1, pp)});
      }
    }
  }
  return s;
}

SimResult simulate(const Schedule& s, int64_t fcost, int64_t bcost) {
  const int P = s.pp, C = s.chunks(), M = s.micro_batches;
  KILN_CHECK(static_cast<int>(s.ranks.size()) == P, "pipeline schedule: {} rank lists for pp = {}",
             s.ranks.size(), P);
  using Key = std::tuple<int, int, int>;  // (kind: 0 activation / 1 gradient, chunk, mb)
  struct Message {
    int64_t time;
    int from, to;
  };
  std::map<Key, Message> in_transit;
  std::set<Key> sent;
  std::vector<std::set<Key>> received(static_cast<size_t>(P));
  std::map<std::pair<int, int>, int> forward_rank, backward_count;  // (chunk, mb)
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<int64_t> clock(static_cast<size_t>(P), 0);
  SimResult res;
  res.busy.assign(static_cast<size_t>(P), 0);
  res.peak_in_flight.assign(static_cast<size_t>(P), 0);
  std::vector<int> in_flight(static_cast<size_t>(P), 0);
  auto fail = [&](int r, const Action& a, const std::string& why) {
    KILN_FAIL("pipeline schedule {} (pp={}, virtual_stages={}, micro-batches={}): rank {}, "
              "action {} ({}): {}", schedule_kind_name(s.kind), P, s.virtual_stages, M, r,
              next[static_cast<size_t>(r)], a.str(), why);
  };
  auto has_input = [&](int r, bool activation, int chunk, int mb) {
    // The forward output of chunk-1 (activation) or the input gradient of chunk+1.
    const int from = activation ? chunk - 1 : chunk + 1;
    if (Schedule::rank_of_chunk(from, P) == r)
      return activation ? forward_rank.count({from, mb}) > 0 : backward_count.count({from, mb}) > 0;
    return received[static_cast<size_t>(r)].count({activation ? 0 : 1, from, mb}) > 0;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      const auto& list = s.ranks[static_cast<size_t>(r)];
      auto& i = next[static_cast<size_t>(r)];
      auto& t = clock[static_cast<size_t>(r)];
      for (; i < list.size(); ++i) {
        const Action& a = list[i];
        const int c = a.chunk, j = a.micro_batch;
        if (c < 0 || c >= C || j < 0 || j >= M) fail(r, a, "chunk or micro-batch out of range");
        const bool mine = Schedule::rank_of_chunk(c, P) == r;
        switch (a.kind) {
          case ActionKind::Forward:
            if (!mine) fail(r, a, "the chunk runs on another rank");
            if (forward_rank.count({c, j})) fail(r, a, "a second forward of the same pass");
            if (c > 0 && !has_input(r, true, c, j)) fail(r, a, "its input activation is not here");
            t += fcost;
            res.busy[static_cast<size_t>(r)] += fcost;
            forward_rank[{c, j}] = r;
            res.peak_in_flight[static_cast<size_t>(r)] =
                std::max(res.peak_in_flight[static_cast<size_t>(r)], ++in_flight[static_cast<size_t>(r)]);
            break;
          case ActionKind::Backward:
            if (!mine) fail(r, a, "the chunk runs on another rank");
            if (!forward_rank.count({c, j})) fail(r, a, "a backward before its forward");
            if (backward_count[{c, j}]++ > 0) fail(r, a, "a second backward of the same pass");
            if (c < C - 1 && !has_input(r, false, c, j)) fail(r, a, "its output gradient is not here");
            t += bcost;
            res.busy[static_cast<size_t>(r)] += bcost;
            --in_flight[static_cast<size_t>(r)];
            break;
          case ActionKind::SendActivation:
          case ActionKind::SendGradient: {
            const bool act = a.kind == ActionKind::SendActivation;
            if (!mine) fail(r, a, "sends what another rank computes");
            if (act ? !forward_rank.count({c, j}) : !backward_count.count({c, j}))
              fail(r, a, "sends a pass not yet run");
            const int to = Schedule::rank_of_chunk(act ? c + 1 : c - 1, P);
            if ((act ? c + 1 >= C : c - 1 < 0) || a.peer != to) fail(r, a, "the wrong peer");
            const Key k{act ? 0 : 1, c, j};
            if (!sent.insert(k).second) fail(r, a, "sent twice");
            in_transit[k] = {t, r, to};
            break;
          }
          case ActionKind::RecvActivation:
          case ActionKind::RecvGradient: {
            const Key k{a.kind == ActionKind::RecvActivation ? 0 : 1, c, j};
            const auto it = in_transit.find(k);
            if (it == in_transit.end()) goto blocked;  // waits for the sender
            if (it->second.to != r || a.peer != it->second.from) fail(r, a, "received on the wrong rank");
            t = std::max(t, it->second.time);
            received[static_cast<size_t>(r)].insert(k);
            in_transit.erase(it);
            break;
          }
        }
        progress = true;
      }
    blocked:;
    }
  }
  std::string waiting;
  for (int r = 0; r < P; ++r) {
    const auto& list = s.ranks[static_cast<size_t>(r)];
    if (next[static_cast<size_t>(r)] < list.size())
      waiting += fmt::format(" rank {} waits at {};", r, list[next[static_cast<size_t>(r)]].str());
  }
  KILN_CHECK(waiting.empty(), "pipeline schedule {} (pp={}, virtual_stages={}, micro-batches={}) "
             "deadlocks:{}", schedule_kind_name(s.kind), P, s.virtual_stages, M, waiting);
  KILN_CHECK(in_transit.empty(), "pipeline schedule {}: {} message(s) sent but never received",
             schedule_kind_name(s.kind), in_transit.size());
  KILN_CHECK(static_cast<int64_t>(forward_rank.size()) == int64_t{C} * M &&
                 static_cast<int64_t>(backward_count.size()) == int64_t{C} * M,
             "pipeline schedule {}: {} forward and {} backward passes of the {} needed",
             schedule_kind_name(s.kind), forward_rank.size(), backward_count.size(), int64_t{C} * M);
  res.makespan = *std::max_element(clock.begin(), clock.end());
  int64_t busy = 0;
  for (int64_t b : res.busy) busy += b;
  res.bubble_fraction = res.makespan > 0
                            ? 1.0 - static_cast<double>(busy) / (static_cast<double>(P) * res.makespan)
                            : 0.0;
  return res;
}

double theoretical_bubble(ScheduleKind kind, int pp, int v, int m) {
  const double p = pp, work = kind == ScheduleKind::Interleaved ? double(v) * m : double(m);
  return (p - 1.0) / (work + p - 1.0);
}

std::vector<int> split_stages(const std::vector<double>& costs, int stages,
                              const std::vector<int64_t>& split) {
  const int n = static_cast<int>(costs.size());
  KILN_CHECK(stages >= 1 && n >= stages,
             "pipeline: {} model parts cannot fill {} stages (parallel.pp x parallel.virtual_stages)",
             n, stages);
  if (!split.empty()) {
    KILN_CHECK(static_cast<int>(split.size()) == stages - 1,
               "parallel.pp_split has {} boundaries; {} stages need {}", split.size(), stages,
               stages - 1);
    std::vector<int> out{0};
    for (int64_t b : split) {
      KILN_CHECK(b > out.back() && b < n, "parallel.pp_split must increase strictly within (0, {}) "
                 "(the first part of each later stage), got {}", n, b);
      out.push_back(static_cast<int>(b));
    }
    return out;
  }
  // Linear partition: best[k][i] = the least largest cost of parts [0, i) in k groups.
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + costs[static_cast<size_t>(i)];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {  // the last group is [j, i)
        const double v = std::max(best[static_cast<size_t>(k) - 1][static_cast<size_t>(j)],
                                  prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(j)]);
        if (v < best[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = v;
          cut[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<int> out(static_cast<size_t>(stages));
  for (int k = stages, i = n; k >= 1; --k) {
    i = cut[static_cast<size_t>(k)][static_cast<size_t>(i)];
    out[static_cast<size_t>(k) - 1] = i;
  }
  return out;
}

}  // namespace kiln::pp
