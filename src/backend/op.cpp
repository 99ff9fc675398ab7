#include "backend/backend.h"

namespace kiln {

const char* op_name(Op op) {
  switch (op) {
    case Op::Embedding: return "embedding";
    case Op::LayerNorm: return "layernorm";
    case Op::Linear: return "linear";
    case Op::Attention: return "attention";
    case Op::Gelu: return "gelu";
    case Op::Add: return "add";
    case Op::Dropout: return "dropout";
    case Op::SoftmaxCrossEntropy: return "softmax_cross_entropy";
    case Op::AdamW: return "adamw";
  }
  return "?";
}

}  // namespace kiln
