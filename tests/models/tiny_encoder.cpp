#include "tiny_encoder.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::testing {

namespace {

// Its own [model] key (ModelArch::keys): the config reads, checks and writes it from the
// registry entry alone.
const ModelKeys& tiny_encoder_keys() {
  static const ModelKeys keys{
      {.name = "ffn_mult", .type = ModelKeyType::Integer, .default_value = 2, .lo = 1,
       .description = "tiny_encoder: SwiGLU width as a multiple of n_embd."},
  };
  return keys;
}

constexpr nn::NormSpec kRms{nn::NormKind::RMSNorm, 1e-6f, true, false};

nn::BlockSpec block_spec(const ModelOptions& o) {
  nn::BlockSpec b;
  b.n_embd = o.n_embd;
  b.norm = kRms;
  b.attention.n_head = o.n_head;
  b.attention.n_kv_head = std::max(1, o.n_head / 2);
  b.attention.head_dim = o.n_embd / o.n_head;
  b.attention.causal = false;
  b.attention.rotary = true;
  b.attention.rope.theta = 10000.0;
  b.mlp = nn::MlpKind::SwiGLU;
  b.mlp_hidden = o.integer(tiny_encoder_keys(), "ffn_mult") * o.n_embd;
  b.bias = false;
  b.names = {"norm_1", "attn.qkv", "attn.out", "norm_2", "mlp.fc", "mlp.out"};
  return b;
}
int64_t pad16(int64_t v) { return (v + 15) / 16 * 16; }

// Its own parallel plans (models/layer_plan.h; applied by src/parallel). Tensor parallel:
// the vocabulary-parallel embedding and Megatron-LM's split of each block, but the norms
// and the output projection replicated, so the loss is the plain one on every rank (and
// parallel.sequence_parallel is refused: it needs every role split). Context parallel:
// every block's (bidirectional) attention takes the ring.
constexpr ParallelTables kTinyEncoderTables{
    .tp = TensorParallelTable{.embedding = nn::TpStyle::Vocab,
                              .attention_qkv = nn::TpStyle::Column,
                              .attention_proj = nn::TpStyle::Row,
                              .mlp_fc = nn::TpStyle::Column,
                              .mlp_proj = nn::TpStyle::Row,
                              .norms = nn::TpStyle::Replicated,
                              .final_norm = nn::TpStyle::Replicated,
                              .lm_head = nn::TpStyle::Replicated},
    .cp = ContextParallelTable{.attention = true},
};
}  // namespace

TinyEncoder::TinyEncoder(const ModelOptions& o, Backend& be, const ModelStorage& storage)
    : LayeredModel(be, storage), o_(o), vp_(pad16(o.vocab_size)),
      embedding_("embed.tokens", "", o.vocab_size, vp_, /*max_positions=*/0, o.n_embd, 0.02f),
      norm_("norm", o.n_embd, kRms),
      head_("lm_head", o.n_embd, vp_, /*bias=*/false, 0.02f) {
  KILN_CHECK(o.n_layer > 0 && o.n_head > 0 && o.n_embd % o.n_head == 0 && o.vocab_size > 0,
             "tiny_encoder: bad shape");
  head_.weight.init.zero_rows_from = o.vocab_size;
  blocks_.reserve(static_cast<size_t>(o.n_layer));
  for (int l = 0; l < o.n_layer; ++l)
    blocks_.emplace_back(fmt::format("layers.{}.", l), block_spec(o));
  for (const LayerPlan* plan : storage.plans)
    plan->apply(layer_roles(arch(), kTinyEncoderTables, embedding_, blocks_, norm_, &head_));
  std::vector<PartLayout> parts(blocks_.size() + 2);
  parts.front().name = "embeddings";
  embedding_.collect(parts.front().params);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    parts[l + 1].name = fmt::format("layers.{}", l);
    blocks_[l].collect(parts[l + 1].params);
  }
  parts.back().name = "head";
  parts.back().resident = true;  // its loss gradient (lm_head) is made in forward
  norm_.collect(parts.back().params);
  head_.collect(parts.back().params);
  build(parts, {OpFamily::Embedding, OpFamily::RMSNorm, OpFamily::Linear, OpFamily::Attention,
                OpFamily::Rope, OpFamily::SwiGLU, OpFamily::Add, OpFamily::SoftmaxCrossEntropy});
}

std::string TinyEncoder::describe() const {
  return fmt::format("tiny_encoder (bidirectional, RMSNorm, rotary GQA, SwiGLU) n_layer={} "
                     "n_head={} n_kv_head={} n_embd={} vocab={} block={}", o_.n_layer, o_.n_head,
                     std::max(1, o_.n_head / 2), o_.n_embd, o_.vocab_size, o_.block_size);
}

nlohmann::json TinyEncoder::config_json() const {
  return {{"n_layer", o_.n_layer}, {"n_head", o_.n_head}, {"n_embd", o_.n_embd},
          {"vocab_size", o_.vocab_size}, {"block_size", o_.block_size}};
}

