// LoRA on Llama against a float64 PyTorch reference (tests/golden/lora_golden.safetensors,
// made by tests/golden/make_lora_golden.py: make_llama_golden.py's Llama with adapters of
// rank 4, alpha 8 on q, v, gate, up and down, B nonzero; see tests/golden/README.md).
//
// For every backend the Llama is built with a LoraPlan (ModelStorage::plans), every
// parameter (base and adapters) is copied from the file, and with golden_compare.h's
// bounds: the logits, the mean loss and each adapter's gradient; every other parameter is
// frozen (no gradient); then the losses of 10 AdamW steps over the adapters only
// (whole_segments: the trainable ones), the adapters after them, and the base unchanged;
// and the merged weights W + scale B A (merged_lora_weights, `kiln export --merge-lora`).
#include "golden_compare.h"

#include "backend/registry.h"
#include "core/error.h"
#include "models/llama/llama.h"
#include "model_io/lora_io.h"
#include "models/lora_plan.h"

#include <map>

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string golden_file() { return golden_path("lora_golden.safetensors"); }
std::string generator_file() { return golden_path("make_lora_golden.py"); }

// The adapters after the AdamW steps, relative norm per tensor (plain fp32 PyTorch: 3.2e-7).
constexpr double kFinalTol = 1e-5;
// The merged weights: fp32 inputs, kiln sums in double and rounds once (the file's are
// float64 products rounded once): within an fp32 rounding.
constexpr double kMergedTol = 1e-6;

const nn::LoraSpec kSpec{4, 8.f, false, 0.f};
const std::vector<std::string> kTargets{"q", "v", "gate", "up", "down"};

LoraPlan make_plan() { return LoraPlan(LoraOptions{kSpec, kTargets, "lora golden"}); }

bool is_adapter(const std::string& name) {
  return name.find(".lora_A.weight") != std::string::npos ||
         name.find(".lora_B.weight") != std::string::npos;
}

// The Llama of the file's config with `plan`'s adapters, its base frozen.
struct LoraLlama {
  LoraPlan plan = make_plan();
  std::unique_ptr<Llama> model;
  LoraLlama(const st::Reader& r, Backend& be) {
    const LlamaConfig cfg = llama_config_of(golden_options("llama", r));
    EXPECT_EQ(cfg.padded_vocab_size, meta_int(r, "padded_vocab_size"));
    ModelStorage storage;
    storage.plans = {&plan};
    model = std::make_unique<Llama>(cfg, be, storage);
  }
};

}  // namespace

