// LLaVA against a float64 PyTorch reference (tests/golden/llava_golden.safetensors, made by
// tests/golden/make_llava_golden.py: a ViT trunk read at its penultimate block, the GELU
// projector, make_llama_golden.py's decoder on each sample's text with the image's tokens
// spliced in (inside the text, first, and absent), the loss over the flagged caption ids;
// one decoder block frozen; see tests/golden/README.md).
//
// For every backend the file's parameters are copied into the model, then with
// golden_compare.h's bounds: the mean loss and every trainable gradient (the frozen block
// has none), the losses of 4 AdamW steps on the batch, and every parameter after them (the
// frozen ones unchanged: bitwise).
#include "golden_compare.h"

#include "backend/registry.h"
#include "models/llava/llava.h"

#include <set>

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string golden_file() { return golden_path("llava_golden.safetensors"); }
std::string generator_file() { return golden_path("make_llava_golden.py"); }

// The parameters after the AdamW steps, relative norm per tensor.
constexpr double kFinalTol = 1e-5;

LlavaConfig config_of(const st::Reader& r) {
  ModelOptions o;
  o.arch = "llava";
  o.n_layer = meta_int(r, "n_layer");
  o.n_head = meta_int(r, "n_head");
  o.n_embd = meta_int(r, "n_embd");
  o.vocab_size = meta_int(r, "vocab_size");
  o.block_size = meta_int(r, "block_size");
  for (const char* key : {"n_kv_head", "ffn_hidden_size", "image_size", "num_channels",
                          "vision.n_layer", "vision.n_head", "vision.n_embd",
                          "vision.ffn_hidden_size", "vision.patch_size", "vision.feature_layer"})
    o.family[key] = meta_int(r, key);
  o.family["norm_eps"] = meta_double(r, "norm_eps");
  o.family["vision.norm_eps"] = meta_double(r, "vision.norm_eps");
  o.family["rope_theta"] = meta_double(r, "rope_theta");
  return llava_config_of(o);
}

ModelStorage storage_of(const st::Reader& r) {
  ModelStorage s;
  s.freeze = {r.metadata("freeze")};
  return s;
}

}  // namespace

TEST(LlavaGolden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  check_generator(r, golden_file(), generator_file(), "llava");
  const LlavaConfig cfg = config_of(r);
  EXPECT_EQ(cfg.text.padded_vocab_size, meta_int(r, "padded_vocab_size"));
  EXPECT_EQ(cfg.feature_layer, -2);  // the last vision block does not run
  auto backend = make_backend("cpu");
  Llava model(cfg, *backend, storage_of(r));
  std::set<std::string> expected{"images", "tokens", "image_at", "targets", "loss", "adamw_losses"};
  int frozen = 0;
  for (const ParamSpec& p : model.params()) {
    for (const std::string& name : {p.name, "adamw_final." + p.name}) {
      expected.insert(name);
      ASSERT_TRUE(r.contains(name)) << "the golden file lacks " << name;
      EXPECT_EQ(r.info(name).kiln_shape(), p.shape) << name;
    }
    EXPECT_EQ(p.weight_decay, p.shape.ndim() == 2 && !p.name.ends_with("pos_embed")) << p.name;
    if (!p.trainable) {
      EXPECT_TRUE(p.name.starts_with("language_model.model.layers.0.")) << p.name;
      ++frozen;
      continue;
    }
    expected.insert("grad." + p.name);
    ASSERT_TRUE(r.contains("grad." + p.name)) << p.name;
  }
  EXPECT_GT(frozen, 0);
  const auto names = r.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
  const int B = meta_int(r, "batch_size"), N = cfg.image_tokens(), T = cfg.text.block_size;
  EXPECT_EQ(r.info("tokens").kiln_shape(), (Shape{B, T - N}));
  EXPECT_EQ(r.info("targets").kiln_shape(), (Shape{B, T}));
  // The three placements of the image are tested.
  const auto at = r.read_i32("image_at");
  EXPECT_EQ(std::set<int32_t>(at.begin(), at.end()), (std::set<int32_t>{-1, 0, 2}));
  int64_t params = 0;
  for (const ParamSpec& p : model.params()) params += p.shape.numel();
  EXPECT_EQ(model.num_parameters(), params - (cfg.text.padded_vocab_size - cfg.text.vocab_size) *
                                                 cfg.text.n_embd * 2);
}

TEST(LlavaGolden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  const LlavaConfig cfg = config_of(r);
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  const int B = meta_int(r, "batch_size"), S = cfg.vision.image_size;
  const int T = cfg.text.block_size, Lt = cfg.text_tokens(T);
  const auto targets_h = r.read_i32("targets");
  int64_t n_valid = 0;
  for (int32_t t : targets_h) n_valid += t != -1;
  for (auto& bep : backends) {
    Backend& be = *bep;
    const std::string bn = be.name();
    SCOPED_TRACE("backend " + bn);
    fmt::print("[{}] LLaVA golden: {}, B={}\n", bn, cfg.str(), B);
    Llava model(cfg, be, storage_of(r));
    copy_reference_params(r, be, model);
    Tensor images = be.empty(Shape{B, S, S, cfg.vision.num_channels}, DType::F32,
                             MemCategory::Activations);
    be.copy_from_host(be.default_stream(), images, r.read_f32("images").data());
    Batch batch;
    batch.set("images", images);
    batch.set("tokens", device_i32(be, r.read_i32("tokens"), Shape{B, Lt}));
    batch.set("image_at", device_i32(be, r.read_i32("image_at"), Shape{B}));
    batch.targets = device_i32(be, targets_h, Shape{B, T});
    const TrainingMatch m = match_training(r, be, model, n_valid, [&](float g) {
      return model.forward(batch, g);
    });
    double worst_final = 0;
    for (const ParamSpec& p : model.params()) {
      const auto now = to_host(be, model.param(p));
      auto want = r.read_f32("adamw_final." + p.name);
      auto got = now;
      if (p.name.ends_with("attn.qkv.bias")) {
        // The k third's gradient is zero in exact arithmetic (it shifts all of a query's
        // scores alike), so AdamW steps it by the sign of rounding noise: not compared.
        const int64_t Cv = cfg.vision.n_embd;
        std::fill_n(got.begin() + Cv, Cv, 0.f);
        std::fill_n(want.begin() + Cv, Cv, 0.f);
      }
      const Cmp c = compare(got, want);
      print_cmp(bn, "adamw_final." + p.name, c, kFinalTol);
      EXPECT_LE(c.rel, kFinalTol) << p.name;
      if (!p.trainable) EXPECT_EQ(now, r.read_f32(p.name)) << p.name << " is frozen";
      worst_final = std::max(worst_final, c.rel);
    }
    fmt::print("[{}] SUMMARY worst: loss rel {:.3e}; grad rel {:.3e} in {}; adamw loss rel "
               "{:.3e} at step {}; parameters after the steps rel {:.3e}\n", bn, m.loss_rel,
               m.worst_grad, m.worst_grad_name, m.worst_adam, m.worst_step, worst_final);
  }
}
