#include "comm/diagnosis.h"

#include "core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace kiln {

// ---- the file ---------------------------------------------------------------------------

namespace {
Collective collective_from_name(const std::string& name, const std::string& path) {
  for (int i = 0; i < kNumCollectives; ++i) {
    const auto c = static_cast<Collective>(i);
    if (name == collective_name(c)) return c;
  }
  KILN_FAIL("{}: unknown operation '{}'", path, name);
}
}  // namespace

std::string ledger_file_text(const RankLedger& ledger) {
  std::string out = nlohmann::json{{"rank", ledger.rank},
                                   {"reason", ledger.reason},
                                   {"written_ns", ledger.written_ns}}
                        .dump() +
                    "\n";
  for (const RankLedger::Group& g : ledger.groups) {
    nlohmann::json entries = nlohmann::json::array();
    for (const LedgerEntry& e : g.entries) {
      entries.push_back({e.seq, collective_name(e.op), std::string(dtype_name(e.dtype)), e.count,
                         e.peer, std::string(e.site), e.submitted_ns, e.done_ns});
    }
    out += nlohmann::json{{"group", g.name},
                          {"rank", g.rank},
                          {"world_ranks", g.world_ranks},
                          {"entries", std::move(entries)}}
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
           "\n";
  }
  return out;
}

RankLedger parse_ledger_file(const std::string& text, const std::string& path) {
  RankLedger r;
  std::istringstream in(text);
  std::string line;
  bool header = true;
  try {
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line);
      if (header) {
        r.rank = j.at("rank").get<int>();
        r.reason = j.at("reason").get<std::string>();
        r.written_ns = j.at("written_ns").get<int64_t>();
        header = false;
        continue;
      }
      RankLedger::Group g;
      g.name = j.at("group").get<std::string>();
      g.rank = j.at("rank").get<int>();
      g.world_ranks = j.at("world_ranks").get<std::vector<int>>();
      for (const nlohmann::json& a : j.at("entries")) {
        LedgerEntry e;
        e.seq = a.at(0).get<int64_t>();
        e.op = collective_from_name(a.at(1).get<std::string>(), path);
        e.dtype = parse_dtype(a.at(2).get<std::string>());
        e.count = a.at(3).get<int64_t>();
        e.peer = a.at(4).get<int>();
        const std::string site = a.at(5).get<std::string>();
        std::snprintf(e.site, sizeof(e.site), "%s", site.c_str());
        e.submitted_ns = a.at(6).get<int64_t>();
        e.done_ns = a.at(7).get<int64_t>();
        g.entries.push_back(e);
      }
      r.groups.push_back(std::move(g));
    }
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: not a ledger file ({})", path, e.what());
  }
  KILN_CHECK(!header, "{}: empty ledger file", path);
  return r;
}

// ---- the diagnosis ------------------------------------------------------------------------

