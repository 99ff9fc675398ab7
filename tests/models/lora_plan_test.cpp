// The LoRA plan (models/lora_plan.h) on tiny models built through the registry: which
// Linears its roles and globs adapt, the frozen base, the errors; and a tiny Llama's
// adapter gradients against central differences of its loss (fp32), so that the adapters
// are wired into the model's training passes, not only into a Linear.
#include "backend/registry.h"
#include "models/registry.h"
#include "support/tiny_decoder.h"
#include "models/lora_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kiln {
namespace {

ModelOptions tiny_llama() { return testing::tiny_decoder("llama"); }
ModelOptions tiny_gpt2() { return testing::tiny_decoder("gpt2"); }

std::unique_ptr<Model> build(Backend& be, const ModelOptions& o, const LoraPlan& plan) {
  ModelStorage storage;
  storage.plans = {&plan};
  return make_model(o, be, storage);
}

LoraPlan plan_of(std::vector<std::string> targets, int64_t rank = 4) {
  return LoraPlan(LoraOptions{nn::LoraSpec{rank, 8.f, false, 0.f}, std::move(targets), "test.toml"});
}

std::vector<std::string> trainable(const Model& m) {
  std::vector<std::string> out;
  for (const ParamSpec& p : m.params())
    if (p.trainable) out.push_back(p.name);
  return out;
}

TEST(LoraPlan, RolesChoosePiecesAndWholeLinearsAndFreezeTheRest) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"q", "v", "down"});
  const auto m = build(*be, tiny_llama(), plan);
  EXPECT_EQ(plan.adapted(), (std::vector<std::string>{
                                "model.layers.0.self_attn.qkv_proj.q", "model.layers.0.self_attn.qkv_proj.v",
                                "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.qkv_proj.q",
                                "model.layers.1.self_attn.qkv_proj.v", "model.layers.1.mlp.down_proj"}));
  const auto names = trainable(*m);
  ASSERT_EQ(names.size(), 12u);
  for (const std::string& n : names) EXPECT_TRUE(n.find(".lora_") != std::string::npos) << n;
  for (const ParamSpec& p : m->params()) {
    EXPECT_EQ(p.adapter, p.trainable) << p.name;
    if (p.name == "model.layers.1.self_attn.qkv_proj.v.lora_B.weight") EXPECT_EQ(p.shape, (Shape{8, 4}));
    if (p.name == "model.layers.1.mlp.down_proj.lora_A.weight") EXPECT_EQ(p.shape, (Shape{4, 24}));
  }
  // GPT-2's fused c_attn whole (PEFT's target on GPT-2) by role and by glob.
  const LoraPlan gpt2 = plan_of({"qkv", "*.h.1.mlp.c_fc"});
  build(*be, tiny_gpt2(), gpt2);
  EXPECT_EQ(gpt2.adapted(), (std::vector<std::string>{"transformer.h.0.attn.c_attn",
                                                       "transformer.h.1.attn.c_attn",
                                                       "transformer.h.1.mlp.c_fc"}));
}

TEST(LoraPlan, AdaptersLeaveTheBaseInitialValuesAlone) {
  // Adapters are numbered after the model's own parameters (nn::Param::adapter): the base
  // of a LoRA model starts where the plain model does.
  auto be = make_backend("cpu");
  const auto plain = make_model(tiny_llama(), *be);
  const LoraPlan plan = plan_of({"q", "o", "gate"});
  const auto adapted = build(*be, tiny_llama(), plan);
  for (size_t i = 0; i < plain->params().size(); ++i) {
    const ParamSpec& p = plain->params()[i];
    for (size_t j = 0; j < adapted->params().size(); ++j)
      if (adapted->params()[j].name == p.name)
        EXPECT_EQ(plain->init_values(i, 7, 0, 5), adapted->init_values(j, 7, 0, 5)) << p.name;
  }
}

