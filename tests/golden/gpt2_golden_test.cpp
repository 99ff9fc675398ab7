// GPT-2 against a float64 PyTorch reference (tests/golden/gpt2_golden.safetensors, made by
// tests/golden/make_gpt2_golden.py; see tests/golden/README.md).
//
// For every backend of this build: the parameters of the file are copied into the
// model, then logits, the mean loss, every parameter gradient and the losses of 10 AdamW
// steps on the same batch are compared with the reference (golden_compare.h); then the
// same batch as packed documents (positions and cu_seqlens from the file): loss and
// gradients. Per tensor
// the test prints the relative norm error ||a - b|| / ||b|| and the worst element; a
// summary line gives the worst over tensors.
#include "golden_compare.h"

#include "backend/registry.h"
#include "models/gpt2/gpt2.h"

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;

namespace {

std::string golden_file() { return golden_path("gpt2_golden.safetensors"); }
std::string generator_file() { return golden_path("make_gpt2_golden.py"); }

GPT2Config config_of(const st::Reader& r) {
  GPT2Config c;
  c.n_layer = meta_int(r, "n_layer");
  c.n_head = meta_int(r, "n_head");
  c.n_embd = meta_int(r, "n_embd");
  c.vocab_size = meta_int(r, "vocab_size");
  c.padded_vocab_size = meta_int(r, "padded_vocab_size");
  c.block_size = meta_int(r, "block_size");
  c.layernorm_eps = static_cast<float>(meta_double(r, "layernorm_eps"));
  c.dropout = static_cast<float>(meta_double(r, "dropout"));
  return c;
}

}  // namespace

// The committed file is what the committed generator writes: its metadata records the
// FNV-1a 64 hash of make_gpt2_golden.py, and its tensors are exactly the model's
// parameters, their gradients and the reference outputs, with consistent shapes.
TEST(GPT2Golden, FileMatchesGeneratorAndModel) {
  const st::Reader r(golden_file());
  const GPT2Config cfg = config_of(r);
  EXPECT_EQ(cfg.dropout, 0.f);
  auto backend = make_backend("cpu");
  GPT2 model(cfg, *backend);
  check_file_matches(r, golden_file(), generator_file(), "gpt2", model, {"transformer.wte.weight"},
                     packed_outputs(model));
}

TEST(GPT2Golden, MatchesReferenceOnEveryBackend) {
  const st::Reader r(golden_file());
  const GPT2Config cfg = config_of(r);
  for (const auto& s : skipped_backends()) fmt::print("skipped backend: {}\n", s);
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  for (auto& bep : backends) {
    Backend& be = *bep;
    SCOPED_TRACE("backend " + be.name());
    fmt::print("[{}] GPT-2 golden: {}, B={} T={}\n", be.name(), cfg.str(),
               meta_int(r, "batch_size"), meta_int(r, "seq_len"));
    GPT2 model(cfg, be);
    match_reference(r, be, model, [&](const Tensor& tokens, const Tensor& logits) {
      model.forward_logits(tokens, logits);
    });
    if (be.supports(OpFamily::VarlenAttention, DType::F32)) match_packed(r, be, model);
  }
}
