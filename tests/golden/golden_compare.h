// What the golden tests of every model share (tests/golden/README.md): the tolerances,
// the per-tensor comparison they print, the check that a golden file is what its
// generator writes and holds exactly the model's parameters, and the comparison of a
// model (its parameters copied from the file) with the reference: logits, the mean loss,
// every parameter gradient and the losses of the AdamW steps on the same batch.
#pragma once

#include "backend/backend.h"
#include "checkpoint/safetensors.h"
#include "models/model.h"
#include "models/registry.h"
#include "optim/adamw.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace kiln::golden {

// Tolerances (fp32 kiln against a float64 reference; plain fp32 PyTorch reaches about
// 3e-7 on logits, 7e-7 (GPT-2) and 9e-7 (Llama) on gradients and 2e-7 on the AdamW losses).
constexpr double kLogitsTol = 1e-5;  // relative norm
constexpr double kLossTol = 1e-5;    // relative
constexpr double kGradTol = 1e-4;    // relative norm, per tensor
constexpr double kAdamTol = 1e-5;    // relative, per step

/// A file of tests/golden: from $KILN_SOURCE_DIR (set by ctest), else the build's
/// KILN_GOLDEN_DIR.
inline std::string golden_path(const std::string& name) {
  if (const char* src = std::getenv("KILN_SOURCE_DIR")) return std::string(src) + "/tests/golden/" + name;
  return std::string(KILN_GOLDEN_DIR) + "/" + name;
}

inline int meta_int(const safetensors::Reader& r, const char* key) { return std::stoi(r.metadata(key)); }
inline double meta_double(const safetensors::Reader& r, const char* key) {
  return std::stod(r.metadata(key));
}

struct Cmp {
  double rel = 0;        // ||a - b|| / ||b||
  double max_abs = 0;    // worst |a_i - b_i|
  int64_t worst = -1;    // its index
  double worst_ref = 0;  // b at that index
  double ref_max = 0;    // max |b_i|
};

inline Cmp compare(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  Cmp c;
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
    c.ref_max = std::max(c.ref_max, std::fabs(static_cast<double>(b[i])));
    if (!(std::fabs(d) <= c.max_abs)) {  // also catches NaN
      c.max_abs = std::isnan(d) ? INFINITY : std::fabs(d);
      c.worst = static_cast<int64_t>(i);
      c.worst_ref = b[i];
    }
  }
  c.rel = den > 0 ? std::sqrt(num) / std::sqrt(den) : (num > 0 ? INFINITY : 0.0);
  if (std::isnan(c.rel)) c.rel = INFINITY;
  return c;
}

inline void print_cmp(const std::string& backend, const std::string& what, const Cmp& c, double tol) {
  fmt::print("[{}] {:<40} rel {:.3e}  worst |diff| {:.3e} at [{}] (ref {:+.5e}, max|ref| {:.3e}){}\n",
             backend, what, c.rel, c.max_abs, c.worst, c.worst_ref, c.ref_max,
             c.rel <= tol ? "" : "  <-- FAIL");
}

inline std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(be.default_stream(), v.data(), t);
  return v;
}

inline Tensor device_i32(Backend& be, const std::vector<int32_t>& host, const Shape& shape) {
  Tensor t = be.empty(shape, DType::I32, MemCategory::Activations);
  be.copy_from_host(be.default_stream(), t, host.data());
  return t;
}

inline uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

/// The file was written by `generator` (its FNV-1a 64 hash in the metadata) for model
/// `kind` in float64.
inline void check_generator(const safetensors::Reader& r, const std::string& file,
                            const std::string& generator, const std::string& kind) {
  std::ifstream f(generator, std::ios::binary);
  ASSERT_TRUE(f) << "cannot read " << generator;
  const std::string script{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  EXPECT_EQ(r.metadata("generator_fnv1a64"), fmt::format("{:016x}", fnv1a64(script)))
      << file << " is stale: " << generator << " changed since it was written. "
      << "Regenerate it: /usr/bin/python3 " << generator;
  EXPECT_EQ(r.metadata("kiln.golden"), kind);
  EXPECT_EQ(r.metadata("reference_dtype"), "float64");
  EXPECT_EQ(meta_int(r, "ignore_index"), -1);
}

/// check_generator, and the file holds exactly `model`'s parameters and gradients (fp32,
/// the model's global shapes) besides `inputs`.
inline void check_generator_and_params(const safetensors::Reader& r, const std::string& file,
                                       const std::string& generator, const std::string& kind,
                                       const Model& model, std::set<std::string> inputs) {
  namespace st = safetensors;
  check_generator(r, file, generator, kind);
  for (const ParamSpec& p : model.params()) {
    inputs.insert(p.name);
    inputs.insert("grad." + p.name);
    for (const std::string& name : {p.name, "grad." + p.name}) {
      ASSERT_TRUE(r.contains(name)) << "the golden file lacks " << name;
      EXPECT_EQ(r.info(name).dtype, st::StDType::F32) << name;
      EXPECT_EQ(r.info(name).kiln_shape(), p.shape) << name;
    }
  }
  const auto names = r.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), inputs);
}

