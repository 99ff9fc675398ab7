// The mixture-of-experts Llama against a float64 PyTorch reference
// (tests/golden/moe_{softmax,sigmoid,capacity}_golden.safetensors, made by
// tests/golden/make_moe_golden.py: a 2-block Qwen3-MoE-like decoder with QK-norm, head_dim
// != n_embd / n_head, 5 experts, top-2, a shared expert; softmax scoring with transformers'
// aux loss, sigmoid scoring with the per-layer aux loss, and softmax with the per-layer aux
// loss and token dropping (moe.capacity_factor 0.8); z-loss in all; see
// tests/golden/README.md).
//
// As the Llama golden test, with its bounds (golden_compare.h): for every backend with the
// MoE ops, the file's parameters are copied into the model built from the file's [model]
// keys (given as TOML, the user's form); logits, the LM loss, every gradient (of LM + aux +
// z) and the LM losses of 10 AdamW steps on the total loss are compared with the
// reference; then the aux loss, the z-loss and the tokens per expert.

#include "golden_compare.h"

#include "backend/registry.h"
#include "config/components.h"
#include "config/config.h"
#include "core/error.h"
#include "models/decoder_model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

const std::vector<std::string> kCases{"softmax", "sigmoid", "capacity"};

std::string golden_file(const std::string& c) {
  return golden_path("moe_" + c + "_golden.safetensors");
}
std::string generator_file() { return golden_path("make_moe_golden.py"); }

// The file's outputs beyond a language model's (check_file_matches).
const std::set<std::string> kMoeOutputs{"aux_loss", "z_loss", "total_loss", "tokens_per_expert",
                                        "adamw_aux_losses", "adamw_z_losses"};

// The [model] section of the file's configuration as TOML: the metadata values are Python
// literals (ints, floats, True/False, bare strings).
std::string model_toml(const st::Reader& r) {
  std::string s = "[model]\narch = \"llama\"\n";
  for (const char* key : {"n_layer", "n_head", "n_kv_head", "n_embd", "head_dim", "ffn_hidden_size",
                          "vocab_size", "block_size", "norm_eps", "rope_theta", "moe.num_experts",
                          "moe.top_k", "moe.ffn_hidden_size", "moe.shared_experts",
                          "moe.aux_loss_coef", "moe.z_loss_coef", "moe.capacity_factor"})
    s += fmt::format("{} = {}\n", key, r.metadata(key));
  for (const char* key : {"qk_norm", "tie_embeddings", "moe.norm_topk_prob"})
    s += fmt::format("{} = {}\n", key, r.metadata(key) == "True" ? "true" : "false");
  for (const char* key : {"moe.scoring", "moe.aux_loss_type"})
    s += fmt::format("{} = \"{}\"\n", key, r.metadata(key));
  return s;
}

// The model of the file's keys on `be`; nullptr with the loader's message in `missing`
// when kiln does not know one of them yet. Any other error is the test's failure.
std::unique_ptr<Model> moe_model(const st::Reader& r, Backend& be) {
  const TrainConfig config = load_config_string(model_toml(r), {}, "moe golden [model]");
  return make_model(model_options_from(config), be);
}

// What a MoE model reports beyond the LM loss, of the training forwards since the last
// report.
struct MoeReport {
  double aux = 0, z = 0;                  // the aux and z losses, coefficients applied
  std::vector<int64_t> tokens_per_expert;  // [n_layer * E]: (token, choice) slots per expert
};

// The figures the model reports (Model::take_moe_stats: the aux and z losses of the
// micro-batches since the last call, their mean, and the slots each expert received).
std::optional<MoeReport> moe_report_of(Model& model) {
  const std::optional<MoeStats> s = model.take_moe_stats();
  if (!s) return std::nullopt;
  MoeReport r{s->aux_loss, s->z_loss, {}};
  for (const std::vector<double>& layer : s->tokens_per_expert)
    for (double c : layer) r.tokens_per_expert.push_back(static_cast<int64_t>(c));
  return r;
}

