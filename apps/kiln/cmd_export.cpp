#include "apps/kiln/commands.h"
#include "train/model_io.h"

#include <fmt/format.h>

namespace kiln::app {

void register_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Write a checkpoint's weights as an llm.c .bin or a Hugging Face .safetensors");
  struct Args {
    std::string checkpoint, format, out;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint, "A checkpoint directory")->required();
  cmd->add_option("--format", a->format, "llmc | safetensors")
      ->required()
      ->check(CLI::IsMember({"llmc", "safetensors"}));
  cmd->add_option("--out", a->out, "Output file")->required();
  cmd->callback([a] {
    export_checkpoint(a->checkpoint, a->format, a->out);
    fmt::print("kiln export: {} -> {} ({})\n", a->checkpoint, a->out, a->format);
  });
}

}  // namespace kiln::app
