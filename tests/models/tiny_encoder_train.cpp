// Trains TinyEncoder (tiny_encoder.h) with kiln's own Trainer: `tiny_encoder_train CONFIG [--set k=v]...`
// registers the architecture and runs `kiln train` on model.arch = "tiny_encoder", under
// mpirun or alone, with no trainer, parallel or checkpoint code knowing the model.
#include "tiny_encoder.h"

#include "comm/communicator.h"
#include "train/trainer.h"

#include <fmt/format.h>

#include <cstring>

int main(int argc, char** argv) {
  try {
    kiln::testing::register_tiny_encoder();
    std::vector<std::string> sets;
    for (int i = 2; i + 1 < argc; i += 2)
      if (std::strcmp(argv[i], "--set") == 0) sets.emplace_back(argv[i + 1]);
    kiln::TrainConfig c = kiln::load_config_file(argv[1], sets);
    kiln::TrainerOptions o;
    o.verbose = true;
    kiln::Trainer t(c, o);
    t.run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "tiny_encoder_train: error: {}\n", e.what());
    if (kiln::launcher_world_size() != 0) kiln::abort_all(fmt::format("error: {}", e.what()));
    return 1;
  }
  return 0;
}
