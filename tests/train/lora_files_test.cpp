// LoRA's files (model_io/lora_io.h) on a tiny Llama: a PEFT adapter folder written by hand
// from PEFT's documented format (tests/train/peft_fixture: adapter_config.json as PEFT's
// LoraConfig writes it, the tensors from make_peft_fixture.py) read into kiln's adapters;
// its config checked against train.lora; the Hugging Face modules of adapted units (a
// piece of a fused Linear, GPT-2's whole c_attn, and Llama's whole qkv_proj, which has
// none; a Mixtral's experts, a module each); and the merged weights W + scale B A against
// a direct double computation, per expert for a Mixtral's.
#include "backend/registry.h"
#include "checkpoint/safetensors.h"
#include "model_io/lora_io.h"
#include "models/registry.h"
#include "support/tiny_decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>

namespace kiln {
namespace {

const std::string kFixture = std::string(KILN_SOURCE_DIR_DEFAULT) + "/tests/train/peft_fixture";

ModelOptions tiny(const std::string& arch) { return testing::tiny_decoder(arch); }

LoraPlan plan_of(std::vector<std::string> targets, int64_t rank, float alpha) {
  return LoraPlan(LoraOptions{nn::LoraSpec{rank, alpha, false, 0.f}, std::move(targets), "test"});
}

std::unique_ptr<Model> build(Backend& be, const ModelOptions& o, const LoraPlan& plan) {
  ModelStorage storage;
  storage.plans = {&plan};
  return make_model(o, be, storage);
}

// make_peft_fixture.py's values.
float fixture_value(int t, int64_t i) { return static_cast<float>(((t * 7 + i * 3) % 23 - 11) / 64.0); }

TEST(LoraFiles, PeftFixtureReadsIntoTheAdapters) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"q", "v"}, 2, 4.f);
  const auto model = build(*be, tiny("llama"), plan);
  const auto source = open_peft_folder(kFixture, tiny("llama"), plan, nn::LoraSpec{2, 4.f, false, 0.f});
  int read = 0;
  for (const ParamSpec& p : model->params()) {
    if (!p.adapter) continue;
    // The fixture's order: layer, module (q_proj, v_proj), lora_A then lora_B.
    const int layer = p.name.find("layers.1.") != std::string::npos;
    const int module = p.name.find(".qkv_proj.v.") != std::string::npos;
    const int which = p.name.find(".lora_B.") != std::string::npos;
    const int t = layer * 4 + module * 2 + which;
    std::vector<float> got(static_cast<size_t>(p.shape.numel()));
    source->read(p, 0, p.shape.numel(), got.data());
    for (int64_t i = 0; i < p.shape.numel(); ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], fixture_value(t, i)) << p.name << "[" << i << "]";
    ++read;
  }
  EXPECT_EQ(read, 8);
}

