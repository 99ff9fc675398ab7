// Llama (src/models/llama) through the registry: parameter names and shapes (tied and
// untied), the published presets' parameter counts, KV-cache decoding against the full
// forward, gradients bitwise equal under every checkpointing policy and with explicit
// positions 0..T-1, and one-line config errors. Numerical correctness against PyTorch
// is tests/golden/llama_golden_test.cpp. With mixture-of-experts blocks (the moe.* keys):
// names and shapes, all parameters counted and active ones in the FLOPs, the balancing
// figures, checkpointing bitwise, decoding, one-line errors naming the key, tp refused,
// the checkpoint JSON round trip.
#include "config/components.h"
#include "support/error_of.h"
#include "backend/registry.h"
#include "models/llama_config.h"
#include "models/llama/llama.h"
#include "models/registry.h"
#include "config/config.h"
#include "model_io/model_io.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <optional>
#include <random>

namespace kiln {
namespace {

ModelOptions tiny(bool tie = false) {
  ModelOptions o;
  o.arch = "llama";
  o.n_layer = 2;
  o.n_head = 4;
  o.n_embd = 16;
  o.block_size = 12;
  o.vocab_size = 29;
  o.family = {{"n_kv_head", 2},
              {"ffn_hidden_size", 24},
              {"rope_theta", 500000.0},
              {"rope_scaling.factor", 8.0},
              // small: the rescaling changes some frequencies
              {"rope_scaling.original_max_position", 16.0},
              {"tie_embeddings", tie ? 1 : 0}};
  return o;
}

// tiny() with Qwen3's attention: heads of 6 (NH * HD = 24 over C = 16) and QK-norm.
ModelOptions tiny_qk_norm(bool tie = false) {
  ModelOptions o = tiny(tie);
  o.family["head_dim"] = 6;
  o.family["qk_norm"] = 1;
  return o;
}

// Three blocks: block 0 dense, blocks 1 and 2 of 4 experts (k = 2, width 8) and shared
// experts of width 16, both balancing losses on.
ModelOptions tiny_moe() {
  ModelOptions o;
  o.arch = "llama";
  o.n_layer = 3;
  o.n_head = 2;
  o.n_embd = 16;
  o.block_size = 12;
  o.vocab_size = 29;
  o.family = {{"n_kv_head", 1},           {"ffn_hidden_size", 24},
              {"moe.num_experts", 4},     {"moe.top_k", 2},
              {"moe.ffn_hidden_size", 8}, {"moe.shared_experts", 2},
              {"moe.first_k_dense", 1},   {"moe.aux_loss_coef", 0.1},
              {"moe.z_loss_coef", 0.01}};
  return o;
}

using kiln::testing::error_of;

struct Rig {
  std::unique_ptr<Backend> be = make_backend("cpu");
  std::unique_ptr<Model> m;
  Tensor x, y;
  static constexpr int B = 2, T = 7;
  explicit Rig(nn::ActivationCheckpointing mode, bool tie = false, bool qk_norm = false)
      : Rig(mode, qk_norm ? tiny_qk_norm(tie) : tiny(tie)) {}
  Rig(nn::ActivationCheckpointing mode, const ModelOptions& options) {
    m = make_model(options, *be);
    m->set_activation_checkpointing(mode);
    m->init_weights(5);
    std::vector<float> w = download_f32(*be, m->param_buffer());
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (const ParamSpec& p : m->params())  // larger weights: attention far from uniform
      if (p.shape.ndim() >= 2)  // a MoE block's experts [E, ., .] too
        for (int64_t i = 0; i < p.shape.numel(); ++i) w[static_cast<size_t>(p.offset + i)] += nd(rng);
    upload_f32(*be, m->param_buffer(), w.data());
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % 29, tgt[i] = (i * 5 + 1) % 29;
    tgt[4] = -1;
    x = i32(tok, Shape{B, T});
    y = i32(tgt, Shape{B, T});
  }
  Tensor i32(const std::vector<int32_t>& h, Shape s) {
    Tensor t = be->empty(s, DType::I32, MemCategory::Activations);
    be->copy_from_host(be->default_stream(), t, h.data());
    return t;
  }
  std::vector<float> grads(const Tensor& pos = Tensor()) {
    m->zero_grad();
    m->forward(Batch::of_tokens(x, y, pos), 1.f);
    m->backward();
    return download_f32(*be, m->grad_buffer());
  }
};

TEST(Llama, ParameterNamesAndShapesAsHuggingFace) {
  auto be = make_backend("cpu");
  const auto m = make_model(tiny(), *be);
  EXPECT_EQ(m->arch(), "llama");
  const std::string l0 = "model.layers.0.";
  const std::vector<std::pair<std::string, Shape>> expect = {
      {"model.embed_tokens.weight", {128, 16}},
      {l0 + "input_layernorm.weight", {16}},
      {l0 + "self_attn.qkv_proj.weight", {(4 + 2 * 2) * 4, 16}},
      {l0 + "self_attn.o_proj.weight", {16, 16}},
      {l0 + "post_attention_layernorm.weight", {16}},
      {l0 + "mlp.gate_up_proj.weight", {48, 16}},
      {l0 + "mlp.down_proj.weight", {16, 24}},
  };
  for (size_t i = 0; i < expect.size(); ++i) {
    EXPECT_EQ(m->params()[i].name, expect[i].first);
    EXPECT_EQ(m->params()[i].shape, expect[i].second) << expect[i].first;
  }
  ASSERT_EQ(m->params().size(), 1 + 2 * 6 + 2u);
  EXPECT_EQ(m->params()[13].name, "model.norm.weight");
  EXPECT_EQ(m->params()[14].name, "lm_head.weight");
  EXPECT_EQ(m->parts().size(), 4u);
  EXPECT_FALSE(m->parts().front().resident);
  EXPECT_TRUE(m->parts().back().resident);  // lm_head's gradient is made in forward

  const auto tied = make_model(tiny(true), *be);
  EXPECT_EQ(tied->params().size(), 1 + 2 * 6 + 1u);
  EXPECT_EQ(tied->params().back().name, "model.norm.weight");
  EXPECT_TRUE(tied->parts().front().resident);  // the embedding is also the head
  EXPECT_FALSE(tied->parts().back().resident);
  EXPECT_EQ(m->num_parameters() - tied->num_parameters(), 29 * 16);
}

// head_dim and qk_norm: the projections around 6-wide heads, the gains after qkv_proj,
// Hugging Face's Qwen3 names; the parameter count of the config is the model's.
TEST(Llama, HeadDimAndQkNormShapeTheAttention) {
  auto be = make_backend("cpu");
  const auto m = make_model(tiny_qk_norm(), *be);
  const std::string l0 = "model.layers.0.";
  const std::vector<std::pair<std::string, Shape>> expect = {
      {l0 + "input_layernorm.weight", {16}},
      {l0 + "self_attn.qkv_proj.weight", {(4 + 2 * 2) * 6, 16}},
      {l0 + "self_attn.q_norm.weight", {6}},
      {l0 + "self_attn.k_norm.weight", {6}},
      {l0 + "self_attn.o_proj.weight", {16, 4 * 6}},
  };
  for (size_t i = 0; i < expect.size(); ++i) {
    EXPECT_EQ(m->params()[i + 1].name, expect[i].first);
    EXPECT_EQ(m->params()[i + 1].shape, expect[i].second) << expect[i].first;
  }
  EXPECT_FALSE(m->params()[3].weight_decay);
  ASSERT_EQ(m->params().size(), 1 + 2 * 8 + 2u);
  int64_t n = 0;
  for (const ParamSpec& p : m->params()) n += p.shape.numel();
  const LlamaConfig c = llama_config_of(tiny_qk_norm());
  EXPECT_EQ(c.head_dim(), 6);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.num_parameters(), n - (128 - 29) * 16 * 2);  // without the padded rows
  EXPECT_EQ(m->num_parameters(), c.num_parameters());
  EXPECT_NE(c.str().find("head_dim=6 qk_norm"), std::string::npos) << c.str();
  // 6 N + 12 L T NH HD: the attention term of 6-wide heads, not C / NH = 4.
  const double N = c.num_parameters() - 29.0 * 16 - 2 * (2 * 16 + 2 * 6) - 16;  // matmuls
  EXPECT_DOUBLE_EQ(c.flops_per_token(10), 6.0 * N + 12.0 * 2 * 10 * 4 * 6);
  // The checkpoint's "model" object gives the same options back.
  const ModelOptions back = llama_options_from_json(llama_config_json(c));
  EXPECT_EQ(back.family.at("head_dim"), 6);
  EXPECT_EQ(back.family.at("qk_norm"), 1);
  EXPECT_EQ(llama_config_json(llama_config_of(back)), llama_config_json(c));
}

// Two pipeline stages of a tied Llama (parts {0, 1}: embeddings and layer 0; {2, 3}:
// layer 1 and the head, with a copy of the tied embedding): the same parameters by name
// and init as the whole model, the loss of the two chunks chained equals the whole
// model's bitwise, every gradient too, and the tied embedding's two gradients sum to the
// whole model's.
TEST(Llama, PipelineStagesChainToTheWholeModel) {
  Rig whole(nn::ActivationCheckpointing::None, /*tie=*/true);
  Backend& be = *whole.be;
  ModelStorage first_s, last_s;
  first_s.held_parts = {0, 1};
  last_s.held_parts = {2, 3};
  const auto first = make_model(tiny(true), be, first_s);
  const auto last = make_model(tiny(true), be, last_s);
  const std::string wte = "model.embed_tokens.weight";
  EXPECT_FALSE(first->spec(wte).tied_copy);
  EXPECT_TRUE(last->spec(wte).tied_copy);
  EXPECT_FALSE(first->parts().front().resident);  // its head is on the other stage
  EXPECT_TRUE(last->parts().back().resident);     // holds the copy, written in forward
  EXPECT_EQ(last->parts().front().global_index, 2);
  EXPECT_EQ(first->params().size() + last->params().size(), whole.m->params().size() + 1);
  // Initial values by global parameter number, whatever the stage holds.
  whole.m->init_weights(5);
  first->init_weights(5);
  last->init_weights(5);
  for (const Model* stage : {first.get(), last.get()})
    for (const ParamSpec& p : stage->params())
      EXPECT_EQ(download_f32(be, stage->param(p)), download_f32(be, whole.m->param(p.name))) << p.name;

  const Batch batch = Batch::of_tokens(whole.x, whole.y);
  whole.m->zero_grad();
  const LossSum want = whole.m->forward(batch, 0.25f);
  whole.m->backward();
  first->zero_grad();
  last->zero_grad();
  const Shape act = first->stage_activation_shape(Rig::B, Rig::T).value();
  Tensor out = be.empty(act, DType::F32, MemCategory::Activations);
  Tensor dout = be.empty(act, DType::F32, MemCategory::Activations);
  first->forward_stage(StagePass{0, 2, 0, batch, {}, out, {}, {}}, 0.25f);
  const LossSum got = last->forward_stage(StagePass{2, 4, 0, batch, out, {}, {}, {}}, 0.25f);
  EXPECT_EQ(got.sum, want.sum);
  EXPECT_EQ(got.targets, want.targets);
  last->backward_stage(StagePass{2, 4, 0, batch, {}, {}, dout, {}});
  first->backward_stage(StagePass{0, 2, 0, batch, {}, {}, {}, dout});
  for (const Model* stage : {first.get(), last.get()})
    for (const ParamSpec& p : stage->params())
      if (p.name != wte)
        EXPECT_EQ(download_f32(be, stage->grad(p)), download_f32(be, whole.m->grad(p.name))) << p.name;
  const auto g0 = download_f32(be, first->grad(wte)), g1 = download_f32(be, last->grad(wte));
  const auto g = download_f32(be, whole.m->grad(wte));
  double err = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i)
    err = std::max(err, std::abs(double{g0[i]} + g1[i] - g[i])), norm = std::max(norm, std::abs(double{g[i]}));
  EXPECT_LE(err, 1e-6 * norm);
  EXPECT_NE(error_of([&] { first->forward_stage(StagePass{0, 4, 0, batch, {}, {}, {}, {}}, 1.f); }).find(
                "part 2 is not held by this pipeline stage"),
            std::string::npos);
}

