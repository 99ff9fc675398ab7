#include "models/patch_encoder.h"

#include "core/error.h"

#include <fmt/format.h>

#include <cmath>

namespace kiln {

namespace {

nn::BlockSpec vit_block_spec(const VisionShape& c) {
  nn::BlockSpec b;
  b.n_embd = c.n_embd;
  b.norm = nn::NormSpec{nn::NormKind::LayerNorm, c.norm_eps, /*weight=*/true, /*bias=*/true};
  b.attention.n_head = c.n_head;
  b.attention.n_kv_head = c.n_head;
  b.attention.head_dim = c.n_embd / c.n_head;
  b.attention.causal = false;  // an encoder: every patch sees every patch
  b.mlp = nn::MlpKind::GeluTanh;
  b.mlp_hidden = c.ffn_hidden_size;
  b.bias = true;
  b.init_std = 0.02f;
  b.residual_init_std = 0.02f / std::sqrt(2.f * static_cast<float>(c.n_layer));
  b.names = {"norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"};
  return b;
}

}  // namespace

PatchEncoder::PatchEncoder(const VisionShape& c, int tokens, const std::string& prefix)
    : shape_(c),
      tokens_(tokens),
      patch_embed_(prefix + "patch_embed.proj", c.patch_dim(), c.n_embd, /*bias=*/true, 0.02f),
      pos_embed_(prefix + "pos_embed", Shape{tokens, c.n_embd}, nn::Init::normal(0.02f),
                 /*decay=*/false) {
  KILN_CHECK(tokens >= c.patches(), "PatchEncoder: {} tokens hold no {} patches", tokens,
             c.patches());
  const nn::BlockSpec spec = vit_block_spec(c);
  blocks_.reserve(static_cast<size_t>(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l)
    blocks_.emplace_back(fmt::format("{}blocks.{}.", prefix, l), spec);
}

void PatchEncoder::add_parts(std::vector<PartLayout>& out) {
  const double C = shape_.n_embd;
  PartLayout& e = out.emplace_back();
  e.name = "embeddings";
  e.cost = shape_.patch_dim() * C;
  patch_embed_.collect(e.params);
  e.params.push_back(&pos_embed_);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    PartLayout& p = out.emplace_back();
    p.name = fmt::format("blocks.{}", l);
    p.cost = 4.0 * C * C + 2.0 * C * shape_.ffn_hidden_size;
    blocks_[l].collect(p.params);
  }
}

void PatchEncoder::reserve(Backend& be, PatchActivations& a, int B, DType dt,
                           nn::ActivationCheckpointing mode) const {
  if (a.B == B && a.saved.mode() == mode && !a.stream.empty()) return;
  a.stream.clear();  // free first so the peak is not doubled
  a.B = B;
  const Stream s = be.default_stream();
  const int64_t C = shape_.n_embd, T = tokens_;
  a.patches = be.empty(Shape{B, T, shape_.patch_dim()}, dt, MemCategory::Activations);
  be.fill(s, a.patches, 0.f);
  a.pos_ids = be.empty(Shape{B, T}, DType::I32, MemCategory::Activations);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<int64_t>(i) % T);
  be.copy_from_host(s, a.pos_ids, ids.data());
  be.synchronize(s);  // ids is a host temporary
  for (int l = 0; l <= n_layer(); ++l)
    a.stream.push_back(be.empty(Shape{B, T, C}, dt, MemCategory::Activations));
  a.saved.reserve(be, blocks_.front().saved_specs(B, T, dt), n_layer(), mode);
  a.scratch = blocks_.front().make_scratch(be, B, T, dt);
}

nn::BlockPass PatchEncoder::pass(Backend& be, Stream s, const PatchActivations& a, int l) const {
  return nn::BlockPass{be, s, a.saved.block(l), a.scratch, {}, {}, {},
                       a.saved.rerun_block(), a.saved.recompute_cheap(), Tensor()};
}

void PatchEncoder::forward(Backend& be, Stream s, PatchActivations& a, const Tensor& images,
                           int n_blocks, ModelHooks* hooks, int first_part) const {
  const int S = shape_.image_size;
  KILN_CHECK(images.ndim() == 4 && images.size(0) == a.B && images.size(1) == S &&
                 images.size(2) == S && images.size(3) == shape_.num_channels &&
                 images.dtype() == DType::F32,
             "vision encoder: images must be fp32 [{},{},{},{}], got {}", a.B, S, S,
             shape_.num_channels, images.str());
  ModelHooks none;
  ModelHooks& h = hooks ? *hooks : none;
  const int64_t B = a.B, C = shape_.n_embd, T = tokens_;
  h.before_forward(first_part);
  be.patchify(s, a.patches, images, shape_.patch_size);
  patch_embed_.forward(be, s, a.stream[0], a.patches);
  const Tensor pos = a.scratch.tmp.view_at(0, Shape{B, T, C});
  be.embedding_forward(s, pos, a.pos_ids, Tensor(), pos_embed_.v(), Tensor());
  be.add(s, a.stream[0], a.stream[0], pos);
  h.after_forward(first_part);
  for (int l = 0; l < n_blocks; ++l) {
    const auto i = static_cast<size_t>(l);
    h.before_forward(first_part + 1 + l);
    blocks_[i].forward(pass(be, s, a, l), a.stream[i], a.stream[i + 1]);
    h.after_forward(first_part + 1 + l);
  }
}

void PatchEncoder::backward(Backend& be, Stream s, PatchActivations& a, const Tensor& dx,
                            int n_blocks, ModelHooks* hooks, int first_part) const {
  ModelHooks none;
  ModelHooks& h = hooks ? *hooks : none;
  for (int l = n_blocks - 1; l >= 0; --l) {
    const auto i = static_cast<size_t>(l);
    h.before_backward(first_part + 1 + l);
    blocks_[i].backward(pass(be, s, a, l), dx, a.stream[i], a.stream[i + 1]);
    h.after_backward(first_part + 1 + l);
  }
  h.before_backward(first_part);
  if (pos_embed_.trainable)
    be.embedding_backward(s, pos_embed_.g(), Tensor(), dx, a.pos_ids, Tensor());
  patch_embed_.backward(be, s, Tensor(), dx, a.patches);  // no image gradient
  h.after_backward(first_part);
}

}  // namespace kiln
