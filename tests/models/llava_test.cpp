// LLaVA (src/models/llava): KV-cache decoding with an image against the training forward,
// gradients bitwise equal under every checkpointing policy, the checkpoint JSON round trip,
// and one-line config errors. Numerical correctness against PyTorch is
// tests/golden/llava_golden_test.cpp; layouts are tests/parallel/llava_train_test.sh.
#include "backend/registry.h"
#include "models/llava/llava.h"
#include "models/registry.h"
#include "support/error_of.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace kiln {
namespace {

using testing::error_of;

ModelOptions tiny() {
  ModelOptions o;
  o.arch = "llava";
  o.n_layer = 2;
  o.n_head = 4;
  o.n_embd = 16;
  o.block_size = 4 + 10;  // 4 image tokens (8x8, patch 4) and 10 text slots
  o.vocab_size = 29;
  o.family = {{"n_kv_head", 2}, {"image_size", 8}, {"num_channels", 3},
              {"vision.patch_size", 4}, {"vision.n_layer", 2}, {"vision.n_head", 2},
              {"vision.n_embd", 8}, {"vision.feature_layer", -2}};
  return o;
}

struct Inputs {
  std::vector<float> images;
  std::vector<int32_t> tokens;
};

Inputs random_inputs(int B, int Lt, int image_numel, int V) {
  std::mt19937 rng(3);
  Inputs in;
  std::uniform_real_distribution<float> px(-1.f, 1.f);
  for (int i = 0; i < B * image_numel; ++i) in.images.push_back(px(rng));
  for (int i = 0; i < B * Lt; ++i) in.tokens.push_back(static_cast<int32_t>(rng() % V));
  return in;
}

Tensor device(Backend& be, const void* host, Shape shape, DType dtype) {
  Tensor t = be.empty(shape, dtype, MemCategory::Temporaries);
  be.copy_from_host(be.default_stream(), t, host);
  return t;
}

// The decoder's log-probability of each text token after the first, as the training
// forward sees it (one forward per target: the loss sum with that one target) and as
// prefill_image + decode see it (the logits of each step).
TEST(Llava, DecodingWithAnImageMatchesTheForward) {
  auto be = make_backend("cpu");
  auto model = make_model(tiny(), *be);
  model->init_weights(7);
  auto& llava = dynamic_cast<Llava&>(*model);
  const int N = llava.image_tokens(), T = tiny().block_size, Lt = T - N, V = 29;
  const int B = 2, image_at = 3;
  const Shape image = llava.image_shape();
  const Inputs in = random_inputs(B, Lt, static_cast<int>(image.numel()), V);
  const Tensor images = device(*be, in.images.data(), batched(B, image), DType::F32);
  const Tensor tokens = device(*be, in.tokens.data(), Shape{B, Lt}, DType::I32);
  // Training forward: the loss of text token i (i > 0) is its target at its position - 1.
  std::vector<double> want(static_cast<size_t>(B * Lt), 0.0);
  const std::vector<int32_t> at(B, image_at);
  for (int i = 1; i < Lt; ++i) {
    std::vector<int32_t> targets(static_cast<size_t>(B * T), -1);
    const int pos = i + (i >= image_at ? N : 0);
    for (int b = 0; b < B; ++b) targets[b * T + pos - 1] = in.tokens[b * Lt + i];
    Batch batch;
    batch.set("images", images);
    batch.set("tokens", tokens);
    batch.set("image_at", device(*be, at.data(), Shape{B}, DType::I32));
    batch.targets = device(*be, targets.data(), Shape{B, T}, DType::I32);
    // B targets, one per sample: their sum; B = 1 rows would do, two test the batch.
    const LossSum s = model->forward(batch, 0.f);
    ASSERT_EQ(s.targets, B);
    want[static_cast<size_t>(i)] = s.sum;
  }
  // Decoding: the prompt's first image_at + 1 tokens with the image, then one at a time.
  LanguageModel& lm = as_language_model(*model, "test");
  const int Vp = lm.padded_vocab_size();
  lm.begin_decode(B, T);
  Tensor logits = be->empty(Shape{B, Vp}, DType::F32, MemCategory::Temporaries);
  std::vector<float> host(static_cast<size_t>(B * Vp));
  auto nll = [&](int i) {  // -log p(token i) summed over the batch, from the last logits
    be->copy_to_host(be->default_stream(), host.data(), logits);
    double sum = 0;
    for (int b = 0; b < B; ++b) {
      const float* row = host.data() + static_cast<size_t>(b) * Vp;
      double mx = row[0], z = 0;
      for (int v = 0; v < V; ++v) mx = std::max<double>(mx, row[v]);
      for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      sum += mx + std::log(z) - row[in.tokens[b * Lt + i]];
    }
    return sum;
  };
  auto columns = [&](int from, int n) {
    std::vector<int32_t> ids;
    for (int b = 0; b < B; ++b)
      for (int k = 0; k < n; ++k) ids.push_back(in.tokens[b * Lt + from + k]);
    return device(*be, ids.data(), Shape{B, n}, DType::I32);
  };
  llava.prefill_image(images, columns(0, image_at + 1), image_at, logits);
  EXPECT_EQ(lm.decoded_length(), image_at + 1 + N);
  for (int i = image_at + 1; i < Lt; ++i) {
    EXPECT_NEAR(nll(i), want[static_cast<size_t>(i)], 1e-4 * want[static_cast<size_t>(i)]) << i;
    lm.decode(columns(i, 1), logits);
  }
  lm.end_decode();
  // The tokens before the image, decoded text-only, see no image either.
  lm.begin_decode(B, T);
  lm.decode(columns(0, 1), logits);
  for (int i = 1; i < image_at; ++i) {
    EXPECT_NEAR(nll(i), want[static_cast<size_t>(i)], 1e-4 * want[static_cast<size_t>(i)]) << i;
    lm.decode(columns(i, 1), logits);
  }
}

TEST(Llava, CheckpointingLeavesGradientsBitwiseAlone) {
  auto be = make_backend("cpu");
  const ModelOptions o = tiny();
  const int T = o.block_size, N = 4, Lt = T - N, B = 2;
  std::vector<std::vector<float>> grads;
  for (auto mode : {nn::ActivationCheckpointing::None, nn::ActivationCheckpointing::Selective,
                    nn::ActivationCheckpointing::Full}) {
    auto model = make_model(o, *be);
    model->init_weights(7);
    model->set_activation_checkpointing(mode);
    const Shape image = dynamic_cast<Llava&>(*model).image_shape();
    const Inputs in = random_inputs(B, Lt, static_cast<int>(image.numel()), 29);
    std::vector<int32_t> targets(static_cast<size_t>(B * T));
    for (size_t i = 0; i < targets.size(); ++i) targets[i] = i % 3 ? static_cast<int32_t>(i % 29) : -1;
    const std::vector<int32_t> at{2, -1};
    Batch batch;
    batch.set("images", device(*be, in.images.data(), batched(B, image), DType::F32));
    batch.set("tokens", device(*be, in.tokens.data(), Shape{B, Lt}, DType::I32));
    batch.set("image_at", device(*be, at.data(), Shape{B}, DType::I32));
    batch.targets = device(*be, targets.data(), Shape{B, T}, DType::I32);
    model->zero_grad();
    model->forward(batch, 0.1f);
    model->backward();
    std::vector<float> g(static_cast<size_t>(model->flat_size()));
    be->copy_to_host(be->default_stream(), g.data(), model->grad_buffer());
    grads.push_back(g);
  }
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(grads[0], grads[2]);
  double norm = 0;
  for (float v : grads[0]) norm += double(v) * v;
  EXPECT_GT(norm, 0);
}

TEST(Llava, ConfigRoundTripsAndBadKeysAreOneLine) {
  auto be = make_backend("cpu");
  auto model = make_model(tiny(), *be);
  const ModelOptions back = model_options_from_json("llava", model->config_json());
  auto again = make_model(back, *be);
  EXPECT_EQ(again->config_json(), model->config_json());
  ModelOptions o = tiny();
  o.family["vision.feature_layer"] = -4;
  EXPECT_NE(error_of([&] { make_model(o, *be); }).find("model.vision.feature_layer (-4)"),
            std::string::npos);
  o = tiny();
  o.family["vision.n_head"] = 3;
  EXPECT_NE(error_of([&] { make_model(o, *be); }).find("model.vision.n_embd (8) must be a positive "
                                                       "multiple of model.vision.n_head (3)"),
            std::string::npos);
  o = tiny();
  o.family["vision.patch_size"] = 3;
  EXPECT_NE(error_of([&] { make_model(o, *be); }).find("model.vision.patch_size (3) must be"),
            std::string::npos);
  o = tiny();
  o.block_size = 4;
  EXPECT_NE(error_of([&] { make_model(o, *be); }).find("must exceed the image's 4 tokens"),
            std::string::npos);
  o = tiny();
  o.family["moe.num_experts"] = 4;
  EXPECT_NE(error_of([&] { make_model(o, *be); }).find("mixture-of-experts decoder"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
