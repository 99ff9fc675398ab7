// kiln: the command-line entry point. Each sub-command lives in its own file
// (cmd_*.cpp) and registers itself here; errors become one line and a non-zero exit.
#include "apps/kiln/commands.h"
#include "comm/communicator.h"
#include "core/error.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <new>
#include <string>

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

int main(int argc, char** argv) {
  // OpenMP threads that sleep between parallel regions instead of spinning: no slower on
  // an idle machine, and 2-100x faster when other processes share the cores (measured on
  // 2-core machines, 2026-11-30). The OpenMP runtime reads its environment when it is
  // loaded, before main(), so the variable is set and the program started again. The
  // user's own setting wins.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // returns only on failure: carry on with the default
  }
  CLI::App app{"kiln: train transformer models on CPUs and GPUs"};
  app.require_subcommand(1);
  kiln::app::register_prepare(app);
  kiln::app::register_train(app);
  kiln::app::register_sample(app);
  kiln::app::register_export(app);
  kiln::app::register_unigram(app);
  kiln::app::register_bench(app);
  kiln::app::register_report(app);
  kiln::app::register_memplan(app);
  kiln::app::register_plan(app);
  kiln::app::register_pp_schedule(app);
  kiln::app::register_classify(app);
  kiln::app::register_sample_images(app);
  kiln::app::register_eval(app);
  kiln::app::register_scenes(app);
  kiln::app::register_score_scenes(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all
    // One line, like every other error of kiln, naming the command's help.
    fmt::print(stderr, "kiln: error: {} (see kiln {}--help)\n", e.what(),
               app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name() + " ");
    return e.get_exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    // Host memory exhausted (a model shape far too large, e.g. n_layer = 10^7): say so.
    const std::string what =
        dynamic_cast<const std::bad_alloc*>(&e) != nullptr
            ? "out of host memory (std::bad_alloc): the model or batch is too large for this "
              "machine (check model.n_layer, n_embd, vocab_size, block_size and train.micro_batch)"
            : e.what();
    // Under mpirun/srun one rank's error ends every rank (no hang), naming the rank.
    if (kiln::launcher_world_size() != 0) kiln::abort_all(fmt::format("error: {}", what));
    fmt::print(stderr, "kiln: error: {}\n", what);
    return 1;
  }
  return 0;
}
