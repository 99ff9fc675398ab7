// MMDiT against a float64 PyTorch reference (tests/golden/mmdit_golden.safetensors, made by
// tests/golden/make_mmdit_golden.py: one rectified-flow training step of a small
// text-conditioned MMDiT: a one-block text encoder, SD3's joint blocks (the last one's
// context pre-only), the pooled caption in the conditioning, every weight random and
// non-zero; captions of 4, 6 (every slot), 0 (the empty caption) and 2 tokens, which
// the reference runs without padding; see tests/golden/README.md), and the same with the
// frozen Llama text encoder (mmdit_llama_golden.safetensors, --llama-text-encoder: width
// 24 against the model's 32, grouped-query heads, rotary, causal; no gradient or update).
//
// With the file's parameters, x0, noise and times on every backend (MMDiT::flow_loss):
//   - the whole batch's evaluation loss (the uncounted image left out) and pred [B,N,D]
//     (predict_velocity on xt, patchified back);
//   - the mean loss and every gradient, and the losses of 10 AdamW steps (the same draws
//     each step), on the counted images only (flow_loss refuses an uncounted training
//     image; the images are independent, so that is the reference's gradient).
// The bounds are golden_compare.h's.
#include "flow_golden.h"
#include "golden_compare.h"

#include "backend/registry.h"
#include "models/mmdit/mmdit.h"

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string generator_file() { return golden_path("make_mmdit_golden.py"); }

MMDiTConfig config_of(const st::Reader& r) {
  ModelOptions o;
  o.arch = "mmdit";
  o.n_layer = meta_int(r, "n_layer");
  o.n_head = meta_int(r, "n_head");
  o.n_embd = meta_int(r, "n_embd");
  o.vocab_size = meta_int(r, "vocab_size");
  for (const char* key : {"ffn_hidden_size", "image_size", "num_channels", "patch_size",
                          "caption_tokens", "text.n_layer"})
    o.family[key] = meta_int(r, key);
  o.family["norm_eps"] = static_cast<float>(meta_double(r, "norm_eps"));
  if (r.metadata().contains("text.encoder")) {  // "'llama'", Python's repr
    EXPECT_EQ(r.metadata("text.encoder"), "'llama'");
    o.family["text.encoder"] = 1;
    for (const char* key : {"text.n_embd", "text.n_head", "text.n_kv_head", "text.ffn_hidden_size"})
      o.family[key] = meta_int(r, key);
    for (const char* key : {"text.norm_eps", "text.rope_theta"}) o.family[key] = meta_double(r, key);
  }
  const int grid = meta_int(r, "image_size") / meta_int(r, "patch_size");
  o.block_size = grid * grid;
  MMDiTConfig c = mmdit_config_of(o);
  EXPECT_EQ(c.frequency_dim, meta_int(r, "frequency_dim"));
  return c;
}

/// Each row of captions [B * Lc] (ids, then -1) as a caption.
std::vector<std::vector<int32_t>> caption_list(const std::vector<int32_t>& slots, int Lc) {
  std::vector<std::vector<int32_t>> out;
  for (size_t b = 0; b < slots.size() / Lc; ++b) {
    out.emplace_back();
    for (int i = 0; i < Lc && slots[b * Lc + i] >= 0; ++i) out.back().push_back(slots[b * Lc + i]);
  }
  return out;
}

class MMDiTGolden : public ::testing::TestWithParam<const char*> {
 protected:
  std::string golden_file() const { return golden_path(GetParam()); }
};

}  // namespace

