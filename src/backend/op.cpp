#include "backend/backend.h"

#include <vector>

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

void upload_f32(Backend& be, const Tensor& dst, const float* src) {
  if (dst.dtype() == DType::F32) {
    be.copy_from_host(be.default_stream(), dst, src);
    return;
  }
  std::vector<uint8_t> bytes(dst.nbytes());
  convert(src, DType::F32, bytes.data(), dst.dtype(), static_cast<size_t>(dst.numel()));
  be.copy_from_host(be.default_stream(), dst, bytes.data());
}

void download_f32(Backend& be, float* dst, const Tensor& src) {
  if (src.dtype() == DType::F32) {
    be.copy_to_host(be.default_stream(), dst, src);
    return;
  }
  std::vector<uint8_t> bytes(src.nbytes());
  be.copy_to_host(be.default_stream(), bytes.data(), src);
  convert(bytes.data(), src.dtype(), dst, DType::F32, static_cast<size_t>(src.numel()));
}

std::vector<float> download_f32(Backend& be, const Tensor& src) {
  std::vector<float> v(static_cast<size_t>(src.numel()));
  download_f32(be, v.data(), src);
  return v;
}

}  // namespace kiln
