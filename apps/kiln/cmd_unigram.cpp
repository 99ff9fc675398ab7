// kiln unigram --data DIR: the baseline a language model must beat. Fits a unigram
// model on the train split (counts with add-one smoothing over the vocabulary) and
// prints its cross-entropy on the val split in nats per token, the loss of a model that
// ignores context (data/unigram.h).
#include "apps/kiln/commands.h"
#include "data/unigram.h"

#include <fmt/format.h>

namespace kiln::app {

void register_unigram(CLI::App& app) {
  auto* cmd = app.add_subcommand("unigram", "Cross-entropy of a unigram model (val split), nats/token");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--data", *dir, "A directory written by kiln prepare")->required();
  cmd->callback([dir] {
    const data::UnigramLoss u = data::unigram_val_loss(*dir);
    fmt::print("unigram val loss: {:.4f} nats/token over {} tokens\n", u.nats_per_token, u.tokens);
  });
}

}  // namespace kiln::app