TEST(Llama, PresetsHaveThePublishedShapes) {
  struct Want {
    const char* preset;
    int64_t params;
    double factor;
    bool tie;
  };
  // Hugging Face's parameter counts of meta-llama/Llama-3.2-1B, -3.2-3B, -3.1-8B, -3.1-70B.
  for (const Want& w : {Want{"llama3.2-1b", 1235814400, 32, true},
                        Want{"llama3.2-3b", 3212749824, 32, true},
                        Want{"llama3.1-8b", 8030261248, 8, false},
                        Want{"llama3.1-70b", 70553706496, 8, false}}) {
    SCOPED_TRACE(w.preset);
    const TrainConfig c = load_config_string(fmt::format("[model]\npreset = \"{}\"\n", w.preset));
    EXPECT_EQ(c.model.arch, "llama");
    const LlamaConfig lc = llama_config_of(model_options_from(c));
    EXPECT_EQ(lc.num_parameters(), w.params);
    EXPECT_EQ(lc.vocab_size, 128256);
    EXPECT_EQ(lc.padded_vocab_size, 128256);
    EXPECT_EQ(lc.block_size, 131072);
    EXPECT_EQ(lc.n_kv_head, 8);
    EXPECT_EQ(lc.rope.theta, 500000.0);
    EXPECT_EQ(lc.rope.scale_factor, w.factor);
    EXPECT_EQ(lc.rope.low_freq_factor, 1.0);
    EXPECT_EQ(lc.rope.high_freq_factor, 4.0);
    EXPECT_EQ(lc.rope.original_max_positions, 8192.0);
    EXPECT_EQ(lc.tie_embeddings, w.tie);
  }
  // 8B: 6 N (N without the embedding look-up: 8030261248 - 128256 * 4096) + 12 L T C.
  const TrainConfig c = load_config_string("[model]\npreset = \"llama3.1-8b\"\n");
  const LlamaConfig lc = llama_config_of(model_options_from(c));
  EXPECT_DOUBLE_EQ(lc.flops_per_token(2048),
                   6.0 * (8030261248.0 - 128256.0 * 4096 - 32 * 2 * 4096 - 4096) +
                       12.0 * 32 * 2048 * 4096);
}

