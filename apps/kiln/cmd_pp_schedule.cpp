// kiln pp-schedule --pp P --micro-batches M [--virtual-stages V] [--schedule S] [--actions]:
// a pipeline schedule (src/parallel/pipeline_schedule.h) run through the simulator: its
// bubble against the theory, each stage's peak of passes in flight, and with --actions
// every rank's list. Needs no model, no MPI.
#include "apps/kiln/commands.h"
#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>

namespace kiln::app {

void register_pp_schedule(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "pp-schedule", "Simulate a pipeline schedule: deadlock check, bubble vs theory, in-flight peaks");
  struct Args {
    int pp = 2, micro_batches = 4, virtual_stages = 1;
    std::string schedule = "1f1b";
    bool actions = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--pp", a->pp, "Pipeline ranks (default 2)");
  cmd->add_option("--micro-batches", a->micro_batches, "Micro-batches per update (default 4)");
  cmd->add_option("--virtual-stages", a->virtual_stages, "Chunks per rank (default 1)");
  cmd->add_option("--schedule", a->schedule, "gpipe, 1f1b (default) or interleaved");
  cmd->add_flag("--actions", a->actions, "Print every rank's action list");
  cmd->callback([a] {
    const pp::ScheduleKind kind = pp::parse_schedule_kind(a->schedule);
    const pp::Schedule s = pp::make_schedule(kind, a->pp, a->virtual_stages, a->micro_batches);
    const pp::SimResult r = pp::simulate(s);
    fmt::print("kiln pp-schedule: {} over {} ranks, {} virtual stage(s) each, {} micro-batches: no "
               "deadlock, every message matched\n", a->schedule, a->pp, a->virtual_stages,
               a->micro_batches);
    fmt::print("  bubble (idle fraction, backward = 2 x forward): simulated {:.4f}, theory {:.4f}\n",
               r.bubble_fraction,
               pp::theoretical_bubble(kind, a->pp, a->virtual_stages, a->micro_batches));
    for (int i = 0; i < a->pp; ++i) {
      fmt::print("  rank {}: peak {} pass(es) in flight, {} actions\n", i,
                 r.peak_in_flight[static_cast<size_t>(i)], s.ranks[static_cast<size_t>(i)].size());
      if (!a->actions) continue;
      std::string line = "   ";
      for (const pp::Action& act : s.ranks[static_cast<size_t>(i)]) {
        line += ' ';  // not line += " " + act.str(): GCC 12's false -Wrestrict (its bug 105329)
        line += act.str();
      }
      fmt::print("{}\n", line);
    }
  });
}

}  // namespace kiln::app