double TinyEncoder::flops_per_token(int T) const {
  // 6 FLOPs per weight per token (qkv C x (C + 2 KV), out C x C, fc 4C x C, proj C x 2C,
  // head Vp x C) plus attention's 12 T C per layer (bidirectional: T keys per query).
  const double C = o_.n_embd, KV = std::max(1, o_.n_head / 2) * (C / o_.n_head);
  return 6.0 * (o_.n_layer * (C * (C + 2 * KV) + C * C + 6 * C * C) + vp_ * C) +
         12.0 * o_.n_layer * T * C;
}

int64_t TinyEncoder::num_parameters() const {
  // Every stored element, the padded vocabulary rows included (a test model; nothing
  // compares this count with a paper's).
  int64_t n = 0;
  for (const ParamSpec& p : params()) n += p.shape.numel();
  return n;
}

void TinyEncoder::reserve(int B, int T) {
  if (B == B_ && T == T_ && saved_.mode() == mode_ && !stream_.empty()) return;
  B_ = B, T_ = T;
  Backend& be = backend();
  const DType dt = dtype();
  auto act = [&](Shape s) { return be.empty(s, dt, MemCategory::Activations); };
  stream_.clear();
  for (size_t i = 0; i <= blocks_.size(); ++i) stream_.push_back(act({B, T, o_.n_embd}));
  saved_.reserve(be, blocks_.front().saved_specs(B, T, dt), o_.n_layer, mode_);
  head_saved_.clear();
  for (const auto& sp : norm_.saved_specs(B, T, dt)) head_saved_.push_back(be.empty(sp.shape, sp.dtype, MemCategory::Activations));
  const int64_t R = nn::classifier_chunk_rows(int64_t{B} * T, vp_, storage().classifier_chunk_mb);
  logits_chunk_ = act({R, vp_});
  losses_chunk_ = be.empty(Shape{R}, DType::F32, MemCategory::Activations);
  dres_ = act({B, T, o_.n_embd});
  scratch_ = blocks_.front().make_scratch(be, B, T, dt);
}

nn::BlockPass TinyEncoder::pass(int l, const Tensor& positions) const {
  return {backend(), backend().default_stream(), saved_.block(l), scratch_, {}, {}, {},
          saved_.rerun_block(), saved_.recompute_cheap(), positions};
}

BatchShape TinyEncoder::batch_shape(int B, int T) const {
  BatchShape s;
  s.inputs.push_back({.name = "tokens", .shape = Shape{B, T}, .dtype = DType::I32,
                      .range = o_.vocab_size, .per_token = true});
  s.inputs.push_back({.name = "positions", .shape = Shape{B, T}, .dtype = DType::I32,
                      .range = o_.block_size, .per_token = true, .optional = true});
  s.targets = Shape{B, T};
  s.target_range = o_.vocab_size;
  return s;
}

LossSum TinyEncoder::forward(const Batch& batch, float grad_scale) {
  const Tensor& tokens = batch.require("tokens", arch());
  const Tensor positions = batch.input("positions");
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  reserve(B, T);
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int last = static_cast<int>(blocks_.size()) + 1;
  hooks().before_forward(0);
  embedding_.forward(be, s, stream_[0], tokens);
  hooks().after_forward(0);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    hooks().before_forward(static_cast<int>(l) + 1);
    blocks_[l].forward(pass(static_cast<int>(l), positions), stream_[l], stream_[l + 1]);
    hooks().after_forward(static_cast<int>(l) + 1);
  }
  hooks().before_forward(last);
  norm_.forward(be, s, head_saved_, stream_.back());
  const bool with_grad = grad_scale > 0.f;
  nn::classifier_cross_entropy(
      be, s, head_saved_[nn::Norm::kOut], head_.weight.v(), batch.targets, o_.vocab_size,
      grad_scale, with_grad ? scratch_.dtmp : Tensor(), with_grad ? head_.weight.g() : Tensor(),
      logits_chunk_, losses_chunk_, loss_.target(be, batch));
  hooks().after_forward(last);
  tokens_ = tokens;
  positions_ = positions;
  have_grad_ = with_grad;
  return loss_.result(be, batch);
}

void TinyEncoder::backward() {
  KILN_CHECK(have_grad_, "tiny_encoder: backward() needs forward() with grad_scale > 0");
  have_grad_ = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const int last = static_cast<int>(blocks_.size()) + 1;
  hooks().before_backward(last);
  be.fill(s, dres_, 0.f);
  norm_.backward(be, s, head_saved_, dres_, scratch_.dtmp, stream_.back());
  hooks().after_backward(last);
  for (int l = static_cast<int>(blocks_.size()) - 1; l >= 0; --l) {
    const auto i = static_cast<size_t>(l);
    hooks().before_backward(l + 1);
    blocks_[i].backward(pass(l, positions_), dres_, stream_[i], stream_[i + 1]);
    hooks().after_backward(l + 1);
  }
  hooks().before_backward(0);
  embedding_.backward(be, s, dres_, tokens_);
  hooks().after_backward(0);
}

void register_tiny_encoder() {
  ModelArch a;
  a.make = [](const ModelOptions& o, Backend& be, const ModelStorage& st) {
    return std::make_unique<TinyEncoder>(o, be, st);
  };
  a.tensor_parallel = true;   // kTinyEncoderTables.tp
  a.context_parallel = true;  // kTinyEncoderTables.cp
  a.keys = tiny_encoder_keys();
  register_arch("tiny_encoder", std::move(a));
}

}  // namespace kiln::testing