TEST(Llama, ConfigKeysReadFromTomlAndRoundTrip) {
  const TrainConfig c = load_config_string(R"([model]
arch = "llama"
n_kv_head = 2
n_head = 4
ffn_hidden_size = 48
tie_embeddings = true
[model.rope_scaling]
factor = 8.0
original_max_position = 64
)");
  EXPECT_EQ(c.model.family.at("tie_embeddings"), 1.0);
  EXPECT_EQ(c.model.family.at("rope_scaling.factor"), 8.0);
  EXPECT_EQ(c.model.family.at("rope_scaling.original_max_position"), 64.0);
  EXPECT_EQ(load_config_string(c.to_toml()), c);
  EXPECT_NE(c.to_toml().find("rope_scaling.factor = 8.0"), std::string::npos);
  const TrainConfig s = load_config_string(
      "", {"model.arch=llama", "model.tie_embeddings=true", "model.rope_scaling.low_freq_factor=2"});
  EXPECT_EQ(s.model.family.at("tie_embeddings"), 1.0);
  EXPECT_EQ(s.model.family.at("rope_scaling.low_freq_factor"), 2.0);
  EXPECT_EQ(error_of([] {
              load_config_string("", {"model.arch=llama", "model.n_head=4", "model.n_kv_head=3"});
            }),
            "--set: key 'model.n_kv_head' (3) must divide model.n_head (4)");
  EXPECT_NE(error_of([] { load_config_string("", {"model.arch=llama", "model.tie_embeddings=1"}); })
                .find("model.tie_embeddings"), std::string::npos);
  EXPECT_NE(error_of([] { load_config_string("", {"model.arch=llama", "model.rope_scaling.factor=8",
                                                  "model.rope_scaling.high_freq_factor=0.5"}); })
                .find("'model.rope_scaling.high_freq_factor'"), std::string::npos);
  // Qwen3's attention keys.
  const TrainConfig q = load_config_string("[model]\narch = \"llama\"\nhead_dim = 128\nqk_norm = true\n");
  EXPECT_EQ(q.model.family.at("head_dim"), 128);
  EXPECT_EQ(q.model.family.at("qk_norm"), 1);
  EXPECT_EQ(load_config_string(q.to_toml()), q);
  EXPECT_EQ(error_of([] { load_config_string("", {"model.arch=llama", "model.head_dim=5"}); }),
            "--set: key 'model.head_dim' (5) must be even: rotary embeddings turn channel pairs");
  for (const char* bad : {"model.head_dim=-2", "model.head_dim=2.5", "model.qk_norm=2"}) {
    const std::string e = error_of([&] { load_config_string("", {"model.arch=llama", bad}); });
    EXPECT_NE(e.find(std::string(bad).substr(0, std::string(bad).find('='))), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(Llama, FactoryErrorsNameTheKey) {
  auto be = make_backend("cpu");
  auto err = [&](auto edit) {
    ModelOptions o = tiny();
    edit(o);
    return error_of([&] { make_model(o, *be); });
  };
  EXPECT_NE(err([](ModelOptions& o) { o.family["n_kv_head"] = 3; }).find("model.n_kv_head"), std::string::npos);
  EXPECT_NE(err([](ModelOptions& o) { o.dropout = 0.1f; }).find("model.dropout"), std::string::npos);
  EXPECT_NE(err([](ModelOptions& o) { o.n_embd = 12; o.n_head = 4; o.family["n_kv_head"] = 2; })
                .find("even"), std::string::npos);  // head size 3
  EXPECT_NE(err([](ModelOptions& o) { o.family["head_dim"] = 7; }).find("model.head_dim (7) must be even"),
            std::string::npos);
  EXPECT_NE(err([](ModelOptions& o) { o.family["head_dim"] = -4; }).find("model.head_dim"),
            std::string::npos);

  ModelOptions g = tiny();
  g.arch = "gpt2";
  g.family = {{"n_kv_head", 2}};  // a llama key: gpt2 declares none (ModelArch::keys)
  EXPECT_EQ(error_of([&] { make_model(g, *be); }),
            "model.n_kv_head (2): not a key of model.arch 'gpt2'");
}

TEST(Llama, CheckpointingPoliciesAndExplicitPositionsGiveBitwiseEqualGradients) {
  for (const auto& [tie, qk] : {std::pair{false, false}, {true, false}, {false, true}}) {
    Rig r(nn::ActivationCheckpointing::None, tie, qk);
    const auto ref = r.grads();
    std::vector<int32_t> p(Rig::B * Rig::T);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(i % Rig::T);
    EXPECT_EQ(r.grads(r.i32(p, Shape{Rig::B, Rig::T})), ref) << "positions 0..T-1";
    EXPECT_EQ(Rig(nn::ActivationCheckpointing::Selective, tie, qk).grads(), ref);
    EXPECT_EQ(Rig(nn::ActivationCheckpointing::Full, tie, qk).grads(), ref);
  }
}

// Prefill 3 positions, then one at a time: each step's logits are the full forward's at
// that position (rotary angles of the cached positions, grouped-query caches; the cached
// keys normalised with QK-norm).
TEST(Llama, DecodeMatchesTheFullForward) {
  // untied, tied, with QK-norm, with MoE blocks (MoeMlp::decode)
  for (int variant : {0, 1, 2, 3}) {
    const bool tie = variant == 1;
    Rig r(nn::ActivationCheckpointing::None, variant == 3 ? tiny_moe() : variant == 2 ? tiny_qk_norm() : tiny(tie));
    Backend& be = *r.be;
    auto* llama = dynamic_cast<Llama*>(r.m.get());
    ASSERT_NE(llama, nullptr);
    const int B = Rig::B, T = Rig::T, Vp = llama->padded_vocab_size();
    Tensor full = be.empty(Shape{B, T, Vp}, DType::F32, MemCategory::Temporaries);
    llama->forward_logits(r.x, full);
    const auto ref = download_f32(be, full);
    const auto tok = [&] {
      std::vector<int32_t> h(B * T);
      be.copy_to_host(be.default_stream(), h.data(), r.x);
      return h;
    }();
    llama->begin_decode(B, T);
    Tensor logits = be.empty(Shape{B, Vp}, DType::F32, MemCategory::Temporaries);
    int t0 = 0;
    for (int n : {3, 1, 1, 1, 1}) {
      std::vector<int32_t> chunk(static_cast<size_t>(B * n));
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < n; ++t) chunk[b * n + t] = tok[b * T + t0 + t];
      llama->decode(r.i32(chunk, Shape{B, n}), logits);
      t0 += n;
      EXPECT_EQ(llama->decoded_length(), t0);
      const auto got = download_f32(be, logits);
      double err = 0, den = 0;
      for (int b = 0; b < B; ++b)
        for (int v = 0; v < Vp; ++v) {
          const double want = ref[(static_cast<size_t>(b) * T + t0 - 1) * Vp + v];
          err = std::max(err, std::abs(got[b * Vp + v] - want));
          den = std::max(den, std::abs(want));
        }
      EXPECT_LT(err, 1e-5 * std::max(1.0, den)) << "after " << t0 << " positions, variant " << variant;
    }
    llama->end_decode();
  }
}


TEST(LlamaMoe, NamesShapesAndCounts) {
  auto be = make_backend("cpu");
  const auto m = make_model(tiny_moe(), *be);
  auto shape_of = [&](const std::string& name) { return m->spec(name).shape; };
  EXPECT_EQ(shape_of("model.layers.0.mlp.gate_up_proj.weight"), (Shape{48, 16}));  // dense
  for (int l : {1, 2}) {
    const std::string p = fmt::format("model.layers.{}.mlp.", l);
    EXPECT_EQ(shape_of(p + "router.weight"), (Shape{4, 16}));
    EXPECT_EQ(shape_of(p + "experts.gate_up_proj.weight"), (Shape{4, 16, 16}));
    EXPECT_EQ(shape_of(p + "experts.down_proj.weight"), (Shape{4, 16, 8}));
    EXPECT_EQ(shape_of(p + "shared_experts.gate_up_proj.weight"), (Shape{32, 16}));
    EXPECT_EQ(shape_of(p + "shared_experts.down_proj.weight"), (Shape{16, 16}));
  }
  // All parameters counted (the padded vocabulary rows of the embedding and lm_head not).
  int64_t all = 0;
  for (const ParamSpec& p : m->params()) all += p.shape.numel();
  EXPECT_EQ(m->num_parameters(), all - 2 * (128 - 29) * 16);
  // FLOPs: active weights only. Attention per block 16 (2 + 2) 8 + 16 16 = 768; the dense
  // block 3 16 24 = 1152; a MoE block the router 4 16 = 64, two experts 3 2 8 16 = 768
  // and the shared 3 16 16 = 768; the head 29 16 = 464.
  const double N = 3 * 768 + 1152 + 2 * (64 + 768 + 768) + 464;
  EXPECT_DOUBLE_EQ(m->flops_per_token(10), 6 * N + 12.0 * 3 * 10 * 2 * 8);
}

TEST(LlamaMoe, TrainsWithBalancingFiguresAndBitwiseCheckpointing) {
  Rig r(nn::ActivationCheckpointing::None, tiny_moe());
  const auto ref = r.grads();
  const std::optional<MoeStats> st = r.m->take_moe_stats();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->micro_batches, 1);
  ASSERT_EQ(st->tokens_per_expert.size(), 2u);
  for (const auto& layer : st->tokens_per_expert)
    EXPECT_EQ(std::accumulate(layer.begin(), layer.end(), 0.0), Rig::B * Rig::T * 2);
  EXPECT_GT(st->aux_loss, 0.0);
  EXPECT_GT(st->z_loss, 0.0);
  EXPECT_EQ(r.m->take_moe_stats()->micro_batches, 0) << "taken: reset";
  EXPECT_EQ(Rig(nn::ActivationCheckpointing::Selective, tiny_moe()).grads(), ref);
  EXPECT_EQ(Rig(nn::ActivationCheckpointing::Full, tiny_moe()).grads(), ref);
  // A dense model has no figures.
  ModelOptions dense = tiny_moe();
  dense.family = {{"n_kv_head", 1}, {"ffn_hidden_size", 24}};
  EXPECT_FALSE(make_model(dense, *r.be)->take_moe_stats());
}

TEST(LlamaMoe, ConfigKeysRoundTripAndErrorsNameTheKey) {
  const TrainConfig c = load_config_string(R"([model]
arch = "llama"
n_head = 4
n_layer = 2
[model.moe]
num_experts = 4
top_k = 1
scoring = "sigmoid"
aux_loss_coef = 0.01
)");
  EXPECT_EQ(c.model.family.at("moe.scoring"), 1.0);
  EXPECT_NE(c.to_toml().find("moe.scoring = \"sigmoid\""), std::string::npos) << c.to_toml();
  EXPECT_EQ(load_config_string(c.to_toml()), c);
  const TrainConfig s = load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                                "model.moe.aux_loss_type=hf"});
  EXPECT_EQ(s.model.family.at("moe.aux_loss_type"), 1.0);
  EXPECT_EQ(error_of([] { load_config_string("", {"model.arch=llama", "model.moe.scoring=soft"}); }),
            "--set: key 'model.moe.scoring' must be one of \"softmax\", \"sigmoid\", got \"soft\"");
  EXPECT_EQ(error_of([] {
              load_config_string("", {"model.arch=llama", "model.n_layer=2", "model.moe.num_experts=2",
                                      "model.moe.top_k=3"});
            }),
            "--set: model.moe.top_k (3) must be in [1, model.moe.num_experts = 2]");
  EXPECT_EQ(error_of([] {
              load_config_string("", {"model.arch=llama", "model.n_layer=2", "model.moe.top_k=1"});
            }),
            "--set: model.moe.top_k is set but model.moe.num_experts is 0 (a dense model): set "
            "moe.num_experts or drop moe.top_k");
  // The model's own check (a checkpoint's or a Hugging Face config's options).
  auto be = make_backend("cpu");
  auto err = [&](auto edit) {
    ModelOptions o = tiny_moe();
    edit(o);
    return error_of([&] { make_model(o, *be); });
  };
  EXPECT_EQ(err([](ModelOptions& o) { o.family["moe.scoring"] = 1; o.family["moe.aux_loss_type"] = 1; }),
            "model.moe.aux_loss_type = \"hf\" needs model.moe.scoring = \"softmax\" "
            "(transformers' loss is over softmax probabilities)");
  EXPECT_EQ(err([](ModelOptions& o) { o.family["moe.first_k_dense"] = 3; }),
            "model.moe.first_k_dense (3), model.moe.sparse_step (1) and model.moe.dense_layers "
            "([]) leave no MoE block among the model.n_layer = 3 blocks");
  EXPECT_EQ(err([](ModelOptions& o) { o.family_lists["moe.dense_layers"] = {1, 3}; }),
            "model.moe.dense_layers holds 3: not a block index in [0, model.n_layer = 3)");
  EXPECT_EQ(err([](ModelOptions& o) { o.family["moe.capacity_factor"] = -0.5; }),
            "model.moe.capacity_factor (-0.5) must be >= 0 (0: dropless)");
  // Token dropping: the key in the config and the model's description (the layers' use of
  // it: moe_test.cpp, tests/parallel/moe_train_test.sh).
  {
    ModelOptions o = tiny_moe();
    o.family["moe.capacity_factor"] = 1.25;
    EXPECT_EQ(llama_config_of(o).moe.capacity_factor, 1.25);
    EXPECT_NE(llama_config_of(o).str().find(" capacity_factor=1.25"), std::string::npos);
  }
  EXPECT_NE(error_of([] {
              load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                      "model.moe.capacity_factor=-1"});
            }).find("model.moe.capacity_factor"), std::string::npos);
  // pp with the hf aux loss (it couples every layer) and cp with token dropping refused
  // when the config loads, naming where the key was set; tp, pp and cp otherwise taken.
  EXPECT_NE(error_of([] {
              load_config_string("[parallel]\npp = 2\n",
                                 {"model.arch=llama", "model.moe.num_experts=4",
                                  "model.moe.aux_loss_type=hf", "model.moe.aux_loss_coef=0.01"},
                                 "moe.toml");
            }).find("moe.toml: parallel.pp = 2: a llama whose auxiliary loss couples every "
                    "mixture-of-experts layer (model.moe.aux_loss_type = \"hf\", "
                    "model.moe.aux_loss_coef > 0) runs with parallel.pp = 1 only"),
            std::string::npos);
  for (const char* layout : {"parallel.pp=2", "parallel.cp=2"})
    EXPECT_NO_THROW(load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                            "model.moe.aux_loss_coef=0.01", layout}));
  EXPECT_NO_THROW(load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                          "model.moe.aux_loss_type=hf", "parallel.pp=2"}))
      << "the hf form without an aux loss couples nothing";
  EXPECT_NO_THROW(load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                          "parallel.tp=2", "parallel.sequence_parallel=true"}));
  EXPECT_NO_THROW(load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                          "model.moe.capacity_factor=1.25", "parallel.pp=2"}));
  EXPECT_NE(error_of([] {
              load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                      "model.moe.capacity_factor=1.25", "parallel.cp=2"});
            }).find("--set: parallel.cp = 2: a llama that drops tokens past an expert's "
                    "capacity (model.moe.capacity_factor > 0) runs with parallel.cp = 1 only"),
            std::string::npos);
  // A config built in code is refused by the trainer's check (config.source).
  TrainConfig cp = load_config_string("", {"model.arch=llama", "model.moe.num_experts=4",
                                           "model.moe.capacity_factor=1.25"});
  cp.parallel.tp = 2;
  EXPECT_NO_THROW(check_layout_supported(cp));
  cp.parallel.cp = 2;
  EXPECT_NE(error_of([&] { check_layout_supported(cp); })
                .find("parallel.cp = 2: a llama that drops tokens"),
            std::string::npos);
}

