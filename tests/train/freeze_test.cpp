// Parameter freezing (train.freeze, nn::Param::trainable) in one process through TrainStep:
//   - frozen parameters are bitwise unchanged after several updates, the others change;
//   - frozen parameters have no gradient and no optimizer state: the gradient and
//     optimizer-state memory shrinks by exactly their elements (fp32 gradients, m and v;
//     bf16 also the fp32 master weights), whatever the ZeRO stage;
//   - the reference: training with P frozen equals training with nothing frozen where P
//     is put back to its initial values after every update (its learning rate 0), with
//     clipping off, so that the trainable parameters' gradients must be those of the
//     whole model (input gradients still propagate through the frozen layers);
//   - the tied wte frozen: the embedding and the output head both leave it alone;
//   - the pattern rule, and a pattern that matches nothing is one error naming the key and
//     showing the first module names.
// The layouts (dp, ZeRO 1-3, tp, pp) against this single process:
// tests/parallel/freeze_train_test.sh.
#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "nn/param.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace kiln {
namespace {

constexpr int B = 2, T = 8, V = 37;

TrainConfig tiny_config(const std::vector<std::string>& overrides, const std::string& dtype = "fp32") {
  ModelOptions mo;
  mo.arch = "gpt2";
  mo.n_layer = 2, mo.n_head = 2, mo.n_embd = 16, mo.block_size = 8, mo.vocab_size = V;
  return step_config(mo, B, T, dtype, overrides);
}

// A world of one running `config`: its own backend, so that its memory is its own.
struct OneRank {
  explicit OneRank(const TrainConfig& config)
      : be(make_backend("cpu")), step(config, *be, {.dp_cp = single}) {
    step.init_weights(7);
  }
  // Update `update` on a fixed batch; returns the loss.
  double update(int64_t update) {
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + 3 + update) % V);
      targets[i] = static_cast<int32_t>((i * 5 + 1 + update) % V);
    }
    return step.run(tokens.data(), targets.data(), update).loss;
  }
  std::map<std::string, std::vector<float>> values() {
    std::map<std::string, std::vector<float>> out;
    for (const ParamSpec& p : step.model().params())
      out[p.name] = download_f32(*be, step.model().param(p));
    return out;
  }
  int64_t bytes(MemCategory c) const { return be->allocator().stats().current_of(c); }

  std::unique_ptr<Backend> be;
  LocalCommunicator single;
  TrainStep step;
};

bool frozen(const OneRank& r, const std::string& name) { return !r.step.model().spec(name).trainable; }

TEST(Freeze, FrozenUnchangedTrainableChange) {
  OneRank run(tiny_config({"train.freeze=[\"h.0.*\", \"wpe\", \"ln_f.bias\"]"}));
  const auto before = run.values();
  for (int u = 0; u < 4; ++u) run.update(u);
  const auto after = run.values();
  int n_frozen = 0, n_trained = 0;
  for (const auto& [name, v] : before) {
    if (frozen(run, name)) {
      ++n_frozen;
      EXPECT_EQ(after.at(name), v) << name << " is frozen but changed";
    } else {
      ++n_trained;
      EXPECT_NE(after.at(name), v) << name << " trains but did not change";
    }
  }
  EXPECT_EQ(n_frozen, 12 + 1 + 1);  // block 0's tensors, wpe, ln_f.bias
  EXPECT_GT(n_trained, 10);
  EXPECT_THROW(run.step.model().grad("transformer.wpe.weight"), Error);
  for (const AdamWSegment& seg : run.step.optimizer().segments())
    EXPECT_TRUE(seg.spec.trainable) << seg.spec.name << " has optimizer state";
  EXPECT_EQ(run.step.param_tally().frozen_names.size(), 14u);
}

