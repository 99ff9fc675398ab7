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
//   - LoRA's adapters in a buffer of their own (train.lora.dtype): fp32 adapters on a bf16
//     base take 4 bytes each and no master copy, and train bitwise as bf16 adapters with
//     fp32 masters do (round to nearest: the GEMMs read the same rounded values).
// The layouts (dp, ZeRO 1-3, tp, pp) against this single process:
// tests/parallel/freeze_train_test.sh.
#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "nn/param.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
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

// A bf16 LoRA fine-tune of the tiny GPT-2 whose adapters are stored in `lora_dtype`.
TrainConfig lora_config(const std::string& lora_dtype, std::vector<std::string> more = {}) {
  more.insert(more.end(), {"train.lora.rank=2", "train.lora.targets=[\"qkv\", \"fc\"]",
                           "train.lora.dtype=" + lora_dtype, "optim.lr=0.01"});
  return tiny_config(more, "bf16");
}

TEST(LoraStorage, Fp32AdaptersOwnBufferNoMasters) {
  OneRank fp32(lora_config("fp32")), bf16(lora_config("bf16"));
  const Model& m = fp32.step.model();
  EXPECT_EQ(m.param_buffer().dtype(), DType::F32);
  EXPECT_EQ(m.frozen_buffer().dtype(), DType::BF16);
  EXPECT_EQ(bf16.step.model().param_buffer().dtype(), DType::BF16);
  for (const ParamSpec& p : m.params()) EXPECT_EQ(p.trainable, p.adapter) << p.name;
  fp32.update(0), bf16.update(0);  // the optimizer state exists from the first update
  const int64_t adapters = fp32.step.param_tally().trainable;
  ASSERT_GT(adapters, 0);
  EXPECT_EQ(m.flat_size(), adapters);  // nothing else in the trainable buffer
  // fp32 adapters: 2 bytes more each, and no 4-byte master in the optimizer state.
  EXPECT_EQ(fp32.bytes(MemCategory::Parameters) - bf16.bytes(MemCategory::Parameters),
            2 * adapters);
  EXPECT_EQ(bf16.bytes(MemCategory::OptimizerState) - fp32.bytes(MemCategory::OptimizerState),
            4 * adapters);
  EXPECT_EQ(fp32.bytes(MemCategory::Gradients), bf16.bytes(MemCategory::Gradients));
}

TEST(LoraStorage, Fp32AdaptersTrainAsRoundedBf16Adapters) {
  // B is zero at first: the noise makes every adapter matter from the first update.
  OneRank fp32(lora_config("fp32")), bf16(lora_config("bf16"));
  // The same fp32 values: fp32's adapters, bf16's masters (its adapters their rounding).
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 0.2f);
  AdamW &a32 = fp32.step.optimizer(), &a16 = bf16.step.optimizer();
  ASSERT_EQ(a32.segments().size(), a16.segments().size());
  for (size_t i = 0; i < a32.segments().size(); ++i) {
    std::vector<float> w = download_f32(*fp32.be, a32.segments()[i].param);
    for (float& x : w) x += nd(rng);
    a32.set_weights(i, w.data());
    a16.set_weights(i, w.data());
  }
  a32.reset_ema(), a16.reset_ema();
  for (int u = 0; u < 4; ++u) EXPECT_EQ(fp32.update(u), bf16.update(u)) << "update " << u + 1;
  const auto a = fp32.values(), b = bf16.values();
  int differ = 0;  // the fp32 adapters keep what rounding drops
  for (const auto& [name, v] : a) {
    std::vector<float> rounded = v;
    for (float& x : rounded) x = bf16_to_f32(f32_to_bf16(x));
    EXPECT_EQ(rounded, b.at(name)) << name;
    differ += v != b.at(name);
  }
  EXPECT_GT(differ, 0);
}

TEST(LoraStorage, Fp32AdaptersNeedFp32Gradients) {
  try {
    OneRank run(lora_config("fp32", {"train.grad_dtype=bf16"}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.grad_dtype = bf16 with train.lora.dtype = fp32"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(OneRank(lora_config("fp16")), Error);  // neither fp32 nor train.dtype
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
