#include "apps/kiln/commands.h"
#include "core/error.h"
#include "train/device.h"
#include "model_io/lora_io.h"
#include "model_io/model_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace kiln::app {

namespace {
// "5GB" (10^9, as transformers), "500MB", "1.5GB", "2GiB", "1048576": bytes, from 1 to
// 10^18. A decimal number (digits, optionally one point and more digits) and a unit, no
// spaces, signs, exponents or hex. Throws kiln::Error.
uint64_t parse_size(const std::string& s) {
  const std::string hint = fmt::format("--shard-size '{}': expected a size from 1 byte to 1EB "
                                       "such as 5GB, 500MB or 2GiB", s);
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) ++pos;
  const std::string number = s.substr(0, pos);
  KILN_CHECK(!number.empty() && std::isdigit(static_cast<unsigned char>(number.front())) &&
                 std::isdigit(static_cast<unsigned char>(number.back())) &&
                 std::count(number.begin(), number.end(), '.') <= 1,
             "{}", hint);
  const double v = std::stod(number);
  std::string unit = s.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> units[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name && v * scale >= 1 && v * scale <= 1e18) return static_cast<uint64_t>(v * scale);
  KILN_FAIL("{}", hint);
}
}  // namespace

void register_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export", "Write a checkpoint's weights as a Hugging Face model folder, an llm.c .bin, a "
                "Hugging Face .safetensors, or a LoRA checkpoint's adapters as a PEFT folder");
  struct Args {
    std::string checkpoint, format, out, dtype, shard_size = "5GB", lora_base;
    bool merge_lora = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--checkpoint", a->checkpoint, "A checkpoint directory")->required();
  cmd->add_option("--format", a->format,
                  "hf (a Hugging Face folder) | llmc | safetensors | peft (a LoRA checkpoint's "
                  "adapters as a Hugging Face PEFT folder)")
      ->required()
      ->check(CLI::IsMember({"hf", "llmc", "safetensors", "peft"}));
  cmd->add_flag("--merge-lora", a->merge_lora,
                "hf: a LoRA checkpoint's model with its adapters merged (W + scale B A)");
  cmd->add_option("--out", a->out, "Output folder (hf) or file")->required();
  cmd->add_option("--dtype", a->dtype, "hf: fp32 | bf16 | fp16 (default: the checkpoint's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--lora-base", a->lora_base,
                  "--merge-lora: the LoRA checkpoint's base where it is now (default: where it "
                  "was trained)");
  cmd->add_option("--shard-size", a->shard_size,
                  "hf: most bytes of tensor data per shard (default 5GB)");
  cmd->callback([a] {
    ExportOptions o;
    o.format = a->format;
    KILN_CHECK(a->format == "hf" || (a->dtype.empty() && a->shard_size == "5GB"),
               "--dtype and --shard-size are options of --format hf");
    KILN_CHECK(!a->merge_lora || a->format == "hf", "--merge-lora is an option of --format hf");
    o.dtype = a->dtype;
    o.shard_bytes = parse_size(a->shard_size);
    KILN_CHECK(a->lora_base.empty() || a->merge_lora, "--lora-base is an option of --merge-lora");
    o.lora_base = a->lora_base;
    if (a->format == "peft" || a->merge_lora) {  // a LoRA checkpoint: docs/lora.md
      const checkpoint::CheckpointReader reader(a->checkpoint);
      auto backend = make_device_backend("cpu");
      if (a->merge_lora)
        export_merged_hf_folder(reader, *backend, o, a->out);
      else
        export_peft_folder(reader, *backend, a->out);
    } else {
      export_checkpoint(a->checkpoint, o, a->out);
    }
    fmt::print("kiln export: {} -> {} ({})\n", a->checkpoint, a->out, a->format);
  });
}

}  // namespace kiln::app
