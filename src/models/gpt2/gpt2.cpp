#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_state.h"

#include "core/rng.h"
#include "nn/classifier.h"

#include <cmath>
#include <vector>

namespace kiln {

namespace {
// Dropout sites inside one block, for distinct Philox streams.
enum DropoutSite : uint64_t { kEmbedding = 0, kAttnProbs = 1, kAttnResid = 2, kMlpResid = 3 };
}  // namespace

std::vector<ParamSpec> gpt2_param_specs(const GPT2Config& config, int64_t unit_alignment) {
  config.validate();
  KILN_CHECK(unit_alignment >= 1, "unit alignment must be >= 1, got {}", unit_alignment);
  const int64_t C = config.n_embd, Vp = config.padded_vocab_size;
  std::vector<ParamSpec> out;
  int64_t offset = 0;
  int current = -1;
  auto add = [&](std::string name, Shape shape, int layer) {
    if (layer != current) {  // a new unit starts aligned
      offset = (offset + unit_alignment - 1) / unit_alignment * unit_alignment;
      current = layer;
    }
    ParamSpec p;
    p.name = std::move(name);
    p.shape = shape;
    p.offset = offset;
    p.weight_decay = shape.ndim() >= 2;
    p.layer = layer;
    offset += shape.numel();
    out.push_back(std::move(p));
  };
  add("transformer.wte.weight", {Vp, C}, -1);
  add("transformer.wpe.weight", {config.block_size, C}, -1);
  for (int l = 0; l < config.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, l);
    add(h + "ln_1.bias", {C}, l);
    add(h + "attn.c_attn.weight", {3 * C, C}, l);
    add(h + "attn.c_attn.bias", {3 * C}, l);
    add(h + "attn.c_proj.weight", {C, C}, l);
    add(h + "attn.c_proj.bias", {C}, l);
    add(h + "ln_2.weight", {C}, l);
    add(h + "ln_2.bias", {C}, l);
    add(h + "mlp.c_fc.weight", {4 * C, C}, l);
    add(h + "mlp.c_fc.bias", {4 * C}, l);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, l);
    add(h + "mlp.c_proj.bias", {C}, l);
  }
  add("transformer.ln_f.weight", {C}, config.n_layer);  // the head is part n_layer
  add("transformer.ln_f.bias", {C}, config.n_layer);
  return out;
}

std::vector<ParamUnit> gpt2_param_units(const GPT2Config& config, int64_t unit_alignment) {
  std::vector<ParamUnit> units;
  for (const ParamSpec& p : gpt2_param_specs(config, unit_alignment)) {
    if (units.empty() || units.back().part != p.layer) units.push_back({p.layer, p.offset, p.offset, 0});
    units.back().end = p.offset + p.shape.numel();
  }
  for (auto& u : units) u.padded_end = (u.end - u.begin + unit_alignment - 1) / unit_alignment * unit_alignment + u.begin;
  return units;
}

GPT2::GPT2(const GPT2Config& config, Backend& backend, const GPT2Storage& storage)
    : config_(config), backend_(backend), storage_(storage) {
  KILN_CHECK(storage.grad_dtype == DType::F32 || storage.grad_dtype == storage.dtype,
             "GPT-2: gradients in {} with parameters in {} are not supported",
             dtype_name(storage.grad_dtype), dtype_name(storage.dtype));
  for (Op op : {Op::Embedding, Op::LayerNorm, Op::Linear, Op::Attention, Op::Gelu, Op::Add,
                Op::SoftmaxCrossEntropy})
    KILN_CHECK(backend.supports(op, storage.dtype), "backend {} has no {} {}", backend.name(),
               dtype_name(storage.dtype), op_name(op));
  params_ = gpt2_param_specs(config_, storage.unit_alignment);
  units_ = gpt2_param_units(config_, storage.unit_alignment);
  flat_size_ = units_.back().padded_end;
  unit_params_.resize(units_.size());
  unit_grads_.resize(units_.size());
  const Stream s = backend_.default_stream();
  if (storage.allocate_params) {
    param_buffer_ = backend_.empty(Shape{flat_size_}, storage.dtype, MemCategory::Parameters);
    backend_.fill(s, param_buffer_, 0.f);
    for (const ParamUnit& u : units_) bind_params(u.part, param_buffer_.view_at(u.begin, Shape{u.padded_size()}));
  }
  if (storage.allocate_grads) {
    grad_buffer_ = backend_.empty(Shape{flat_size_}, storage.grad_dtype, MemCategory::Gradients);
    for (const ParamUnit& u : units_) bind_grads(u.part, grad_buffer_.view_at(u.begin, Shape{u.padded_size()}));
    zero_grad();
  }
}