TEST(LoraFiles, PeftConfigMustBeTrainLoras) {
  auto be = make_backend("cpu");
  auto error_of = [&](std::vector<std::string> targets, nn::LoraSpec spec) {
    const LoraPlan plan = plan_of(std::move(targets), spec.rank, spec.alpha);
    build(*be, tiny("llama"), plan);
    try {
      open_peft_folder(kFixture, tiny("llama"), plan, spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({"q", "v"}, nn::LoraSpec{4, 4.f, false, 0.f}).find("r = 2, lora_alpha = 4"),
            std::string::npos);
  EXPECT_NE(error_of({"q", "v"}, nn::LoraSpec{2, 8.f, false, 0.f}).find("adapter_config.json"),
            std::string::npos);
  // Adapters the folder holds but the targets do not choose are an error, not dropped.
  EXPECT_NE(error_of({"q"}, nn::LoraSpec{2, 4.f, false, 0.f}).find("does not choose"),
            std::string::npos);
  EXPECT_NE(error_of({"q", "k"}, nn::LoraSpec{2, 4.f, false, 0.f})
                .find("no tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight'"),
            std::string::npos);
}

TEST(LoraFiles, PeftFeaturesKilnDoesNotComputeAreRefused) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"q", "v"}, 2, 4.f);
  build(*be, tiny("llama"), plan);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kiln_peft_features";
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"use_dora", true},
                                                           {"rank_pattern", {{"q_proj", 4}}},
                                                           {"bias", "all"},
                                                           {"modules_to_save", {"lm_head"}},
                                                           {"layers_to_transform", {0}},
                                                           {"target_modules", ".*q_proj"},
                                                           {"target_modules", "all-linear"}}) {
    std::filesystem::remove_all(dir);
    std::filesystem::copy(kFixture, dir);
    std::ifstream in(dir / "adapter_config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    in.close();
    c[key] = value;
    std::ofstream(dir / "adapter_config.json") << c.dump(2);
    try {
      open_peft_folder(dir, tiny("llama"), plan, nn::LoraSpec{2, 4.f, false, 0.f});
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

// A PEFT folder holding an adapter beyond what the targets choose says why it cannot be read:
// a module the model lacks, one kiln puts no adapter on, or one the targets leave out.
TEST(LoraFiles, ExtraAdaptersNameWhyTheyCannotBeRead) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"q", "v"}, 2, 4.f);
  build(*be, tiny("llama"), plan);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "kiln_peft_extra";
  for (const auto& [module, why] : std::vector<std::pair<std::string, std::string>>{
           {"model.layers.5.self_attn.q_proj", "which this model does not have"},
           {"lm_head", "which takes no LoRA adapter in kiln"},
           {"model.layers.0.self_attn.k_proj", "train.lora.targets does not choose"}}) {
    std::filesystem::remove_all(dir);
    std::filesystem::copy(kFixture, dir);
    {
      safetensors::Reader in((kFixture + "/adapter_model.safetensors"));
      safetensors::Writer out((dir / "adapter_model.safetensors").string());
      for (const safetensors::TensorInfo& t : in.tensors()) {
        out.add_f32(t.name, t.shape, in.read_f32(t.name));
      }
      out.add_f32("base_model.model." + module + ".lora_A.weight", {2, 16}, std::vector<float>(32, 0.f));
      out.write();
    }
    try {
      open_peft_folder(dir, tiny("llama"), plan, nn::LoraSpec{2, 4.f, false, 0.f});
      ADD_FAILURE() << module << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(LoraFiles, HuggingFaceModulesOfAdaptedUnits) {
  auto be = make_backend("cpu");
  const LoraPlan llama = plan_of({"q", "up", "down"}, 2, 4.f);
  build(*be, tiny("llama"), llama);
  const auto m = peft_modules(tiny("llama"), llama.units());
  using Names = std::vector<std::string>;
  EXPECT_EQ(m.at("model.layers.1.self_attn.qkv_proj.q"), Names{"model.layers.1.self_attn.q_proj"});
  EXPECT_EQ(m.at("model.layers.0.mlp.gate_up_proj.up"), Names{"model.layers.0.mlp.up_proj"});
  EXPECT_EQ(m.at("model.layers.0.mlp.down_proj"), Names{"model.layers.0.mlp.down_proj"});
  const LoraPlan gpt2 = plan_of({"qkv"}, 2, 4.f);
  build(*be, tiny("gpt2"), gpt2);
  EXPECT_EQ(peft_modules(tiny("gpt2"), gpt2.units()).at("transformer.h.0.attn.c_attn"),
            Names{"transformer.h.0.attn.c_attn"});
  const LoraPlan whole = plan_of({"qkv"}, 2, 4.f);  // Hugging Face splits Llama's qkv_proj
  build(*be, tiny("llama"), whole);
  EXPECT_THROW(peft_modules(tiny("llama"), whole.units()), Error);
}

// Gives `model` its initial values plus N(0, 0.5^2) noise from `seed` (so B is nonzero) and
// returns its parameters' values by name.
std::function<std::vector<float>(const std::string&)> random_weights(Backend& be, Model& model,
                                                                     uint32_t seed) {
  model.init_weights(3);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::map<std::string, std::vector<float>> values;
  for (const ParamSpec& p : model.params()) {
    std::vector<float> w = download_f32(be, model.param(p));
    for (float& x : w) x += nd(rng);
    upload_f32(be, model.param(p), w.data());
    values[p.name] = std::move(w);
  }
  return [values](const std::string& name) {
    const auto it = values.find(name);
    if (it != values.end()) return it->second;
    ADD_FAILURE() << name;
    return std::vector<float>();
  };
}

TEST(LoraFiles, MergedWeightsAreWPlusScaleBA) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"v", "down"}, 3, 6.f);  // scale 2
  const auto model = build(*be, tiny("llama"), plan);
  const auto value = random_weights(*be, *model, 4);
  const auto merged = merged_lora_weights(*model, plan);
  ASSERT_EQ(merged.size(), 4u);  // qkv_proj and down_proj of 2 layers
  for (const LoraUnit& u : plan.units()) {
    const auto W = value(u.linear + ".weight"), A = value(u.name + ".lora_A.weight"),
               B = value(u.name + ".lora_B.weight");
    const std::vector<float>& M = merged.at(u.linear + ".weight");
    const int64_t in = static_cast<int64_t>(A.size()) / 3, rows = static_cast<int64_t>(W.size()) / in;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < in; ++c) {
        double want = W[static_cast<size_t>(r * in + c)];
        if (r >= u.row0 && r < u.row0 + u.rows)
          for (int64_t k = 0; k < 3; ++k)
            want += 2.0 * B[static_cast<size_t>((r - u.row0) * 3 + k)] * A[static_cast<size_t>(k * in + c)];
        ASSERT_NEAR(M[static_cast<size_t>(r * in + c)], want, 1e-6 * std::max(1.0, std::abs(want)))
            << u.name << " row " << r << " col " << c;
      }
  }
}

