// ParamSpec: one named parameter inside a model's flat parameter buffer. Shared by
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
  int64_t offset = 0;         // in elements, within the flat buffer (of local_shape())
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
  int64_t frozen_before = 0;  // elements of frozen regions (ModelPart::frozen_size) before
                              // it in the flat layout: its gradient's offset is
                              // offset - frozen_before in the gradient layout
  /// The shape this rank stores: `shape`, or its slice.
  Shape local_shape() const { return slice.local_shape(shape); }
  /// Where its gradient starts in the flat gradient layout (trainable parameters only).
  int64_t grad_offset() const { return offset - frozen_before; }
};

}  // namespace kiln
