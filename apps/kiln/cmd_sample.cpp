#include "apps/kiln/commands.h"
#include "backend/registry.h"
#include "core/error.h"
#include "data/llava.h"
#include "data/pair_dataset.h"
#include "models/registry.h"
#include "train/device.h"
#include "eval/eval.h"
#include "model_io/model_io.h"
#include "models/hf_formats.h"
#include "sampling/sampler.h"

#include <fmt/format.h>

namespace kiln::app {

namespace {

// kiln sample --image: the model's answer to `question` about the image at `path`, in
// LLaVA-1.5's format (data/llava.h), until the end-of-text id.
void answer_about_image(Model& model, const data::Tokenizer& tok, const std::string& path,
                        const std::string& question, SampleOptions o) {
  const Shape shape = as_vision_language_model(model, "sample --image").image_shape();
  const std::vector<uint8_t> px = data::read_image_as(
      path, {static_cast<int>(shape[0]), static_cast<int>(shape[1]), static_cast<int>(shape[2])});
  ImagePrompt image;
  image.pixels.resize(px.size());
  data::scale_pixels(px, image.pixels.data());
  const data::CaptionTokens prompt = data::llava_prompt(tok, question, /*with_image=*/true);
  image.image_at = static_cast<int>(prompt.image_at);
  o.stop_token = tok.eot_id();
  std::vector<int32_t> out = sample_tokens(model, prompt.ids, o, &image);
  if (!out.empty() && out.back() == tok.eot_id()) out.pop_back();
  std::string text = tok.decode(out);
  if (text.starts_with(' ')) text.erase(0, 1);  // the answer follows "ASSISTANT:" after a space
  fmt::print("{}\n", text);
}

}  // namespace

void register_sample(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sample", "Generate text from a checkpoint or a Hugging Face folder (KV cache)");
  struct Args {
    std::string checkpoint, prompt, image, device = "cpu", lora_base;
    SampleOptions o;
  };
  auto a = std::make_shared<Args>();
  a->o.max_new_tokens = 200;
  cmd->add_option("--checkpoint", a->checkpoint,
                  "A checkpoint directory (ckpt/step_XXXXXXXX) or a Hugging Face folder")
      ->required();
  cmd->add_option("--prompt", a->prompt, "Text to continue (default: start of a document); with --image, "
                  "the question about it");
  CLI::Option* image = cmd->add_option("--image", a->image, "A PNG image to answer --prompt about (a vision-language model: "
                  "LLaVA-1.5's conversation format, \"<image>\" placing it in the prompt)");
  cmd->add_option("--lora-base", a->lora_base,
                  "A LoRA checkpoint's base where it is now (default: where it was trained)");
  cmd->add_option("--device", a->device, "Where to run (as train.device): cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--max-new-tokens", a->o.max_new_tokens, "Tokens to generate")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--temperature", a->o.temperature, "Softmax temperature; 0 = greedy")
      ->check(CLI::Range(0.0f, 1e6f));
  cmd->add_option("--top-k", a->o.top_k, "Sample among the k most likely tokens (0 = all)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--seed", a->o.seed, "Random seed: same seed, same text");
  cmd->callback([a, image] {
    if (!is_hf_folder(a->checkpoint)) {
      const checkpoint::CheckpointReader reader(a->checkpoint);
      const ModelOptions options = checkpoint_model_options(reader);
      const ModelArch arch = model_arch(options.arch);
      KILN_CHECK(arch.decodes, "{}: a {} checkpoint, {}: kiln sample generates text (kiln "
                 "sample-images samples an image generator, kiln classify scores an image "
                 "classifier)", a->checkpoint, options.arch,
                 arch.takes_images ? "an image model" : "not a language model");
    }
    auto backend = make_device_backend(a->device);
    // A checkpoint (a LoRA one: its adapters on their base, unmerged, model_io/lora_io.h)
    // or a Hugging Face folder, as kiln eval reads them.
    const ScoringModel loaded = load_scoring_model(a->checkpoint, *backend, a->lora_base);
    Model& model = *loaded.model;
    const LanguageModel& lm = as_language_model(model, a->checkpoint);
    KILN_CHECK(loaded.tokenizer, "{}: a Hugging Face folder without tokenizer.json: kiln sample "
               "needs its tokenizer", a->checkpoint);
    const data::Tokenizer* tok = loaded.tokenizer.get();
    if (image->count() > 0) {
      KILN_CHECK(!a->image.empty(), "sample: --image is an empty path");
      answer_about_image(model, *tok, a->image, a->prompt, a->o);
      return;
    }
    if (model.vision_language_model() != nullptr)
      fmt::print(stderr, "kiln sample: {} is a vision-language model and no --image was given: "
                 "continuing the text alone, outside the conversation format it was trained "
                 "on\n", a->checkpoint);
    std::vector<int32_t> prompt{tok->eot_id()};
    if (!a->prompt.empty()) {
      const auto ids = tok->encode(a->prompt);
      prompt.insert(prompt.end(), ids.begin(), ids.end());
    }
    KILN_CHECK(static_cast<int>(prompt.size()) < lm.max_positions(),
               "sample: the prompt has {} tokens, the model's context is {}", prompt.size(),
               lm.max_positions());
    const auto out = sample_tokens(model, prompt, a->o);
    fmt::print("{}{}\n", a->prompt, tok->decode(out));
    if (static_cast<int>(out.size()) < a->o.max_new_tokens)
      fmt::print(stderr, "kiln sample: stopped after {} tokens: the model's context ({} tokens) "
                 "is full\n", out.size(), lm.max_positions());
  });
}

}  // namespace kiln::app
