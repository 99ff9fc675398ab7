#include "comm/ledger.h"

#include "comm/detail.h"
#include "comm/diagnosis.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kiln {

namespace {
thread_local const CommSite* t_site = nullptr;
}  // namespace

CommSite::CommSite(std::string_view text) : previous_(t_site) {
  const size_t n = std::min(text.size(), kCommSiteChars - 1);
  std::memcpy(text_, text.data(), n);
  text_[n] = '\0';
  t_site = this;
}

CommSite::~CommSite() { t_site = previous_; }

const char* CommSite::current() { return t_site != nullptr ? t_site->text_ : ""; }

int64_t ledger_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string describe_call(Collective op, DType dtype, int64_t count, int peer) {
  std::string s = collective_name(op);
  if (op == Collective::Barrier) return s;
  s += fmt::format(" {}[{}]", dtype_name(dtype), count);
  if (peer < 0) return s;
  return s + fmt::format(" {} {}", op == Collective::Send ? "to" : "from", peer);
}

std::string describe_site(std::string_view site) {
  return site.empty() ? std::string("an untagged call") : fmt::format("'{}'", site);
}

// ---- Ledger -------------------------------------------------------------------------

Ledger::Ledger(std::string group, int rank, std::vector<int> world_ranks)
    : group_(std::move(group)),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      ring_(kLedgerEntries),
      sends_(world_ranks_.size(), 0),
      recvs_(world_ranks_.size(), 0) {}

LedgerEntry Ledger::add(Collective op, DType dtype, int64_t count, int peer) {
  LedgerEntry e;
  e.op = op;
  e.dtype = dtype;
  e.count = count;
  e.peer = peer;
  std::strncpy(e.site, CommSite::current(), sizeof(e.site) - 1);
  e.submitted_ns = ledger_now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  const bool p2p = op == Collective::Send || op == Collective::Recv;
  if (p2p && peer >= 0 && static_cast<size_t>(peer) < sends_.size())
    e.seq = ++(op == Collective::Send ? sends_ : recvs_)[static_cast<size_t>(peer)];
  else
    e.seq = ++collectives_;
  ring_[static_cast<size_t>(added_ % static_cast<int64_t>(kLedgerEntries))] = e;
  ++added_;
  return e;
}

void Ledger::done(Collective op, int64_t seq, int peer) {
  const int64_t now = ledger_now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  // Calls complete roughly in order: search back from the newest.
  const int64_t oldest = std::max<int64_t>(0, added_ - static_cast<int64_t>(kLedgerEntries));
  for (int64_t i = added_ - 1; i >= oldest; --i) {
    LedgerEntry& e = ring_[static_cast<size_t>(i % static_cast<int64_t>(kLedgerEntries))];
    if (e.seq == seq && e.op == op && e.peer == peer) {
      e.done_ns = now;
      return;
    }
  }
}

std::vector<LedgerEntry> Ledger::tail(size_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto count = static_cast<int64_t>(std::min({n, kLedgerEntries, static_cast<size_t>(added_)}));
  std::vector<LedgerEntry> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = added_ - count; i < added_; ++i)
    out.push_back(ring_[static_cast<size_t>(i % static_cast<int64_t>(kLedgerEntries))]);
  return out;
}

// ---- the process's ledgers and their files ------------------------------------------

namespace {
std::mutex g_mu;
std::vector<std::weak_ptr<Ledger>> g_ledgers;  // guarded by g_mu
std::string g_dir;                             // guarded by g_mu
int64_t g_dir_set_ns = 0;                      // guarded by g_mu
std::string g_written;                         // guarded by g_mu: the file written, if any
std::atomic<bool> g_signal{false};

constexpr int kMaxStaleRanks = 1 << 20;

std::string rank_file(const std::string& dir, int rank) {
  return fmt::format("{}/rank-{}.jsonl", dir, rank);
}

RankLedger snapshot(std::string_view reason) {
  RankLedger r;
  r.rank = comm_detail::world_rank();
  r.reason = std::string(reason);
  r.written_ns = ledger_now_ns();
  for (const auto& weak : g_ledgers) {
    if (auto l = weak.lock()) {
      r.groups.push_back({.name = l->group(), .rank = l->rank(), .world_ranks = l->world_ranks(),
                          .entries = l->tail()});
    }
  }
  return r;
}

int world_size_of_ledgers() {
  int n = 0;
  for (const auto& weak : g_ledgers)
    if (auto l = weak.lock())
      for (int w : l->world_ranks()) n = std::max(n, w + 1);
  return n;
}

bool write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

/// The ledgers of the world's ranks written since this process set the dir (older files
/// are an earlier run's), each parsed; unreadable ones are skipped.
std::vector<RankLedger> read_rank_files(const std::string& dir, int world_size, int64_t since_ns) {
  std::vector<RankLedger> out;
  for (int r = 0; r < world_size; ++r) {
    std::ifstream in(rank_file(dir, r), std::ios::binary);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    try {
      RankLedger l = parse_ledger_file(text.str(), rank_file(dir, r));
      if (l.written_ns >= since_ns) out.push_back(std::move(l));
    } catch (const std::exception&) {  // half-read or foreign: as if absent
    }
  }
  return out;
}
}  // namespace

