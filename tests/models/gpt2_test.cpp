// GPT-2 model tests that need no reference file: sizes, FLOPs, initialisation, dropout
// replay and a finite-difference check of the whole model's backward. The comparison
// against PyTorch lives in tests/golden.
#include "backend/registry.h"
#include "models/gpt2/gpt2.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

namespace kiln {
namespace {

GPT2Config tiny(float dropout = 0.f) {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 3;
  c.n_embd = 24;
  c.vocab_size = 37;
  c.padded_vocab_size = GPT2Config::pad_vocab(37, 16);
  c.block_size = 9;
  c.dropout = dropout;
  return c;
}

std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(be.default_stream(), v.data(), t);
  return v;
}

Tensor tokens_tensor(Backend& be, const std::vector<int32_t>& v, int B, int T) {
  Tensor t = be.empty(Shape{B, T}, DType::I32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), t, v.data());
  return t;
}

TEST(GPT2Config, PresetsAndParameterCount) {
  // Hugging Face's gpt2 has 124,439,808 parameters (tied embedding counted once).
  EXPECT_EQ(GPT2Config::preset("gpt2").num_parameters(), 124439808);
  EXPECT_EQ(GPT2Config::preset("gpt2-medium").num_parameters(), 354823168);
  EXPECT_EQ(GPT2Config::preset("gpt2-large").num_parameters(), 774030080);
  EXPECT_EQ(GPT2Config::preset("gpt2-xl").num_parameters(), 1557611200);
  EXPECT_EQ(GPT2Config::pad_vocab(50257), 50304);
  EXPECT_THROW(GPT2Config::preset("gpt3"), Error);
  GPT2Config bad = tiny();
  bad.n_head = 5;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(GPT2Config, FlopsPerToken) {
  const GPT2Config c = GPT2Config::preset("gpt2");
  const double N = 124439808.0 - 1024.0 * 768.0;
  EXPECT_EQ(c.num_flop_parameters(), static_cast<int64_t>(N));
  EXPECT_DOUBLE_EQ(c.flops_per_token(1024), 6 * N + 12.0 * 12 * 1024 * 768);
}

TEST(GPT2, FlatLayoutCoversEveryParameterOnce) {
  auto be = make_backend("cpu");
  GPT2 m(tiny(), *be);
  int64_t expect = 0;
  for (const auto& p : m.params()) {
    EXPECT_EQ(p.offset, expect) << p.name;
    expect += p.shape.numel();
  }
  EXPECT_EQ(expect, m.flat_size());
  const GPT2Config c = tiny();
  EXPECT_EQ(m.flat_size(), c.num_parameters() +
                               static_cast<int64_t>(c.padded_vocab_size - c.vocab_size) * c.n_embd);
  EXPECT_THROW(m.param("transformer.h.9.ln_1.weight"), Error);
}

TEST(GPT2, InitialisationFollowsGPT2AndIgnoresThreadCount) {
  auto be = make_backend("cpu");
  GPT2Config c = tiny();
  c.n_embd = 96;
  c.n_head = 4;
  GPT2 m(c, *be);
  omp_set_num_threads(1);
  m.init_weights(42);
  const auto one = to_host(*be, m.param_buffer());
  omp_set_num_threads(2);
  m.init_weights(42);
  const auto two = to_host(*be, m.param_buffer());
  EXPECT_EQ(one, two);
  auto stddev = [&](const char* name) {
    const auto v = to_host(*be, m.param(name));
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    const double mean = s / v.size();
    return std::sqrt(s2 / v.size() - mean * mean);
  };
  EXPECT_NEAR(stddev("transformer.h.0.mlp.c_fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("transformer.h.1.attn.c_proj.weight"), 0.02 / std::sqrt(4.0), 0.002);
  EXPECT_NEAR(stddev("transformer.h.1.mlp.c_proj.weight"), 0.02 / std::sqrt(4.0), 0.002);
  const auto wte = to_host(*be, m.param("transformer.wte.weight"));
  for (int64_t i = int64_t(c.vocab_size) * c.n_embd; i < int64_t(wte.size()); ++i)
    ASSERT_EQ(wte[i], 0.f) << "padded vocabulary row not zero";
  for (float g : to_host(*be, m.param("transformer.ln_f.weight"))) ASSERT_EQ(g, 1.f);
  for (float b : to_host(*be, m.param("transformer.h.0.attn.c_attn.bias"))) ASSERT_EQ(b, 0.f);
}

TEST(GPT2, DropoutMasksReplayAndChangeWithTheCall) {
  auto be = make_backend("cpu");
  GPT2 m(tiny(0.2f), *be);
  m.init_weights(3);
  const int B = 2, T = 7;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 5) % 37, tgt[i] = (i * 11 + 1) % 37;
  const Tensor x = tokens_tensor(*be, tok, B, T), y = tokens_tensor(*be, tgt, B, T);
  m.set_dropout(true, 99, 5);
  const double a = m.forward(Batch::of_tokens(x, y), 0.f).sum;
  const double b = m.forward(Batch::of_tokens(x, y), 0.f).sum;
  m.set_dropout(true, 99, 6);
  const double c = m.forward(Batch::of_tokens(x, y), 0.f).sum;
  m.set_dropout(false, 0, 0);
  const double d = m.forward(Batch::of_tokens(x, y), 0.f).sum;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
}

// Dropout keyed by the global sample index and the position within the sample: a
// micro-batch of 4 samples from global sample 8 drops what two micro-batches of 2 (from
// samples 8 and 10) drop, so the losses and gradients agree (to summation order).
TEST(GPT2, DropoutMasksFollowTheSampleNotTheMicroBatch) {
  auto be = make_backend("cpu");
  GPT2 m(tiny(0.3f), *be);
  m.init_weights(3);
  const int B = 4, T = 7;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 5 + 3) % 37, tgt[i] = (i * 11 + 1) % 37;
  auto half = [&](const std::vector<int32_t>& v, int h) {
    return std::vector<int32_t>(v.begin() + h * 2 * T, v.begin() + (h + 1) * 2 * T);
  };
  m.set_dropout(true, 99, 8);
  m.zero_grad();
  const double whole = m.forward(Batch::of_tokens(tokens_tensor(*be, tok, B, T),
                                                  tokens_tensor(*be, tgt, B, T)), 1.f).sum;
  m.backward();
  const std::vector<float> g_whole = to_host(*be, m.grad_buffer());
  double parts = 0;
  m.zero_grad();
  for (int h = 0; h < 2; ++h) {
    m.set_dropout(true, 99, 8 + 2 * h);
    parts += m.forward(Batch::of_tokens(tokens_tensor(*be, half(tok, h), 2, T),
                                        tokens_tensor(*be, half(tgt, h), 2, T)), 1.f).sum;
    m.backward();
  }
  const std::vector<float> g_parts = to_host(*be, m.grad_buffer());
  EXPECT_NEAR(parts, whole, 1e-5 * std::abs(whole));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g_whole.size(); ++i)
    diff += std::pow(g_whole[i] - g_parts[i], 2), norm += std::pow(g_whole[i], 2);
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
  // Another first sample draws other masks.
  m.set_dropout(true, 99, 9);
  const double shifted = m.forward(Batch::of_tokens(tokens_tensor(*be, tok, B, T),
                                                    tokens_tensor(*be, tgt, B, T)), 0.f).sum;
  EXPECT_GT(std::abs(shifted - whole), 1e-3 * std::abs(whole));
}

