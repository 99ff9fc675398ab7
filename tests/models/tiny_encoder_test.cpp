// TinyEncoder (tiny_encoder.h), a second model from the layer library, through the Model
// interface and the registry: its backward against central differences of its forward,
// gradients bitwise equal under every activation-checkpointing policy, and the parallel
// plans taken or refused as its registry entry says.
#include "tiny_encoder.h"

#include "backend/registry.h"
#include "config/components.h"
#include "config/config.h"
#include "parallel/context_parallel.h"
#include "parallel/tp_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace kiln::testing {
namespace {

ModelOptions tiny() {
  ModelOptions o;
  o.arch = "tiny_encoder";
  o.n_layer = 2;
  o.n_head = 4;
  o.n_embd = 16;
  o.block_size = 9;
  o.vocab_size = 29;
  return o;
}

struct Rig {
  std::unique_ptr<Backend> be = make_backend("cpu");
  std::unique_ptr<Model> m;
  Tensor x, y, pos;
  std::vector<float> w;
  Rig(nn::ActivationCheckpointing mode) {
    register_tiny_encoder();
    m = make_model(tiny(), *be);
    m->set_activation_checkpointing(mode);
    m->init_weights(3);
    w = download_f32(*be, m->param_buffer());
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (const ParamSpec& p : m->params())  // larger weights: a less flat function
      if (p.shape.ndim() == 2)
        for (int64_t i = 0; i < p.shape.numel(); ++i) w[static_cast<size_t>(p.offset + i)] += nd(rng);
    upload_f32(*be, m->param_buffer(), w.data());
    const int B = 2, T = 7;
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 3) % 29, tgt[i] = (i * 5 + 1) % 29;
    tgt[4] = -1;
    x = be->empty(Shape{B, T}, DType::I32, MemCategory::Activations);
    y = be->empty(Shape{B, T}, DType::I32, MemCategory::Activations);
    be->copy_from_host(be->default_stream(), x, tok.data());
    be->copy_from_host(be->default_stream(), y, tgt.data());
    // Explicit positions (the rotary angles), not 0..T-1: packed or shifted sequences.
    std::vector<int32_t> p(B * T);
    for (int i = 0; i < B * T; ++i) p[i] = (i % T) * 3 + (i / T) * 5;
    pos = be->empty(Shape{B, T}, DType::I32, MemCategory::Activations);
    be->copy_from_host(be->default_stream(), pos, p.data());
  }
  double loss() { return m->forward(Batch::of_tokens(x, y, pos), 0.f).sum; }
  std::vector<float> grads() {
    m->zero_grad();
    m->forward(Batch::of_tokens(x, y, pos), 1.f);
    m->backward();
    return download_f32(*be, m->grad_buffer());
  }
};

