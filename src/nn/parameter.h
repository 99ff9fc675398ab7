// ParamSpec: one named parameter inside one of a model's flat parameter buffers. Shared by
// models (which define the layout), the optimizer, parallel wrappers and checkpoints.
#pragma once

#include "core/tensor.h"
#include "nn/param_slice.h"

#include <string>

namespace kiln {

struct ParamSpec {
  std::string name;           // Hugging Face-style name, e.g. transformer.h.0.ln_1.weight
  Shape shape;                // global shape
  nn::ParamSlice slice;          // the part of it this rank holds (tp and ep cuts; whole unless sliced)
  bool tp_partial_grad = false;  // the rank's gradient is a partial sum over tp
  int64_t offset = 0;         // in elements, within its flat layout (of local_shape()): the
                              // trainable layout (also its gradient's) when trainable, the
                              // frozen layout when not (models/model.h, ModelPart)
  bool weight_decay = false;  // matrices (2-D) decay; biases and norm gains do not
  int part = 0;               // the model part holding it (ModelPart::index)
  uint64_t init_stream = 0;   // the Philox stream of its initial values: its number in the
                              // whole model's layout, whatever parts this model holds
  bool tied_copy = false;     // a copy of a tied parameter whose owner part lives on another
                              // pipeline stage (GPT-2's wte beside the head): kept bitwise
                              // equal to the owner, saved and counted in norms by the owner
  bool trainable = true;      // false: frozen (nn::Param::trainable): no gradient storage,
                              // optimizer state, reduction or norm term; saved as before
  bool adapter = false;       // a LoRA adapter's (nn::Param::adapter): a fine-tune's
                              // checkpoints hold these, not the frozen base
  /// The shape this rank stores: `shape`, or its slice.
  Shape local_shape() const { return slice.local_shape(shape); }
};

}  // namespace kiln