namespace {

bool is_p2p(Collective op) { return op == Collective::Send || op == Collective::Recv; }

double seconds_between(int64_t from_ns, int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e9;
}

/// What must agree between the members of a collective.
std::string signature(const LedgerEntry& e) {
  const std::string count =
      e.op == Collective::AllToAll ? std::string("all_to_all") : describe_call(e.op, e.dtype, e.count, e.peer);
  return count + " at " + describe_site(e.site);
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

/// A communicator: its name and members (several communicators share a name, e.g. the
/// 'dp' groups of the pipeline stages).
using GroupId = std::pair<std::string, std::vector<int>>;
GroupId id_of(const RankLedger::Group& g) { return {g.name, g.world_ranks}; }

class Diagnosis {
 public:
  Diagnosis(const std::vector<RankLedger>& ledgers, int world_size, bool own_view)
      : ledgers_(ledgers), world_size_(world_size), own_view_(own_view) {
    for (const RankLedger& l : ledgers_) by_rank_[l.rank] = &l;
  }

  std::vector<std::string> run() {
    std::vector<int> absent;
    for (int r = 0; r < world_size_; ++r)
      if (!by_rank_.count(r)) absent.push_back(r);
    std::vector<int> present;
    for (const auto& [r, l] : by_rank_) present.push_back(r);
    if (!own_view_) {
      lines_.push_back(fmt::format("ledgers written by {}{}", rank_list(present),
                                   absent.empty() ? std::string()
                                                  : "; none by " + rank_list(absent)));
    }
    first_disagreement();
    waits();
    return lines_;
  }

 private:
  const RankLedger::Group* group_of(int rank, const GroupId& id) const {
    auto it = by_rank_.find(rank);
    if (it == by_rank_.end()) return nullptr;
    for (const auto& g : it->second->groups)
      if (id_of(g) == id) return &g;
    return nullptr;
  }

  /// "'dp'" for a communicator of every rank, else "'dp' (ranks 2, 3)".
  std::string group_text(const GroupId& id) const {
    if (static_cast<int>(id.second.size()) == world_size_) return fmt::format("'{}'", id.first);
    return fmt::format("'{}' ({})", id.first, rank_list(id.second));
  }

  /// "all_reduce fp32[4] #12 of 'dp' at 'train.loss'", "recv fp32[8] from rank 2 #3 of
  /// 'pp' (ranks 1, 2) at ..." (peers and roots as world ranks).
  std::string call_text(const LedgerEntry& e, const RankLedger::Group& g) const {
    std::string call = describe_call(e.op, e.dtype, e.count, -1);
    if (e.peer >= 0 && static_cast<size_t>(e.peer) < g.world_ranks.size()) {
      const char* dir = e.op == Collective::Send ? "to" : "from";
      call += fmt::format(" {} rank {}", dir, g.world_ranks[static_cast<size_t>(e.peer)]);
    }
    return fmt::format("{} #{} of {} at {}", call, e.seq, group_text(id_of(g)), describe_site(e.site));
  }

  // The first collective number of a group at which the members' calls differ.
  void first_disagreement() {
    std::set<GroupId> ids;
    for (const RankLedger& l : ledgers_)
      for (const auto& g : l.groups) ids.insert(id_of(g));
    for (const GroupId& id : ids) {
      std::map<int64_t, std::map<std::string, std::vector<int>>> at;  // seq -> signature -> ranks
      for (const RankLedger& l : ledgers_)
        if (const auto* g = group_of(l.rank, id))
          for (const LedgerEntry& e : g->entries)
            if (!is_p2p(e.op)) at[e.seq][signature(e)].push_back(l.rank);
      for (const auto& [seq, calls] : at) {
        if (calls.size() < 2) continue;
        std::vector<std::string> parts;
        size_t most = 0;
        for (const auto& [sig, ranks] : calls) most = std::max(most, ranks.size());
        for (const auto& [sig, ranks] : calls) parts.push_back(rank_list(ranks) + " called " + sig);
        std::string odd;
        for (const auto& [sig, ranks] : calls)
          if (ranks.size() < most && calls.size() == 2) odd = rank_list(ranks) + " differs: ";
        lines_.push_back(fmt::format("{}collective #{} of {} differs between ranks: {}", odd, seq,
                                     group_text(id), fmt::join(parts, "; ")));
        break;
      }
    }
  }

  /// Where a rank is: its oldest call in flight, else its last call.
  std::string where_is(int rank) const {
    auto it = by_rank_.find(rank);
    if (it == by_rank_.end() && own_view_) return "not known (only this rank's ledger was read)";
    if (it == by_rank_.end()) return "it wrote no ledger (busy outside communication, e.g. computing or writing files; stopped; or exited)";
    const RankLedger& l = *it->second;
    const LedgerEntry* waiting = nullptr;
    const LedgerEntry* last = nullptr;
    const RankLedger::Group* waiting_group = nullptr;
    const RankLedger::Group* last_group = nullptr;
    for (const auto& g : l.groups) {
      for (const LedgerEntry& e : g.entries) {
        if (e.done_ns == 0 && (!waiting || e.submitted_ns < waiting->submitted_ns)) {
          waiting = &e;
          waiting_group = &g;
        }
        if (!last || e.submitted_ns > last->submitted_ns) {
          last = &e;
          last_group = &g;
        }
      }
    }
    if (waiting)
      return fmt::format("it waits in {} (for {:.1f} s)", call_text(*waiting, *waiting_group),
                         seconds_between(waiting->submitted_ns, l.written_ns));
    if (last)
      return fmt::format("it is in no call; its last was {}, done {:.1f} s before its ledger was written",
                         call_text(*last, *last_group), seconds_between(last->done_ns, l.written_ns));
    return "it has made no call";
  }

  /// Whether `member` has reached `e` (a call of `group`): it has a collective numbered
  /// e.seq or later; for a receive (send), it has sent to (received from) the caller that
  /// many times. nullopt: `member` wrote no ledger.
  std::optional<bool> reached(int member, const RankLedger::Group& group, const LedgerEntry& e) const {
    const auto* g = group_of(member, id_of(group));
    if (!g) return std::nullopt;
    int64_t highest = 0;
    for (const LedgerEntry& m : g->entries) {
      if (e.op == Collective::Recv) {
        if (m.op == Collective::Send && m.peer == group.rank) highest = std::max(highest, m.seq);
      } else if (e.op == Collective::Send) {
        if (m.op == Collective::Recv && m.peer == group.rank) highest = std::max(highest, m.seq);
      } else if (!is_p2p(m.op)) {
        highest = std::max(highest, m.seq);
      }
    }
    return highest >= e.seq;
  }

  // Per waiting call (a collective merged across the ranks waiting in it): who it misses
  // and where they are.
  void waits() {
    // (call text, the waiting rank for a send/recv, else -1) -> ranks waiting in it, and
    // the members that have not reached it.
    using Key = std::pair<std::string, int>;
    std::map<Key, std::vector<int>> waiting, missing;
    for (const RankLedger& l : ledgers_) {
      for (const auto& g : l.groups) {
        for (const LedgerEntry& e : g.entries) {
          if (e.done_ns != 0) continue;
          const Key what{call_text(e, g), is_p2p(e.op) ? l.rank : -1};
          waiting[what].push_back(l.rank);
          std::vector<int> members;
          if (is_p2p(e.op)) {
            if (e.peer >= 0 && static_cast<size_t>(e.peer) < g.world_ranks.size())
              members.push_back(e.peer);
          } else {
            for (size_t i = 0; i < g.world_ranks.size(); ++i) members.push_back(static_cast<int>(i));
          }
          for (int m : members) {
            const int world = g.world_ranks[static_cast<size_t>(m)];
            if (world == l.rank) continue;
            const std::optional<bool> r = reached(world, g, e);
            auto& list = missing[what];
            if ((!r || !*r) && std::find(list.begin(), list.end(), world) == list.end()) list.push_back(world);
          }
          break;  // the oldest call in flight of this group is the one that blocks
        }
      }
    }
    for (const auto& [key, ranks] : waiting) {
      const std::string& what = key.first;
      const auto& miss = missing[key];
      if (miss.empty()) {
        lines_.push_back(fmt::format("{} wait{} in {}: every member reached it (one is stuck inside it, "
                                     "or the members called different collectives)",
                                     rank_list(ranks), ranks.size() == 1 ? "s" : "", what));
        continue;
      }
      lines_.push_back(fmt::format("{} wait{} in {}; missing: {}", rank_list(ranks),
                                   ranks.size() == 1 ? "s" : "", what, rank_list(miss)));
      for (int m : miss) lines_.push_back(fmt::format("  rank {}: {}", m, where_is(m)));
    }
    if (waiting.empty()) lines_.push_back("no rank that wrote a ledger waits in a call");
  }

  const std::vector<RankLedger>& ledgers_;
  int world_size_;
  bool own_view_;
  std::map<int, const RankLedger*> by_rank_;
  std::vector<std::string> lines_;
};

}  // namespace

std::vector<std::string> diagnose(const std::vector<RankLedger>& ledgers, int world_size,
                                  bool own_view) {
  return Diagnosis(ledgers, world_size, own_view).run();
}

}  // namespace kiln