// The whole model's backward against central differences of its forward, with dropout
// on (the masks are replayed, so the function is deterministic).
TEST(GPT2, BackwardMatchesFiniteDifferences) {
  for (float p : {0.f, 0.1f}) {
    auto be = make_backend("cpu");
    GPT2 m(tiny(p), *be);
    m.init_weights(7);
    // Larger weights than GPT-2's init make the function less flat, the check sharper.
    std::vector<float> w = to_host(*be, m.param_buffer());
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> nd(0.f, 0.2f);
    const GPT2Config c = tiny(p);
    for (size_t i = 0; i < w.size(); ++i)
      if (i < size_t(c.vocab_size) * c.n_embd || i >= size_t(c.padded_vocab_size) * c.n_embd)
        w[i] += nd(rng);
    be->copy_from_host(be->default_stream(), m.param_buffer(), w.data());
    const int B = 2, T = 5;
    std::vector<int32_t> tok(B * T), tgt(B * T);
    std::uniform_int_distribution<int> tokd(0, c.vocab_size - 1);
    for (int i = 0; i < B * T; ++i) tok[i] = tokd(rng), tgt[i] = tokd(rng);
    tgt[3] = -1;  // an ignored target
    const Tensor x = tokens_tensor(*be, tok, B, T), y = tokens_tensor(*be, tgt, B, T);
    m.set_dropout(true, 1234, 0);
    m.zero_grad();
    m.forward(Batch::of_tokens(x, y), 1.f).sum;
    m.backward();
    const auto g = to_host(*be, m.grad_buffer());
    auto loss_at = [&](size_t i, float h) {
      std::vector<float> w2 = w;
      w2[i] += h;
      be->copy_from_host(be->default_stream(), m.param_buffer(), w2.data());
      return m.forward(Batch::of_tokens(x, y), 0.f).sum;
    };
    std::uniform_int_distribution<size_t> pick(0, w.size() - 1);
    int checked = 0;
    double worst = 0;
    for (const auto& spec : m.params()) {
      for (int k = 0; k < 2; ++k) {
        size_t i = size_t(spec.offset) + pick(rng) % size_t(spec.shape.numel());
        if (spec.name == "transformer.wte.weight") i = size_t(tok[0]) * c.n_embd + k;
        const float h = 1e-2f;
        const double fd = (loss_at(i, h) - loss_at(i, -h)) / (2 * h);
        const double err = std::abs(fd - g[i]) / std::max(1e-2, std::abs(fd) + std::abs(g[i]));
        worst = std::max(worst, err);
        EXPECT_LT(err, 2e-2) << spec.name << " element " << i << " fd " << fd << " grad " << g[i]
                             << " dropout " << p;
        ++checked;
      }
    }
    std::printf("dropout %.1f: %d coordinates, worst relative error %.2e\n", p, checked, worst);
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Decoding with the KV cache (prefill, then one token at a time) gives the logits of a
// full forward pass at every position.
TEST(GPT2, KVCacheDecodeMatchesFullForward) {
  auto be = make_backend("cpu");
  const GPT2Config c = tiny();
  GPT2 m(c, *be);
  m.init_weights(11);
  const int B = 2, T = 8, prefill = 3;
  std::vector<int32_t> tok(B * T);
  std::mt19937 rng(std::random_device{}());
  for (auto& t : tok) t = int32_t(rng() % c.vocab_size);
  const Tensor x = tokens_tensor(*be, tok, B, T);
  Tensor full = be->empty(Shape{B, T, c.padded_vocab_size}, DType::F32, MemCategory::Temporaries);
  m.forward_logits(x, full);
  const auto ref = to_host(*be, full);
  m.begin_decode(B, T);
  Tensor logits = be->empty(Shape{B, c.padded_vocab_size}, DType::F32, MemCategory::Temporaries);
  double worst = 0;
  for (int t0 = 0; t0 < T;) {
    const int n = t0 == 0 ? prefill : 1;
    std::vector<int32_t> chunk;
    for (int b = 0; b < B; ++b)
      for (int t = t0; t < t0 + n; ++t) chunk.push_back(tok[b * T + t]);
    m.decode(tokens_tensor(*be, chunk, B, n), logits);
    t0 += n;
    const auto got = to_host(*be, logits);
    for (int b = 0; b < B; ++b)
      for (int v = 0; v < c.vocab_size; ++v)
        worst = std::max(worst, double(std::abs(got[b * c.padded_vocab_size + v] -
                                                ref[(b * T + t0 - 1) * c.padded_vocab_size + v])));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(m.decoded_length(), T);
  EXPECT_THROW(m.decode(tokens_tensor(*be, {1, 2}, B, 1), logits), Error);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Activation checkpointing changes what is kept, never the result: gradients are
// bitwise those without checkpointing (the recompute runs the same kernels on the same
// inputs, dropout masks replayed), and full checkpointing keeps far less.
TEST(GPT2, ActivationCheckpointingGivesIdenticalGradientsWithLessMemory) {
  GPT2Config c = tiny(0.1f);
  c.n_layer = 4;
  const int B = 2, T = 9;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 7 + 1) % c.vocab_size, tgt[i] = (i * 5 + 2) % c.vocab_size;
  std::vector<float> ref;
  double ref_loss = 0;
  int64_t ref_acts = 0;
  for (auto mode : {nn::ActivationCheckpointing::None, nn::ActivationCheckpointing::Selective,
                    nn::ActivationCheckpointing::Full}) {
    auto be = make_backend("cpu");
    GPT2 m(c, *be);
    m.init_weights(5);
    m.set_activation_checkpointing(mode);
    m.set_dropout(true, 77, 3);
    const Tensor x = tokens_tensor(*be, tok, B, T), y = tokens_tensor(*be, tgt, B, T);
    be->allocator().reset_peak();
    const double loss = m.forward(Batch::of_tokens(x, y), 1.f / (B * T)).sum;
    m.backward();
    const int64_t acts = be->allocator().stats().peak_of(MemCategory::Activations);
    const auto g = to_host(*be, m.grad_buffer());
    if (mode == nn::ActivationCheckpointing::None) {
      ref = g, ref_loss = loss, ref_acts = acts;
      continue;
    }
    EXPECT_EQ(loss, ref_loss);
    EXPECT_EQ(g, ref) << "gradients differ with checkpointing mode " << int(mode);
    EXPECT_LT(acts, ref_acts);
    std::printf("mode %d: activations %lld bytes (none: %lld)\n", int(mode), (long long)acts,
                (long long)ref_acts);
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The numbers: a 12-layer, 256-channel model with a byte vocabulary at T = 256:
// full checkpointing keeps at most a quarter of the activation bytes of none.
TEST(GPT2, FullCheckpointingKeepsAQuarterOfTheActivations) {
  GPT2Config c;
  c.n_layer = 12;
  c.n_head = 4;
  c.n_embd = 256;
  c.vocab_size = 257;
  c.padded_vocab_size = GPT2Config::pad_vocab(257);
  c.block_size = 256;
  const int B = 2, T = 256;
  std::vector<int32_t> tok(B * T, 1);
  int64_t none = 0;
  for (auto mode : {nn::ActivationCheckpointing::None, nn::ActivationCheckpointing::Selective,
                    nn::ActivationCheckpointing::Full}) {
    auto be = make_backend("cpu");
    GPT2 m(c, *be);
    m.set_activation_checkpointing(mode);
    const Tensor x = tokens_tensor(*be, tok, B, T);
    m.forward(Batch::of_tokens(x, x), 0.f).sum;  // allocates what a training step keeps
    const int64_t acts = be->allocator().stats().peak_of(MemCategory::Activations);
    if (mode == nn::ActivationCheckpointing::None) none = acts;
    std::printf("mode %d: %.2f MB of activations (%.0f%% of none)\n", int(mode), acts / 1e6,
                100.0 * acts / none);
    if (mode == nn::ActivationCheckpointing::Full) {
      EXPECT_LE(acts * 4, none);
    }
  }
}

}  // namespace
}  // namespace kiln
