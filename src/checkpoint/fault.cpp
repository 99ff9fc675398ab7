#include "checkpoint/fault.h"

#include "core/error.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace kiln::checkpoint {

namespace {

enum class Mode { None, Trace, Kill, KillMid, Enospc, Eio };

struct Plan {
  Mode mode = Mode::None;
  int64_t k = 0;
  int rank = -1;  // -1: every rank
};

int world_rank_from_env() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

Plan parse_plan(const std::string& spec) {
  Plan p;
  if (spec.empty()) return p;
  if (spec == "trace") {
    p.mode = Mode::Trace;
    return p;
  }
  const auto c1 = spec.find(':');
  const std::string mode = spec.substr(0, c1);
  if (mode == "kill") p.mode = Mode::Kill;
  else if (mode == "kill_mid") p.mode = Mode::KillMid;
  else if (mode == "enospc") p.mode = Mode::Enospc;
  else if (mode == "eio") p.mode = Mode::Eio;
  KILN_CHECK(p.mode != Mode::None && c1 != std::string::npos,
             "KILN_FAULT='{}': expected trace, kill:K, kill_mid:K, enospc:K or eio:K (optionally "
             ":RANK)", spec);
  const std::string rest = spec.substr(c1 + 1);
  const auto c2 = rest.find(':');
  char* end = nullptr;
  const std::string ks = rest.substr(0, c2);
  p.k = std::strtoll(ks.c_str(), &end, 10);
  KILN_CHECK(!ks.empty() && *end == '\0' && p.k >= 1, "KILN_FAULT='{}': K must be an integer >= 1",
             spec);
  if (c2 != std::string::npos) {
    const std::string rs = rest.substr(c2 + 1);
    p.rank = static_cast<int>(std::strtol(rs.c_str(), &end, 10));
    KILN_CHECK(!rs.empty() && *end == '\0' && p.rank >= 0,
               "KILN_FAULT='{}': RANK must be an integer >= 0", spec);
  }
  return p;
}

struct State {
  std::mutex mu;
  bool loaded = false;
  Plan plan;
  int64_t count = 0;
  int64_t current = 0;  // number of the operation begun last
  bool active = false;  // the plan applies to this rank
};

State& state() {
  static State s;
  return s;
}

void load_locked(State& s) {
  if (s.loaded) return;
  s.loaded = true;
  const char* env = std::getenv("KILN_FAULT");
  s.plan = parse_plan(env ? env : "");
  s.active = s.plan.rank < 0 || s.plan.rank == world_rank_from_env();
}

}  // namespace

const char* file_op_name(FileOp op) {
  switch (op) {
    case FileOp::Create: return "create";
    case FileOp::Write: return "write";
    case FileOp::Fsync: return "fsync";
    case FileOp::Rename: return "rename";
    case FileOp::Exchange: return "exchange";
    case FileOp::Mkdir: return "mkdir";
    case FileOp::Remove: return "remove";
    case FileOp::FsyncDir: return "fsync_dir";
  }
  return "?";
}

void set_fault_plan(const std::string& spec) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.plan = parse_plan(spec);
  s.loaded = true;
  s.active = s.plan.rank < 0 || s.plan.rank == world_rank_from_env();
  s.count = 0;
  s.current = 0;
}

int64_t file_op_count() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.count;
}

namespace detail {

[[noreturn]] void kill_now() {
  std::fflush(nullptr);
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

int begin_file_op(FileOp op, const std::string& path) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  load_locked(s);
  s.current = ++s.count;
  if (!s.active || s.plan.mode == Mode::None) return 0;
  if (s.plan.mode == Mode::Trace) {
    std::fprintf(stderr, "kiln: file op %lld (rank %d): %s %s\n", static_cast<long long>(s.current),
                 world_rank_from_env(), file_op_name(op), path.c_str());
    return 0;
  }
  if (s.current != s.plan.k) return 0;
  if (s.plan.mode == Mode::KillMid && op != FileOp::Write) kill_now();
  if (s.plan.mode == Mode::Enospc) return ENOSPC;
  if (s.plan.mode == Mode::Eio) return EIO;
  return 0;
}

void end_file_op() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.active && s.plan.mode == Mode::Kill && s.current == s.plan.k) kill_now();
}

bool kill_mid_write() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.active && s.plan.mode == Mode::KillMid && s.current == s.plan.k;
}

}  // namespace detail
}  // namespace kiln::checkpoint
