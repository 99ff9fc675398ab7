#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_state.h"

#include "nn/classifier.h"

#include <cmath>
#include <vector>

namespace kiln {

namespace {
// The parameter table of `layers`, part by part, each part starting at a multiple of
// `alignment`; ptrs[i] is the layer's Param of entry i.
std::vector<ParamSpec> layout(GPT2Layers& layers, int64_t alignment, std::vector<nn::Param*>* ptrs) {
  KILN_CHECK(alignment >= 1, "unit alignment must be >= 1, got {}", alignment);
  std::vector<ParamSpec> out;
  int64_t offset = 0;
  const auto parts = layers.parts();
  for (size_t k = 0; k < parts.size(); ++k) {
    offset = (offset + alignment - 1) / alignment * alignment;  // a new unit starts aligned
    for (nn::Param* prm : parts[k]) {
      ParamSpec p;
      p.name = prm->name;
      p.shape = prm->shape;
      p.offset = offset;
      p.weight_decay = prm->weight_decay;
      p.layer = static_cast<int>(k) - 1;  // -1 embeddings, 0..n_layer-1 blocks, n_layer head
      offset += p.shape.numel();
      out.push_back(std::move(p));
      if (ptrs) ptrs->push_back(prm);
    }
  }
  return out;
}
}  // namespace

std::vector<ParamSpec> gpt2_param_specs(const GPT2Config& config, int64_t unit_alignment) {
  GPT2Layers layers(config);
  return layout(layers, unit_alignment, nullptr);
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
  layers_ = std::make_unique<GPT2Layers>(config_);
  params_ = layout(*layers_, storage.unit_alignment, &param_ptrs_);
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
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].layer == part)
      param_ptrs_[i]->value = storage ? storage.view_at(params_[i].offset - u.begin, params_[i].shape) : Tensor();
}

void GPT2::bind_grads(int part, const Tensor& storage) {
  const ParamUnit& u = unit(part);
  if (storage) check_shape(storage, Shape{u.padded_size()}, "bind_grads storage");
  unit_grads_[static_cast<size_t>(part + 1)] = storage;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].layer == part)
      param_ptrs_[i]->grad = storage ? storage.view_at(params_[i].offset - u.begin, params_[i].shape) : Tensor();
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

void GPT2::set_activation_checkpointing(ActivationCheckpointing mode) { checkpointing_ = mode; }

std::vector<float> gpt2_init_values(const GPT2Config& config, const ParamSpec& p, size_t index,
                                    uint64_t seed) {
  GPT2Layers layers(config);
  std::vector<nn::Param*> ptrs;
  layout(layers, 1, &ptrs);
  KILN_CHECK(index < ptrs.size() && ptrs[index]->name == p.name,
             "gpt2_init_values: parameter {} is not number {} of GPT-2", p.name, index);
  return nn::init_values(*ptrs[index], seed, index, 0, p.shape.numel());
}

