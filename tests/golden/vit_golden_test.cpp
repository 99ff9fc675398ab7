// ViT against a float64 PyTorch reference (tests/golden/vit_golden.safetensors, made by
// tests/golden/make_vit_golden.py: patches in a convolution weight's (channel, row,
// column) order, a zero class-token row after the patches, learned positions, pre-LN
// bidirectional blocks, the class token's LayerNorm and a bias-free head; see
// tests/golden/README.md).
//
// As the language models' golden tests, with their bounds (golden_compare.h): for every
// backend the file's parameters are copied into the model; logits [B, K], the mean loss
// (one label ignored), every gradient and the losses of 10 AdamW steps are compared.
#include "golden_compare.h"

#include "backend/registry.h"
#include "models/vit/vit.h"

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string golden_file() { return golden_path("vit_golden.safetensors"); }
std::string generator_file() { return golden_path("make_vit_golden.py"); }

ViTConfig config_of(const st::Reader& r) {
  ModelOptions o;
  o.arch = "vit";
  o.n_layer = meta_int(r, "n_layer");
  o.n_head = meta_int(r, "n_head");
  o.n_embd = meta_int(r, "n_embd");
  for (const char* key : {"ffn_hidden_size", "image_size", "num_channels", "patch_size", "num_classes"})
    o.family[key] = meta_int(r, key);
  o.family["norm_eps"] = static_cast<float>(meta_double(r, "norm_eps"));
  const int grid = meta_int(r, "image_size") / meta_int(r, "patch_size");
  o.block_size = grid * grid + 1;
  return vit_config_of(o);
}

}  // namespace

TEST(ViTGolden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  const ViTConfig cfg = config_of(r);
  EXPECT_GT(cfg.num_channels, 1);  // the patch element order is tested
  auto backend = make_backend("cpu");
  ViT model(cfg, *backend);
  check_generator_and_params(r, golden_file(), generator_file(), "vit", model,
                             {"images", "labels", "logits", "loss", "adamw_losses"});
  const int B = meta_int(r, "batch_size"), S = cfg.image_size;
  EXPECT_EQ(r.info("images").kiln_shape(), (Shape{B, S, S, cfg.num_channels}));
  EXPECT_EQ(r.info("labels").kiln_shape(), (Shape{B}));
  EXPECT_EQ(r.info("labels").dtype, st::StDType::I32);
  EXPECT_EQ(r.info("logits").kiln_shape(), (Shape{B, cfg.num_classes}));
  int64_t n_valid = 0;
  for (int32_t y : r.read_i32("labels")) {
    EXPECT_TRUE(y == -1 || (y >= 0 && y < cfg.num_classes)) << y;
    n_valid += y != -1;
  }
  EXPECT_EQ(n_valid, meta_int(r, "n_targets"));
  EXPECT_LT(n_valid, B);  // an ignored label is tested
  // The generator decays the 2-D parameters except pos_embed, as kiln does.
  for (const ParamSpec& p : model.params())
    EXPECT_EQ(p.weight_decay, p.shape.ndim() == 2 && p.name != "pos_embed") << p.name;
  EXPECT_EQ(model.num_parameters(), [&] {
    int64_t n = 0;
    for (const ParamSpec& p : model.params()) n += p.shape.numel();
    return n;
  }());
}

TEST(ViTGolden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  const ViTConfig cfg = config_of(r);
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  const int B = meta_int(r, "batch_size"), S = cfg.image_size;
  const auto labels_h = r.read_i32("labels");
  int64_t n_valid = 0;
  for (int32_t y : labels_h) n_valid += y != -1;
  for (auto& bep : backends) {
    Backend& be = *bep;
    SCOPED_TRACE("backend " + be.name());
    fmt::print("[{}] ViT golden: {}, B={}\n", be.name(), cfg.str(), B);
    ViT model(cfg, be);
    copy_reference_params(r, be, model);
    Tensor images = be.empty(Shape{B, S, S, cfg.num_channels}, DType::F32, MemCategory::Activations);
    be.copy_from_host(be.default_stream(), images, r.read_f32("images").data());
    const Tensor labels = device_i32(be, labels_h, Shape{B});
    const Batch batch = Batch::of_images(images, labels);
    match_reference_batch(r, be, model, batch, n_valid, [&] {
      Tensor logits = be.empty(Shape{B, cfg.num_classes}, DType::F32, MemCategory::Temporaries);
      model.classify(images, logits);
      return to_host(be, logits);
    });
    // Evaluation counts the images whose top logit is the label, as the reference's.
    const auto ref = r.read_f32("logits");
    int64_t want = 0;
    for (int b = 0; b < B; ++b) {
      if (labels_h[b] < 0) continue;
      const float* row = ref.data() + static_cast<size_t>(b) * cfg.num_classes;
      want += std::max_element(row, row + cfg.num_classes) - row == labels_h[b];
    }
    copy_reference_params(r, be, model);
    const LossSum eval = model.forward(batch, 0.f);
    EXPECT_EQ(eval.correct, want);
    EXPECT_EQ(eval.targets, n_valid);
  }
}