TEST(TinyEncoder, BackwardMatchesFiniteDifferences) {
  Rig r(nn::ActivationCheckpointing::None);
  EXPECT_EQ(r.m->arch(), "tiny_encoder");
  EXPECT_EQ(r.m->parts().size(), 4u);
  const auto g = r.grads();
  int checked = 0;
  for (const ParamSpec& p : r.m->params()) {
    const int64_t n = p.shape.numel();
    for (int64_t j : {int64_t{1}, n / 3, n - 1}) {
      size_t i = static_cast<size_t>(p.offset + j);
      if (p.name == "embed.tokens") i = static_cast<size_t>(p.offset + 3 * 16 + j % 16);  // a used row
      auto at = [&](float h) {
        std::vector<float> w2 = r.w;
        w2[i] += h;
        upload_f32(*r.be, r.m->param_buffer(), w2.data());
        return r.loss();
      };
      const float h = 1e-2f;
      const double fd = (at(h) - at(-h)) / (2 * h);
      const double err = std::abs(fd - g[i]) / std::max(5e-2, std::abs(fd) + std::abs(g[i]));
      EXPECT_LT(err, 2e-2) << p.name << "[" << j << "]: finite difference " << fd << ", backward " << g[i];
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

TEST(TinyEncoder, CheckpointingPoliciesGiveBitwiseEqualGradients) {
  const auto ref = Rig(nn::ActivationCheckpointing::None).grads();
  EXPECT_EQ(Rig(nn::ActivationCheckpointing::Selective).grads(), ref);
  EXPECT_EQ(Rig(nn::ActivationCheckpointing::Full).grads(), ref);
}

// Bidirectional: the loss at position 0 depends on the token at the LAST position of its
// own sequence (a causal model's would not), and on nothing of the other sequence.
TEST(TinyEncoder, AttentionSeesTheWholeSequenceAndOnlyIt) {
  Rig r(nn::ActivationCheckpointing::None);
  std::vector<int32_t> tgt(14, -1);
  tgt[0] = 5;
  r.be->copy_from_host(r.be->default_stream(), r.y, tgt.data());
  const auto g = r.grads();
  const ParamSpec& wte = r.m->spec("embed.tokens");
  auto row_norm = [&](int token) {
    double s = 0;
    for (int c = 0; c < 16; ++c) s += std::pow(g[static_cast<size_t>(wte.offset + token * 16 + c)], 2);
    return std::sqrt(s);
  };
  EXPECT_GT(row_norm((6 * 7 + 3) % 29), 1e-6) << "token at b=0, t=6 does not reach t=0";
  for (int i = 7; i < 14; ++i) EXPECT_EQ(row_norm((i * 7 + 3) % 29), 0.0) << "sequence 1 leaks into 0";
}

// Groups of two ranks that are never asked to communicate: building a model only installs
// the plans (the layers read size and rank).
struct TwoRanks final : nn::TpGroup, nn::CpGroup {
  int size() const override { return 2; }
  int rank() const override { return 0; }
  void all_reduce_sum(Stream, const Tensor&) override { KILN_FAIL("unused"); }
  void all_gather_rows(Stream, const Tensor&, const Tensor&) override { KILN_FAIL("unused"); }
  void reduce_scatter_rows(Stream, const Tensor&, const Tensor&) override { KILN_FAIL("unused"); }
  std::unique_ptr<Transfer> shift(Stream, const Tensor&, const Tensor&, int) override {
    KILN_FAIL("unused");
  }
};

// Whether it takes tensor and context parallelism is its registry entry (with the plan
// tables it states in tiny_encoder.cpp): the same model is split by its table, and
// refused with one line naming it and the key once its entry says no.
TEST(TinyEncoder, ParallelPlansFollowItsRegistryEntry) {
  register_tiny_encoder();
  auto be = make_backend("cpu");
  TwoRanks group;
  const TensorParallelPlan tp(group, false);
  const ContextParallelPlan cp(group);
  const std::vector<const LayerPlan*> plans{&tp, &cp};
  for (const LayerPlan* plan : plans) {
    const bool is_tp = plan == &tp;
    SCOPED_TRACE(plan->what());
    ModelStorage st;
    st.plans = {plan};
    ModelOptions o = tiny();
    const int64_t whole = make_model(o, *be)->flat_size();
    auto m = make_model(o, *be, st);
    EXPECT_EQ(m->flat_size() < whole, is_tp);  // split by its table (tp), or whole (cp)
    ModelArch entry = model_arch("tiny_encoder");
    if (is_tp) {
      entry.tensor_parallel = false;
    } else {
      entry.context_parallel = false;
    }
    register_arch("tiny_encoder", entry);
    try {
      make_model(o, *be, st);
      ADD_FAILURE() << "accepted against its registry entry";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(is_tp ? "parallel.tp = 2" : "parallel.cp = 2"), std::string::npos) << what;
      EXPECT_NE(what.find("not supported for tiny_encoder"), std::string::npos) << what;
    }
    register_tiny_encoder();
  }
}

// Its own [model] key, ffn_mult, declared in its registry entry (tiny_encoder.cpp) and
// nowhere else: a config sets it, to_toml() writes it back, the model is as wide as it
// says, and another arch refuses it naming the arch that has it.
TEST(TinyEncoder, ItsOwnConfigKeyComesFromItsRegistryEntry) {
  register_tiny_encoder();
  auto be = make_backend("cpu");
  const std::string toml = "[model]\narch = \"tiny_encoder\"\nn_layer = 1\nn_head = 4\n"
                           "n_embd = 16\nblock_size = 9\nvocab_size = 29\n";
  const TrainConfig plain = load_config_string(toml, {}, "config.toml");
  EXPECT_EQ(plain.model.family.at("ffn_mult"), 2.0);  // its declared default
  const TrainConfig c = load_config_string(toml + "ffn_mult = 3\n", {}, "config.toml");
  EXPECT_EQ(c.model.family.at("ffn_mult"), 3.0);
  EXPECT_NE(c.to_toml().find("\nffn_mult = 3\n"), std::string::npos) << c.to_toml();
  EXPECT_EQ(load_config_string(c.to_toml()), c);
  const int64_t wide = make_model(model_options_from(c), *be)->flat_size();
  const int64_t narrow = make_model(model_options_from(plain), *be)->flat_size();
  EXPECT_EQ(wide - narrow, 3 * 16 * 16);  // one more n_embd of gate, up and down
  auto error = [](const std::string& text, const std::vector<std::string>& set) {
    try {
      load_config_string(text, set, "config.toml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(toml, {"model.ffn_mult=0"}), "--set: key 'model.ffn_mult' must be >= 1, got 0");
  EXPECT_EQ(error("[model]\nffn_mult = 3\n", {}),
            "config.toml: key 'model.ffn_mult' is not a key of model.arch 'gpt2' (tiny_encoder "
            "has it)");
  EXPECT_EQ(error("", {"model.ffn_mul=3"}),
            "--set: unknown key 'model.ffn_mul' (did you mean 'model.ffn_mult'?)");
}

TEST(TinyEncoder, UnknownArchitectureNamesTheKnownOnes) {
  auto be = make_backend("cpu");
  ModelOptions o = tiny();
  o.arch = "llama9";
  try {
    make_model(o, *be);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::testing