/// check_generator_and_params for a language model's file (tokens, targets, logits [B,T,V],
/// loss, AdamW losses, and the generator's `more_outputs`), with consistent shapes; decay
/// exactly on the parameters of 2 or more dimensions (matrices, stacked expert matrices);
/// the targets' count is as recorded and rows V.. of `padded_rows` parameters [Vp, C] are
/// zero.
inline void check_file_matches(const safetensors::Reader& r, const std::string& file,
                               const std::string& generator, const std::string& kind,
                               Model& model, const std::vector<std::string>& padded_rows,
                               const std::set<std::string>& more_outputs = {}) {
  namespace st = safetensors;
  std::set<std::string> outputs{"input_tokens", "target_tokens", "logits", "loss", "adamw_losses"};
  outputs.insert(more_outputs.begin(), more_outputs.end());
  check_generator_and_params(r, file, generator, kind, model, outputs);
  const int B = meta_int(r, "batch_size"), T = meta_int(r, "seq_len");
  const LanguageModel& lm = as_language_model(model, file);
  const int V = lm.vocab_size();
  EXPECT_LE(T, lm.max_positions());
  // The generators decay exactly the parameters of 2 or more dimensions (embeddings,
  // linear weights, stacked experts).
  for (const ParamSpec& p : model.params()) EXPECT_EQ(p.weight_decay, p.shape.ndim() >= 2) << p.name;
  EXPECT_EQ(r.info("input_tokens").kiln_shape(), (Shape{B, T}));
  EXPECT_EQ(r.info("input_tokens").dtype, st::StDType::I32);
  EXPECT_EQ(r.info("target_tokens").kiln_shape(), (Shape{B, T}));
  EXPECT_EQ(r.info("target_tokens").dtype, st::StDType::I32);
  EXPECT_EQ(r.info("logits").kiln_shape(), (Shape{B, T, V}));
  EXPECT_EQ(r.info("loss").kiln_shape(), (Shape{1}));
  EXPECT_EQ(r.info("adamw_losses").kiln_shape(), (Shape{meta_int(r, "adamw.steps")}));
  int64_t n_valid = 0;
  for (int32_t t : r.read_i32("input_tokens")) EXPECT_TRUE(t >= 0 && t < V) << t;
  for (int32_t t : r.read_i32("target_tokens")) {
    EXPECT_TRUE(t == -1 || (t >= 0 && t < V)) << t;
    n_valid += t != -1;
  }
  EXPECT_EQ(n_valid, meta_int(r, "n_targets"));
  for (const std::string& name : padded_rows) {
    const auto w = r.read_f32(name);
    const size_t C = w.size() / static_cast<size_t>(lm.padded_vocab_size());
    for (size_t i = static_cast<size_t>(V) * C; i < w.size(); ++i) ASSERT_EQ(w[i], 0.f) << name;
  }
}

/// The [model] options of golden file `r` of architecture `arch` ("gpt2": the shape;
/// "llama": also n_kv_head, ffn_hidden_size, norm_eps, the rope and tie_embeddings).
inline ModelOptions golden_options(const std::string& arch, const safetensors::Reader& r) {
  ModelOptions o;
  o.arch = arch;
  o.n_layer = meta_int(r, "n_layer");
  o.n_head = meta_int(r, "n_head");
  o.n_embd = meta_int(r, "n_embd");
  o.vocab_size = meta_int(r, "vocab_size");
  o.block_size = meta_int(r, "block_size");
  if (arch == "llama") {
    for (const char* key : {"n_kv_head", "ffn_hidden_size"}) o.family[key] = meta_int(r, key);
    o.family["norm_eps"] = static_cast<float>(meta_double(r, "norm_eps"));
    for (const char* key : {"rope_theta", "rope_scaling.factor", "rope_scaling.low_freq_factor",
                            "rope_scaling.high_freq_factor", "rope_scaling.original_max_position"})
      o.family[key] = meta_double(r, key);
    o.family["tie_embeddings"] = r.metadata("tie_embeddings") == "True" ? 1 : 0;
  }
  return o;
}

/// logits [B,T,Vp] (fp32) of tokens int32 [B,T]: the model's inference forward.
using ForwardLogits = std::function<void(const Tensor& tokens, const Tensor& logits)>;

