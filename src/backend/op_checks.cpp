#include "backend/op_checks.h"

namespace kiln::checks {

namespace {
int64_t rows(const Tensor& t) { return t.ndim() == 0 ? 0 : t.numel() / t.size(-1); }
}  // namespace

EmbeddingDims embedding(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                        const Tensor& wpe) {
  KILN_CHECK(tokens.ndim() == 2, "embedding: tokens must be [B,T], got {}", tokens.str());
  check_dtype(tokens, DType::I32, "embedding tokens");
  EmbeddingDims d{tokens.size(0), tokens.size(1), wte.size(-1), wte.size(0), wpe.size(0)};
  KILN_CHECK(wte.ndim() == 2 && wpe.ndim() == 2 && wpe.size(1) == d.C,
             "embedding: wte {} and wpe {} must be [Vp,C] and [maxT,C]", wte.str(), wpe.str());
  KILN_CHECK(d.T <= d.maxT, "embedding: sequence length {} exceeds the position table ({})", d.T,
             d.maxT);
  check_shape(out, Shape{d.B, d.T, d.C}, "embedding out");
  return d;
}

RowDims layernorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                  const Tensor& weight, const Tensor& bias) {
  RowDims d{rows(inp), inp.size(-1)};
  KILN_CHECK(out.numel() == inp.numel(), "layernorm: out {} and inp {} differ", out.str(),
             inp.str());
  KILN_CHECK(mean.numel() == d.N && rstd.numel() == d.N,
             "layernorm: mean {} / rstd {} must have {} elements", mean.str(), rstd.str(), d.N);
  check_dtype(mean, DType::F32, "layernorm mean");
  check_dtype(rstd, DType::F32, "layernorm rstd");
  KILN_CHECK(weight.numel() == d.C && bias.numel() == d.C,
             "layernorm: weight {} / bias {} must have C = {} elements", weight.str(), bias.str(),
             d.C);
  return d;
}

RowDims layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd) {
  const RowDims d = layernorm(dout, mean, rstd, inp, weight, dbias);
  same_size(dinp, inp, "layernorm_backward dinp");
  grad_of(dweight, weight, "layernorm_backward dweight");
  return d;
}

LinearDims linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  const LinearDims d = linear(dout, inp, weight, dbias);
  if (dinp) same_size(dinp, inp, "linear_backward dinp");
  if (dweight) grad_of(dweight, weight, "linear_backward dweight");
  return d;
}

LinearDims linear(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(weight.ndim() == 2, "linear: weight must be [OC,IC], got {}", weight.str());
  LinearDims d{rows(inp), weight.size(1), weight.size(0)};
  KILN_CHECK(inp.size(-1) == d.IC, "linear: inp {} does not match weight {}", inp.str(),
             weight.str());
  KILN_CHECK(out.size(-1) == d.OC && rows(out) == d.N, "linear: out {} must be [{}, {}]",
             out.str(), d.N, d.OC);
  if (bias) KILN_CHECK(bias.numel() == d.OC, "linear: bias {} must be [{}]", bias.str(), d.OC);
  return d;
}

AttentionDims attention(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head) {
  KILN_CHECK(qkv.ndim() == 3 && qkv.size(2) % 3 == 0, "attention: qkv must be [B,T,3C], got {}",
             qkv.str());
  AttentionDims d{qkv.size(0), qkv.size(1), qkv.size(2) / 3, n_head, 0};
  KILN_CHECK(n_head > 0 && d.C % n_head == 0, "attention: C = {} not divisible by n_head = {}",
             d.C, n_head);
  d.HD = d.C / n_head;
  check_shape(out, Shape{d.B, d.T, d.C}, "attention out");
  check_shape(lse, Shape{d.B, d.NH, d.T}, "attention lse");
  check_dtype(lse, DType::F32, "attention lse");
  return d;
}

DecodeDims attention_decode(const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& qkv, int64_t past, int n_head) {
  KILN_CHECK(qkv.ndim() == 3 && qkv.size(2) % 3 == 0,
             "attention_decode: qkv must be [B,Tq,3C], got {}", qkv.str());
  DecodeDims d{qkv.size(0), qkv.size(1), qkv.size(2) / 3, n_head, k_cache.size(1)};
  KILN_CHECK(n_head > 0 && d.C % n_head == 0,
             "attention_decode: C = {} not divisible by n_head = {}", d.C, n_head);
  check_shape(out, Shape{d.B, d.T, d.C}, "attention_decode out");
  KILN_CHECK(k_cache.ndim() == 3 && k_cache.size(0) == d.B && k_cache.size(2) == d.C,
             "attention_decode: k_cache {} must be [{}, Tmax, {}]", k_cache.str(), d.B, d.C);
  check_shape(v_cache, k_cache.shape(), "attention_decode v_cache");
  KILN_CHECK(past >= 0 && past + d.T <= d.Tmax,
             "attention_decode: positions {}..{} exceed the cache of {}", past, past + d.T - 1,
             d.Tmax);
  return d;
}

CrossEntropyDims cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                               const Tensor& targets, int vocab_size) {
  CrossEntropyDims d{rows(logits), logits.size(-1)};
  KILN_CHECK(vocab_size > 0 && vocab_size <= d.Vp,
             "softmax_cross_entropy: vocab_size {} outside (0, {}]", vocab_size, d.Vp);
  KILN_CHECK(losses.numel() == d.N, "softmax_cross_entropy: losses {} must have {} elements",
             losses.str(), d.N);
  check_dtype(losses, DType::F32, "softmax_cross_entropy losses");
  KILN_CHECK(targets.numel() == d.N, "softmax_cross_entropy: targets {} must have {} elements",
             targets.str(), d.N);
  check_dtype(targets, DType::I32, "softmax_cross_entropy targets");
  if (dlogits)
    KILN_CHECK(dlogits.numel() == logits.numel(), "softmax_cross_entropy: dlogits {} vs logits {}",
               dlogits.str(), logits.str());
  return d;
}

void grad_of(const Tensor& grad, const Tensor& param, const char* op) {
  KILN_CHECK(grad.numel() == param.numel() &&
                 (grad.dtype() == DType::F32 || grad.dtype() == param.dtype()),
             "{}: gradient {} does not match parameter {} (same size, fp32 or its dtype)", op,
             grad.str(), param.str());
}

void same_size(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.numel() == b.numel() && a.dtype() == b.dtype(), "{}: {} and {} differ", op, a.str(),
             b.str());
}

}  // namespace kiln::checks
