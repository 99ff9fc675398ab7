// What the golden tests of the flow models (DiT, MMDiT) share beside golden_compare.h:
// patchify on the host, a subset of a batch's samples, host values on the device, and the
// three comparisons of a flow model with its file (match_flow_golden).
#pragma once

#include "golden_compare.h"

#include "backend/backend.h"
#include "models/vision_config.h"

#include <functional>
#include <vector>

namespace kiln::golden {

/// Backend::patchify on the host: [B,S,S,Ci] -> [B,N,Ci*P*P].
inline std::vector<float> patchify_host(const std::vector<float>& images, const VisionShape& c) {
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

inline Tensor device_f32(Backend& be, const std::vector<float>& host, const Shape& shape) {
  Tensor t = be.empty(shape, DType::F32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), t, host.data());
  return t;
}

/// xt = (1 - t) x0 + t noise per sample of `pixels` values, as
/// Backend::rectified_flow_inputs (fp32).
inline std::vector<float> noisy_images(const std::vector<float>& x0, const std::vector<float>& noise,
                                       const std::vector<float>& t, size_t pixels) {
  std::vector<float> xt(x0.size());
  for (size_t i = 0; i < xt.size(); ++i) {
    const float ti = t[i / pixels];
    xt[i] = (1.f - ti) * x0[i] + ti * noise[i];
  }
  return xt;
}

/// How a test runs its flow model on the file's batch, whatever it is conditioned on.
struct FlowCalls {
  /// flow_loss of the file's samples `keep` (x0 fp32 [keep.size(),S,S,C] on the device:
  /// theirs) at the file's noise, times and conditioning, with grad_scale.
  std::function<LossSum(const Tensor& x0, const std::vector<size_t>& keep, float grad_scale)>
      flow_loss;
  /// predict_velocity of every sample of the file at xt fp32 [B,S,S,C] into velocity.
  std::function<void(const Tensor& xt, const Tensor& velocity)> predict_velocity;
};

/// On backend `be`, with the file's parameters copied into `model`: the evaluation loss
/// of the whole batch (the images not in `counted` left out), pred [B,N,D] of every image
/// (predict_velocity on xt, patchified back), then the loss, every gradient and the AdamW
/// losses of the training step on the `counted` images alone (flow_loss refuses an
/// uncounted training image; the images are independent, so that is the reference's
/// gradient of the mean over the counted images). Prints each error and a summary line.
inline void match_flow_golden(const safetensors::Reader& r, Backend& be, Model& model,
                              const VisionShape& cfg, const std::vector<size_t>& counted,
                              const FlowCalls& calls) {
  const std::string bn = be.name();
  const int B = meta_int(r, "batch_size"), S = cfg.image_size, Ci = cfg.num_channels;
  const size_t pixels = static_cast<size_t>(S) * S * Ci;
  const auto x0_h = r.read_f32("images"), noise_h = r.read_f32("noise"), t_h = r.read_f32("t");
  const double ref_loss = r.read_f32("loss")[0];
  const auto n_valid = static_cast<int64_t>(counted.size());
  copy_reference_params(r, be, model);
  const Shape image{B, S, S, Ci};
  std::vector<size_t> all(static_cast<size_t>(B));
  for (size_t b = 0; b < all.size(); ++b) all[b] = b;

  // ---- evaluation of the whole batch: the loss over the counted images ----
  const LossSum ev = calls.flow_loss(device_f32(be, x0_h, image), all, 0.f);
  EXPECT_EQ(ev.targets, n_valid);
  const double eval_loss = ev.sum / static_cast<double>(n_valid);
  const double eval_rel = std::fabs(eval_loss - ref_loss) / ref_loss;
  fmt::print("[{}] {:<40} {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, "evaluation loss", eval_loss,
             ref_loss, eval_rel, eval_rel <= kLossTol ? "" : "  <-- FAIL");
  EXPECT_LE(eval_rel, kLossTol) << "evaluation loss";

  // ---- pred of every image (the uncounted ones too): predict_velocity on xt ----
  const Tensor xt = device_f32(be, noisy_images(x0_h, noise_h, t_h, pixels), image);
  const Tensor velocity = be.empty(image, DType::F32, MemCategory::Activations);
  calls.predict_velocity(xt, velocity);
  const Cmp cp = compare(patchify_host(to_host(be, velocity), cfg), r.read_f32("pred"));
  print_cmp(bn, "pred", cp, kLogitsTol);
  EXPECT_LE(cp.rel, kLogitsTol) << "pred";

  // ---- the training step on the counted images: loss and every gradient ----
  const Tensor x0c = device_f32(be, samples(x0_h, pixels, counted),
                                Shape{static_cast<int64_t>(counted.size()), S, S, Ci});
  const TrainingMatch m = match_training(r, be, model, n_valid, [&](float grad_scale) {
    return calls.flow_loss(x0c, counted, grad_scale);
  });
  fmt::print(
      "[{}] SUMMARY worst: pred rel {:.3e} (tol {:.0e}); loss rel {:.3e}, evaluation {:.3e} "
      "(tol {:.0e}); grad rel {:.3e} in {} (tol {:.0e}); adamw loss rel {:.3e} at step {} "
      "(tol {:.0e})\n",
      bn, cp.rel, kLogitsTol, m.loss_rel, eval_rel, kLossTol, m.worst_grad, m.worst_grad_name,
      kGradTol, m.worst_adam, m.worst_step, kAdamTol);
}

}  // namespace kiln::golden