/// Copies the file's parameters into `model` (on `be`).
inline void copy_reference_params(const safetensors::Reader& r, Backend& be, Model& model) {
  for (const ParamSpec& p : model.params()) {
    const auto v = r.read_f32(p.name);
    ASSERT_EQ(static_cast<int64_t>(v.size()), p.shape.numel()) << p.name;
    be.copy_from_host(be.default_stream(), model.param(p), v.data());
  }
}

/// The worst errors of match_training.
struct TrainingMatch {
  double loss_rel = 0, worst_grad = 0, worst_adam = 0;
  std::string worst_grad_name;
  int worst_step = -1;
};

/// With the file's parameters in `model`: `forward(grad_scale)` (one forward with
/// gradient of the file's batch, n_valid targets) against the file's loss, every
/// trainable gradient after backward() against "grad.<name>", and the file's AdamW steps'
/// losses (of the trainable parameters),
/// printing each error.
inline TrainingMatch match_training(const safetensors::Reader& r, Backend& be, Model& model,
                                    int64_t n_valid,
                                    const std::function<LossSum(float grad_scale)>& forward) {
  const std::string bn = be.name();
  const int steps = meta_int(r, "adamw.steps");
  const AdamWConfig acfg{static_cast<float>(meta_double(r, "adamw.lr")),
                         static_cast<float>(meta_double(r, "adamw.beta1")),
                         static_cast<float>(meta_double(r, "adamw.beta2")),
                         static_cast<float>(meta_double(r, "adamw.eps")),
                         static_cast<float>(meta_double(r, "adamw.weight_decay"))};
  const double ref_loss = r.read_f32("loss")[0];
  const auto ref_adam = r.read_f32("adamw_losses");
  // ---- loss and gradients ----
  model.zero_grad();
  const LossSum ls = forward(1.f / static_cast<float>(n_valid));
  model.backward();
  be.synchronize(be.default_stream());
  EXPECT_EQ(ls.targets, n_valid);
  const double loss = ls.sum / static_cast<double>(ls.targets);
  const double loss_rel = std::fabs(loss - ref_loss) / ref_loss;
  fmt::print("[{}] {:<40} {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, "loss", loss, ref_loss, loss_rel,
             loss_rel <= kLossTol ? "" : "  <-- FAIL");
  EXPECT_LE(loss_rel, kLossTol) << "loss " << loss << " vs " << ref_loss;
  TrainingMatch m;
  m.loss_rel = loss_rel;
  for (const ParamSpec& p : model.params()) {
    if (!p.trainable) continue;  // frozen: no gradient
    const Cmp cg = compare(to_host(be, model.grad(p)), r.read_f32("grad." + p.name));
    print_cmp(bn, "grad." + p.name, cg, kGradTol);
    EXPECT_LE(cg.rel, kGradTol) << "grad." << p.name;
    if (!(cg.rel <= m.worst_grad)) {
      m.worst_grad = cg.rel;
      m.worst_grad_name = p.name;
    }
  }

  // ---- AdamW steps on the same batch ----
  AdamW opt(be, model.params(), model.param_buffer(), model.grad_buffer(), acfg);
  for (int i = 0; i < steps; ++i) {
    model.zero_grad();
    const double li =
        forward(1.f / static_cast<float>(n_valid)).sum /
        static_cast<double>(n_valid);
    model.backward();
    opt.step(acfg.lr, 1.f);
    be.synchronize(be.default_stream());
    const double rel = std::fabs(li - ref_adam[i]) / ref_adam[i];
    fmt::print("[{}] adamw step {:2d} loss {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, i + 1, li,
               ref_adam[i], rel, rel <= kAdamTol ? "" : "  <-- FAIL");
    EXPECT_LE(rel, kAdamTol) << "AdamW step " << i + 1;
    if (!(rel <= m.worst_adam)) {
      m.worst_adam = rel;
      m.worst_step = i + 1;
    }
  }
  return m;
}

/// With the file's parameters in `model`: compares `logits()` (kiln's logits, laid out as
/// the file's "logits"), the mean loss of `batch` (n_valid targets), every gradient and
/// the losses of the file's AdamW steps with the reference, printing each error and a
/// SUMMARY line.
inline void match_reference_batch(const safetensors::Reader& r, Backend& be, Model& model,
                                  const Batch& batch, int64_t n_valid,
                                  const std::function<std::vector<float>()>& logits) {
  const std::string bn = be.name();
  const auto ref_logits = r.read_f32("logits");

  // ---- logits ----
  const Cmp cl = compare(logits(), ref_logits);
  print_cmp(bn, "logits", cl, kLogitsTol);
  EXPECT_LE(cl.rel, kLogitsTol) << "logits";

  const TrainingMatch m = match_training(r, be, model, n_valid, [&](float g) {
    return model.forward(batch, g);
  });
  fmt::print(
      "[{}] SUMMARY worst: logits rel {:.3e} (tol {:.0e}); loss rel {:.3e} (tol {:.0e}); "
      "grad rel {:.3e} in {} (tol {:.0e}); adamw loss rel {:.3e} at step {} (tol {:.0e})\n",
      bn, cl.rel, kLogitsTol, m.loss_rel, kLossTol, m.worst_grad, m.worst_grad_name, kGradTol,
      m.worst_adam, m.worst_step, kAdamTol);
}