TEST(LoraPlan, ErrorsNameTheTarget) {
  auto be = make_backend("cpu");
  auto fails = [&](const ModelOptions& o, std::vector<std::string> targets, const char* text) {
    const LoraPlan plan = plan_of(std::move(targets));
    try {
      build(*be, o, plan);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  fails(tiny_llama(), {"q_proj"}, "train.lora.targets 'q_proj' matches no Linear");
  fails(tiny_llama(), {"qkv", "q"}, "test.toml: train.lora.targets choose both "
                                    "model.layers.0.self_attn.qkv_proj and "
                                    "model.layers.0.self_attn.qkv_proj.q");
  fails(tiny_gpt2(), {"gate"}, "train.lora.targets 'gate' matches no Linear");
  fails(tiny_llama(), {}, "adapts no Linear");
}

TEST(LoraPlan, MoeBlocksAdaptTheirExpertsAndSharedExperts) {
  auto be = make_backend("cpu");
  ModelOptions o = tiny_llama();
  o.family["moe.num_experts"] = 3;
  o.family["moe.top_k"] = 2;
  o.family["moe.ffn_hidden_size"] = 8;
  o.family["moe.shared_experts"] = 1;
  o.family["moe.first_k_dense"] = 1;
  const LoraPlan plan = plan_of({"gate", "down"}, 2);
  const auto m = build(*be, o, plan);
  const std::string l1 = "model.layers.1.mlp.";
  EXPECT_EQ(plan.adapted(), (std::vector<std::string>{
                                "model.layers.0.mlp.gate_up_proj.gate", "model.layers.0.mlp.down_proj",
                                l1 + "experts.gate_up_proj.gate", l1 + "experts.down_proj",
                                l1 + "shared_experts.gate_up_proj.gate", l1 + "shared_experts.down_proj"}));
  for (const LoraUnit& u : plan.units()) EXPECT_EQ(u.experts, u.name.find(".experts.") != std::string::npos ? 3 : 0) << u.name;
  for (const ParamSpec& p : m->params()) {
    EXPECT_EQ(p.adapter, p.trainable) << p.name;
    if (p.name == l1 + "experts.gate_up_proj.gate.lora_B.weight") EXPECT_EQ(p.shape, (Shape{3, 8, 2}));
    if (p.name == l1 + "experts.down_proj.lora_A.weight") EXPECT_EQ(p.shape, (Shape{3, 2, 8}));
  }
  // A glob reaches one expert projection's piece; dropout on experts is refused.
  const LoraPlan glob = plan_of({"*.experts.gate_up_proj.up"});
  build(*be, o, glob);
  EXPECT_EQ(glob.adapted(), (std::vector<std::string>{l1 + "experts.gate_up_proj.up"}));
  const LoraPlan drop(LoraOptions{nn::LoraSpec{2, 8.f, false, 0.1f}, {"up"}, "test.toml"});
  try {
    build(*be, o, drop);
    ADD_FAILURE() << "dropout on experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a mixture-of-experts layer's experts, is not supported"),
              std::string::npos) << e.what();
  }
}

TEST(LoraPlan, LlamaAdapterGradientsMatchCentralDifferences) {
  auto be = make_backend("cpu");
  const LoraPlan plan = plan_of({"q", "v", "o", "gate", "up", "down"}, 3);
  const auto m = build(*be, tiny_llama(), plan);
  m->init_weights(5);
  // Nonzero B (a fresh B = 0 gives A no gradient) and larger weights, the adapters' in the
  // trainable buffer and the base's in the frozen one.
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 0.3f);
  for (const ParamSpec& p : m->params())
    if (p.shape.ndim() >= 2) {
      std::vector<float> w = download_f32(*be, m->param(p));
      for (float& x : w) x += nd(rng);
      upload_f32(*be, m->param(p), w.data());
    }
  const int B = 2, T = 7;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[static_cast<size_t>(i)] = (i * 7 + 3) % 29, tgt[static_cast<size_t>(i)] = (i * 5 + 1) % 29;
  auto i32 = [&](const std::vector<int32_t>& h) {
    Tensor t = be->empty(Shape{B, T}, DType::I32, MemCategory::Activations);
    be->copy_from_host(be->default_stream(), t, h.data());
    return t;
  };
  const Tensor x = i32(tok), y = i32(tgt);
  auto loss = [&] {
    m->zero_grad();
    const LossSum l = m->forward(Batch::of_tokens(x, y), 1.f);
    m->backward();
    return l.sum;
  };
  loss();
  std::vector<std::vector<float>> grads;  // the adapters', in order, before any probe
  for (const ParamSpec& p : m->params())
    if (p.adapter) grads.push_back(download_f32(*be, m->grad(p)));
  int checked = 0;
  for (const ParamSpec& p : m->params()) {
    if (!p.adapter) continue;
    const std::vector<float>& g = grads[static_cast<size_t>(checked / 3)];
    std::vector<float> w = download_f32(*be, m->param(p));
    for (int64_t i : {int64_t{0}, p.shape.numel() / 2, p.shape.numel() - 1}) {
      const size_t at = static_cast<size_t>(i);
      const float saved = w[at], eps = 1e-2f;
      w[at] = saved + eps;
      upload_f32(*be, m->param(p), w.data());
      const double up = loss();
      w[at] = saved - eps;
      upload_f32(*be, m->param(p), w.data());
      const double down = loss();
      w[at] = saved;
      upload_f32(*be, m->param(p), w.data());
      const double want = (up - down) / (2 * eps);
      const double got = g[at];
      EXPECT_NEAR(got, want, 2e-2 * std::max(1.0, std::abs(want))) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 2 * 6 * 3);
}

}  // namespace
}  // namespace kiln
