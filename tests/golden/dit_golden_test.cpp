// DiT against a float64 PyTorch reference (tests/golden/dit_golden.safetensors, made by
// tests/golden/make_dit_golden.py: one rectified-flow training step of a small
// class-conditional DiT, patches in (channel, row, column) order, learned positions,
// DiT's sinusoidal timestep MLP, a label table with a null class, adaLN-Zero blocks (but
// every weight random and non-zero) and the modulated final layer; see
// tests/golden/README.md).
//
// With the file's parameters, x0, noise and times on every backend (DiT::flow_loss):
//   - the whole batch's evaluation loss (label -1 not counted; conditioning -1 the null
//     class) and pred [B,N,D] (predict_velocity on xt, patchified back);
//   - the mean loss and every gradient, and the losses of 10 AdamW steps (the same draws
//     each step), on the counted images only: flow_loss refuses a training image without a
//     label, and the images are independent, so that is the reference's gradient of the
//     mean over the counted images of the whole batch.
// The bounds are golden_compare.h's.
#include "flow_golden.h"
#include "golden_compare.h"

#include "backend/registry.h"
#include "models/dit/dit.h"

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string golden_file() { return golden_path("dit_golden.safetensors"); }
std::string generator_file() { return golden_path("make_dit_golden.py"); }

DiTConfig config_of(const st::Reader& r) {
  ModelOptions o;
  o.arch = "dit";
  o.n_layer = meta_int(r, "n_layer");
  o.n_head = meta_int(r, "n_head");
  o.n_embd = meta_int(r, "n_embd");
  for (const char* key : {"ffn_hidden_size", "image_size", "num_channels", "patch_size", "num_classes"})
    o.family[key] = meta_int(r, key);
  o.family["norm_eps"] = static_cast<float>(meta_double(r, "norm_eps"));
  const int grid = meta_int(r, "image_size") / meta_int(r, "patch_size");
  o.block_size = grid * grid;
  DiTConfig c = dit_config_of(o);
  EXPECT_EQ(c.frequency_dim, meta_int(r, "frequency_dim"));
  return c;
}

}  // namespace

TEST(DiTGolden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  const DiTConfig cfg = config_of(r);
  EXPECT_GT(cfg.num_channels, 1);  // the patch element order is tested
  auto backend = make_backend("cpu");
  DiT model(cfg, *backend);
  check_generator_and_params(r, golden_file(), generator_file(), "dit", model,
                             {"images", "noise", "t", "labels", "conditioning", "pred", "loss",
                              "adamw_losses"});
  const int B = meta_int(r, "batch_size"), S = cfg.image_size;
  const Shape image{B, S, S, cfg.num_channels};
  EXPECT_EQ(r.info("images").kiln_shape(), image);
  EXPECT_EQ(r.info("noise").kiln_shape(), image);
  EXPECT_EQ(r.info("t").kiln_shape(), (Shape{B}));
  EXPECT_EQ(r.info("pred").kiln_shape(), (Shape{B, cfg.patches(), cfg.patch_dim()}));
  EXPECT_EQ(r.info("loss").kiln_shape(), (Shape{1}));
  EXPECT_EQ(r.info("adamw_losses").kiln_shape(), (Shape{meta_int(r, "adamw.steps")}));
  for (const char* name : {"labels", "conditioning"}) {
    EXPECT_EQ(r.info(name).kiln_shape(), (Shape{B})) << name;
    EXPECT_EQ(r.info(name).dtype, st::StDType::I32) << name;
  }
  for (float x : r.read_f32("images")) EXPECT_TRUE(x >= -1.f && x <= 1.f) << x;
  for (float t : r.read_f32("t")) EXPECT_TRUE(t > 0.f && t < 1.f) << t;
  const auto labels = r.read_i32("labels"), cond = r.read_i32("conditioning");
  int64_t n_valid = 0;
  bool null_class_trained = false;
  for (int b = 0; b < B; ++b) {
    EXPECT_TRUE(labels[b] == -1 || (labels[b] >= 0 && labels[b] < cfg.num_classes)) << labels[b];
    EXPECT_TRUE(cond[b] == -1 || (cond[b] >= 0 && cond[b] < cfg.num_classes)) << cond[b];
    n_valid += labels[b] != -1;
    null_class_trained |= labels[b] != -1 && cond[b] == -1;
  }
  EXPECT_EQ(n_valid, meta_int(r, "n_targets"));
  EXPECT_LT(n_valid, B);            // an uncounted image is tested
  EXPECT_TRUE(null_class_trained);  // the null class's row has a gradient
  // Every reference gradient is non-zero (the file's adaLN and final weights are random,
  // not kiln's zeros).
  for (const ParamSpec& p : model.params()) {
    double sq = 0;
    for (float x : r.read_f32("grad." + p.name)) sq += static_cast<double>(x) * x;
    EXPECT_GT(sq, 0.0) << "grad." << p.name;
  }
  // The generator decays the 2-D parameters except pos_embed and the label table, as kiln.
  for (const ParamSpec& p : model.params())
    EXPECT_EQ(p.weight_decay, p.shape.ndim() == 2 && p.name != "pos_embed" &&
                                  p.name != "y_embedder.embedding_table.weight")
        << p.name;
  EXPECT_EQ(model.num_parameters(), [&] {
    int64_t n = 0;
    for (const ParamSpec& p : model.params()) n += p.shape.numel();
    return n;
  }());
}

TEST(DiTGolden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  const DiTConfig cfg = config_of(r);
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  const size_t pixels = static_cast<size_t>(cfg.image_size) * cfg.image_size * cfg.num_channels;
  const auto noise_h = r.read_f32("noise"), t_h = r.read_f32("t");
  const auto labels_h = r.read_i32("labels"), cond_h = r.read_i32("conditioning");
  std::vector<size_t> counted;
  for (size_t b = 0; b < labels_h.size(); ++b)
    if (labels_h[b] >= 0) counted.push_back(b);
  for (auto& bep : backends) {
    Backend& be = *bep;
    SCOPED_TRACE("backend " + be.name());
    fmt::print("[{}] DiT golden: {}, B={} ({} counted)\n", be.name(), cfg.str(),
               labels_h.size(), counted.size());
    DiT model(cfg, be);
    FlowCalls calls;
    calls.flow_loss = [&](const Tensor& x0, const std::vector<size_t>& keep, float grad_scale) {
      return model.flow_loss(x0, samples(labels_h, 1, keep), samples(cond_h, 1, keep),
                             samples(noise_h, pixels, keep), samples(t_h, 1, keep), grad_scale);
    };
    calls.predict_velocity = [&](const Tensor& xt, const Tensor& velocity) {
      FlowConditioning cond;
      cond.labels = cond_h;
      model.predict_velocity(xt, t_h, cond, velocity);
    };
    match_flow_golden(r, be, model, cfg, counted, calls);
  }
}
