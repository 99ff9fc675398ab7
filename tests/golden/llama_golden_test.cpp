// Llama against a float64 PyTorch reference (tests/golden/llama_golden.safetensors, made by
// tests/golden/make_llama_golden.py: RMSNorm, rotate-half RoPE with the llama3 frequency
// rescaling, grouped-query attention and SwiGLU written out in plain torch, Hugging Face's
// LlamaForCausalLM computation; see tests/golden/README.md).
//
// As the GPT-2 golden test, with its bounds (golden_compare.h): for every backend the
// file's parameters (q/k/v and gate/up fused by the generator into kiln's qkv_proj and
// gate_up_proj) are copied into the model; logits, the mean loss, every gradient and
// the losses of 10 AdamW steps are compared with the reference; then the packed-documents
// case (loss and gradients).
#include "golden_compare.h"

#include "backend/registry.h"
#include "models/llama/llama.h"

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string golden_file() { return golden_path("llama_golden.safetensors"); }
std::string generator_file() { return golden_path("make_llama_golden.py"); }

// The file's config; its padded vocabulary is the one kiln pads to.
LlamaConfig config_of(const st::Reader& r) {
  const LlamaConfig c = llama_config_of(golden_options("llama", r));
  EXPECT_EQ(c.padded_vocab_size, meta_int(r, "padded_vocab_size"));
  return c;
}

}  // namespace

TEST(LlamaGolden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  const LlamaConfig cfg = config_of(r);
  EXPECT_GT(cfg.rope.scale_factor, 0.0);           // rope scaling on
  EXPECT_LT(cfg.n_kv_head, cfg.n_head);            // grouped-query
  auto backend = make_backend("cpu");
  Llama model(cfg, *backend);
  check_file_matches(r, golden_file(), generator_file(), "llama", model,
                     {"model.embed_tokens.weight", "lm_head.weight"}, packed_outputs(model));
  // The rescaling changes some of the frequencies this model uses.
  RopeSpec plain = cfg.rope;
  plain.scale_factor = 0.0;
  const auto a = rope_inv_freq(cfg.rope, cfg.head_dim()), b = rope_inv_freq(plain, cfg.head_dim());
  int changed = 0;
  for (size_t i = 0; i < a.size(); ++i) changed += a[i] != b[i];
  EXPECT_GE(changed, 2);
}

TEST(LlamaGolden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  const LlamaConfig cfg = config_of(r);
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  for (auto& bep : backends) {
    Backend& be = *bep;
    SCOPED_TRACE("backend " + be.name());
    fmt::print("[{}] Llama golden: {}, B={} T={}\n", be.name(), cfg.str(),
               meta_int(r, "batch_size"), meta_int(r, "seq_len"));
    Llama model(cfg, be);
    match_reference(r, be, model, [&](const Tensor& tokens, const Tensor& logits) {
      model.forward_logits(tokens, logits);
    });
    if (be.supports(OpFamily::VarlenAttention, DType::F32)) match_packed(r, be, model);
  }
}
