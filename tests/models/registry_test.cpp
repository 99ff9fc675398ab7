// The registry's statements against the models themselves: every built-in family's entry
// says what its models do (language model, image classifier, flow model, stages, the
// inputs it reads), its presets are its own, and asking a model for a capability it lacks
// is a one-line error naming its arch.
#include "backend/registry.h"
#include "models/registry.h"
#include "support/error_of.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

using testing::error_of;

// A tiny model of each built-in family.
ModelOptions tiny(const std::string& arch) {
  ModelOptions o;
  o.arch = arch;
  o.n_layer = 1;
  o.n_head = 2;
  o.n_embd = 16;
  o.vocab_size = 37;
  o.block_size = 8;
  if (arch == "vit" || arch == "dit") {
    o.family = {{"image_size", 8}, {"num_channels", 1}, {"patch_size", 4}, {"num_classes", 3}};
    o.vocab_size = 0;
    o.block_size = arch == "vit" ? 5 : 4;  // 4 patches (+ the class token)
  }
  if (arch == "mmdit") {  // 4 patches and 5 caption slots
    o.family = {{"image_size", 8}, {"num_channels", 1}, {"patch_size", 4}, {"caption_tokens", 5},
                {"text.n_layer", 1}};
    o.block_size = 4;
  }
  if (arch == "llava")  // 4 image tokens and 4 text slots
    o.family = {{"image_size", 8}, {"num_channels", 1}, {"vision.patch_size", 4},
                {"vision.n_embd", 8}, {"vision.n_head", 2}, {"vision.n_layer", 1}};
  return o;
}

TEST(Registry, EveryEntryStatesWhatItsModelsDo) {
  auto be = make_backend("cpu");
  for (const char* arch : {"gpt2", "llama", "vit", "dit", "llava", "mmdit"}) {
    const ModelArch entry = model_arch(arch);
    const ModelOptions o = tiny(arch);
    auto m = make_model(o, *be);
    EXPECT_EQ(m->arch(), arch);
    EXPECT_EQ(entry.decodes, m->language_model() != nullptr) << arch;
    EXPECT_EQ(entry.classifies_images, m->image_classifier() != nullptr) << arch;
    EXPECT_EQ(entry.generates_images, m->flow_model() != nullptr) << arch;
    EXPECT_EQ(entry.stages, m->stage_activation_shape(2, o.block_size).has_value()) << arch;
    const BatchShape shape = m->batch_shape(2, o.block_size);
    EXPECT_EQ(entry.takes_images, shape.find("images") != nullptr) << arch;
    EXPECT_EQ(!entry.takes_images || entry.takes_text, shape.find("tokens") != nullptr) << arch;
    for (const ModelPreset& p : entry.presets) EXPECT_EQ(p.arch, arch) << p.name;
  }
}

TEST(Registry, PresetsComeFromTheFamilies) {
  const auto presets = model_presets();
  ASSERT_EQ(presets.size(), 8u);
  EXPECT_EQ(presets.front().name, "gpt2");
  ASSERT_TRUE(find_model_preset("llama3.1-8b"));
  EXPECT_EQ(find_model_preset("llama3.1-8b")->arch, "llama");
  EXPECT_FALSE(find_model_preset("gpt5"));
  EXPECT_EQ(model_archs_with(&ModelArch::stages), (std::vector<std::string>{"gpt2", "llama"}));
}

TEST(Registry, AMissingCapabilityNamesTheArch) {
  auto be = make_backend("cpu");
  auto vit = make_model(tiny("vit"), *be);
  EXPECT_NE(error_of([&] { as_language_model(*vit, "ckpt/step_1"); })
                .find("ckpt/step_1: model.arch 'vit' is not a language model"),
            std::string::npos);
  EXPECT_NE(error_of([&] { as_flow_model(*vit, "x"); }).find("'vit' is not a flow model"),
            std::string::npos);
  auto gpt2 = make_model(tiny("gpt2"), *be);
  EXPECT_NE(error_of([&] { as_image_classifier(*gpt2, "x"); })
                .find("'gpt2' is not an image classifier"),
            std::string::npos);
  EXPECT_EQ(&as_language_model(*gpt2, "x"), gpt2->language_model());
}

TEST(Batch, NamedInputs) {
  Tensor a = Tensor::view(reinterpret_cast<void*>(16), Shape{2, 3}, DType::I32);
  Batch b = Batch::of_tokens(a, a);
  EXPECT_TRUE(b.input("tokens"));
  EXPECT_FALSE(b.input("positions"));  // an empty tensor is no input
  EXPECT_NE(error_of([&] { b.require("images", "vit"); }).find("vit: the batch has no input 'images'"),
            std::string::npos);
  b.set("tokens", Tensor());
  EXPECT_TRUE(b.inputs.empty());
  BatchShape s;
  s.inputs.push_back({.name = "tokens", .shape = Shape{2, 3}, .dtype = DType::I32});
  s.inputs.push_back({.name = "positions", .shape = Shape{2, 3}, .dtype = DType::I32, .optional = true});
  s.inputs.push_back({.name = "images", .shape = Shape{2, 4, 4, 1}, .dtype = DType::F32});
  EXPECT_EQ(s.required().size(), 2u);
  EXPECT_EQ(s.required_bytes(), 2 * 3 * 4 + 2 * 16 * 4);
  EXPECT_EQ(batched(5, Shape{4, 4, 1}), (Shape{5, 4, 4, 1}));
}

}  // namespace
}  // namespace kiln