void GPT2::bind_params(int part, const Tensor& storage) {
  const ParamUnit& u = unit(part);
  if (storage) check_shape(storage, Shape{u.padded_size()}, "bind_params storage");
  unit_params_[static_cast<size_t>(part + 1)] = storage;
}

void GPT2::bind_grads(int part, const Tensor& storage) {
  const ParamUnit& u = unit(part);
  if (storage) check_shape(storage, Shape{u.padded_size()}, "bind_grads storage");
  unit_grads_[static_cast<size_t>(part + 1)] = storage;
}

GPT2::~GPT2() = default;

Tensor GPT2::param(const ParamSpec& p) const {
  const Tensor& t = unit_params_[static_cast<size_t>(p.layer + 1)];
  KILN_CHECK(t, "GPT-2: parameter {} is not bound (part {})", p.name, p.layer);
  return t.view_at(p.offset - unit(p.layer).begin, p.shape);
}

Tensor GPT2::grad(const ParamSpec& p) const {
  const Tensor& t = unit_grads_[static_cast<size_t>(p.layer + 1)];
  KILN_CHECK(t, "GPT-2: gradient of {} is not bound (part {})", p.name, p.layer);
  return t.view_at(p.offset - unit(p.layer).begin, p.shape);
}

Tensor GPT2::param(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return param(p);
  KILN_FAIL("GPT-2 has no parameter named '{}'", name);
}

Tensor GPT2::grad(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return grad(p);
  KILN_FAIL("GPT-2 has no parameter named '{}'", name);
}

ActivationCheckpointing parse_activation_checkpointing(std::string_view s) {
  if (s == "none") return ActivationCheckpointing::None;
  if (s == "selective") return ActivationCheckpointing::Selective;
  if (s == "full") return ActivationCheckpointing::Full;
  KILN_FAIL("activation_checkpointing must be none, selective or full, got '{}'", s);
}

void GPT2::set_activation_checkpointing(ActivationCheckpointing mode) { checkpointing_ = mode; }

std::vector<float> gpt2_init_values(const GPT2Config& config, const ParamSpec& p, size_t index,
                                    uint64_t seed) {
  const int64_t n = p.shape.numel();
  std::vector<float> host(static_cast<size_t>(n), 0.f);
  const bool is_norm_gain = p.name.ends_with("ln_1.weight") || p.name.ends_with("ln_2.weight") ||
                            p.name.ends_with("ln_f.weight");
  if (is_norm_gain) {
    std::fill(host.begin(), host.end(), 1.f);
  } else if (p.shape.ndim() >= 2) {
    const float std_residual = 0.02f / std::sqrt(2.f * static_cast<float>(config.n_layer));
    const bool residual = p.name.ends_with("c_proj.weight");
    fill_normal(host.data(), n, seed, index, 0.f, residual ? std_residual : 0.02f);
    if (p.name == "transformer.wte.weight")  // padded vocabulary rows stay zero
      std::fill(host.begin() + static_cast<int64_t>(config.vocab_size) * config.n_embd,
                host.end(), 0.f);
  }
  return host;
}

void GPT2::init_weights(uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto host = gpt2_init_values(config_, params_[i], i, seed);
    upload_f32(backend_, param(params_[i]), host.data());
  }
}

void GPT2::zero_grad() {
  if (grad_buffer_) {
    backend_.fill(backend_.default_stream(), grad_buffer_, 0.f);
    return;
  }
  for (const Tensor& g : unit_grads_)
    if (g) backend_.fill(backend_.default_stream(), g, 0.f);
}

