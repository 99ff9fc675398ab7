#include "models/layered_model.h"

#include "core/error.h"
#include "nn/block.h"

#include <algorithm>
#include <map>

namespace kiln {

LayerRoles layer_roles(std::string arch, const ParallelTables& tables,
                       nn::TokenPositionEmbedding& embedding,
                       std::vector<nn::TransformerBlock>& blocks, nn::Norm& final_norm,
                       nn::Linear* lm_head) {
  LayerRoles r;
  r.arch = std::move(arch);
  r.tables = tables;
  r.embedding = &embedding;
  for (auto& b : blocks) r.blocks.push_back(&b);
  r.final_norm = &final_norm;
  r.lm_head = lm_head;
  return r;
}

namespace {

// Every parameter's owner (the first part listing it) and init stream (its number).
using Owners = std::map<const nn::Param*, std::pair<int, uint64_t>>;

// The regions of a part, in layout order (ModelPart): its trainable dense parameters, its
// trainable expert-parallel ones (ParamSlice::ep_sharded), its frozen dense ones, its
// frozen expert-parallel ones.
enum class Region { Dense, Expert, Frozen, FrozenExpert };

Region region_of(const nn::Param& prm) {
  const bool expert = prm.slice.ep_sharded();
  if (!prm.trainable) return expert ? Region::FrozenExpert : Region::Frozen;
  return expert ? Region::Expert : Region::Dense;
}

// Appends part k's parameters of region `region` to `out` from `offset` in the region's
// layout (trainable or frozen; advanced past them); returns whether it laid out a tied copy.
bool place_params(const PartLayout& part, int k, const Owners& owner,
                  const std::vector<bool>& is_held, Region region, const ModelPart& mp,
                  int64_t& offset, FlatLayout& out) {
  bool copies = false;
  for (nn::Param* prm : part.params) {
    const auto [o, stream] = owner.at(prm);
    const bool copy = o != k;
    if (copy && is_held[static_cast<size_t>(o)]) continue;  // laid out in its owner
    if (region_of(*prm) != region) continue;
    ParamSpec p;
    p.name = prm->name;
    p.shape = prm->shape;
    p.slice = prm->slice;
    p.tp_partial_grad = prm->tp_partial_grad;
    p.offset = offset;
    p.weight_decay = prm->weight_decay;
    p.part = mp.index;
    p.init_stream = stream;
    p.tied_copy = copy;
    p.trainable = region == Region::Dense || region == Region::Expert;
    p.adapter = prm->adapter;
    copies = copies || copy;
    offset += p.local_shape().numel();
    out.params.push_back(std::move(p));
    out.layer_params.push_back(prm);
  }
  return copies;
}

}  // namespace

FlatLayout lay_out(const std::vector<PartLayout>& parts, int64_t alignment,
                   const std::vector<int>& held) {
  KILN_CHECK(alignment >= 1, "part alignment must be >= 1, got {}", alignment);
  const auto n_parts = static_cast<int>(parts.size());
  std::vector<bool> is_held(parts.size(), held.empty());
  for (int k : held) {
    KILN_CHECK(k >= 0 && k < n_parts, "held part {} outside the model's {} parts", k, n_parts);
    is_held[static_cast<size_t>(k)] = true;
  }
  Owners owner;
  for (bool adapters : {false, true})  // a model's own parameters first (nn::Param::adapter)
    for (int k = 0; k < n_parts; ++k)
      for (const nn::Param* prm : parts[static_cast<size_t>(k)].params)
        if (prm->adapter == adapters) owner.try_emplace(prm, k, owner.size());
  std::vector<bool> lends(parts.size(), false);  // owns a parameter a later held part uses
  for (int k = 0; k < n_parts; ++k)
    for (const nn::Param* prm : parts[static_cast<size_t>(k)].params)
      if (const int o = owner.at(prm).first; o != k && is_held[static_cast<size_t>(k)])
        lends[static_cast<size_t>(o)] = true;
  auto align = [&](int64_t x) { return (x + alignment - 1) / alignment * alignment; };
  FlatLayout out;
  int64_t offset = 0, frozen = 0;  // the ends of the trainable and frozen layouts so far
  for (int k = 0; k < n_parts; ++k) {
    if (!is_held[static_cast<size_t>(k)]) continue;
    const PartLayout& part = parts[static_cast<size_t>(k)];
    ModelPart mp;
    mp.index = static_cast<int>(out.parts.size());
    mp.global_index = k;
    mp.name = part.name;
    mp.cost = part.cost;
    mp.resident = part.resident || lends[static_cast<size_t>(k)];
    bool copies = false;
    // Lays out region r in its layout from `at`, aligned from `start` (the part's begin in
    // that layout); returns its padded size.
    auto place_region = [&](Region r, int64_t start, int64_t& at) {
      const int64_t region_begin = start + align(at - start);
      int64_t region_end = region_begin;
      copies = place_params(part, k, owner, is_held, r, mp, region_end, out) || copies;
      if (region_end == region_begin) return int64_t{0};
      at = region_end;
      return align(region_end - region_begin);
    };
    // Trainable: the dense parameters, then (aligned) the expert-parallel ones.
    mp.begin = offset = align(offset);  // a part starts aligned
    place_region(Region::Dense, mp.begin, offset);
    mp.expert_size = place_region(Region::Expert, mp.begin, offset);
    mp.end = offset;
    mp.padded_end = mp.begin + align(mp.end - mp.begin);
    offset = mp.padded_end;
    // Frozen: likewise, in the frozen layout.
    mp.frozen_begin = frozen;  // aligned: the sizes before it are padded
    mp.frozen_size = place_region(Region::Frozen, mp.frozen_begin, frozen);
    mp.frozen_expert_size = place_region(Region::FrozenExpert, mp.frozen_begin, frozen);
    mp.frozen_size += mp.frozen_expert_size;
    frozen = mp.frozen_begin + mp.frozen_size;
    mp.resident = mp.resident || copies;
    out.parts.push_back(mp);
  }
  return out;
}

int LayeredModel::local_part(int global) const {
  return global >= 0 && global < global_parts_ ? local_of_global_[static_cast<size_t>(global)] : -1;
}

LayeredModel::LayeredModel(Backend& backend, const ModelStorage& storage)
    : backend_(backend), storage_(storage) {}

void LayeredModel::build(const std::vector<PartLayout>& parts,
                         const std::vector<OpFamily>& ops) {
  KILN_CHECK(storage_.grad_dtype == DType::F32 || storage_.grad_dtype == trainable_dtype(),
             "{}: gradients in {} with parameters in {} are not supported", arch(),
             dtype_name(storage_.grad_dtype), dtype_name(trainable_dtype()));
  for (OpFamily op : ops)
    KILN_CHECK(backend_.supports(op, storage_.dtype), "backend {} has no {} {}", backend_.name(),
               dtype_name(storage_.dtype), family_name(op));
  if (!storage_.freeze.empty()) {
    std::vector<nn::Param*> all;  // the whole model's, held or not, each once
    for (const PartLayout& part : parts)
      for (nn::Param* prm : part.params)
        if (std::find(all.begin(), all.end(), prm) == all.end()) all.push_back(prm);
    nn::freeze_matching(all, storage_.freeze, "train.freeze");
    // Over the whole model: a pipeline stage whose own parameters are all frozen still
    // passes gradients back to the trainable ones of earlier stages.
    KILN_CHECK(std::any_of(all.begin(), all.end(), [](const nn::Param* p) { return p->trainable; }),
               "{}: every parameter is frozen (train.freeze): there is nothing to train", arch());
  }
  if (trainable_dtype() != storage_.dtype)  // only adapters cast their weights (nn/lora.h)
    for (const PartLayout& part : parts)
      for (const nn::Param* prm : part.params)
        KILN_CHECK(!prm->trainable || prm->adapter, "{}: trainable parameters in {} with the "
                   "model in {} must all be LoRA adapters, but {} trains", arch(),
                   dtype_name(trainable_dtype()), dtype_name(storage_.dtype), prm->name);
  FlatLayout layout = lay_out(parts, storage_.part_alignment, storage_.held_parts);
  params_ = std::move(layout.params);
  layer_params_ = std::move(layout.layer_params);
  parts_ = std::move(layout.parts);
  global_parts_ = static_cast<int>(parts.size());
  local_of_global_.assign(parts.size(), -1);
  for (const ModelPart& u : parts_) local_of_global_[static_cast<size_t>(u.global_index)] = u.index;
  part_params_.resize(parts_.size());
  part_frozen_.resize(parts_.size());
  part_grads_.resize(parts_.size());
  const Stream s = backend_.default_stream();
  if (storage_.allocate_params) {
    param_buffer_ = backend_.empty(Shape{flat_size()}, trainable_dtype(), MemCategory::Parameters);
    frozen_buffer_ =
        backend_.empty(Shape{frozen_flat_size()}, storage_.dtype, MemCategory::Parameters);
    for (const Tensor* t : {&param_buffer_, &frozen_buffer_})
      if (*t) backend_.fill(s, *t, 0.f);  // either may be empty
    for (const ModelPart& u : parts_)
      bind_params(u.index, param_buffer_.view_at(u.begin, Shape{u.padded_size()}),
                  frozen_buffer_.view_at(u.frozen_begin, Shape{u.frozen_size}));
  }
  if (storage_.allocate_grads) {
    grad_buffer_ = backend_.empty(Shape{flat_size()}, storage_.grad_dtype, MemCategory::Gradients);
    for (const ModelPart& u : parts_)
      if (u.padded_size() > 0)
        bind_grads(u.index, grad_buffer_.view_at(u.begin, Shape{u.padded_size()}));
    zero_grad();
  }
}

int64_t LayeredModel::frozen_flat_size() const {
  return parts_.empty() ? 0 : parts_.back().frozen_begin + parts_.back().frozen_size;
}

const ModelPart& LayeredModel::part_of(int index) const {
  KILN_CHECK(index >= 0 && index < static_cast<int>(parts_.size()), "{}: no part {}", arch(), index);
  return parts_[static_cast<size_t>(index)];
}

void LayeredModel::bind_params(int part, const Tensor& storage, const Tensor& frozen) {
  const ModelPart& u = part_of(part);
  if (storage) check_shape(storage, Shape{u.padded_size()}, "bind_params storage");
  if (frozen) check_shape(frozen, Shape{u.frozen_size}, "bind_params frozen storage");
  part_params_[static_cast<size_t>(part)] = storage;
  part_frozen_[static_cast<size_t>(part)] = frozen;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].part == part) {
      const Tensor& t = params_[i].trainable ? storage : frozen;
      layer_params_[i]->value =
          t ? t.view_at(in_part(params_[i]), params_[i].local_shape()) : Tensor();
    }
}

