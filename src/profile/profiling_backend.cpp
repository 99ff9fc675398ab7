#include "profile/profiling_backend.h"

#include "core/dtype.h"

#include <fmt/format.h>

namespace kiln::profile {

namespace cost {
namespace {
double es(const Tensor& t) { return static_cast<double>(dtype_size(t.dtype())); }
double d(int64_t x) { return static_cast<double>(x); }
int64_t last(const Tensor& t) { return t.size(-1); }
int64_t rows(const Tensor& t) { return t.numel() / last(t); }
}  // namespace

OpCost embedding_forward(const Tensor& out, const Tensor& tokens) {
  const int64_t N = tokens.numel(), T = tokens.size(-1), C = last(out);
  const double e = es(out);
  return {d(N * C), 4.0 * d(N) + d(N * C) * e + d(T * C) * e + d(N * C) * e,
          fmt::format("B={} T={} C={}", N / T, T, C)};
}

OpCost embedding_backward(const Tensor& dout, const Tensor& tokens) {
  const int64_t N = tokens.numel(), T = tokens.size(-1), C = last(dout);
  const double e = es(dout);
  return {2.0 * d(N * C), d(N * C) * e + 4.0 * d(N) + 2.0 * d(N * C) * e + 2.0 * d(T * C) * e,
          fmt::format("B={} T={} C={}", N / T, T, C)};
}

OpCost layernorm_forward(const Tensor& inp) {
  const int64_t C = last(inp), N = rows(inp);
  return {8.0 * d(N * C), (2.0 * d(N * C) + 2.0 * d(C)) * es(inp) + 8.0 * d(N),
          fmt::format("N={} C={}", N, C)};
}

OpCost layernorm_backward(const Tensor& inp) {
  const int64_t C = last(inp), N = rows(inp);
  return {14.0 * d(N * C), (4.0 * d(N * C) + 5.0 * d(C)) * es(inp) + 8.0 * d(N),
          fmt::format("N={} C={}", N, C)};
}

OpCost linear_forward(const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const int64_t IC = last(inp), N = rows(inp), OC = weight.size(0);
  const bool b = static_cast<bool>(bias);
  const double flops = 2.0 * d(N) * d(IC) * d(OC) + (b ? d(N * OC) : 0.0);
  const double bytes = (d(N * IC) + d(OC * IC) + d(N * OC) + (b ? d(OC) : 0.0)) * es(inp);
  return {flops, bytes, fmt::format("N={} IC={} OC={}", N, IC, OC)};
}

OpCost linear_backward(const Tensor& dinp, const Tensor& dbias, const Tensor& inp,
                       const Tensor& weight) {
  const int64_t IC = last(inp), N = rows(inp), OC = weight.size(0);
  const bool di = static_cast<bool>(dinp), db = static_cast<bool>(dbias);
  const double mm = 2.0 * d(N) * d(IC) * d(OC);
  const double flops = mm + (di ? mm : 0.0) + (db ? d(N * OC) : 0.0);
  const double bytes = (d(N * OC) + d(N * IC) + 2.0 * d(OC * IC) +
                        (di ? d(OC * IC) + d(N * IC) : 0.0) + (db ? 2.0 * d(OC) : 0.0)) *
                       es(inp);
  return {flops, bytes,
          fmt::format("N={} IC={} OC={}{}", N, IC, OC, di ? "" : " (no dinp)")};
}

namespace {
OpCost attention(const Tensor& qkv, int n_head, double matmuls, double tensors_btc) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  // matmuls * (2 HD FLOPs per causal pair) * NH heads * T(T+1)/2 pairs * B
  //   = matmuls * B * C * T * (T+1)
  const double flops = matmuls * d(B) * d(C) * d(T) * d(T + 1);
  const double bytes = tensors_btc * d(B * T * C) * es(qkv) + 4.0 * d(B * n_head * T);
  return {flops, bytes, fmt::format("B={} T={} C={} NH={}", B, T, C, n_head)};
}
}  // namespace

OpCost attention_forward(const Tensor& qkv, int n_head) { return attention(qkv, n_head, 2.0, 4.0); }
OpCost attention_backward(const Tensor& qkv, int n_head) { return attention(qkv, n_head, 5.0, 8.0); }

OpCost attention_decode(const Tensor& qkv, int64_t past) {
  const int64_t B = qkv.size(0), Tq = qkv.size(1), C = qkv.size(2) / 3;
  const double pairs = d(Tq) * d(past) + d(Tq) * d(Tq + 1) / 2.0;
  const double flops = 4.0 * d(B) * d(C) * pairs;
  const double bytes = (3.0 * d(B * Tq * C) + 2.0 * d(B * (past + Tq) * C) + 2.0 * d(B * Tq * C) +
                        d(B * Tq * C)) * es(qkv);
  return {flops, bytes, fmt::format("B={} Tq={} past={} C={}", B, Tq, past, C)};
}

OpCost gelu_forward(const Tensor& inp) {
  const double n = d(inp.numel());
  return {8.0 * n, 2.0 * n * es(inp), fmt::format("n={}", inp.numel())};
}
OpCost gelu_backward(const Tensor& inp) {
  const double n = d(inp.numel());
  return {16.0 * n, 3.0 * n * es(inp), fmt::format("n={}", inp.numel())};
}
OpCost add(const Tensor& out) {
  const double n = d(out.numel());
  return {n, 3.0 * n * es(out), fmt::format("n={}", out.numel())};
}
OpCost dropout(const Tensor& t) {
  const double n = d(t.numel());
  return {n, 2.0 * n * es(t), fmt::format("n={}", t.numel())};
}

OpCost softmax_cross_entropy(const Tensor& logits, const Tensor& dlogits, int vocab_size) {
  const int64_t Vp = last(logits), N = rows(logits);
  const bool g = static_cast<bool>(dlogits);
  const double flops = (3.0 + (g ? 2.0 : 0.0)) * d(N) * d(vocab_size);
  const double bytes = d(N * Vp) * es(logits) * (g ? 2.0 : 1.0) + 8.0 * d(N);
  return {flops, bytes, fmt::format("N={} V={} Vp={}{}", N, vocab_size, Vp, g ? "" : " (no grad)")};
}

OpCost adamw_step(const Tensor& param, const Tensor& grad) {
  const double n = d(param.numel());
  return {14.0 * n, 2.0 * n * es(param) + n * es(grad) + 16.0 * n,
          fmt::format("n={}", param.numel())};
}

OpCost sum_squares(const Tensor& t) {
  const double n = d(t.numel());
  return {2.0 * n, n * es(t), fmt::format("n={}", t.numel())};
}

OpCost copy(size_t nbytes) {
  return {0.0, 2.0 * static_cast<double>(nbytes), fmt::format("bytes={}", nbytes)};
}

OpCost fill(const Tensor& t) {
  return {0.0, static_cast<double>(t.nbytes()), fmt::format("n={}", t.numel())};
}
}  // namespace cost