void GPT2::set_dropout(bool on, uint64_t seed, uint64_t call_index) {
  dropout_on_ = on && config_.dropout > 0.f;
  dropout_seed_ = seed;
  dropout_call_ = call_index;
}

void GPT2::reserve(int B, int T) {
  if (acts_ && acts_->B == B && acts_->T == T && acts_->mode == checkpointing_) return;
  acts_.reset();  // free first so the peak is not doubled
  auto a = std::make_unique<Activations>();
  a->B = B;
  a->T = T;
  const int64_t C = config_.n_embd, NH = config_.n_head, N = static_cast<int64_t>(B) * T;
  const int64_t Vp = config_.padded_vocab_size;
  // Activations in the model dtype; statistics (LayerNorm mean/rstd, lse, losses) fp32.
  auto act = [&](Shape s) { return backend_.empty(s, storage_.dtype, MemCategory::Activations); };
  auto stat = [&](Shape s) { return backend_.empty(s, DType::F32, MemCategory::Activations); };
  a->encoded = act({B, T, C});
  a->mode = checkpointing_;
  const bool full = checkpointing_ == ActivationCheckpointing::Full;
  const bool selective = checkpointing_ == ActivationCheckpointing::Selective;
  auto alloc_layer = [&](Activations::Layer& L, bool with_gelu_out) {
    L.ln1 = act({B, T, C});
    L.ln1_mean = stat({N});
    L.ln1_rstd = stat({N});
    L.qkv = act({B, T, 3 * C});
    L.atty = act({B, T, C});
    L.lse = stat({B, NH, T});
    L.residual2 = act({B, T, C});
    L.ln2 = act({B, T, C});
    L.ln2_mean = stat({N});
    L.ln2_rstd = stat({N});
    L.fch = act({B, T, 4 * C});
    if (with_gelu_out) L.fch_gelu = act({B, T, 4 * C});
  };
  a->layers.resize(static_cast<size_t>(config_.n_layer));
  for (auto& L : a->layers) {
    if (!full) alloc_layer(L, !selective);
    L.residual3 = act({B, T, C});
  }
  if (full) {
    alloc_layer(a->work, true);
    a->work.residual3 = act({B, T, C});  // the recomputed block's output (unused)
  }
  if (selective) a->work.fch_gelu = act({B, T, 4 * C});
  a->lnf = act({B, T, C});
  a->lnf_mean = stat({N});
  a->lnf_rstd = stat({N});
  const int64_t R = nn::classifier_chunk_rows(N, Vp);
  a->logits_chunk = act({R, Vp});
  a->losses_chunk = stat({R});
  a->dresidual = act({B, T, C});
  a->tmp = act({B, T, C});
  a->dtmp = act({B, T, C});
  a->datty = act({B, T, C});
  a->dbig = act({B, T, 4 * C});
  acts_ = std::move(a);
}

DropoutSpec GPT2::dropout_spec(int layer, uint64_t site) const {
  DropoutSpec d;
  if (!dropout_on_) return d;
  d.p = config_.dropout;
  d.seed = dropout_seed_;
  d.stream = ((dropout_call_ * static_cast<uint64_t>(config_.n_layer + 1) +
               static_cast<uint64_t>(layer + 1)) << 2) | site;
  return d;
}

void GPT2::block_forward(int l, const Tensor& x, const Tensor& out) {
  Activations& a = *acts_;
  Backend& be = backend_;
  const Stream s = be.default_stream();
  const float eps = config_.layernorm_eps;
  const ParamSpec* p = &params_[2 + 12 * static_cast<size_t>(l)];
  const bool full = a.mode == ActivationCheckpointing::Full;
  auto& L = full ? a.work : a.layers[static_cast<size_t>(l)];
  const Tensor fch_gelu = a.mode == ActivationCheckpointing::None ? L.fch_gelu : a.work.fch_gelu;
  be.layernorm_forward(s, L.ln1, L.ln1_mean, L.ln1_rstd, x, param(p[0]), param(p[1]), eps);
  be.linear_forward(s, L.qkv, L.ln1, param(p[2]), param(p[3]));
  be.attention_forward(s, L.atty, L.lse, L.qkv, config_.n_head, dropout_spec(l, kAttnProbs));
  be.linear_forward(s, a.tmp, L.atty, param(p[4]), param(p[5]));
  if (dropout_on_) be.dropout_forward(s, a.tmp, a.tmp, dropout_spec(l, kAttnResid));
  be.add(s, L.residual2, x, a.tmp);
  be.layernorm_forward(s, L.ln2, L.ln2_mean, L.ln2_rstd, L.residual2, param(p[6]), param(p[7]), eps);
  be.linear_forward(s, L.fch, L.ln2, param(p[8]), param(p[9]));
  be.gelu_forward(s, fch_gelu, L.fch);
  be.linear_forward(s, a.tmp, fch_gelu, param(p[10]), param(p[11]));
  if (dropout_on_) be.dropout_forward(s, a.tmp, a.tmp, dropout_spec(l, kMlpResid));
  be.add(s, out, L.residual2, a.tmp);
}