void LayeredModel::bind_grads(int part, const Tensor& storage) {
  const ModelPart& u = part_of(part);
  if (storage) check_shape(storage, Shape{u.padded_size()}, "bind_grads storage");
  part_grads_[static_cast<size_t>(part)] = storage;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].part == part && params_[i].trainable)
      layer_params_[i]->grad =
          storage ? storage.view_at(in_part(params_[i]), params_[i].local_shape()) : Tensor();
}

int64_t LayeredModel::in_part(const ParamSpec& p) const {
  const ModelPart& u = part_of(p.part);
  return p.offset - (p.trainable ? u.begin : u.frozen_begin);
}

Tensor LayeredModel::param(const ParamSpec& p) const {
  const auto& bound = p.trainable ? part_params_ : part_frozen_;
  const Tensor& t = bound[static_cast<size_t>(p.part)];
  KILN_CHECK(t, "{}: parameter {} is not bound (part {})", arch(), p.name, p.part);
  return t.view_at(in_part(p), p.local_shape());
}

Tensor LayeredModel::grad(const ParamSpec& p) const {
  KILN_CHECK(p.trainable, "{}: {} is frozen (train.freeze): it has no gradient", arch(), p.name);
  const Tensor& t = part_grads_[static_cast<size_t>(p.part)];
  KILN_CHECK(t, "{}: gradient of {} is not bound (part {})", arch(), p.name, p.part);
  return t.view_at(in_part(p), p.local_shape());
}

