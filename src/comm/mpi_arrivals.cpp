#include "comm/mpi_arrivals.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>

namespace kiln::comm_detail {

namespace {
constexpr int kTag = 1;
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Arrivals::Arrivals(MPI_Comm comm, int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)),
      seen_(new std::atomic<int64_t>[static_cast<size_t>(size)]),
      heard_(new std::atomic<int64_t>[static_cast<size_t>(size)]) {
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

void Arrivals::announce(int64_t s) {
  seen_[static_cast<size_t>(rank_)].store(s);
  send_all(s);
  poll();
}

void Arrivals::send_all(int64_t value) {
  last_sent_ns_ = now_ns();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Send send{MPI_REQUEST_NULL, std::make_unique<int64_t>(value)};
    if (MPI_Isend(send.value.get(), 1, MPI_INT64_T, p, kTag, hb_, &send.request) == MPI_SUCCESS)
      sends_.push_back(std::move(send));
  }
}

void Arrivals::poll() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kTag, hb_, &flag, &st) != MPI_SUCCESS || !flag) break;
    int64_t v = 0;
    MPI_Recv(&v, 1, MPI_INT64_T, st.MPI_SOURCE, kTag, hb_, MPI_STATUS_IGNORE);
    auto& seen = seen_[static_cast<size_t>(st.MPI_SOURCE)];
    if (v > seen.load()) seen.store(v);
    heard_[static_cast<size_t>(st.MPI_SOURCE)].store(now_ns());
  }
  // Heartbeat: poll() runs while operations are in flight, so a waiting rank repeats its
  // latest number; a stopped one falls silent.
  if (sends_.size() < static_cast<size_t>(4 * size_) &&
      now_ns() - last_sent_ns_ > static_cast<int64_t>(kHeartbeatS * 1e9))
    send_all(seen_[static_cast<size_t>(rank_)].load());
  while (!sends_.empty()) {
    int done = 0;
    MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    sends_.pop_front();
  }
}

std::string Arrivals::missing(int64_t s) const {
  std::vector<int> ranks;
  std::vector<int64_t> last;
  for (int r = 0; r < size_; ++r) {
    const int64_t v = seen_[static_cast<size_t>(r)].load();
    if (v < s) {
      ranks.push_back(r);
      last.push_back(v);
    }
  }
  if (ranks.empty()) {
    const int64_t now = now_ns();
    std::vector<std::string> silent;
    for (int r = 0; r < size_; ++r) {
      const double quiet = static_cast<double>(now - heard_[static_cast<size_t>(r)].load()) / 1e9;
      if (r != rank_ && quiet > kSilentS) silent.push_back(fmt::format("rank {} ({:.1f} s)", r, quiet));
    }
    if (!silent.empty())
      return fmt::format("every rank arrived at it (collective #{} of '{}'), but {} {} been silent "
                         "since: {} (stopped or hung)", s, name_, silent.size() == 1 ? "one" : "some",
                         silent.size() == 1 ? "has" : "have", fmt::join(silent, ", "));
    return fmt::format("every rank arrived at it (collective #{} of '{}') and answers: one is stuck "
                       "inside it, or the ranks called different collectives", s, name_);
  }
  return fmt::format("{} {} did not arrive (collective #{} of '{}'; {} last {} #{})",
                     ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "), s, name_,
                     ranks.size() == 1 ? "its" : "their", ranks.size() == 1 ? "was" : "were",
                     fmt::join(last, ", #"));
}

}  // namespace kiln::comm_detail
