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

/// Backend::patchify on the host: [B,S,S,Ci] -> [B,N,Ci*P*P].
std::vector<float> patchify_host(const std::vector<float>& images, const DiTConfig& c) {
  const int S = c.image_size, Ci = c.num_channels, P = c.patch_size, G = S / P;
  const int N = c.patches(), D = c.patch_dim();
  const size_t B = images.size() / (static_cast<size_t>(S) * S * Ci);
  std::vector<float> out(B * N * D);
  for (size_t b = 0; b < B; ++b)
    for (int py = 0; py < G; ++py)
      for (int px = 0; px < G; ++px)
        for (int ch = 0; ch < Ci; ++ch)
          for (int dy = 0; dy < P; ++dy)
            for (int dx = 0; dx < P; ++dx)
              out[(b * N + py * G + px) * D + ch * P * P + dy * P + dx] =
                  images[((b * S + py * P + dy) * S + px * P + dx) * Ci + ch];
  return out;
}

/// The samples `keep` of a host array of samples of `per` elements each.
template <class T>
std::vector<T> samples(const std::vector<T>& v, size_t per, const std::vector<size_t>& keep) {
  std::vector<T> out;
  for (size_t b : keep) out.insert(out.end(), v.begin() + b * per, v.begin() + (b + 1) * per);
  return out;
}

Tensor device_f32(Backend& be, const std::vector<float>& host, const Shape& shape) {
  Tensor t = be.empty(shape, DType::F32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), t, host.data());
  return t;
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
  const int B = meta_int(r, "batch_size"), S = cfg.image_size, Ci = cfg.num_channels;
  const size_t pixels = static_cast<size_t>(S) * S * Ci;
  const auto x0_h = r.read_f32("images"), noise_h = r.read_f32("noise"), t_h = r.read_f32("t");
  const auto labels_h = r.read_i32("labels"), cond_h = r.read_i32("conditioning");
  const auto ref_pred = r.read_f32("pred");
  const double ref_loss = r.read_f32("loss")[0];
  std::vector<size_t> counted;
  for (size_t b = 0; b < labels_h.size(); ++b)
    if (labels_h[b] >= 0) counted.push_back(b);
  const auto n_valid = static_cast<int64_t>(counted.size());
  const int Bc = static_cast<int>(n_valid);
  // xt = (1 - t) x0 + t noise, as Backend::rectified_flow_inputs (fp32).
  std::vector<float> xt_h(x0_h.size());
  for (size_t i = 0; i < xt_h.size(); ++i) {
    const float t = t_h[i / pixels];
    xt_h[i] = (1.f - t) * x0_h[i] + t * noise_h[i];
  }
  for (auto& bep : backends) {
    Backend& be = *bep;
    const std::string bn = be.name();
    SCOPED_TRACE("backend " + bn);
    fmt::print("[{}] DiT golden: {}, B={} ({} counted)\n", bn, cfg.str(), B, n_valid);
    DiT model(cfg, be);
    copy_reference_params(r, be, model);
    const Shape image{B, S, S, Ci};

    // ---- evaluation of the whole batch: the loss over the counted images ----
    const Tensor x0 = device_f32(be, x0_h, image);
    const LossSum ev = model.flow_loss(x0, labels_h, cond_h, noise_h, t_h, 0.f);
    EXPECT_EQ(ev.targets, n_valid);
    const double eval_loss = ev.sum / static_cast<double>(n_valid);
    const double eval_rel = std::fabs(eval_loss - ref_loss) / ref_loss;
    fmt::print("[{}] {:<40} {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, "evaluation loss", eval_loss,
               ref_loss, eval_rel, eval_rel <= kLossTol ? "" : "  <-- FAIL");
    EXPECT_LE(eval_rel, kLossTol) << "evaluation loss";

    // ---- pred of every image (the uncounted one too): predict_velocity on xt ----
    const Tensor xt = device_f32(be, xt_h, image);
    const Tensor velocity = be.empty(image, DType::F32, MemCategory::Activations);
    model.predict_velocity(xt, t_h, FlowConditioning{cond_h}, velocity);
    const Cmp cp = compare(patchify_host(to_host(be, velocity), cfg), ref_pred);
    print_cmp(bn, "pred", cp, kLogitsTol);
    EXPECT_LE(cp.rel, kLogitsTol) << "pred";

    // ---- the training step on the counted images: loss and every gradient ----
    const Tensor x0c = device_f32(be, samples(x0_h, pixels, counted), Shape{Bc, S, S, Ci});
    const auto noise_c = samples(noise_h, pixels, counted);
    const auto t_c = samples(t_h, 1, counted);
    const auto labels_c = samples(labels_h, 1, counted), cond_c = samples(cond_h, 1, counted);
    const TrainingMatch m = match_training(r, be, model, n_valid, [&](float grad_scale) {
      return model.flow_loss(x0c, labels_c, cond_c, noise_c, t_c, grad_scale);
    });
    fmt::print(
        "[{}] SUMMARY worst: pred rel {:.3e} (tol {:.0e}); loss rel {:.3e}, evaluation {:.3e} "
        "(tol {:.0e}); grad rel {:.3e} in {} (tol {:.0e}); adamw loss rel {:.3e} at step {} "
        "(tol {:.0e})\n",
        bn, cp.rel, kLogitsTol, m.loss_rel, eval_rel, kLossTol, m.worst_grad, m.worst_grad_name,
        kGradTol, m.worst_adam, m.worst_step, kAdamTol);
  }
}
