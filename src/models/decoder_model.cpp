#include "models/decoder_model.h"

#include "core/error.h"
#include "nn/block.h"
#include "nn/classifier.h"
#include "nn/embedding.h"
#include "nn/norm.h"
#include "nn/tensor_parallel.h"

#include <algorithm>

namespace kiln {

// Backward scratch shared by every slot, for one (B, T).
struct DecoderModel::Shared {
  int B = 0, T = 0;
  nn::ActivationCheckpointing mode = nn::ActivationCheckpointing::None;
  nn::HeadScratch head_scratch;  // the loss's chunk buffers ([R,Vp], or [R,Vp/tp])
  Tensor dresidual;              // the residual stream's gradient
  nn::BlockScratch scratch;      // shared by the blocks; dtmp also holds dL/d(norm out)
                                 // between a whole-model forward and its backward
};

// One micro-batch in flight on one chunk: what its forward saved for its backward.
struct DecoderModel::Slot {
  int b0 = 0, b1 = 0;              // the chunk's blocks [b0, b1)
  bool embeds = false, head = false;
  std::vector<Tensor> stream;      // [l - b0]: block l's input, l in [b0, b1] (b1: the output)
  nn::SavedActivations saved;      // the blocks' own tensors under the checkpointing mode
  std::vector<Tensor> head_saved;  // the final norm's saved out [B,T,C] and statistics
  Tensor dhead;                    // dL/d(norm out): scratch.dtmp for the whole model, else own
  Batch batch;                     // the forward's micro-batch (views)
  Tensor positions;                // its positions, or empty: 0..T-1
  Tensor cu_seqlens;               // documents packed into the sequences, or empty
  bool have_grad = false;
  bool balanced = false;           // a training forward of MoE blocks: their balancing
                                   // losses are on (MoeBalance)
  MoeMicroStats moe;               // their statistics (allocated at the first such forward)
};

DecoderModel::DecoderModel(Backend& backend, const ModelStorage& storage)
    : LayeredModel(backend, storage) {}

DecoderModel::~DecoderModel() = default;

DropoutSpec DecoderModel::dropout_spec(int, uint64_t, int64_t) const { return {}; }

int DecoderModel::n_layer() const { return static_cast<int>(layers_.blocks->size()); }

void DecoderModel::set_layers(const DecoderLayers& layers) {
  layers_ = layers;
  std::vector<nn::MoeMlp*> moe;
  std::vector<bool> held;  // by this pipeline stage (block l is part l + 1)
  const std::vector<int>& parts = storage().held_parts;
  moe_index_.clear();
  for (size_t l = 0; l < layers.blocks->size(); ++l) {
    nn::TransformerBlock& b = (*layers.blocks)[l];
    moe_index_.push_back(b.moe() ? static_cast<int>(moe.size()) : -1);
    if (!b.moe()) continue;
    moe.push_back(b.moe());
    const int part = static_cast<int>(l) + 1;
    held.push_back(parts.empty() || std::count(parts.begin(), parts.end(), part) > 0);
  }
  balance_.reset();
  if (!moe.empty()) balance_ = std::make_unique<MoeBalance>(backend(), layers.balance, moe, held);
}

std::pair<int, int> DecoderModel::moe_layers(int b0, int b1) const {
  int first = 0;
  for (int l = 0; l < b0; ++l) first += moe_index_[static_cast<size_t>(l)] >= 0 ? 1 : 0;
  int end = first;
  for (int l = b0; l < b1; ++l) end += moe_index_[static_cast<size_t>(l)] >= 0 ? 1 : 0;
  return {first, end};
}

void DecoderModel::set_aux_loss_scale(float scale) {
  if (balance_) balance_->set_grad_scale(scale);
}

void DecoderModel::set_moe_balance_groups(MoeBalanceGroup* micro_batch, MoeBalanceGroup* global) {
  if (balance_) balance_->set_groups(micro_batch, global);
}

std::optional<MoeStats> DecoderModel::take_moe_stats() {
  if (!balance_) return std::nullopt;
  return balance_->take();
}

void DecoderModel::update_moe_bias(MoeStats& step) {
  if (balance_) balance_->update_bias(step);
}

std::vector<ModelBuffer> DecoderModel::buffers() const {
  return balance_ ? balance_->buffers() : std::vector<ModelBuffer>{};
}

void DecoderModel::set_activation_checkpointing(nn::ActivationCheckpointing mode) { mode_ = mode; }

BatchShape DecoderModel::batch_shape(int B, int T) const {
  BatchShape s;
  s.inputs.push_back({.name = "tokens", .shape = Shape{B, T}, .dtype = DType::I32,
                      .range = vocab_size(), .per_token = true});
  s.inputs.push_back({.name = "positions", .shape = Shape{B, T}, .dtype = DType::I32,
                      .range = max_positions(), .per_token = true, .optional = true});
  s.inputs.push_back({.name = "cu_seqlens", .shape = Shape{int64_t{B} * T + 1},
                      .dtype = DType::I32, .range = int64_t{B} * T + 1, .optional = true,
                      .whole_under_cp = true});
  s.targets = Shape{B, T};
  s.target_range = vocab_size();
  return s;
}

std::optional<Shape> DecoderModel::stage_activation_shape(int B, int T) const {
  return layers_.blocks->front().residual_shape(B, T);
}

void DecoderModel::reserve(int B, int T) {
  if (shared_ && shared_->B == B && shared_->T == T && shared_->mode == mode_) return;
  slots_.clear();  // free first so that the peak is not doubled
  shared_.reset();
  auto a = std::make_unique<Shared>();
  a->B = B, a->T = T, a->mode = mode_;
  Backend& be = backend();
  const auto& block = layers_.blocks->front();
  if (local_part(global_parts() - 1) >= 0)
    a->head_scratch = nn::make_head_scratch(be, *layers_.head_placement, int64_t{B} * T,
                                            layers_.n_embd,
                                            layers_.head_weight->local_shape()[0], dtype(),
                                            storage().classifier_chunk_mb);
  a->dresidual = be.empty(block.residual_shape(B, T), dtype(), MemCategory::Activations);
  a->scratch = nn::TransformerBlock::make_scratch(be, *layers_.blocks, B, T, dtype());
  shared_ = std::move(a);
}

DecoderModel::Slot& DecoderModel::slot(int first, int end, int index) {
  auto& owned = slots_[{first, index}];
  if (owned) return *owned;
  const int L = n_layer(), B = shared_->B, T = shared_->T;
  auto a = std::make_unique<Slot>();
  a->embeds = first == 0;
  a->head = end == L + 2;
  a->b0 = std::max(first, 1) - 1;
  a->b1 = std::min(end, L + 1) - 1;
  Backend& be = backend();
  const DType dt = dtype();
  const auto& block = layers_.blocks->front();
  for (int l = a->b0; l <= a->b1; ++l)
    a->stream.push_back(be.empty(block.residual_shape(B, T), dt, MemCategory::Activations));
  std::vector<std::vector<nn::SavedSpec>> specs;
  for (int l = a->b0; l < a->b1; ++l)
    specs.push_back((*layers_.blocks)[static_cast<size_t>(l)].saved_specs(B, T, dt));
  a->saved.reserve(be, specs, mode_);
  if (a->head) {
    const auto [rb, rt] = block.residual_bt(B, T);
    for (const nn::SavedSpec& s : layers_.norm->saved_specs(rb, rt, dt))
      a->head_saved.push_back(be.empty(s.shape, s.dtype, MemCategory::Activations));
    const Tensor& out = a->head_saved[nn::Norm::kOut];
    a->dhead = a->embeds ? shared_->scratch.dtmp.view_at(0, out.shape())
                         : be.empty(out.shape(), dt, MemCategory::Activations);
  }
  owned = std::move(a);
  return *owned;
}

Tensor DecoderModel::stream_work() const {
  const Shared& a = *shared_;
  return a.scratch.work ? a.scratch.work.reshape(Shape{a.B, a.T, layers_.n_embd}) : Tensor();
}

nn::BlockPass DecoderModel::block_pass(const Slot& a, int l) const {
  const int m = moe_index_[static_cast<size_t>(l)];
  return nn::BlockPass{backend(),
                       backend().default_stream(),
                       a.saved.block(l - a.b0),
                       shared_->scratch,
                       dropout_spec(l, nn::kAttnProbsSite, shared_->T),
                       dropout_spec(l, nn::kAttnResidSite, shared_->T),
                       dropout_spec(l, nn::kMlpResidSite, shared_->T),
                       a.saved.rerun_block(),
                       a.saved.recompute_cheap(),
                       a.positions,
                       a.cu_seqlens,
                       a.balanced && m >= 0 ? balance_->pass(a.moe, m) : nn::MoeBalancePass{}};
}

void DecoderModel::embed_forward(const Batch& batch, const Tensor& positions, const Tensor& out) {
  const Tensor& tokens = batch.require("tokens", arch());
  KILN_CHECK(tokens.ndim() == 2 && tokens.size(0) == shared_->B && tokens.size(1) == shared_->T,
             "{}: tokens {} and targets {} must both be [B,T]", arch(), tokens.str(),
             batch.targets.str());
  Backend& be = backend();
  const Stream s = be.default_stream();
  layers_.embedding->forward(be, s, out, tokens, positions, 0, stream_work());
  const DropoutSpec d = nn::rows_dropout(dropout_spec(-1, nn::kEmbeddingSite, shared_->T),
                                         layers_.embedding->placement(), out.numel());
  if (d.p > 0.f) be.dropout_forward(s, out, out, d);
}

void DecoderModel::embed_backward(const Batch& batch, const Tensor& positions, const Tensor& dout) {
  Backend& be = backend();
  const Stream s = be.default_stream();
  const DropoutSpec d = nn::rows_dropout(dropout_spec(-1, nn::kEmbeddingSite, shared_->T),
                                         layers_.embedding->placement(), dout.numel());
  if (d.p > 0.f) be.dropout_backward(s, dout, dout, d);
  layers_.embedding->backward(be, s, dout, batch.require("tokens", arch()), positions,
                              stream_work());
}

void DecoderModel::embed(Slot& a) {
  hooks().before_forward(local_part(0));
  embed_forward(a.batch, a.positions, a.stream[0]);
  hooks().after_forward(local_part(0));
}

LossSum DecoderModel::forward(const Batch& batch, float grad_scale) {
  return forward_stage(StagePass{0, global_parts(), 0, batch, {}, {}, {}, {}}, grad_scale);
}

void DecoderModel::backward() {
  backward_stage(StagePass{0, global_parts(), 0, {}, {}, {}, {}, {}});
}

LossSum DecoderModel::forward_stage(const StagePass& p, float grad_scale) {
  const Tensor& targets = p.batch.targets;
  const Tensor positions = p.batch.input("positions");
  KILN_CHECK(targets.ndim() == 2, "{}: targets {} must be [B,T]", arch(), targets.str());
  KILN_CHECK(!positions || positions.shape() == targets.shape(),
             "{}: positions {} must be [B,T] like targets {}", arch(), positions.str(),
             targets.str());
  const int B = static_cast<int>(targets.size(0)), T = static_cast<int>(targets.size(1));
  KILN_CHECK(T <= max_positions(), "{}: sequence length {} exceeds block_size {}", arch(), T,
             max_positions());
  KILN_CHECK(p.first >= 0 && p.first < p.end && p.end <= global_parts(),
             "{}: no part range [{}, {})", arch(), p.first, p.end);
  for (int k = p.first; k < p.end; ++k)
    KILN_CHECK(local_part(k) >= 0, "{}: part {} is not held by this pipeline stage", arch(), k);
  reserve(B, T);
  Slot& a = slot(p.first, p.end, p.slot);
  a.batch = p.batch;
  a.positions = positions;
  a.cu_seqlens = p.batch.input("cu_seqlens");
  const bool with_grad = grad_scale > 0.f;
  a.balanced = balance_ && with_grad;
  if (a.balanced) {
    // The micro-batch counts once on each rank: on its first chunk.
    if (!a.moe.load) a.moe = balance_->micro_stats();
    const auto [first, end] = moe_layers(a.b0, a.b1);
    const bool count = p.first == parts().front().global_index;
    balance_->begin_forward(a.moe, int64_t{B} * T, first, end, count);
  }
  Backend& be = backend();
  const Stream s = be.default_stream();
  if (a.embeds) {
    embed(a);
  } else {
    check_shape(p.input, a.stream[0].shape(), "stage input");
    be.copy(s, a.stream[0], p.input);
  }
  for (int l = a.b0; l < a.b1; ++l) {
    hooks().before_forward(local_part(l + 1));
    (*layers_.blocks)[static_cast<size_t>(l)].forward(block_pass(a, l), a.stream[l - a.b0],
                                                      a.stream[l - a.b0 + 1]);
    hooks().after_forward(local_part(l + 1));
  }
  if (a.balanced) balance_->end_forward(a.moe);
  a.have_grad = with_grad;
  if (!a.head) {
    check_shape(p.output, a.stream.back().shape(), "stage output");
    be.copy(s, p.output, a.stream.back());
    return {};
  }
  // The output projection: its gradient lands in its weight's (lm_head, or the tied
  // embedding's) here, dL/d(norm out) in the slot's dhead for backward.
  const int head = local_part(global_parts() - 1);
  hooks().before_forward(head);
  layers_.norm->forward(be, s, a.head_saved, a.stream.back());
  const Tensor& x = a.head_saved[nn::Norm::kOut];
  nn::head_cross_entropy(be, s, *layers_.head_placement, x, layers_.head_weight->v(),
                         p.batch.targets, layers_.vocab_size, grad_scale,
                         with_grad ? a.dhead : Tensor(),
                         with_grad ? layers_.head_weight->trainable_grad() : Tensor(), shared_->head_scratch,
                         loss_.target(be, p.batch));
  hooks().after_forward(head);
  return loss_.result(be, p.batch);
}

void DecoderModel::backward_stage(const StagePass& p) {
  const auto it = slots_.find({p.first, p.slot});
  KILN_CHECK(it != slots_.end() && it->second->have_grad,
             "{}: backward needs a preceding forward with grad_scale > 0 (parts [{}, {}), slot {})",
             arch(), p.first, p.end, p.slot);
  Slot& a = *it->second;
  a.have_grad = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  const Tensor& dres = shared_->dresidual;
  if (a.head) {
    // Final norm: dresidual = norm'(dhead), dhead left by forward.
    const int head = local_part(global_parts() - 1);
    hooks().before_backward(head);
    be.fill(s, dres, 0.f);
    layers_.norm->backward(be, s, a.head_saved, dres, a.dhead, a.stream.back());
    hooks().after_backward(head);
  } else {
    check_shape(p.doutput, dres.shape(), "stage output gradient");
    be.copy(s, dres, p.doutput);
  }
  for (int l = a.b1 - 1; l >= a.b0; --l) {
    hooks().before_backward(local_part(l + 1));
    (*layers_.blocks)[static_cast<size_t>(l)].backward(block_pass(a, l), dres, a.stream[l - a.b0],
                                                       a.stream[l - a.b0 + 1]);
    hooks().after_backward(local_part(l + 1));
  }
  if (!a.embeds) {
    check_shape(p.dinput, dres.shape(), "stage input gradient");
    be.copy(s, p.dinput, dres);
    return;
  }
  hooks().before_backward(local_part(0));
  embed_backward(a.batch, a.positions, dres);
  a.batch = Batch();
  hooks().after_backward(local_part(0));
}

void DecoderModel::forward_logits(const Tensor& tokens, const Tensor& logits) {
  KILN_CHECK(tokens.ndim() == 2, "forward_logits: tokens must be [B,T], got {}", tokens.str());
  const int B = static_cast<int>(tokens.size(0)), T = static_cast<int>(tokens.size(1));
  check_shape(logits, Shape{B, T, padded_vocab_size()}, "forward_logits logits");
  KILN_CHECK(!layers_.head_placement->active() && !layers_.embedding->placement().active(),
             "{}: logits of a tensor-parallel model are not supported yet", arch());
  KILN_CHECK(static_cast<int>(parts().size()) == global_parts(),
             "{}: logits of a pipeline stage are not supported", arch());
  // The forward up to the final norm, without a loss: slot 0 of the whole model.
  reserve(B, T);
  Slot& a = slot(0, global_parts(), 0);
  a.batch = Batch();
  a.batch.set("tokens", tokens);
  a.positions = Tensor();
  a.cu_seqlens = Tensor();
  a.balanced = false;
  Backend& be = backend();
  const Stream s = be.default_stream();
  embed(a);
  for (int l = 0; l < n_layer(); ++l) {
    hooks().before_forward(l + 1);
    (*layers_.blocks)[static_cast<size_t>(l)].forward(block_pass(a, l), a.stream[l], a.stream[l + 1]);
    hooks().after_forward(l + 1);
  }
  const int head = n_layer() + 1;
  hooks().before_forward(head);
  layers_.norm->forward(be, s, a.head_saved, a.stream.back());
  a.have_grad = false;
  project_logits(logits, a.head_saved[nn::Norm::kOut], layers_.head_weight->v());
  hooks().after_forward(head);
}

}  // namespace kiln
