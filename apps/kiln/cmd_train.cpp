#include "apps/kiln/commands.h"
#include "config/config.h"
#include "train/trainer.h"

namespace kiln::app {

void register_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    TrainerOptions options;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("config", a->config, "The TOML config (see configs/ and docs/config.md)")
      ->required();
  cmd->add_option("--set", a->sets, "Override a key: --set section.key=value (repeatable)");
  cmd->add_option("--resume", a->options.resume,
                  "auto (newest complete checkpoint of run.dir) or a checkpoint directory");
  cmd->add_option("--exit-interval", a->options.exit_interval,
                  "Checkpoint and stop after this many updates in total (as if preempted)");
  cmd->callback([a] {
    const TrainConfig config = load_config_file(a->config, a->sets);
    // Before the ranks connect, so that under mpirun a missing key is said once (rank 0).
    config.validate_for_training();
    // Installed once the inputs are open: before that a SIGTERM or Ctrl-C ends kiln at once
    // (the default action) instead of waiting for a training loop that has not begun, e.g.
    // while a read blocks on a FIFO given as a data file.
    Trainer trainer(config, a->options);
    install_preemption_handlers();
    trainer.run();
  });
}

}  // namespace kiln::app
