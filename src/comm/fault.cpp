#include "comm/fault.h"

#include "comm/detail.h"
#include "comm/ledger.h"
#include "core/error.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln {

namespace {

struct Plan {
  bool active = false;
  CommFault kind = CommFault::Skip;
  std::string site;
  int rank = -1;
  int64_t n = 1;
};

Plan parse(const std::string& spec) {
  Plan p;
  if (spec.empty()) return p;
  const auto bad = [&] {
    return fmt::format("KILN_COMM_FAULT='{}': expected KIND:SITE:RANK[:N] with KIND skip, count, "
                       "sleep or exit, RANK >= 0 and N >= 1", spec);
  };
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t at; (at = spec.find(':', from)) != std::string::npos; from = at + 1)
    parts.push_back(spec.substr(from, at - from));
  parts.push_back(spec.substr(from));
  KILN_CHECK(parts.size() == 3 || parts.size() == 4, "{}", bad());
  if (parts[0] == "skip") p.kind = CommFault::Skip;
  else if (parts[0] == "count") p.kind = CommFault::Count;
  else if (parts[0] == "sleep") p.kind = CommFault::Sleep;
  else if (parts[0] == "exit") p.kind = CommFault::Exit;
  else KILN_FAIL("{}", bad());
  p.site = parts[1];
  KILN_CHECK(!p.site.empty(), "{}", bad());
  char* end = nullptr;
  p.rank = static_cast<int>(std::strtol(parts[2].c_str(), &end, 10));
  KILN_CHECK(!parts[2].empty() && *end == '\0' && p.rank >= 0, "{}", bad());
  if (parts.size() == 4) {
    p.n = std::strtoll(parts[3].c_str(), &end, 10);
    KILN_CHECK(!parts[3].empty() && *end == '\0' && p.n >= 1, "{}", bad());
  }
  p.active = true;
  return p;
}

struct State {
  std::once_flag loaded;
  Plan plan;  // set once, then read only
  std::mutex mu;
  int64_t matches = 0;  // guarded by mu
};

State& state() {
  static State s;
  std::call_once(s.loaded, [&] {
    const char* env = std::getenv("KILN_COMM_FAULT");
    s.plan = parse(env ? env : "");
  });
  return s;
}

}  // namespace

void check_comm_fault(int world_size) {
  const Plan& p = state().plan;
  if (!p.active) return;
  KILN_CHECK(world_size > 1, "KILN_COMM_FAULT is set, but this run has one process: its faults "
             "apply to the MPI communicators of several ranks");
  KILN_CHECK(p.rank < world_size, "KILN_COMM_FAULT names rank {}, but the world has {} ranks",
             p.rank, world_size);
}

bool comm_fault_now(CommFault kind) {
  State& s = state();
  const Plan& p = s.plan;
  if (!p.active || p.kind != kind || p.rank != comm_detail::world_rank()) return false;
  if (std::string_view(CommSite::current()).substr(0, p.site.size()) != p.site) return false;
  std::lock_guard<std::mutex> lock(s.mu);
  return ++s.matches == p.n;
}

bool apply_comm_faults(double timeout_s) {
  if (comm_fault_now(CommFault::Exit)) {
    std::fprintf(stderr, "kiln: rank %d: KILN_COMM_FAULT: exiting at '%s'\n",
                 comm_detail::world_rank(), CommSite::current());
    std::fflush(stderr);
    std::_Exit(3);
  }
  if (comm_fault_now(CommFault::Sleep))
    std::this_thread::sleep_for(std::chrono::duration<double>(2 * timeout_s));
  return comm_fault_now(CommFault::Skip);
}

}  // namespace kiln
