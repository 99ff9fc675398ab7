// The MMDiT's text encoder (model.text.encoder): what turns a caption's Lc token slots into
// the rows [Lc, Ct] the context stream and the pooled conditioning read.
//   "joint"  JointTextEncoder (joint_text_encoder.h): a bidirectional transformer trained
//            with the model;
//   "llama"  LlamaTextEncoder (llama_text_encoder.h): a frozen Llama decoder's hidden
//            states.
// A caption's padding slots (-1) are a document of their own (cu_seqlens): whatever the
// encoder writes there, no caption token reads it.
#pragma once

#include "backend/backend.h"
#include "models/mmdit/config.h"
#include "nn/param.h"
#include "nn/saved.h"

#include <memory>
#include <vector>

namespace kiln {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;

  /// Its parameters, in layout order (a frozen encoder's with trainable false).
  virtual void collect(std::vector<nn::Param*>& out) = 0;
  /// Its part cost per caption position (LayeredModel part balancing): the matmul weights
  /// a position meets in a training step, a third of them for a forward-only encoder.
  virtual double cost_per_position() const = 0;
  /// Allocates the activations of B captions in `dtype`, what `mode` keeps (again only
  /// when one of them changes).
  virtual void reserve(Backend& be, int B, DType dtype, nn::ActivationCheckpointing mode) = 0;
  /// output() [B,Lc,Ct] from tokens int32 [B,Lc] (ids, then -1) and cu_seqlens int32
  /// [2B+1] (each caption, then its padding).
  virtual void forward(Backend& be, Stream s, const Tensor& tokens, const Tensor& cu_seqlens) = 0;
  virtual const Tensor& output() const = 0;
  /// The parameters' gradients from denc = dL/doutput() [B,Lc,Ct] (forward's tokens and
  /// cu_seqlens); nothing for a frozen encoder.
  virtual void backward(Backend& be, Stream s, const Tensor& denc, const Tensor& tokens,
                        const Tensor& cu_seqlens) = 0;
};

/// The encoder c.text_encoder names, its parameters under "text_encoder.".
std::unique_ptr<TextEncoder> make_text_encoder(const MMDiTConfig& c);

}  // namespace kiln
