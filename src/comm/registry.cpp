#include "comm/registry.h"

#include "comm/local_communicator.h"
#include "core/error.h"

#if defined(KILN_HAVE_MPI)
#include "comm/mpi_communicator.h"
#endif
#if defined(KILN_HAVE_NCCL)
#include "comm/nccl/nccl_communicator.h"
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

namespace kiln {

namespace {

std::unique_ptr<Communicator> make_local_world(int /*gpu*/) {
  const int launched = launcher_world_size();
  KILN_CHECK(launched == 0 || launched == 1,
             "communicator 'local' runs one process, but the launcher started {}",
             launched < 0 ? std::string("several") : std::to_string(launched));
  return std::make_unique<LocalCommunicator>("world");
}

// The built-in communicators of this build, then whatever was registered.
struct Table {
  Table() {
    factories["local"] = make_local_world;
#if defined(KILN_HAVE_MPI)
    factories["mpi"] = [](int) { return make_mpi_world_communicator(); };
#endif
#if defined(KILN_HAVE_NCCL)
    factories["nccl"] = [](int gpu) {
      return make_nccl_communicator(make_world_communicator(), gpu);
    };
#endif
  }
  std::mutex mu;
  std::map<std::string, CommunicatorFactory> factories;
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

void register_communicator(const std::string& name, CommunicatorFactory factory) {
  KILN_CHECK(!name.empty() && name != "auto" && factory,
             "register_communicator: '{}' needs a name other than auto and a factory", name);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.factories[name] = std::move(factory);
}

std::vector<std::string> communicator_names() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<std::string> names;
  for (const auto& [name, factory] : t.factories) names.push_back(name);
  return names;
}

bool communicator_registered(const std::string& name) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.factories.count(name) != 0;
}

std::unique_ptr<Communicator> make_communicator(const std::string& name, int gpu) {
  if (name == "auto") return make_world_communicator();
  CommunicatorFactory make;
  {
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mu);
    if (const auto it = t.factories.find(name); it != t.factories.end()) make = it->second;
  }
  KILN_CHECK(make, "communicator '{}' is not in this build (it has: auto, {}; mpi needs "
             "KILN_MPI, nccl KILN_NCCL: see docs/distributed.md)",
             name, fmt::join(communicator_names(), ", "));
  return make(gpu);
}

}  // namespace kiln