std::vector<float> LayeredModel::init_values(size_t index, uint64_t seed, int64_t begin,
                                             int64_t end) const {
  KILN_CHECK(index < layer_params_.size(), "{}: no parameter number {}", arch(), index);
  return nn::init_values(*layer_params_[index], seed, params_[index].init_stream, begin, end);
}

void LayeredModel::project_logits(const Tensor& out, const Tensor& x, const Tensor& weight) const {
  const Stream s = backend_.default_stream();
  if (out.dtype() == storage_.dtype) {
    backend_.linear_forward(s, out, x, weight, Tensor());
    return;
  }
  Tensor tmp = backend_.empty(out.shape(), storage_.dtype, MemCategory::Temporaries);
  backend_.linear_forward(s, tmp, x, weight, Tensor());
  backend_.copy(s, out, tmp);
}

void LayeredModel::last_positions(const Tensor& out, const Tensor& x) const {
  const int64_t B = x.size(0), Tq = x.size(1), C = x.size(2);
  check_shape(out, Shape{B, C}, "last_positions out");
  const Stream s = backend_.default_stream();
  for (int64_t b = 0; b < B; ++b)
    backend_.copy(s, out.view_at(b * C, Shape{C}), x.view_at((b * Tq + Tq - 1) * C, Shape{C}));
}

void LayeredModel::zero_grad() {
  const Stream s = backend_.default_stream();
  if (grad_buffer_) {
    backend_.fill(s, grad_buffer_, 0.f);
    return;
  }
  for (const Tensor& g : part_grads_)
    if (g) backend_.fill(s, g, 0.f);
}

}  // namespace kiln