// A tiny Mixtral: the tiny Llama with 3 experts of 8 units, each token taking 2.
ModelOptions tiny_mixtral() {
  ModelOptions o = tiny("llama");
  o.family["moe.num_experts"] = 3;
  o.family["moe.top_k"] = 2;
  o.family["moe.ffn_hidden_size"] = 8;
  return o;
}

TEST(LoraFiles, MixtralExpertsHaveAPeftModulePerExpert) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"gate", "down"}, 2, 4.f);
  build(*be, tiny_mixtral(), plan);
  const auto m = peft_modules(tiny_mixtral(), plan.units());
  using Names = std::vector<std::string>;
  const std::string moe = "model.layers.1.block_sparse_moe.experts.";
  EXPECT_EQ(m.at("model.layers.1.mlp.experts.gate_up_proj.gate"),
            (Names{moe + "0.w1", moe + "1.w1", moe + "2.w1"}));
  EXPECT_EQ(m.at("model.layers.1.mlp.experts.down_proj"),
            (Names{moe + "0.w2", moe + "1.w2", moe + "2.w2"}));
  const LoraPlan whole = plan_of({"fc"}, 2, 4.f);  // Mixtral's w1 and w3 are modules apart
  build(*be, tiny_mixtral(), whole);
  EXPECT_THROW(peft_modules(tiny_mixtral(), whole.units()), Error);
}

TEST(LoraFiles, MergedExpertWeightsAreWPlusScaleBAPerExpert) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"up", "down"}, 3, 6.f);  // scale 2
  const auto model = build(*be, tiny_mixtral(), plan);
  const auto value = random_weights(*be, *model, 5);
  const auto merged = merged_lora_weights(*model, plan);
  ASSERT_EQ(merged.size(), 4u);  // gate_up_proj and down_proj of 2 layers
  const int64_t E = 3, r = 3;
  for (const LoraUnit& u : plan.units()) {
    ASSERT_EQ(u.experts, E) << u.name;
    const auto W = value(u.linear + ".weight"), A = value(u.name + ".lora_A.weight"),
               B = value(u.name + ".lora_B.weight");
    const std::vector<float>& M = merged.at(u.linear + ".weight");
    const int64_t in = static_cast<int64_t>(A.size()) / (E * r);
    const int64_t out = static_cast<int64_t>(W.size()) / (E * in);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t c = 0; c < in; ++c) {
          const size_t at = static_cast<size_t>((e * out + o) * in + c);
          double want = W[at];
          if (o >= u.row0 && o < u.row0 + u.rows)
            for (int64_t k = 0; k < r; ++k)
              want += 2.0 * B[static_cast<size_t>((e * u.rows + o - u.row0) * r + k)] *
                      A[static_cast<size_t>((e * r + k) * in + c)];
          ASSERT_NEAR(M[at], want, 1e-6 * std::max(1.0, std::abs(want)))
              << u.name << " expert " << e << " row " << o << " col " << c;
        }
  }
}

}  // namespace
}  // namespace kiln