// With the file's parameters in `model`: one training forward and backward of the file's
// batch (its report emptied first), then the aux and z losses and the tokens per expert
// against the reference.
void match_moe_report(const st::Reader& r, Backend& be, Model& model) {
  const int B = meta_int(r, "batch_size"), T = meta_int(r, "seq_len");
  copy_reference_params(r, be, model);
  const Tensor tokens = device_i32(be, r.read_i32("input_tokens"), Shape{B, T});
  const Tensor targets = device_i32(be, r.read_i32("target_tokens"), Shape{B, T});
  (void)moe_report_of(model);  // the AdamW steps' figures
  model.zero_grad();
  model.forward(Batch::of_tokens(tokens, targets), 1.f / meta_int(r, "n_targets"));
  model.backward();
  be.synchronize(be.default_stream());
  const std::optional<MoeReport> rep = moe_report_of(model);
  if (!rep) {
    ADD_FAILURE() << "the MoE model reports no balancing figures (Model::take_moe_stats)";
    return;
  }
  for (const auto& [name, got] :
       {std::pair{"aux_loss", rep->aux}, std::pair{"z_loss", rep->z}}) {
    const double ref = r.read_f32(name)[0], rel = std::fabs(got - ref) / ref;
    fmt::print("[{}] {:<40} {:.7f} vs {:.7f}, rel {:.3e}{}\n", be.name(), name, got, ref, rel,
               rel <= kLossTol ? "" : "  <-- FAIL");
    EXPECT_LE(rel, kLossTol) << name;
  }
  const auto ref_tpe = r.read_i32("tokens_per_expert");
  EXPECT_EQ(rep->tokens_per_expert, std::vector<int64_t>(ref_tpe.begin(), ref_tpe.end()));
}

// What the file must hold to test what it claims: the configuration, routing that leaves
// an expert without tokens and, with a capacity, experts chosen past it (dropped slots).
void check_moe_file(const st::Reader& r, const std::string& c) {
  EXPECT_EQ(r.metadata("case"), c);
  EXPECT_EQ(r.metadata("moe.scoring"), c == "sigmoid" ? "sigmoid" : "softmax");
  EXPECT_NE(meta_int(r, "head_dim") * meta_int(r, "n_head"), meta_int(r, "n_embd"));
  EXPECT_EQ(r.metadata("qk_norm"), "True");
  EXPECT_GT(meta_int(r, "moe.shared_experts"), 0);
  EXPECT_GT(meta_double(r, "moe.aux_loss_coef"), 0.0);
  EXPECT_GT(meta_double(r, "moe.z_loss_coef"), 0.0);
  // Every token is routed top_k times per layer; the dead expert gets none in layer 0.
  const int L = meta_int(r, "n_layer"), E = meta_int(r, "moe.num_experts");
  const int slots = meta_int(r, "batch_size") * meta_int(r, "seq_len") * meta_int(r, "moe.top_k");
  EXPECT_EQ(r.info("tokens_per_expert").kiln_shape(), (Shape{L, E}));
  const auto tpe = r.read_i32("tokens_per_expert");
  for (int l = 0; l < L; ++l)
    EXPECT_EQ(std::accumulate(tpe.begin() + l * E, tpe.begin() + (l + 1) * E, 0), slots) << l;
  EXPECT_EQ(tpe[meta_int(r, "dead_expert")], 0);
  const double factor = meta_double(r, "moe.capacity_factor");
  EXPECT_EQ(factor > 0, c == "capacity");
  if (factor > 0) {  // capacity = ceil(slots / E x factor): some expert of each layer over it
    const int capacity = static_cast<int>(std::ceil(double(slots) / E * factor));
    for (int l = 0; l < L; ++l)
      EXPECT_GT(*std::max_element(tpe.begin() + l * E, tpe.begin() + (l + 1) * E), capacity)
          << "layer " << l << " drops no slot at capacity " << capacity;
  }
  const double total =
      r.read_f32("loss")[0] + r.read_f32("aux_loss")[0] + r.read_f32("z_loss")[0];
  EXPECT_NEAR(r.read_f32("total_loss")[0], total, 1e-6 * total);
}

}  // namespace

TEST(MoeGolden, FilesMatchGeneratorAndModel) {
  for (const std::string& c : kCases) {
    SCOPED_TRACE(golden_file(c));
    const st::Reader r(golden_file(c));
    check_moe_file(r, c);
    auto backend = make_backend("cpu");
    std::unique_ptr<Model> model = moe_model(r, *backend);
    check_file_matches(r, golden_file(c), generator_file(), "moe", *model,
                       {"model.embed_tokens.weight", "lm_head.weight"}, kMoeOutputs);
  }
}

TEST(MoeGolden, MatchesReferenceOnEveryBackend) {
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  for (const std::string& c : kCases) {
    SCOPED_TRACE(golden_file(c));
    const st::Reader r(golden_file(c));
    for (auto& bep : backends) {
      Backend& be = *bep;
      SCOPED_TRACE("backend " + be.name());
      if (!be.supports(OpFamily::MoE, DType::F32)) {
        fmt::print("[{}] skipped: no MoE ops on this backend\n", be.name());
        continue;
      }
      std::unique_ptr<Model> model = moe_model(r, be);
      fmt::print("[{}] MoE golden ({}): {}, B={} T={}\n", be.name(), c, model->describe(),
                 meta_int(r, "batch_size"), meta_int(r, "seq_len"));
      auto& decoder = dynamic_cast<DecoderModel&>(*model);
      match_reference(r, be, *model, [&](const Tensor& tokens, const Tensor& logits) {
        decoder.forward_logits(tokens, logits);
      });
      match_moe_report(r, be, *model);
    }
  }
}