TEST(LoraGolden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  check_generator(r, golden_file(), generator_file(), "lora");
  EXPECT_EQ(meta_int(r, "lora.rank"), kSpec.rank);
  EXPECT_EQ(meta_double(r, "lora.alpha"), kSpec.alpha);
  EXPECT_EQ(r.metadata("lora.rslora"), "False");
  EXPECT_EQ(meta_double(r, "lora.dropout"), 0.0);
  EXPECT_EQ(r.metadata("lora.targets"), "q,v,gate,up,down");
  auto backend = make_backend("cpu");
  LoraLlama m(r, *backend);
  const Llama& model = *m.model;
  const int n_layer = meta_int(r, "n_layer");
  // The plan adapted q and v of qkv_proj, gate and up of gate_up_proj and down_proj.
  std::vector<std::string> units;
  for (int l = 0; l < n_layer; ++l)
    for (const char* u : {"self_attn.qkv_proj.q", "self_attn.qkv_proj.v", "mlp.gate_up_proj.gate",
                          "mlp.gate_up_proj.up", "mlp.down_proj"})
      units.push_back(fmt::format("model.layers.{}.{}", l, u));
  EXPECT_EQ(m.plan.adapted(), units);

  // The file holds every parameter (the model lays the adapters out first in each part,
  // its trainable region: the names compare as sets), a gradient and a final value of each
  // adapter, and the merged weight of each adapted Linear.
  std::set<std::string> expected{"input_tokens", "target_tokens", "logits", "loss", "adamw_losses"};
  std::vector<std::string> file_params;
  for (const std::string& n : r.names())
    if (r.info(n).dtype == st::StDType::F32 && n.find('.') != std::string::npos &&
        !n.starts_with("grad.") && !n.starts_with("adamw_final.") && !n.starts_with("merged."))
      file_params.push_back(n);
  std::vector<std::string> model_params;
  int adapters = 0;
  for (const ParamSpec& p : model.params()) {
    model_params.push_back(p.name);
    expected.insert(p.name);
    ASSERT_TRUE(r.contains(p.name)) << "the golden file lacks " << p.name;
    EXPECT_EQ(r.info(p.name).dtype, st::StDType::F32) << p.name;
    EXPECT_EQ(r.info(p.name).kiln_shape(), p.shape) << p.name;
    EXPECT_EQ(p.trainable, is_adapter(p.name)) << p.name;  // the base frozen
    if (!p.trainable) continue;
    ++adapters;
    EXPECT_TRUE(p.weight_decay) << p.name;  // AdamW decays every adapter, as the generator
    EXPECT_EQ(p.shape.ndim(), 2) << p.name;
    EXPECT_EQ(p.shape[p.name.find(".lora_A.") != std::string::npos ? 0 : 1], kSpec.rank) << p.name;
    for (const std::string& name : {"grad." + p.name, "adamw_final." + p.name}) {
      expected.insert(name);
      ASSERT_TRUE(r.contains(name)) << "the golden file lacks " << name;
      EXPECT_EQ(r.info(name).dtype, st::StDType::F32) << name;
      EXPECT_EQ(r.info(name).kiln_shape(), p.shape) << name;
    }
  }
  EXPECT_EQ(std::set<std::string>(file_params.begin(), file_params.end()),
            std::set<std::string>(model_params.begin(), model_params.end()));
  EXPECT_EQ(adapters, 2 * 5 * n_layer);
  for (const char* lin : {"self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"})
    for (int l = 0; l < n_layer; ++l) {
      const std::string w = fmt::format("model.layers.{}.{}.weight", l, lin);
      expected.insert("merged." + w);
      ASSERT_TRUE(r.contains("merged." + w));
      EXPECT_EQ(r.info("merged." + w).kiln_shape(), model.spec(w).shape) << w;
    }
  const auto names = r.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);

  const int B = meta_int(r, "batch_size"), T = meta_int(r, "seq_len");
  const int V = model.vocab_size();
  EXPECT_EQ(r.info("logits").kiln_shape(), (Shape{B, T, V}));
  EXPECT_EQ(r.info("adamw_losses").kiln_shape(), (Shape{meta_int(r, "adamw.steps")}));
  int64_t n_valid = 0;
  for (int32_t t : r.read_i32("input_tokens")) EXPECT_TRUE(t >= 0 && t < V) << t;
  for (int32_t t : r.read_i32("target_tokens")) {
    EXPECT_TRUE(t == -1 || (t >= 0 && t < V)) << t;
    n_valid += t != -1;
  }
  EXPECT_EQ(n_valid, meta_int(r, "n_targets"));
  EXPECT_GT(n_valid, 0);
  EXPECT_LT(n_valid, B * T);  // some targets ignored
  // A test that can fail: every B is nonzero, so every A has a gradient.
  for (const ParamSpec& p : model.params()) {
    if (!p.trainable) continue;
    double norm = 0;
    for (float v : r.read_f32(p.name)) norm += double(v) * v;
    EXPECT_GT(norm, 0) << p.name;
    norm = 0;
    for (float v : r.read_f32("grad." + p.name)) norm += double(v) * v;
    EXPECT_GT(norm, 0) << "grad." << p.name;
  }
}