void register_ledger(const std::shared_ptr<Ledger>& ledger) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase_if(g_ledgers, [](const std::weak_ptr<Ledger>& w) { return w.expired(); });
  g_ledgers.push_back(ledger);
}

void unregister_ledger(const Ledger* ledger) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase_if(g_ledgers, [&](const std::weak_ptr<Ledger>& w) {
    auto l = w.lock();
    return !l || l.get() == ledger;
  });
}

void set_ledger_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_mu);
  // What an earlier run left: this rank's file; on rank 0 the diagnosis and the files of
  // ranks beyond this world. (Readers also skip files older than this call.)
  std::error_code ec;
  if (!dir.empty()) {
    const int rank = comm_detail::world_rank();
    std::filesystem::remove(rank_file(dir, rank), ec);
    if (rank == 0) {
      std::filesystem::remove(dir + "/diagnosis.txt", ec);
      for (int r = world_size_of_ledgers(); r < kMaxStaleRanks; ++r)
        if (!std::filesystem::remove(rank_file(dir, r), ec)) break;
    }
  }
  g_dir = dir;
  g_dir_set_ns = ledger_now_ns();
  g_written.clear();
}

std::string ledger_dir() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_dir;
}

std::string write_ledger_file(std::string_view reason) {
  try {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_dir.empty() || !g_written.empty()) return g_written;
    std::error_code ec;
    std::filesystem::create_directories(g_dir, ec);  // made only when needed
    const std::string path = rank_file(g_dir, comm_detail::world_rank());
    if (write_atomically(path, ledger_file_text(snapshot(reason)))) g_written = path;
    return g_written;
  } catch (const std::exception&) {
    return {};
  }
}

void report_hang(std::string_view what, double gather_s) {
  try {
    const std::string mine = write_ledger_file(what);
    std::string dir;
    int world = 0;
    int64_t since = 0;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      dir = g_dir;
      world = world_size_of_ledgers();
      since = g_dir_set_ns;
    }
    if (dir.empty() || world == 0) return;
    if (mine.empty()) {  // say at least what this rank knows
      std::string text;
      {
        std::lock_guard<std::mutex> lock(g_mu);
        for (const std::string& line : diagnose({snapshot(what)}, world, /*own_view=*/true)) text += "  " + line + "\n";
      }
      std::fprintf(stderr, "kiln: rank %d: could not write its collective ledger into %s; its own view:\n%s",
                   comm_detail::world_rank(), dir.c_str(), text.c_str());
      std::fflush(stderr);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<RankLedger> ledgers;
    for (;;) {
      ledgers = read_rank_files(dir, world, since);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (static_cast<int>(ledgers.size()) == world || waited >= gather_s) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // The first rank here prints: diagnosis.txt appears whole (link of a complete file),
    // and only once (link fails when it exists).
    std::string text;
    for (const std::string& line : diagnose(ledgers, world)) text += "  " + line + "\n";
    const std::string mine_tmp = fmt::format("{}/diagnosis.rank-{}.tmp", dir, comm_detail::world_rank());
    if (!write_atomically(mine_tmp, text)) return;
    const bool first = ::link(mine_tmp.c_str(), (dir + "/diagnosis.txt").c_str()) == 0;
    ::unlink(mine_tmp.c_str());
    if (!first) return;
    std::fprintf(stderr, "kiln: rank %d: diagnosis from the collective ledgers in %s:\n%s",
                 comm_detail::world_rank(), dir.c_str(), text.c_str());
    std::fflush(stderr);
  } catch (const std::exception&) {
  }
}

void note_stop_signal() { g_signal.store(true, std::memory_order_relaxed); }
bool stop_signal_noted() { return g_signal.load(std::memory_order_relaxed); }

}  // namespace kiln
