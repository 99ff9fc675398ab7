#include "comm/mpi_arrivals.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace kiln::comm_detail {

namespace {
constexpr int kTag = 1;
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Announcement announcement_of(const LedgerEntry& e) {
  Announcement a;
  a.seq = e.seq;
  a.count = e.count;
  a.op = static_cast<int32_t>(e.op);
  a.dtype = static_cast<int32_t>(e.dtype);
  a.root = e.op == Collective::Broadcast ? e.peer : -1;
  std::memcpy(a.site, e.site, sizeof(a.site));
  return a;
}

Arrivals::Arrivals(MPI_Comm comm, int rank, std::vector<int> world_ranks, std::string name)
    : rank_(rank), size_(static_cast<int>(world_ranks.size())), world_ranks_(std::move(world_ranks)),
      name_(std::move(name)),
      seen_(new std::atomic<int64_t>[world_ranks_.size()]),
      heard_(new std::atomic<int64_t>[world_ranks_.size()]),
      recent_(world_ranks_.size() * kRecent) {
  for (int r = 0; r < size_; ++r) {
    seen_[static_cast<size_t>(r)].store(0);
    heard_[static_cast<size_t>(r)].store(now_ns());
  }
  MPI_Comm_dup(comm, &hb_);
  MPI_Comm_set_errhandler(hb_, MPI_ERRORS_RETURN);
}

void Arrivals::close() {
  if (hb_ == MPI_COMM_NULL) return;
  poll();
  for (Send& s : sends_) MPI_Wait(&s.request, MPI_STATUS_IGNORE);
  sends_.clear();
  // The duplicate is left to MPI_Finalize, not freed: another rank's last announcements
  // and heartbeats may still be on their way, and Open MPI reuses a freed communicator's
  // context id, matching such a late message into the next communicator that gets it (a
  // crash in ob1's add_comm, seen when meshes were built and destroyed in a loop). Freeing
  // safely would take a collective count of the messages, which would make a rank that
  // leaves on an error wait for the others. One communicator per communicator created.
  hb_ = MPI_COMM_NULL;
}

void Arrivals::announce(const Announcement& a) {
  seen_[static_cast<size_t>(rank_)].store(a.seq);
  latest_ = a;
  {
    std::lock_guard<std::mutex> lock(recent_mu_);
    keep_and_compare(rank_, a);
  }
  send_all(a);
  poll();
}

void Arrivals::send_all(const Announcement& a) {
  last_sent_ns_ = now_ns();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Send send{MPI_REQUEST_NULL, std::make_unique<Announcement>(a)};
    if (MPI_Isend(send.value.get(), sizeof(Announcement), MPI_BYTE, p, kTag, hb_, &send.request) ==
        MPI_SUCCESS)
      sends_.push_back(std::move(send));
  }
}

std::string Arrivals::what(const Announcement& a) const {
  const auto op = static_cast<Collective>(a.op);
  const std::string call = op == Collective::AllToAll
                               ? std::string(collective_name(op))
                               : describe_call(op, static_cast<DType>(a.dtype), a.count, a.root);
  return call + " at " + describe_site(std::string_view(a.site, strnlen(a.site, sizeof(a.site))));
}

void Arrivals::keep_and_compare(int r, const Announcement& a) {
  recent_[static_cast<size_t>(r) * kRecent + static_cast<size_t>(a.seq % kRecent)] = a;
  for (int q = 0; q < size_; ++q) {
    if (q == r) continue;
    const Announcement& b = recent_[static_cast<size_t>(q) * kRecent + static_cast<size_t>(a.seq % kRecent)];
    if (b.seq != a.seq) continue;
    const bool a2a = a.op == static_cast<int32_t>(Collective::AllToAll);
    const bool same_shape = a.op == b.op && a.dtype == b.dtype && a.root == b.root &&
                            (a2a || a.count == b.count);
    const bool same_site = std::strncmp(a.site, b.site, sizeof(a.site)) == 0;
    if (same_shape && same_site) continue;
    const int lo = std::min(r, q), hi = std::max(r, q);
    const Announcement& at_lo = lo == r ? a : b;
    const Announcement& at_hi = lo == r ? b : a;
    const std::string text = fmt::format("collective #{} of '{}': rank {} calls {}; rank {} calls {}",
                                         a.seq, name_, world_ranks_[static_cast<size_t>(lo)],
                                         what(at_lo), world_ranks_[static_cast<size_t>(hi)],
                                         what(at_hi));
    if (first_disagreement_.empty()) first_disagreement_ = text;
    if (!same_shape) {
      abort_all(text == first_disagreement_
                    ? "the ranks' calls differ at " + text
                    : fmt::format("the ranks' calls differ at {}; they first differed at {} (a "
                                  "call made by some ranks only, or in another order)",
                                  text, first_disagreement_));
    }
  }
}