/// A language model against the file: tokens and targets [B,T] from it, logits [B,T,V]
/// (the padded columns dropped) from `forward_logits`.
inline void match_reference(const safetensors::Reader& r, Backend& be, Model& model,
                            const ForwardLogits& forward_logits) {
  const int B = meta_int(r, "batch_size"), T = meta_int(r, "seq_len");
  const LanguageModel& lm = as_language_model(model, "golden");
  const int V = lm.vocab_size(), Vp = lm.padded_vocab_size();
  const auto tokens_h = r.read_i32("input_tokens");
  const auto targets_h = r.read_i32("target_tokens");
  int64_t n_valid = 0;
  for (int32_t t : targets_h) n_valid += t != -1;
  copy_reference_params(r, be, model);
  const Tensor tokens = device_i32(be, tokens_h, Shape{B, T});
  const Tensor targets = device_i32(be, targets_h, Shape{B, T});
  match_reference_batch(r, be, model, Batch::of_tokens(tokens, targets), n_valid, [&] {
    Tensor logits = be.empty(Shape{B, T, Vp}, DType::F32, MemCategory::Temporaries);
    forward_logits(tokens, logits);
    const auto lp = to_host(be, logits);
    std::vector<float> lv(static_cast<size_t>(B) * T * V);
    for (int64_t row = 0; row < static_cast<int64_t>(B) * T; ++row)
      std::copy_n(lp.begin() + row * Vp, V, lv.begin() + row * V);
    return lv;
  });
}

/// The names of the packed-documents case (make_gpt2_golden.py's PACKED_DOCS) in a file:
/// packed.positions, packed.cu_seqlens, packed.loss and packed.grad.<param>.
inline std::set<std::string> packed_outputs(const Model& model) {
  std::set<std::string> out{"packed.positions", "packed.cu_seqlens", "packed.loss"};
  for (const ParamSpec& p : model.params()) out.insert("packed.grad." + p.name);
  return out;
}

/// The packed-documents case: the file's parameters and batch, with the file's positions
/// (restarting at each document) and cu_seqlens as the batch's inputs, against the
/// reference's loss and gradients with attention masked to each document.
inline void match_packed(const safetensors::Reader& r, Backend& be, Model& model) {
  const std::string bn = be.name();
  const int B = meta_int(r, "batch_size"), T = meta_int(r, "seq_len");
  const auto targets_h = r.read_i32("target_tokens");
  int64_t n_valid = 0;
  for (int32_t t : targets_h) n_valid += t != -1;
  copy_reference_params(r, be, model);
  Batch batch = Batch::of_tokens(device_i32(be, r.read_i32("input_tokens"), Shape{B, T}),
                                 device_i32(be, targets_h, Shape{B, T}),
                                 device_i32(be, r.read_i32("packed.positions"), Shape{B, T}));
  batch.set("cu_seqlens", device_i32(be, r.read_i32("packed.cu_seqlens"), Shape{int64_t{B} * T + 1}));
  model.zero_grad();
  const LossSum ls = model.forward(batch, 1.f / static_cast<float>(n_valid));
  model.backward();
  be.synchronize(be.default_stream());
  const double loss = ls.sum / static_cast<double>(ls.targets), ref = r.read_f32("packed.loss")[0];
  const double loss_rel = std::fabs(loss - ref) / ref;
  fmt::print("[{}] {:<40} {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, "packed.loss", loss, ref, loss_rel,
             loss_rel <= kLossTol ? "" : "  <-- FAIL");
  EXPECT_LE(loss_rel, kLossTol) << "packed loss " << loss << " vs " << ref;
  double worst = 0;
  for (const ParamSpec& p : model.params()) {
    const Cmp cg = compare(to_host(be, model.grad(p)), r.read_f32("packed.grad." + p.name));
    print_cmp(bn, "packed.grad." + p.name, cg, kGradTol);
    EXPECT_LE(cg.rel, kGradTol) << "packed.grad." << p.name;
    worst = std::max(worst, cg.rel);
  }
  fmt::print("[{}] SUMMARY packed documents: loss rel {:.3e}, worst grad rel {:.3e}\n", bn,
             loss_rel, worst);
}

}  // namespace kiln::golden
