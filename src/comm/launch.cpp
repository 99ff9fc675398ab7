#include "comm/launch.h"

#include "comm/ledger.h"
#include "core/error.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

namespace kiln {

namespace {

// Who started this process: "launched by srun --mpi=pmix in Slurm job 12 step 0",
// "launched by mpirun (Open MPI) in Slurm job 12", "launched by mpirun (Open MPI)",
// "started in Slurm job 12" (one process of a batch script); "" by hand outside Slurm.
std::string launcher_description() {
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");  // srun's tasks have it, a batch script not
  std::string by;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) by = "mpirun (Open MPI)";
  else if (std::getenv("PMIX_RANK") != nullptr) by = step ? "srun --mpi=pmix" : "a PMIx launcher";
  else if (std::getenv("PMI_SIZE") != nullptr) by = step ? "srun --mpi=pmi2" : "a PMI launcher";
  else if (step != nullptr) by = "srun";
  std::string slurm;
  if (job != nullptr)
    slurm = step != nullptr ? fmt::format("Slurm job {} step {}", job, step)
                            : fmt::format("Slurm job {}", job);
  if (by.empty()) return slurm.empty() ? std::string() : "started in " + slurm;
  return slurm.empty() ? "launched by " + by : fmt::format("launched by {} in {}", by, slurm);
}

// "0-3", "0,2,5-7": ascending values as ranges.
std::string ranges(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    out += (out.empty() ? "" : ",") +
           (j == i ? std::to_string(values[i]) : fmt::format("{}-{}", values[i], values[j]));
    i = j + 1;
  }
  return out;
}

constexpr int kHostWords = 16;  // 64 bytes of host name, the last one NUL

struct HostRanks {
  std::vector<int> ranks, local_ranks;
};

}  // namespace

std::string launch_summary(Communicator& world) {
  const std::string by = launcher_description();
  if (world.size() == 1 && by.empty()) return {};
  const int words = kHostWords + 1;
  std::vector<int32_t> mine(words, 0), all(static_cast<size_t>(words) * world.size());
  char host[4 * kHostWords] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::memcpy(mine.data(), host, sizeof(host));
  mine[kHostWords] = launcher_local_rank();
  const CommSite site("launch.all_gather hosts");
  world.all_gather(Tensor::view(all.data(), Shape{static_cast<int64_t>(all.size())}, DType::I32),
                   Tensor::view(mine.data(), Shape{words}, DType::I32));
  std::vector<std::string> order;
  std::map<std::string, HostRanks> by_host;
  for (int r = 0; r < world.size(); ++r) {
    const int32_t* w = all.data() + static_cast<size_t>(r) * words;
    const std::string name(reinterpret_cast<const char*>(w), strnlen(reinterpret_cast<const char*>(w), sizeof(host)));
    HostRanks& h = by_host[name];
    if (h.ranks.empty()) order.push_back(name);
    for (size_t i = 0; i < h.ranks.size(); ++i)
      KILN_CHECK(h.local_ranks[i] != w[kHostWords],
                 "ranks {} and {} on host {} both have local rank {} from the launcher: they would "
                 "share a GPU (check OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID)",
                 h.ranks[i], r, name, w[kHostWords]);
    h.ranks.push_back(r);
    h.local_ranks.push_back(w[kHostWords]);
  }
  std::string hosts;
  for (const std::string& name : order) {
    HostRanks h = by_host[name];
    std::sort(h.local_ranks.begin(), h.local_ranks.end());
    const char* plural = h.ranks.size() == 1 ? "" : "s";
    hosts += fmt::format("{}{}: rank{} {}, local rank{} {}", hosts.empty() ? "" : "; ", name,
                         plural, ranges(h.ranks), plural, ranges(h.local_ranks));
  }
  return fmt::format("{} rank{}{}; {}", world.size(), world.size() == 1 ? "" : "s",
                     by.empty() ? "" : " " + by, hosts);
}

}  // namespace kiln