ProfilingBackend::ProfilingBackend(Backend& inner, Tracer& tracer, bool synchronize_ops)
    : inner_(inner), tracer_(tracer), sync_(synchronize_ops) {}

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner, Tracer& tracer,
                                   bool synchronize_ops)
    : owned_(std::move(inner)), inner_(*owned_), tracer_(tracer), sync_(synchronize_ops) {}

void ProfilingBackend::finish(const char* name, const char* category, Stream s,
                              Clock::time_point t0, const OpCost& c) {
  if (sync_) inner_.synchronize(s);
  tracer_.record_complete(name, category, t0, Clock::now(), c.flops, c.bytes, c.shape);
}

// Disabled: forward and return after one relaxed load. Enabled: time the call, then
// record it with its cost (computed after the call, from shapes only).
#define KILN_PROFILED(NAME, CATEGORY, CALL, COST) \
  do {                                            \
    if (!tracer_.enabled()) {                     \
      CALL;                                       \
      return;                                     \
    }                                             \
    const auto t0_ = Clock::now();                \
    CALL;                                         \
    finish(NAME, CATEGORY, s, t0_, COST);         \
  } while (0)

void ProfilingBackend::copy_from_host(Stream s, const Tensor& dst, const void* src) {
  KILN_PROFILED("copy_from_host", "memory", inner_.copy_from_host(s, dst, src),
                cost::copy(dst.nbytes()));
}
void ProfilingBackend::copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src,
                                             uint64_t seed, uint64_t stream) {
  KILN_PROFILED("copy_stochastic_round", "memory",
                inner_.copy_stochastic_round(s, dst, src, seed, stream),
                cost::copy(src.nbytes()));
}

void ProfilingBackend::copy_to_host(Stream s, void* dst, const Tensor& src) {
  KILN_PROFILED("copy_to_host", "memory", inner_.copy_to_host(s, dst, src),
                cost::copy(src.nbytes()));
}
void ProfilingBackend::copy(Stream s, const Tensor& dst, const Tensor& src) {
  KILN_PROFILED("copy", "memory", inner_.copy(s, dst, src), cost::copy(src.nbytes()));
}
void ProfilingBackend::fill(Stream s, const Tensor& t, float value) {
  KILN_PROFILED("fill", "memory", inner_.fill(s, t, value), cost::fill(t));
}
double ProfilingBackend::sum_squares(Stream s, const Tensor& t) {
  if (!tracer_.enabled()) return inner_.sum_squares(s, t);
  const auto t0 = Clock::now();
  const double r = inner_.sum_squares(s, t);
  finish("sum_squares", "optimizer", s, t0, cost::sum_squares(t));
  return r;
}

