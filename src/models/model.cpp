// The Model interface's own code: look-ups, initialisation, the loss accumulator, the
// one-chunk stage default, batches and the capability look-ups.
#include "models/model.h"

#include "core/error.h"

#include <algorithm>

namespace kiln {

const ParamSpec& Model::spec(std::string_view name) const {
  for (const auto& p : params())
    if (p.name == name) return p;
  KILN_FAIL("{} has no parameter named '{}'", arch(), name);
}

int64_t Model::trainable_elements() const {
  int64_t n = 0;
  for (const ParamSpec& p : params())
    if (p.trainable && !p.tied_copy) n += p.shape.numel();
  return n;
}

int64_t Model::frozen_elements() const {
  int64_t n = 0;
  for (const ParamSpec& p : params())
    if (!p.trainable && !p.tied_copy) n += p.shape.numel();
  return n;
}

void Model::init_weights(uint64_t seed) {
  for (size_t i = 0; i < params().size(); ++i) {
    const ParamSpec& p = params()[i];
    // Each run of the rank's elements is drawn at its global indices (nn/tensor_parallel.h).
    std::vector<float> host;
    for (const auto& [b, e] : p.slice.global_runs(p.shape)) {
      const auto run = init_values(i, seed, b, e);
      host.insert(host.end(), run.begin(), run.end());
    }
    upload_f32(backend(), param(p), host.data());
  }
}

Tensor LossAccumulator::target(Backend& be, const Batch& batch) {
  if (batch.loss) {
    KILN_CHECK(batch.loss.dtype() == DType::F64 && batch.loss.numel() == 2,
               "batch loss accumulator must be fp64 [2], got {}", batch.loss.str());
    return batch.loss;
  }
  if (!own_) own_ = be.empty(Shape{2}, DType::F64, MemCategory::Activations);
  be.fill(be.default_stream(), own_, 0.f);
  return own_;
}

LossSum LossAccumulator::result(Backend& be, const Batch& batch) const {
  if (batch.loss) return {};
  double v[2] = {0.0, 0.0};
  be.copy_to_host(be.default_stream(), v, own_);  // completes before returning
  return {v[0], static_cast<int64_t>(v[1])};
}

namespace {
// Throws unless `p` is the one chunk of a model without stages: the whole model, slot 0.
void check_whole_model(const Model& m, const StagePass& p) {
  KILN_CHECK(p.first == 0 && p.end == static_cast<int>(m.parts().size()) && p.slot == 0,
             "{} does not run as pipeline stages (parts [{}, {}) of {}, slot {}): it runs only "
             "as one chunk", m.arch(), p.first, p.end, m.parts().size(), p.slot);
}
}  // namespace

LossSum Model::forward_stage(const StagePass& p, float grad_scale) {
  check_whole_model(*this, p);
  return forward(p.batch, grad_scale);
}

void Model::backward_stage(const StagePass& p) {
  check_whole_model(*this, p);
  backward();
}

// Batches ------------------------------------------------------------------------------

Shape batched(int64_t B, const Shape& item) {
  Shape s{B};
  for (int i = 0; i < item.ndim(); ++i) s.push_back(item[i]);
  return s;
}

const BatchInput* BatchShape::find(std::string_view name) const {
  for (const BatchInput& in : inputs)
    if (in.name == name) return &in;
  return nullptr;
}

std::vector<BatchInput> BatchShape::required() const {
  std::vector<BatchInput> out;
  for (const BatchInput& in : inputs)
    if (!in.optional) out.push_back(in);
  return out;
}

int64_t BatchShape::required_bytes() const {
  int64_t n = 0;
  for (const BatchInput& in : inputs)
    if (!in.optional) n += in.nbytes();
  return n;
}

Batch Batch::of_tokens(Tensor tokens, Tensor targets, Tensor positions) {
  Batch b;
  b.set("tokens", std::move(tokens));
  b.set("positions", std::move(positions));
  b.targets = std::move(targets);
  return b;
}

Batch Batch::of_images(Tensor images, Tensor targets) {
  Batch b;
  b.set("images", std::move(images));
  b.targets = std::move(targets);
  return b;
}

void Batch::set(std::string_view name, Tensor t) {
  auto it = std::find_if(inputs.begin(), inputs.end(), [&](const auto& in) { return in.first == name; });
  if (it != inputs.end()) inputs.erase(it);
  if (t) inputs.emplace_back(std::string(name), std::move(t));
}

Tensor Batch::input(std::string_view name) const {
  for (const auto& [n, t] : inputs)
    if (n == name) return t;
  return {};
}

const Tensor& Batch::require(std::string_view name, std::string_view model) const {
  for (const auto& [n, t] : inputs)
    if (n == name) return t;
  KILN_FAIL("{}: the batch has no input '{}'", model, name);
}

// Capabilities -------------------------------------------------------------------------

LanguageModel& as_language_model(Model& model, std::string_view who) {
  LanguageModel* m = model.language_model();
  KILN_CHECK(m, "{}: model.arch '{}' is not a language model (it has no vocabulary to decode "
             "text from)", who, model.arch());
  return *m;
}

ImageClassifier& as_image_classifier(Model& model, std::string_view who) {
  ImageClassifier* m = model.image_classifier();
  KILN_CHECK(m, "{}: model.arch '{}' is not an image classifier", who, model.arch());
  return *m;
}

VisionLanguageModel& as_vision_language_model(Model& model, std::string_view who) {
  VisionLanguageModel* m = model.vision_language_model();
  KILN_CHECK(m, "{}: model.arch '{}' is not a vision-language model (it reads no image among "
             "its text)", who, model.arch());
  return *m;
}

FlowModel& as_flow_model(Model& model, std::string_view who) {
  FlowModel* m = model.flow_model();
  KILN_CHECK(m, "{}: model.arch '{}' is not a flow model (it does not generate images)", who,
             model.arch());
  return *m;
}

}  // namespace kiln