void GPT2::run_forward(const Tensor& tokens, int B, int T) {
  KILN_CHECK(T <= config_.block_size, "sequence length {} exceeds block_size {}", T,
             config_.block_size);
  reserve(B, T);
  Activations& a = *acts_;
  Backend& be = backend_;
  const Stream s = be.default_stream();
  const float eps = config_.layernorm_eps;
  hooks_->before_forward(-1);
  be.embedding_forward(s, a.encoded, tokens, param(params_[0]), param(params_[1]));
  if (dropout_on_) be.dropout_forward(s, a.encoded, a.encoded, dropout_spec(-1, kEmbedding));
  hooks_->after_forward(-1);
  Tensor x = a.encoded;
  for (int l = 0; l < config_.n_layer; ++l) {
    hooks_->before_forward(l);
    const Tensor out = a.layers[static_cast<size_t>(l)].residual3;
    block_forward(l, x, out);
    hooks_->after_forward(l);
    x = out;
  }
  hooks_->before_forward(config_.n_layer);
  const ParamSpec* pf = &params_[params_.size() - 2];
  be.layernorm_forward(s, a.lnf, a.lnf_mean, a.lnf_rstd, x, param(pf[0]), param(pf[1]), eps);
}

double GPT2::forward(const Tensor& tokens, const Tensor& targets, float grad_scale,
                     int64_t* n_targets) {
  KILN_CHECK(tokens.ndim() == 2 && targets.shape() == tokens.shape(),
             "forward: tokens {} and targets {} must both be [B,T]", tokens.str(), targets.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  run_forward(tokens, B, T);
  Activations& a = *acts_;
  const bool with_grad = grad_scale > 0.f;
  const auto r = nn::classifier_cross_entropy(
      backend_, backend_.default_stream(), a.lnf, param(params_[0]), targets, config_.vocab_size,
      grad_scale, with_grad ? a.dtmp : Tensor(), with_grad ? grad(params_[0]) : Tensor(), a.logits_chunk,
      a.losses_chunk);
  hooks_->after_forward(config_.n_layer);
  a.tokens = tokens;
  a.targets = targets;
  a.have_grad = with_grad;
  if (n_targets) *n_targets = r.n_targets;
  return r.loss_sum;
}

void GPT2::backward() {
  KILN_CHECK(acts_ && acts_->have_grad, "backward() needs a preceding forward() with grad_scale > 0");
  Activations& a = *acts_;
  a.have_grad = false;
  Backend& be = backend_;
  const Stream s = be.default_stream();
  const int B = a.B, T = a.T;
  const int64_t C = config_.n_embd;

  // Final LayerNorm: dresidual = LN_f'(dlnf), dlnf was left in dtmp by forward().
  hooks_->before_backward(config_.n_layer);
  const ParamSpec* pf = &params_[params_.size() - 2];
  const Tensor x_last = config_.n_layer > 0 ? a.layers.back().residual3 : a.encoded;
  be.fill(s, a.dresidual, 0.f);
  be.layernorm_backward(s, a.dresidual, grad(pf[0]), grad(pf[1]), a.dtmp, x_last, param(pf[0]),
                        a.lnf_mean, a.lnf_rstd);
  hooks_->after_backward(config_.n_layer);
  const Tensor dqkv = a.dbig.view_at(0, Shape{B, T, 3 * C});
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    hooks_->before_backward(l);
    const ParamSpec* p = &params_[2 + 12 * static_cast<size_t>(l)];
    const Tensor x_in = l == 0 ? a.encoded : a.layers[static_cast<size_t>(l - 1)].residual3;
    // Recompute what forward did not keep: the whole block (full) into the work
    // buffers, or the GELU output (selective). Same kernels, same inputs, same dropout
    // masks: bitwise the activations of forward. The block output is written to the
    // work buffer so that the kept residual stream is untouched.
    if (a.mode == ActivationCheckpointing::Full) block_forward(l, x_in, a.work.residual3);
    auto& L = a.mode == ActivationCheckpointing::Full ? a.work : a.layers[static_cast<size_t>(l)];
    const Tensor fch_gelu = a.mode == ActivationCheckpointing::None ? L.fch_gelu : a.work.fch_gelu;
    if (a.mode == ActivationCheckpointing::Selective) be.gelu_forward(s, fch_gelu, L.fch);
    // MLP: residual3 = residual2 + dropout(c_proj(gelu(c_fc(ln_2(residual2))))).
    Tensor d_out = a.dresidual;
    if (dropout_on_) {
      be.dropout_backward(s, a.tmp, a.dresidual, dropout_spec(l, kMlpResid));
      d_out = a.tmp;
    }
    be.linear_backward(s, a.dbig, grad(p[10]), grad(p[11]), d_out, fch_gelu, param(p[10]));
    be.gelu_backward(s, a.dbig, a.dbig, L.fch);
    be.linear_backward(s, a.dtmp, grad(p[8]), grad(p[9]), a.dbig, L.ln2, param(p[8]));
    be.layernorm_backward(s, a.dresidual, grad(p[6]), grad(p[7]), a.dtmp, L.residual2,
                          param(p[6]), L.ln2_mean, L.ln2_rstd);
    // Attention: residual2 = x + dropout(c_proj(attn(c_attn(ln_1(x))))).
    d_out = a.dresidual;
    if (dropout_on_) {
      be.dropout_backward(s, a.tmp, a.dresidual, dropout_spec(l, kAttnResid));
      d_out = a.tmp;
    }
    be.linear_backward(s, a.datty, grad(p[4]), grad(p[5]), d_out, L.atty, param(p[4]));
    be.attention_backward(s, dqkv, a.datty, L.qkv, L.atty, L.lse, config_.n_head,
                          dropout_spec(l, kAttnProbs));
    be.linear_backward(s, a.dtmp, grad(p[2]), grad(p[3]), dqkv, L.ln1, param(p[2]));
    be.layernorm_backward(s, a.dresidual, grad(p[0]), grad(p[1]), a.dtmp, x_in, param(p[0]),
                          L.ln1_mean, L.ln1_rstd);
    hooks_->after_backward(l);
  }
  hooks_->before_backward(-1);
  if (dropout_on_) be.dropout_backward(s, a.dresidual, a.dresidual, dropout_spec(-1, kEmbedding));
  be.embedding_backward(s, grad(params_[0]), grad(params_[1]), a.dresidual, a.tokens);
  hooks_->after_backward(-1);
}

void GPT2::forward_logits(const Tensor& tokens, const Tensor& logits) {
  KILN_CHECK(tokens.ndim() == 2, "forward_logits: tokens must be [B,T], got {}", tokens.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  check_shape(logits, Shape{B, T, config_.padded_vocab_size}, "forward_logits logits");
  run_forward(tokens, B, T);
  const Stream s = backend_.default_stream();
  if (logits.dtype() == storage_.dtype) {
    backend_.linear_forward(s, logits, acts_->lnf, param(params_[0]), Tensor());
  } else {  // computed in the model dtype, converted for the caller
    Tensor tmp = backend_.empty(logits.shape(), storage_.dtype, MemCategory::Temporaries);
    backend_.linear_forward(s, tmp, acts_->lnf, param(params_[0]), Tensor());
    backend_.copy(s, logits, tmp);
  }
  hooks_->after_forward(config_.n_layer);
}

}  // namespace kiln