// Frozen elements' gradient and optimizer-state bytes: none.
void expect_no_grad_or_state(const std::string& dtype, const std::vector<std::string>& layout) {
  std::vector<std::string> with = layout;
  with.push_back("train.freeze=h.0.*,wte");
  OneRank plain(tiny_config(layout, dtype)), freezing(tiny_config(with, dtype));
  plain.update(0), freezing.update(0);
  const TrainStep::ParamTally& tally = freezing.step.param_tally();
  EXPECT_EQ(tally.trainable + tally.frozen, plain.step.param_tally().trainable);
  EXPECT_EQ(plain.step.param_tally().frozen, 0);
  const int64_t grad = 4;                          // train.grad_dtype fp32
  const int64_t state = dtype == "fp32" ? 8 : 12;  // m, v (and the fp32 masters)
  const std::string what = dtype + (layout.empty() ? "" : " " + layout[0]);
  EXPECT_EQ(plain.bytes(MemCategory::Gradients) - freezing.bytes(MemCategory::Gradients),
            tally.frozen * grad) << what;
  EXPECT_EQ(plain.bytes(MemCategory::OptimizerState) -
                freezing.bytes(MemCategory::OptimizerState), tally.frozen * state) << what;
  EXPECT_EQ(freezing.step.model().flat_size() + freezing.step.model().frozen_flat_size(),
            plain.step.model().flat_size()) << what;
  EXPECT_EQ(freezing.step.model().frozen_flat_size(), tally.frozen) << what;
}

TEST(Freeze, NoGradientOrOptimizerMemory) {
  expect_no_grad_or_state("fp32", {});
  expect_no_grad_or_state("bf16", {});
  // ZeRO over one rank: the same storage split (sharded gradients, parameter slices).
  expect_no_grad_or_state("fp32", {"parallel.zero_stage=2"});
  expect_no_grad_or_state("fp32", {"parallel.zero_stage=3"});
}

TEST(Freeze, EqualsLearningRateZeroReference) {
  const std::vector<std::string> common{"optim.grad_clip=0", "optim.lr=0.01"};
  std::vector<std::string> with = common;
  with.push_back("train.freeze=h.1.mlp.*,wpe");
  OneRank freezing(tiny_config(with)), reference(tiny_config(common));
  const auto initial = reference.values();
  for (int u = 0; u < 4; ++u) {
    const double a = freezing.update(u), b = reference.update(u);
    EXPECT_EQ(a, b) << "update " << u + 1;
    // The reference's P back to its initial values: a learning rate of 0 for P.
    for (const ParamSpec& p : reference.step.model().params())
      if (frozen(freezing, p.name))
        upload_f32(*reference.be, reference.step.model().param(p), initial.at(p.name).data());
  }
  const auto a = freezing.values(), b = reference.values();
  for (const auto& [name, v] : a) EXPECT_EQ(v, b.at(name)) << name;
}

TEST(Freeze, TiedEmbeddingFrozenBothWays) {
  // GPT-2's wte is the embedding and the output head: frozen, neither writes a gradient.
  OneRank run(tiny_config({"train.freeze=wte"}));
  const auto before = run.values();
  for (int u = 0; u < 3; ++u) run.update(u);
  EXPECT_EQ(run.values().at("transformer.wte.weight"), before.at("transformer.wte.weight"));
  EXPECT_NE(run.values().at("transformer.wpe.weight"), before.at("transformer.wpe.weight"));
}

TEST(Freeze, Patterns) {
  using nn::freeze_pattern_matches;
  const std::string name = "transformer.h.0.attn.c_attn.weight";
  EXPECT_TRUE(freeze_pattern_matches(name, name));
  EXPECT_TRUE(freeze_pattern_matches("h.0.*", name));
  EXPECT_TRUE(freeze_pattern_matches("h.0", name));
  EXPECT_TRUE(freeze_pattern_matches("attn", name));
  EXPECT_TRUE(freeze_pattern_matches("*.c_attn.*", name));
  EXPECT_TRUE(freeze_pattern_matches("transformer.h.*.attn.c_attn.weight", name));
  EXPECT_FALSE(freeze_pattern_matches("h.1", name));
  EXPECT_FALSE(freeze_pattern_matches("h.0.attn.c_proj.*", name));
  EXPECT_FALSE(freeze_pattern_matches("ransformer.h.0.*", name));  // a whole component
  EXPECT_FALSE(freeze_pattern_matches("h.1", "transformer.h.10.ln_1.weight"));
}

TEST(Freeze, PatternMatchingNothingIsAnError) {
  try {
    OneRank run(tiny_config({"train.freeze=h.0.*,h.9.*"}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.freeze"), std::string::npos) << what;
    EXPECT_NE(what.find("\"h.9.*\""), std::string::npos) << what;
    // What the names look like: the model's first modules, in order.
    EXPECT_NE(what.find("its modules begin transformer.wte, transformer.wpe, transformer.h.0.ln_1"),
              std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace kiln