void Arrivals::poll() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kTag, hb_, &flag, &st) != MPI_SUCCESS || !flag) break;
    Announcement a;
    MPI_Recv(&a, sizeof(a), MPI_BYTE, st.MPI_SOURCE, kTag, hb_, MPI_STATUS_IGNORE);
    auto& seen = seen_[static_cast<size_t>(st.MPI_SOURCE)];
    if (a.seq > seen.load()) {
      seen.store(a.seq);
      std::lock_guard<std::mutex> lock(recent_mu_);
      keep_and_compare(st.MPI_SOURCE, a);
    }
    heard_[static_cast<size_t>(st.MPI_SOURCE)].store(now_ns());
  }
  // Heartbeat: poll() runs while operations are in flight, so a waiting rank repeats its
  // latest number; a stopped one falls silent.
  if (sends_.size() < static_cast<size_t>(4 * size_) &&
      now_ns() - last_sent_ns_ > static_cast<int64_t>(kHeartbeatS * 1e9))
    send_all(latest_);
  while (!sends_.empty()) {
    int done = 0;
    MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    sends_.pop_front();
  }
}

std::string Arrivals::missing(int64_t s) const {
  std::string disagreement;
  {
    std::lock_guard<std::mutex> lock(recent_mu_);
    if (!first_disagreement_.empty()) disagreement = "; the ranks' calls first differed at " + first_disagreement_;
  }
  return missing_ranks(s) + disagreement;
}

std::string Arrivals::missing_ranks(int64_t s) const {
  std::vector<int> ranks;
  std::vector<std::string> last;
  for (int r = 0; r < size_; ++r) {
    const int64_t v = seen_[static_cast<size_t>(r)].load();
    if (v < s) {
      ranks.push_back(world_ranks_[static_cast<size_t>(r)]);
      std::lock_guard<std::mutex> lock(recent_mu_);
      const Announcement& a = recent_[static_cast<size_t>(r) * kRecent + static_cast<size_t>(v % kRecent)];
      last.push_back(v == 0 ? std::string("none") : a.seq == v ? fmt::format("#{}, {}", v, what(a)) : fmt::format("#{}", v));
    }
  }
  if (ranks.empty()) {
    const int64_t now = now_ns();
    std::vector<std::string> silent;
    for (int r = 0; r < size_; ++r) {
      const double quiet = static_cast<double>(now - heard_[static_cast<size_t>(r)].load()) / 1e9;
      if (r != rank_ && quiet > kSilentS)
        silent.push_back(fmt::format("rank {} ({:.1f} s)", world_ranks_[static_cast<size_t>(r)], quiet));
    }
    if (!silent.empty())
      return fmt::format("every rank arrived at it (collective #{} of '{}'), but {} {} been silent "
                         "since: {} (stopped, hung or dead)", s, name_, silent.size() == 1 ? "one" : "some",
                         silent.size() == 1 ? "has" : "have", fmt::join(silent, ", "));
    return fmt::format("every rank arrived at it (collective #{} of '{}') and answers: one is stuck "
                       "inside it, or the ranks called different collectives", s, name_);
  }
  return fmt::format("{} {} did not arrive (collective #{} of '{}'; {} last {} {})",
                     ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "), s, name_,
                     ranks.size() == 1 ? "its" : "their", ranks.size() == 1 ? "was" : "were",
                     fmt::join(last, "; "));
}

}  // namespace kiln::comm_detail
