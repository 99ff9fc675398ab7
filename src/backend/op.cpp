#include "backend/backend.h"

#include "core/error.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace kiln {

const char* family_name(OpFamily family) {
  switch (family) {
    case OpFamily::Embedding: return "embedding";
    case OpFamily::LayerNorm: return "layernorm";
    case OpFamily::RMSNorm: return "rmsnorm";
    case OpFamily::Linear: return "linear";
    case OpFamily::Attention: return "attention";
    case OpFamily::VarlenAttention: return "varlen_attention";
    case OpFamily::RingAttention: return "ring_attention";
    case OpFamily::Decode: return "decode";
    case OpFamily::Rope: return "rope";
    case OpFamily::SwiGLU: return "swiglu";
    case OpFamily::Gelu: return "gelu";
    case OpFamily::Silu: return "silu";
    case OpFamily::Modulate: return "modulate";
    case OpFamily::Add: return "add";
    case OpFamily::Dropout: return "dropout";
    case OpFamily::SoftmaxCrossEntropy: return "softmax_cross_entropy";
    case OpFamily::VocabParallel: return "vocab_parallel";
    case OpFamily::Patchify: return "patchify";
    case OpFamily::Unpatchify: return "unpatchify";
    case OpFamily::FlowMatching: return "flow_matching";
    case OpFamily::StepStats: return "step_stats";
    case OpFamily::AdamW: return "adamw";
    case OpFamily::Ema: return "ema";
    case OpFamily::MoE: return "moe";
    case OpFamily::Fp8: return "fp8";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
#define KILN_OP_NAME(Call, method, family, category, params, args) \
  case Op::Call:                                                   \
    return #method;
    KILN_BACKEND_OPS(KILN_OP_NAME)
#undef KILN_OP_NAME
  }
  return "?";
}

std::optional<Op> Backend::unsupported_op(OpFamily family, DType dtype) const {
  for (Op op : kAllOps)
    if (op_family(op) == family && !supports(op, dtype)) return op;
  return std::nullopt;
}

void require_ops(const Backend& be, OpFamily family, DType dtype, std::string_view feature) {
  if (const std::optional<Op> op = be.unsupported_op(family, dtype))
    KILN_FAIL("{} needs {}, which the {} backend does not run with {}", feature, op_name(*op),
              be.name(), dtype_name(dtype));
}

std::vector<float> rope_inv_freq(const RopeSpec& rope, int64_t head_dim) {
  KILN_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope: head size {} must be even and positive",
             head_dim);
  KILN_CHECK(rope.theta > 0.0, "rope: theta {} must be positive", rope.theta);
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[i] = 1.f / std::pow(static_cast<float>(rope.theta), e);
  }
  if (rope.scale_factor <= 0.0) return f;
  // Llama 3.1's rescaling (as transformers' _compute_llama3_parameters): wavelengths
  // longer than original / low_freq_factor are divided by the factor, shorter than
  // original / high_freq_factor kept, and those between blended linearly in
  // original / wavelength.
  KILN_CHECK(rope.high_freq_factor > rope.low_freq_factor,
             "rope: high_freq_factor {} must exceed low_freq_factor {}", rope.high_freq_factor,
             rope.low_freq_factor);
  const double low_wavelen = rope.original_max_positions / rope.low_freq_factor;
  const double high_wavelen = rope.original_max_positions / rope.high_freq_factor;
  for (float& x : f) {
    const double inv = x, wavelen = 2.0 * std::numbers::pi / inv;
    double out = inv;
    if (wavelen > low_wavelen) {
      out = inv / rope.scale_factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
      out = (1.0 - smooth) * inv / rope.scale_factor + smooth * inv;
    }
    x = static_cast<float>(out);
  }
  return f;
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

double Backend::marker_elapsed_ms(int64_t from, int64_t to) {
  KILN_FAIL("{}: no timing markers (ids {} and {}): record_marker returned -1 here", name(),
            from, to);
}

void adamw_tensor_step(Backend& be, Stream s, const AdamWTensor& t, const Tensor& scale,
                       const AdamWParams& hp) {
  AdamWParams h = hp;
  h.weight_decay = t.weight_decay;
  be.adamw_step(s, t.master ? t.master : t.param, t.grad, t.m, t.v, scale, h);
  if (t.master) be.copy(s, t.param, t.master);
}

double read_sum_squares(Backend& be, const Tensor& x) {
  const Stream s = be.default_stream();
  const Tensor acc = be.empty({1}, DType::F64, MemCategory::Temporaries);
  be.fill(s, acc, 0.f);
  be.sum_squares(s, acc, x);
  double host = 0.0;
  be.copy_to_host(s, &host, acc);
  return host;
}

uint64_t hash_bytes(Backend& be, const Tensor& t, uint64_t h) {
  std::vector<uint8_t> bytes(static_cast<size_t>(t.nbytes()));
  be.copy_to_host(be.default_stream(), bytes.data(), t);
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

std::vector<float> download_f32(Backend& be, const Tensor& src) {
  std::vector<float> v(static_cast<size_t>(src.numel()));
  download_f32(be, v.data(), src);
  return v;
}

}  // namespace kiln