void ProfilingBackend::embedding_forward(Stream s, const Tensor& out, const Tensor& tokens,
                                         const Tensor& wte, const Tensor& wpe) {
  KILN_PROFILED("embedding_forward", "forward", inner_.embedding_forward(s, out, tokens, wte, wpe),
                cost::embedding_forward(out, tokens));
}
void ProfilingBackend::embedding_backward(Stream s, const Tensor& dwte, const Tensor& dwpe,
                                          const Tensor& dout, const Tensor& tokens) {
  KILN_PROFILED("embedding_backward", "backward",
                inner_.embedding_backward(s, dwte, dwpe, dout, tokens),
                cost::embedding_backward(dout, tokens));
}
void ProfilingBackend::layernorm_forward(Stream s, const Tensor& out, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& inp,
                                         const Tensor& weight, const Tensor& bias, float eps) {
  KILN_PROFILED("layernorm_forward", "forward",
                inner_.layernorm_forward(s, out, mean, rstd, inp, weight, bias, eps),
                cost::layernorm_forward(inp));
}
void ProfilingBackend::layernorm_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                          const Tensor& dbias, const Tensor& dout,
                                          const Tensor& inp, const Tensor& weight,
                                          const Tensor& mean, const Tensor& rstd) {
  KILN_PROFILED("layernorm_backward", "backward",
                inner_.layernorm_backward(s, dinp, dweight, dbias, dout, inp, weight, mean, rstd),
                cost::layernorm_backward(inp));
}
void ProfilingBackend::linear_forward(Stream s, const Tensor& out, const Tensor& inp,
                                      const Tensor& weight, const Tensor& bias) {
  KILN_PROFILED("linear_forward", "forward", inner_.linear_forward(s, out, inp, weight, bias),
                cost::linear_forward(inp, weight, bias));
}
void ProfilingBackend::linear_backward(Stream s, const Tensor& dinp, const Tensor& dweight,
                                       const Tensor& dbias, const Tensor& dout,
                                       const Tensor& inp, const Tensor& weight) {
  KILN_PROFILED("linear_backward", "backward",
                inner_.linear_backward(s, dinp, dweight, dbias, dout, inp, weight),
                cost::linear_backward(dinp, dbias, inp, weight));
}
void ProfilingBackend::attention_forward(Stream s, const Tensor& out, const Tensor& lse,
                                         const Tensor& qkv, int n_head,
                                         const DropoutSpec& dropout) {
  KILN_PROFILED("attention_forward", "forward",
                inner_.attention_forward(s, out, lse, qkv, n_head, dropout),
                cost::attention_forward(qkv, n_head));
}
void ProfilingBackend::attention_backward(Stream s, const Tensor& dqkv, const Tensor& dout,
                                          const Tensor& qkv, const Tensor& out,
                                          const Tensor& lse, int n_head,
                                          const DropoutSpec& dropout) {
  KILN_PROFILED("attention_backward", "backward",
                inner_.attention_backward(s, dqkv, dout, qkv, out, lse, n_head, dropout),
                cost::attention_backward(qkv, n_head));
}
void ProfilingBackend::attention_decode(Stream s, const Tensor& out, const Tensor& k_cache,
                                        const Tensor& v_cache, const Tensor& qkv, int64_t past,
                                        int n_head) {
  KILN_PROFILED("attention_decode", "forward",
                inner_.attention_decode(s, out, k_cache, v_cache, qkv, past, n_head),
                cost::attention_decode(qkv, past));
}
void ProfilingBackend::gelu_forward(Stream s, const Tensor& out, const Tensor& inp) {
  KILN_PROFILED("gelu_forward", "forward", inner_.gelu_forward(s, out, inp),
                cost::gelu_forward(inp));
}
void ProfilingBackend::gelu_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                     const Tensor& inp) {
  KILN_PROFILED("gelu_backward", "backward", inner_.gelu_backward(s, dinp, dout, inp),
                cost::gelu_backward(inp));
}
void ProfilingBackend::add(Stream s, const Tensor& out, const Tensor& a, const Tensor& b) {
  KILN_PROFILED("add", "forward", inner_.add(s, out, a, b), cost::add(out));
}
void ProfilingBackend::dropout_forward(Stream s, const Tensor& out, const Tensor& inp,
                                       const DropoutSpec& spec) {
  KILN_PROFILED("dropout_forward", "forward", inner_.dropout_forward(s, out, inp, spec),
                cost::dropout(inp));
}
void ProfilingBackend::dropout_backward(Stream s, const Tensor& dinp, const Tensor& dout,
                                        const DropoutSpec& spec) {
  KILN_PROFILED("dropout_backward", "backward", inner_.dropout_backward(s, dinp, dout, spec),
                cost::dropout(dout));
}
void ProfilingBackend::softmax_cross_entropy(Stream s, const Tensor& losses,
                                             const Tensor& dlogits, const Tensor& logits,
                                             const Tensor& targets, int vocab_size,
                                             int ignore_index, float grad_scale) {
  KILN_PROFILED("softmax_cross_entropy", "loss",
                inner_.softmax_cross_entropy(s, losses, dlogits, logits, targets, vocab_size,
                                             ignore_index, grad_scale),
                cost::softmax_cross_entropy(logits, dlogits, vocab_size));
}
void ProfilingBackend::adamw_step(Stream s, const Tensor& param, const Tensor& grad,
                                  const Tensor& m, const Tensor& v, const AdamWParams& hp) {
  KILN_PROFILED("adamw_step", "optimizer", inner_.adamw_step(s, param, grad, m, v, hp),
                cost::adamw_step(param, grad));
}

#undef KILN_PROFILED

}  // namespace kiln::profile