TEST_P(MMDiTGolden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  const MMDiTConfig cfg = config_of(r);
  EXPECT_GT(cfg.num_channels, 1);  // the patch element order is tested
  EXPECT_GE(cfg.n_layer, 2);       // a full block and the pre-only last one
  auto backend = make_backend("cpu");
  MMDiT model(cfg, *backend);
  check_generator_and_params(r, golden_file(), generator_file(), "mmdit", model,
                             {"images", "noise", "t", "counted", "captions", "pred", "loss",
                              "adamw_losses"});
  const int B = meta_int(r, "batch_size"), Lc = cfg.caption_tokens;
  EXPECT_EQ(r.info("captions").kiln_shape(), (Shape{B, Lc}));
  EXPECT_EQ(r.info("pred").kiln_shape(), (Shape{B, cfg.patches(), cfg.patch_dim()}));
  for (float x : r.read_f32("images")) EXPECT_TRUE(x >= -1.f && x <= 1.f) << x;
  for (float t : r.read_f32("t")) EXPECT_TRUE(t > 0.f && t < 1.f) << t;
  // The captions cover what padding can do: none (every slot), some, all (empty).
  std::set<size_t> lengths;
  for (const auto& c : caption_list(r.read_i32("captions"), Lc)) lengths.insert(c.size());
  EXPECT_TRUE(lengths.count(0) && lengths.count(static_cast<size_t>(Lc)) && lengths.size() >= 3);
  const auto counted = r.read_i32("counted");
  EXPECT_EQ(std::count(counted.begin(), counted.end(), 0), meta_int(r, "n_targets"));
  EXPECT_LT(meta_int(r, "n_targets"), B);  // an uncounted image is tested
  const bool llama = cfg.text_encoder == TextEncoderKind::Llama;
  if (llama) EXPECT_NE(cfg.text_width(), cfg.n_embd);  // the embedders' widths are tested
  for (const ParamSpec& p : model.params()) {
    EXPECT_EQ(p.weight_decay, p.shape.ndim() == 2 && p.name != "pos_embed") << p.name;
    // Every reference gradient is non-zero (random adaLN and final weights, not zeros),
    // but the frozen Llama's, which are zero.
    const bool frozen = p.name.starts_with("text_encoder.model.");
    EXPECT_EQ(p.trainable, !frozen) << p.name;
    EXPECT_EQ(frozen, llama && p.name.starts_with("text_encoder.")) << p.name;
    double sq = 0;
    for (float x : r.read_f32("grad." + p.name)) sq += static_cast<double>(x) * x;
    if (frozen) EXPECT_EQ(sq, 0.0) << "grad." << p.name;
    else EXPECT_GT(sq, 0.0) << "grad." << p.name;
  }
  EXPECT_EQ(model.num_parameters(), [&] {  // a Llama's padding rows not counted (as HF's)
    int64_t n = 0;
    for (const ParamSpec& p : model.params()) n += p.shape.numel();
    if (llama) n -= int64_t{cfg.text_llama.padded_vocab_size - cfg.vocab_size} * cfg.text_width();
    return n;
  }());
}

TEST_P(MMDiTGolden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  const MMDiTConfig cfg = config_of(r);
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  const size_t pixels = static_cast<size_t>(cfg.image_size) * cfg.image_size * cfg.num_channels;
  const auto Lc = static_cast<size_t>(cfg.caption_tokens);
  const auto noise_h = r.read_f32("noise"), t_h = r.read_f32("t");
  const auto counted_h = r.read_i32("counted"), captions_h = r.read_i32("captions");
  const auto captions = caption_list(captions_h, cfg.caption_tokens);
  std::vector<size_t> counted;
  for (size_t b = 0; b < counted_h.size(); ++b)
    if (counted_h[b] == 0) counted.push_back(b);
  for (auto& bep : backends) {
    Backend& be = *bep;
    SCOPED_TRACE("backend " + be.name());
    fmt::print("[{}] MMDiT golden: {}, B={} ({} counted)\n", be.name(), cfg.str(),
               counted_h.size(), counted.size());
    MMDiT model(cfg, be);
    FlowCalls calls;
    calls.flow_loss = [&](const Tensor& x0, const std::vector<size_t>& keep, float grad_scale) {
      return model.flow_loss(x0, samples(counted_h, 1, keep), samples(captions_h, Lc, keep),
                             samples(noise_h, pixels, keep), samples(t_h, 1, keep), grad_scale);
    };
    calls.predict_velocity = [&](const Tensor& xt, const Tensor& velocity) {
      FlowConditioning cond;  // the captions as lists, not slots
      cond.captions = captions;
      model.predict_velocity(xt, t_h, cond, velocity);
    };
    match_flow_golden(r, be, model, cfg, counted, calls);
  }
}

INSTANTIATE_TEST_SUITE_P(TextEncoders, MMDiTGolden,
                         ::testing::Values("mmdit_golden.safetensors",
                                           "mmdit_llama_golden.safetensors"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "Joint" : "FrozenLlama");
                         });