TEST(LlamaMoe, ConfigJsonRoundTrips) {
  const LlamaConfig c = llama_config_of(tiny_moe());
  EXPECT_EQ(c.moe.ffn_hidden_size, 8);
  EXPECT_TRUE(c.is_moe_block(1) && c.is_moe_block(2) && !c.is_moe_block(0));
  ModelOptions step = tiny_moe();  // Qwen3's decoder_sparse_step: blocks 1 and 3 of 4
  step.n_layer = 4;
  step.family["moe.first_k_dense"] = 0;
  step.family["moe.sparse_step"] = 2;
  const LlamaConfig sc = llama_config_of(step);
  EXPECT_TRUE(!sc.is_moe_block(0) && sc.is_moe_block(1) && !sc.is_moe_block(2) &&
              sc.is_moe_block(3));
  const ModelOptions o = llama_options_from_json(llama_config_json(c));
  EXPECT_EQ(llama_config_of(o).moe, c.moe);
  step.family_lists["moe.dense_layers"] = {3, 0};  // Qwen3's mlp_only_layers: block 3 dense
  const LlamaConfig dc = llama_config_of(step);
  EXPECT_TRUE(dc.is_moe_block(1) && !dc.is_moe_block(3));
  EXPECT_EQ(llama_config_json(dc)["moe"]["dense_layers"], nlohmann::json({3, 0}));
  const LlamaConfig back = llama_config_of(llama_options_from_json(llama_config_json(dc)));
  EXPECT_EQ(back.moe.dense_layers, (std::vector<int>{3, 0}));
  EXPECT_EQ(back.moe, dc.moe);
  // A MoE state written before the key: no "dense_layers", none dense.
  nlohmann::json before = llama_config_json(sc);
  before["moe"].erase("dense_layers");
  EXPECT_EQ(llama_config_of(llama_options_from_json(before)).moe, sc.moe);
  ModelOptions dense = tiny_moe();
  dense.family = {{"n_kv_head", 1}};
  EXPECT_FALSE(llama_config_json(llama_config_of(dense)).contains("moe"))
      << "a dense model's state is unchanged";
}

}  // namespace
}  // namespace kiln