TEST(LoraGolden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  const int B = meta_int(r, "batch_size"), T = meta_int(r, "seq_len");
  const auto tokens_h = r.read_i32("input_tokens"), targets_h = r.read_i32("target_tokens");
  int64_t n_valid = 0;
  for (int32_t t : targets_h) n_valid += t != -1;
  const int steps = meta_int(r, "adamw.steps");
  const AdamWConfig acfg{static_cast<float>(meta_double(r, "adamw.lr")),
                         static_cast<float>(meta_double(r, "adamw.beta1")),
                         static_cast<float>(meta_double(r, "adamw.beta2")),
                         static_cast<float>(meta_double(r, "adamw.eps")),
                         static_cast<float>(meta_double(r, "adamw.weight_decay"))};
  for (auto& bep : backends) {
    Backend& be = *bep;
    const std::string bn = be.name();
    SCOPED_TRACE("backend " + bn);
    LoraLlama m(r, be);
    Llama& model = *m.model;
    fmt::print("[{}] LoRA golden: {} with {}, targets {}, B={} T={}\n", bn, model.config().str(),
               m.plan.what(), r.metadata("lora.targets"), B, T);
    const int V = model.vocab_size(), Vp = model.padded_vocab_size();
    copy_reference_params(r, be, model);
    // ---- the merged weights W + scale B A (kiln export --merge-lora) ----
    double worst_merged = 0;
    for (const auto& [name, merged] : merged_lora_weights(model, m.plan)) {
      const Cmp cm = compare(merged, r.read_f32("merged." + name));
      print_cmp(bn, "merged." + name, cm, kMergedTol);
      EXPECT_LE(cm.rel, kMergedTol) << "merged." << name;
      worst_merged = std::max(worst_merged, cm.rel);
    }
    const Tensor tokens = device_i32(be, tokens_h, Shape{B, T});
    const Tensor targets = device_i32(be, targets_h, Shape{B, T});
    const Batch batch = Batch::of_tokens(tokens, targets);
    const float grad_scale = 1.f / static_cast<float>(n_valid);

    // ---- logits ----
    Tensor logits = be.empty(Shape{B, T, Vp}, DType::F32, MemCategory::Temporaries);
    model.forward_logits(tokens, logits);
    const auto lp = to_host(be, logits);
    std::vector<float> lv(static_cast<size_t>(B) * T * V);
    for (int64_t row = 0; row < int64_t{B} * T; ++row)
      std::copy_n(lp.begin() + row * Vp, V, lv.begin() + row * V);
    const Cmp cl = compare(lv, r.read_f32("logits"));
    print_cmp(bn, "logits", cl, kLogitsTol);
    EXPECT_LE(cl.rel, kLogitsTol) << "logits";

    // ---- loss and the adapters' gradients; the base has none ----
    model.zero_grad();
    const LossSum ls = model.forward(batch, grad_scale);
    model.backward();
    be.synchronize(be.default_stream());
    EXPECT_EQ(ls.targets, n_valid);
    const double loss = ls.sum / static_cast<double>(ls.targets), ref_loss = r.read_f32("loss")[0];
    const double loss_rel = std::fabs(loss - ref_loss) / ref_loss;
    fmt::print("[{}] {:<40} {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, "loss", loss, ref_loss, loss_rel,
               loss_rel <= kLossTol ? "" : "  <-- FAIL");
    EXPECT_LE(loss_rel, kLossTol) << "loss " << loss << " vs " << ref_loss;
    double worst_grad = 0;
    std::string worst_grad_name;
    int frozen = 0;
    for (const ParamSpec& p : model.params()) {
      if (!is_adapter(p.name)) {
        EXPECT_FALSE(p.trainable) << p.name << " should be frozen";
        EXPECT_THROW(model.grad(p), Error) << p.name << " (frozen) has a gradient";
        ++frozen;
        continue;
      }
      ASSERT_TRUE(p.trainable) << p.name;
      const Cmp cg = compare(to_host(be, model.grad(p)), r.read_f32("grad." + p.name));
      print_cmp(bn, "grad." + p.name, cg, kGradTol);
      EXPECT_LE(cg.rel, kGradTol) << "grad." << p.name;
      if (!(cg.rel <= worst_grad)) worst_grad = cg.rel, worst_grad_name = p.name;
    }
    EXPECT_EQ(frozen, static_cast<int>(model.params().size()) - 2 * 5 * meta_int(r, "n_layer"));

    // ---- AdamW steps over the trainable segments (the adapters) ----
    std::vector<AdamWSegment> segs =
        whole_segments(model.params(), model.param_buffer(), model.grad_buffer());
    ASSERT_EQ(segs.size(), size_t{2 * 5} * static_cast<size_t>(meta_int(r, "n_layer")));
    for (const AdamWSegment& s : segs) EXPECT_TRUE(is_adapter(s.spec.name)) << s.spec.name;
    AdamW opt(be, std::move(segs), acfg);
    const auto ref_adam = r.read_f32("adamw_losses");
    double worst_adam = 0;
    int worst_step = -1;
    for (int i = 0; i < steps; ++i) {
      model.zero_grad();
      const double li = model.forward(batch, grad_scale).sum / static_cast<double>(n_valid);
      model.backward();
      opt.step(acfg.lr, 1.f);
      be.synchronize(be.default_stream());
      const double rel = std::fabs(li - ref_adam[i]) / ref_adam[i];
      fmt::print("[{}] adamw step {:2d} loss {:.7f} vs {:.7f}, rel {:.3e}{}\n", bn, i + 1, li,
                 ref_adam[i], rel, rel <= kAdamTol ? "" : "  <-- FAIL");
      EXPECT_LE(rel, kAdamTol) << "AdamW step " << i + 1;
      if (!(rel <= worst_adam)) worst_adam = rel, worst_step = i + 1;
    }
    double worst_final = 0;
    std::string worst_final_name;
    for (const ParamSpec& p : model.params()) {
      const auto now = to_host(be, model.param(p));
      if (!p.trainable) {  // frozen: bitwise the file's
        EXPECT_EQ(now, r.read_f32(p.name)) << p.name << " (frozen) changed";
        continue;
      }
      const Cmp cf = compare(now, r.read_f32("adamw_final." + p.name));
      print_cmp(bn, "adamw_final." + p.name, cf, kFinalTol);
      EXPECT_LE(cf.rel, kFinalTol) << "adamw_final." << p.name;
      if (!(cf.rel <= worst_final)) worst_final = cf.rel, worst_final_name = p.name;
    }
    fmt::print(
        "[{}] SUMMARY worst: logits rel {:.3e} (tol {:.0e}); loss rel {:.3e} (tol {:.0e}); "
        "grad rel {:.3e} in {} (tol {:.0e}); adamw loss rel {:.3e} at step {} (tol {:.0e}); "
        "final adapter rel {:.3e} in {} (tol {:.0e}); merged rel {:.3e} (tol {:.0e})\n",
        bn, cl.rel, kLogitsTol, loss_rel, kLossTol, worst_grad, worst_grad_name, kGradTol,
        worst_adam, worst_step, kAdamTol, worst_final, worst_final_name, kFinalTol, worst_merged,
        kMergedTol);
  }
}