void GPT2::init_weights(uint64_t seed) {
  // Parameter i draws from Philox stream i, element j of it at global index j.
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto host = nn::init_values(*param_ptrs_[i], seed, i, 0, params_[i].shape.numel());
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
  if (acts_ && acts_->B == B && acts_->T == T && acts_->saved.mode() == checkpointing_) return;
  acts_.reset();  // free first so the peak is not doubled
  auto a = std::make_unique<Activations>();
  a->B = B;
  a->T = T;
  const int64_t C = config_.n_embd, N = static_cast<int64_t>(B) * T;
  const int64_t Vp = config_.padded_vocab_size;
  const DType dt = storage_.dtype;
  // Activations in the model dtype; statistics (LayerNorm mean/rstd, lse, losses) fp32.
  auto act = [&](Shape s) { return backend_.empty(s, dt, MemCategory::Activations); };
  a->stream.push_back(act({B, T, C}));
  for (int l = 0; l < config_.n_layer; ++l) a->stream.push_back(act({B, T, C}));
  const auto& blocks = layers_->blocks;
  a->saved.reserve(backend_, blocks.front().saved_specs(B, T, dt), config_.n_layer, checkpointing_);
  for (const nn::SavedSpec& sp : layers_->ln_f.saved_specs(B, T, dt))
    a->head.push_back(backend_.empty(sp.shape, sp.dtype, MemCategory::Activations));
  const int64_t R = nn::classifier_chunk_rows(N, Vp);
  a->logits_chunk = act({R, Vp});
  a->losses_chunk = backend_.empty(Shape{R}, DType::F32, MemCategory::Activations);
  a->dresidual = act({B, T, C});
  a->scratch = blocks.front().make_scratch(backend_, B, T, dt);
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

nn::BlockPass GPT2::block_pass(int l) const {
  const Activations& a = *acts_;
  return nn::BlockPass{backend_,
                       backend_.default_stream(),
                       a.saved.block(l),
                       a.scratch,
                       dropout_spec(l, nn::kAttnProbsSite),
                       dropout_spec(l, nn::kAttnResidSite),
                       dropout_spec(l, nn::kMlpResidSite),
                       a.saved.rerun_block(),
                       a.saved.recompute_cheap()};
}

void GPT2::run_forward(const Tensor& tokens, int B, int T) {
  KILN_CHECK(T <= config_.block_size, "sequence length {} exceeds block_size {}", T,
             config_.block_size);
  reserve(B, T);
  Activations& a = *acts_;
  Backend& be = backend_;
  const Stream s = be.default_stream();
  hooks_->before_forward(-1);
  layers_->embedding.forward(be, s, a.stream[0], tokens);
  if (dropout_on_) be.dropout_forward(s, a.stream[0], a.stream[0], dropout_spec(-1, nn::kEmbeddingSite));
  hooks_->after_forward(-1);
  for (int l = 0; l < config_.n_layer; ++l) {
    hooks_->before_forward(l);
    const auto i = static_cast<size_t>(l);
    layers_->blocks[i].forward(block_pass(l), a.stream[i], a.stream[i + 1]);
    hooks_->after_forward(l);
  }
  hooks_->before_forward(config_.n_layer);
  layers_->ln_f.forward(be, s, a.head, a.stream.back());
}

double GPT2::forward(const Tensor& tokens, const Tensor& targets, float grad_scale,
                     int64_t* n_targets) {
  KILN_CHECK(tokens.ndim() == 2 && targets.shape() == tokens.shape(),
             "forward: tokens {} and targets {} must both be [B,T]", tokens.str(), targets.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  run_forward(tokens, B, T);
  Activations& a = *acts_;
  const bool with_grad = grad_scale > 0.f;
  const nn::Param& wte = layers_->embedding.wte;
  // The tied output projection: its logits' gradient lands in wte's gradient here, and
  // dL/d(ln_f output) in scratch.dtmp for backward().
  const auto r = nn::classifier_cross_entropy(
      backend_, backend_.default_stream(), a.head[nn::LayerNorm::kOut], wte.v(), targets,
      config_.vocab_size, grad_scale, with_grad ? a.scratch.dtmp : Tensor(),
      with_grad ? wte.g() : Tensor(), a.logits_chunk, a.losses_chunk);
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
  // Final LayerNorm: dresidual = LN_f'(dlnf), dlnf was left in scratch.dtmp by forward().
  hooks_->before_backward(config_.n_layer);
  be.fill(s, a.dresidual, 0.f);
  layers_->ln_f.backward(be, s, a.head, a.dresidual, a.scratch.dtmp, a.stream.back());
  hooks_->after_backward(config_.n_layer);
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    hooks_->before_backward(l);
    const auto i = static_cast<size_t>(l);
    layers_->blocks[i].backward(block_pass(l), a.dresidual, a.stream[i], a.stream[i + 1]);
    hooks_->after_backward(l);
  }
  hooks_->before_backward(-1);
  if (dropout_on_) be.dropout_backward(s, a.dresidual, a.dresidual, dropout_spec(-1, nn::kEmbeddingSite));
  layers_->embedding.backward(be, s, a.dresidual, a.tokens);
  hooks_->after_backward(-1);
}

void GPT2::forward_logits(const Tensor& tokens, const Tensor& logits) {
  KILN_CHECK(tokens.ndim() == 2, "forward_logits: tokens must be [B,T], got {}", tokens.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  check_shape(logits, Shape{B, T, config_.padded_vocab_size}, "forward_logits logits");
  run_forward(tokens, B, T);
  const Stream s = backend_.default_stream();
  const Tensor& x = acts_->head[nn::LayerNorm::kOut];
  const Tensor& wte = layers_->embedding.wte.v();
  if (logits.dtype() == storage_.dtype) {
    backend_.linear_forward(s, logits, x, wte, Tensor());
  } else {  // computed in the model dtype, converted for the caller
    Tensor tmp = backend_.empty(logits.shape(), storage_.dtype, MemCategory::Temporaries);
    backend_.linear_forward(s, tmp, x, wte, Tensor());
    backend_.copy(s, logits, tmp);
  }
  hooks_->after_forward(config_.n_layer);
}

}  // namespace kiln
