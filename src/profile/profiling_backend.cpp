#include "profile/profiling_backend.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/op_region.h"

#include <algorithm>
#include <fmt/format.h>

namespace kiln::profile {

namespace cost {
namespace {
double es(const Tensor& t) { return static_cast<double>(dtype_size(t.dtype())); }
double d(int64_t x) { return static_cast<double>(x); }
int64_t last(const Tensor& t) { return t.size(-1); }
int64_t rows(const Tensor& t) { return t.numel() / last(t); }
}  // namespace

OpCost embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor&, const Tensor&,
                         const Tensor& wpe) {
  const int64_t N = tokens.numel(), T = tokens.size(-1), C = last(out);
  const double e = es(out), pos = wpe ? 1.0 : 0.0;
  return {pos * d(N * C), 4.0 * d(N) + d(N * C) * e + pos * d(T * C) * e + d(N * C) * e,
          fmt::format("B={} T={} C={}", N / T, T, C)};
}

OpCost embedding_backward(const Tensor&, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, const Tensor&) {
  const int64_t N = tokens.numel(), T = tokens.size(-1), C = last(dout);
  const double e = es(dout), pos = dwpe ? 1.0 : 0.0;
  return {(1.0 + pos) * d(N * C),
          d(N * C) * e + 4.0 * d(N) + 2.0 * d(N * C) * e + pos * 2.0 * d(T * C) * e,
          fmt::format("B={} T={} C={}", N / T, T, C)};
}

OpCost layernorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor& inp,
                         const Tensor&, const Tensor&, float) {
  const int64_t C = last(inp), N = rows(inp);
  return {8.0 * d(N * C), (2.0 * d(N * C) + 2.0 * d(C)) * es(inp) + 8.0 * d(N),
          fmt::format("N={} C={}", N, C)};
}

OpCost layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor& inp, const Tensor&, const Tensor&, const Tensor&) {
  const int64_t C = last(inp), N = rows(inp);
  return {14.0 * d(N * C), (4.0 * d(N * C) + 5.0 * d(C)) * es(inp) + 8.0 * d(N),
          fmt::format("N={} C={}", N, C)};
}

OpCost rmsnorm_forward(const Tensor&, const Tensor&, const Tensor& inp, const Tensor&, float) {
  const int64_t C = last(inp), N = rows(inp);
  return {4.0 * d(N * C), (2.0 * d(N * C) + d(C)) * es(inp) + 4.0 * d(N),
          fmt::format("N={} C={}", N, C)};
}

OpCost rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor& inp,
                        const Tensor&, const Tensor&) {
  const int64_t C = last(inp), N = rows(inp);
  return {8.0 * d(N * C), (4.0 * d(N * C) + 3.0 * d(C)) * es(inp) + 4.0 * d(N),
          fmt::format("N={} C={}", N, C)};
}

OpCost linear_forward(const Tensor&, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const int64_t IC = last(inp), N = rows(inp), OC = weight.size(0);
  const bool b = static_cast<bool>(bias);
  const double flops = 2.0 * d(N) * d(IC) * d(OC) + (b ? d(N * OC) : 0.0);
  const double bytes = (d(N * IC) + d(OC * IC) + d(N * OC) + (b ? d(OC) : 0.0)) * es(inp);
  return {flops, bytes, fmt::format("N={} IC={} OC={}", N, IC, OC)};
}

OpCost linear_backward(const Tensor& dinp, const Tensor&, const Tensor& dbias, const Tensor&,
                       const Tensor& inp, const Tensor& weight) {
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

// An fp8 linear's costs: the linear's (the same FLOPs, whatever their rate) plus the
// quantization of its operands (each read and written once more).
OpCost fp8_amax(const Tensor&, const Tensor& x) {
  const double n = d(x.numel());
  return {n, n * es(x), fmt::format("n={}", x.numel())};
}
OpCost fp8_amax_history(const Tensor& amax, const Tensor& history, const Tensor&, int64_t, bool) {
  const double n = d(history.numel());
  return {n, 4.0 * (n + 3.0 * d(amax.numel())), fmt::format("n={}", history.numel())};
}
OpCost fp8_linear_forward(const Tensor& out, const Tensor& inp, const Tensor& weight,
                          const Tensor& bias, const Tensor&) {
  OpCost c = linear_forward(out, inp, weight, bias);
  const double q = d(inp.numel()) + d(weight.numel());
  c.flops += 4.0 * q;
  c.bytes += 2.0 * q * es(inp);
  return c;
}
OpCost fp8_linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight,
                           const Tensor&) {
  OpCost c = linear_backward(dinp, dweight, dbias, dout, inp, weight);
  const double q = d(dout.numel()) + (dweight ? d(inp.numel()) : 0.0) +
                   (dinp ? d(weight.numel()) : 0.0);
  c.flops += 4.0 * q;
  c.bytes += 2.0 * q * es(inp);
  return c;
}

namespace {
// matmuls * (2 HD FLOPs per (query, key) pair) * NH heads * pairs * B; tensors of width
// W (qkv) and C = NH*HD (out) read or written.
OpCost attention(const Tensor& qkv, const AttentionShape& a, double matmuls, double w_tensors,
                 double c_tensors) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = a.q_width(), W = a.qkv_width();
  const double pairs = a.causal ? d(T) * d(T + 1) / 2.0 : d(T) * d(T);
  const double flops = matmuls * 2.0 * d(B) * d(C) * pairs;
  const double bytes =
      (w_tensors * d(W) + c_tensors * d(C)) * d(B * T) * es(qkv) + 4.0 * d(B * a.n_head * T);
  return {flops, bytes,
          fmt::format("B={} T={} NH={} NKV={} HD={}{}", B, T, a.n_head, a.kv_heads(), a.head_dim,
                      a.causal ? "" : " bidirectional")};
}
}  // namespace

OpCost attention_forward(const Tensor&, const Tensor&, const Tensor& qkv,
                         const AttentionShape& shape, const DropoutSpec&) {
  return attention(qkv, shape, 2.0, 1.0, 1.0);
}
OpCost attention_backward(const Tensor&, const Tensor&, const Tensor& qkv, const Tensor&,
                          const Tensor&, const AttentionShape& shape, const DropoutSpec&) {
  return attention(qkv, shape, 5.0, 2.0, 2.0);
}
// Documents: the whole sequences' cost, an upper bound (the device data is not read).
OpCost attention_varlen_forward(const Tensor&, const Tensor&, const Tensor& qkv, const Tensor&,
                                const AttentionShape& shape, const DropoutSpec&) {
  return attention(qkv, shape, 2.0, 1.0, 1.0);
}
OpCost attention_varlen_backward(const Tensor&, const Tensor&, const Tensor& qkv, const Tensor&,
                                 const Tensor&, const Tensor&, const AttentionShape& shape,
                                 const DropoutSpec&) {
  return attention(qkv, shape, 5.0, 2.0, 2.0);
}

namespace {
// A tile: matmuls * 2 HD FLOPs per (query, key) pair of the tile, NH heads, B sequences;
// its q rows and k/v rows read, `outs` fp32 [q_len, C] tensors read and written.
OpCost attention_tile(const Tensor& qkv, const AttentionShape& a, const AttentionTile& t,
                      double matmuls, double outs) {
  const int64_t B = qkv.size(0), C = a.q_width(), KV = a.kv_width();
  const double pairs = t.causal ? d(t.q_len) * d(t.q_len + 1) / 2.0 : d(t.q_len) * d(t.k_len);
  const double flops = matmuls * 2.0 * d(B) * d(C) * pairs;
  const double bytes = (d(t.q_len * C) + 2.0 * d(t.k_len * KV)) * d(B) * es(qkv) +
                       outs * 2.0 * 4.0 * d(B * t.q_len * C);
  return {flops, bytes, fmt::format("B={} q={}+{} k={}+{}{} NH={} NKV={} HD={}", B, t.q_begin,
                                    t.q_len, t.k_begin, t.k_len, t.causal ? " causal" : "",
                                    a.n_head, a.kv_heads(), a.head_dim)};
}
}  // namespace

OpCost attention_tile_forward(const Tensor&, const Tensor&, const Tensor& qkv, const Tensor&,
                              const Tensor&, const AttentionShape& shape,
                              const AttentionTile& tile) {
  return attention_tile(qkv, shape, tile, 2.0, 1.0);
}
OpCost attention_tile_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor& qkv,
                               const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const AttentionShape& shape, const AttentionTile& tile) {
  return attention_tile(qkv, shape, tile, 5.0, 3.0);
}
OpCost copy_columns(const Tensor& dst, const Tensor& src, int64_t, int64_t, int64_t ncols) {
  const int64_t N = dst.numel() / std::max<int64_t>(dst.size(-1), 1);
  return {0.0, d(N * ncols) * (es(dst) + es(src)), fmt::format("N={} cols={}", N, ncols)};
}

OpCost attention_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor& qkv,
                        int64_t past, const AttentionShape& a) {
  const int64_t B = qkv.size(0), Tq = qkv.size(1), C = a.q_width(), W = a.qkv_width();
  const int64_t KV = a.kv_width();
  const double pairs = d(Tq) * d(past) + d(Tq) * d(Tq + 1) / 2.0;
  const double flops = 4.0 * d(B) * d(C) * pairs;
  const double bytes = (d(W * B * Tq) + 2.0 * d(B * (past + Tq) * KV) + 2.0 * d(B * Tq * KV) +
                        d(B * Tq * C)) * es(qkv);
  return {flops, bytes, fmt::format("B={} Tq={} past={} C={}", B, Tq, past, C)};
}

OpCost rope_forward(const Tensor& qkv, const Tensor& positions, const AttentionShape& a,
                    const RopeSpec&) {
  const int64_t B = qkv.size(0), T = qkv.size(1);
  const double n = d(B * T) * d((a.n_head + a.kv_heads()) * a.head_dim);
  return {3.0 * n, 2.0 * n * es(qkv) + (positions ? 4.0 * d(B * T) : 0.0),
          fmt::format("B={} T={} NH={} NKV={} HD={}", B, T, a.n_head, a.kv_heads(), a.head_dim)};
}
OpCost rope_backward(const Tensor& dqkv, const Tensor& positions, const AttentionShape& a,
                     const RopeSpec& rope) {
  return rope_forward(dqkv, positions, a, rope);
}

OpCost gelu_forward(const Tensor&, const Tensor& inp) {
  const double n = d(inp.numel());
  return {8.0 * n, 2.0 * n * es(inp), fmt::format("n={}", inp.numel())};
}
OpCost gelu_backward(const Tensor&, const Tensor&, const Tensor& inp) {
  const double n = d(inp.numel());
  return {16.0 * n, 3.0 * n * es(inp), fmt::format("n={}", inp.numel())};
}
OpCost silu_forward(const Tensor&, const Tensor& inp) {
  const double n = d(inp.numel());
  return {5.0 * n, 2.0 * n * es(inp), fmt::format("n={}", inp.numel())};
}
OpCost silu_backward(const Tensor&, const Tensor&, const Tensor& inp) {
  const double n = d(inp.numel());
  return {9.0 * n, 3.0 * n * es(inp), fmt::format("n={}", inp.numel())};
}
OpCost swiglu_forward(const Tensor& out, const Tensor& inp) {
  const double n = d(out.numel());
  return {5.0 * n, 3.0 * n * es(inp), fmt::format("N={} H={}", rows(out), last(out))};
}
OpCost swiglu_backward(const Tensor&, const Tensor& dout, const Tensor& inp) {
  const double n = d(dout.numel());
  return {10.0 * n, 5.0 * n * es(inp), fmt::format("N={} H={}", rows(dout), last(dout))};
}
OpCost add(const Tensor& out, const Tensor&, const Tensor&) {
  const double n = d(out.numel());
  return {n, 3.0 * n * es(out), fmt::format("n={}", out.numel())};
}
// Reads src and out's columns, writes those columns; a multiply-add per element.
OpCost add_columns(const Tensor& out, const Tensor& src, int64_t, float) {
  const int64_t Ws = last(src), N = src.numel() / std::max<int64_t>(Ws, 1);
  const double n = d(N * Ws);
  return {2.0 * n, 3.0 * n * es(out), fmt::format("N={} cols={} of {}", N, Ws, last(out))};
}
// x * (offset + scale) + shift per element; mod's two chunks read once per sample.
OpCost modulate(const Tensor&, const Tensor& x, const Tensor& mod, int, int shift_index, float) {
  const double n = d(x.numel()), chunks = shift_index >= 0 ? 2.0 : 1.0;
  const double row = d(mod.size(0)) * d(last(mod));
  return {(shift_index >= 0 ? 3.0 : 2.0) * n, (2.0 * n + chunks * row) * es(x),
          fmt::format("N={} C={}{}", rows(x), last(x), shift_index >= 0 ? "" : " (no shift)")};
}
// Reads dout and x, writes dx; two column sums (multiply-add, add) per element.
OpCost modulate_backward(const Tensor& dx, const Tensor&, const Tensor&, const Tensor& x,
                         const Tensor& mod, int, int shift_index, float) {
  const double n = d(x.numel()), chunks = shift_index >= 0 ? 2.0 : 1.0;
  const double row = d(mod.size(0)) * d(last(mod));
  const bool w = static_cast<bool>(dx);
  return {(2.0 + chunks + (w ? 1.0 : 0.0)) * n,
          ((w ? 3.0 : 2.0) * n + (1.0 + chunks) * row) * es(x),
          fmt::format("N={} C={}{}", rows(x), last(x), w ? "" : " (no dx)")};
}
namespace {
OpCost dropout(const Tensor& t) {
  const double n = d(t.numel());
  return {n, 2.0 * n * es(t), fmt::format("n={}", t.numel())};
}
}  // namespace
OpCost dropout_forward(const Tensor&, const Tensor& inp, const DropoutSpec&) {
  return dropout(inp);
}
OpCost dropout_backward(const Tensor&, const Tensor& dout, const DropoutSpec&) {
  return dropout(dout);
}

OpCost softmax_cross_entropy(const Tensor&, const Tensor& dlogits, const Tensor& logits,
                             const Tensor&, int vocab_size, int, float) {
  const int64_t Vp = last(logits), N = rows(logits);
  const bool g = static_cast<bool>(dlogits);
  const double flops = (3.0 + (g ? 2.0 : 0.0)) * d(N) * d(vocab_size);
  const double bytes = d(N * Vp) * es(logits) * (g ? 2.0 : 1.0) + 8.0 * d(N);
  return {flops, bytes, fmt::format("N={} V={} Vp={}{}", N, vocab_size, Vp, g ? "" : " (no grad)")};
}

OpCost cross_entropy_shard_stats(const Tensor&, const Tensor& logits, const Tensor&, int64_t,
                                 int valid) {
  const int64_t Vl = last(logits), N = rows(logits);
  return {3.0 * d(N) * d(valid), d(N * Vl) * es(logits) + 16.0 * d(N),
          fmt::format("N={} valid={} Vl={}", N, valid, Vl)};
}

OpCost cross_entropy_shard_backward(const Tensor&, const Tensor& logits, const Tensor&,
                                    const Tensor&, int64_t, int valid, int, float) {
  const int64_t Vl = last(logits), N = rows(logits);
  return {3.0 * d(N) * d(valid), 2.0 * d(N * Vl) * es(logits) + 8.0 * d(N),
          fmt::format("N={} valid={} Vl={}", N, valid, Vl)};
}

OpCost shard_ids(const Tensor&, const Tensor& ids, int64_t, int64_t) {
  return {0.0, 8.0 * d(ids.numel()), fmt::format("n={}", ids.numel())};
}

OpCost patchify(const Tensor& out, const Tensor& images, int patch) {
  return {0.0, d(images.numel()) * 4.0 + d(out.numel()) * es(out),
          fmt::format("images={} patch={}", images.str(), patch)};
}

OpCost unpatchify(const Tensor& images, const Tensor& patches, int patch) {
  return {0.0, d(images.numel()) * (4.0 + es(patches)),
          fmt::format("images={} patch={}", images.str(), patch)};
}

OpCost rectified_flow_inputs(const Tensor&, const Tensor&, const Tensor& images, const Tensor&,
                             const Tensor& t) {
  const double n = d(images.numel());
  return {4.0 * n, 16.0 * n + 4.0 * d(t.numel()), fmt::format("images={}", images.str())};
}

OpCost mse_loss(const Tensor& losses, const Tensor& dpred, const Tensor& pred, const Tensor&,
                float) {
  const double n = d(pred.numel());
  const bool g = static_cast<bool>(dpred);
  return {(3.0 + (g ? 2.0 : 0.0)) * n, n * es(pred) * (g ? 2.0 : 1.0) + 4.0 * n +
                                           4.0 * d(losses.numel()),
          fmt::format("pred={}{}", pred.str(), g ? "" : " (no grad)")};
}

OpCost accumulate_loss(const Tensor&, const Tensor& losses, const Tensor&) {
  const double n = d(losses.numel());
  return {n, 8.0 * n, fmt::format("N={}", losses.numel())};
}

OpCost cross_entropy_shard_combine(const Tensor& lse, const Tensor&, const Tensor& stats,
                                   const Tensor&) {
  const double n = d(lse.numel()), s = d(stats.numel());
  return {s, 4.0 * s + 12.0 * n, fmt::format("N={} tp={}", lse.numel(), stats.numel() / (3 * std::max<int64_t>(1, lse.numel())))};
}

OpCost sum_squares(const Tensor&, const Tensor& x) {
  const double n = d(x.numel());
  return {2.0 * n, n * es(x), fmt::format("n={}", x.numel())};
}

OpCost clip_coefficient(const Tensor&, const Tensor&, const Tensor&, double, float) {
  return {4.0, 20.0, "n=1"};
}

OpCost adamw_step(const Tensor& param, const Tensor& grad, const Tensor&, const Tensor&,
                  const Tensor&, const AdamWParams&) {
  const double n = d(param.numel());
  return {14.0 * n, 2.0 * n * es(param) + n * es(grad) + 16.0 * n,
          fmt::format("n={}", param.numel())};
}

OpCost adamw_multi_step(std::span<const AdamWTensor> tensors, const Tensor&,
                        const AdamWParams&) {
  // adamw_step's per tensor, plus, with a master, the rounded parameters written.
  OpCost c{0.0, 0.0, fmt::format("tensors={}", tensors.size())};
  int64_t total = 0;
  for (const AdamWTensor& t : tensors) {
    const double n = d(t.param.numel());
    c.flops += 14.0 * n;
    c.bytes += n * es(t.grad) + 16.0 * n + (t.master ? 8.0 * n + n * es(t.param) : 2.0 * n * es(t.param));
    total += t.param.numel();
  }
  c.shape += fmt::format(" n={}", total);
  return c;
}

OpCost ema_update(const Tensor& ema, const Tensor& param, float) {
  // ema read and written (fp32), param read: 3 FLOPs per element.
  const double n = d(ema.numel());
  return {3.0 * n, 8.0 * n + n * es(param), fmt::format("n={}", ema.numel())};
}

OpCost moe_router_forward(const Tensor&, const Tensor& expert_idx, const Tensor&,
                          const Tensor& logits, const Tensor&, const MoeRouterSpec& spec) {
  // Scores (~5 FLOPs per logit), the top-k passes (k compares per logit); logits read,
  // scores written, the k ids and weights written.
  const int64_t E = last(logits), N = rows(logits);
  return {(5.0 + spec.k) * d(N * E), 8.0 * d(N * E) + 8.0 * d(expert_idx.numel()),
          fmt::format("N={} E={} k={}", N, E, spec.k)};
}

OpCost moe_router_backward(const Tensor&, const Tensor& dexpert_weight, const Tensor& dscores,
                           const Tensor& scores, const Tensor&, const MoeRouterSpec& spec) {
  const int64_t E = last(scores), N = rows(scores);
  return {6.0 * d(N * E), (dscores ? 12.0 : 8.0) * d(N * E) + 8.0 * d(dexpert_weight.numel()),
          fmt::format("N={} E={} k={}", N, E, spec.k)};
}

OpCost moe_balance_stats(const Tensor& load, const Tensor&, const Tensor&, const Tensor& logits,
                         const Tensor& expert_idx, MoeScoring, float, float) {
  // A softmax (or sigmoid) and a log-sum-exp per row (~8 FLOPs per logit); logits and ids
  // read, the [E] sums written.
  const int64_t E = last(logits), N = rows(logits);
  return {8.0 * d(N * E), 4.0 * d(N * E) + 4.0 * d(expert_idx.numel()) + 8.0 * d(load.numel()),
          fmt::format("N={} E={}", N, E)};
}

OpCost moe_balance_backward(const Tensor&, const Tensor& logits, const Tensor&, MoeScoring, float,
                            float) {
  const int64_t E = last(logits), N = rows(logits);
  return {12.0 * d(N * E), 12.0 * d(N * E), fmt::format("N={} E={}", N, E)};
}

OpCost moe_permute_plan(const Tensor& offsets, const Tensor&, const Tensor& expert_idx, int64_t) {
  return {0.0, 12.0 * d(expert_idx.numel()) + 4.0 * d(offsets.numel()),
          fmt::format("slots={} E={}", expert_idx.numel(), offsets.numel() - 1)};
}

namespace {
// A permutation between N token rows and M = N*k expert rows of C channels: `flops` per
// expert-row element, the rows read and written, the int32 rows and fp32 weights read.
OpCost permutation(const Tensor& tokens, const Tensor& expert_rows, const Tensor& idx,
                   double flops, double expert_passes, bool weights) {
  const double M = d(rows(expert_rows)), C = d(last(expert_rows)), N = d(rows(tokens));
  return {flops * M * C, (expert_passes * M * C + N * C) * es(tokens) + (weights ? 8.0 : 4.0) * M,
          fmt::format("N={} k={} C={}", rows(tokens), idx.size(-1), last(expert_rows))};
}
}  // namespace
OpCost moe_permute(const Tensor& out, const Tensor& inp, const Tensor& rows_) {
  return permutation(inp, out, rows_, 0.0, 1.0, false);
}
OpCost moe_permute_backward(const Tensor& dinp, const Tensor& dout, const Tensor& rows_) {
  return permutation(dinp, dout, rows_, 1.0, 1.0, false);
}
OpCost moe_unpermute(const Tensor& out, const Tensor& expert_out, const Tensor&,
                     const Tensor& rows_) {
  return permutation(out, expert_out, rows_, 2.0, 1.0, true);
}
OpCost moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dexpert_weight,
                              const Tensor& dout, const Tensor& expert_out, const Tensor&,
                              const Tensor& rows_) {
  const double outs = (dexpert_out ? 1.0 : 0.0) + (dexpert_weight ? 1.0 : 0.0);
  return permutation(dout, expert_out, rows_, 2.0 * outs, outs, true);
}

OpCost grouped_linear_forward(const Tensor&, const Tensor& inp, const Tensor& weight,
                              const Tensor&) {
  const int64_t M = rows(inp), I = last(inp), E = weight.size(0), O = weight.size(1);
  return {2.0 * d(M) * d(I) * d(O), (d(M * I) + d(E * O * I) + d(M * O)) * es(inp),
          fmt::format("M={} I={} O={} E={}", M, I, O, E)};
}

OpCost grouped_linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor&,
                               const Tensor& inp, const Tensor& weight, const Tensor&) {
  const int64_t M = rows(inp), I = last(inp), E = weight.size(0), O = weight.size(1);
  const bool di = static_cast<bool>(dinp), dw = static_cast<bool>(dweight);
  const double mm = 2.0 * d(M) * d(I) * d(O);
  const double bytes = (d(M * O) + (di ? d(E * O * I) + d(M * I) : 0.0) +
                        (dw ? d(M * I) + 2.0 * d(E * O * I) : 0.0)) * es(inp);
  return {(di ? mm : 0.0) + (dw ? mm : 0.0), bytes,
          fmt::format("M={} I={} O={} E={}{}", M, I, O, E, di ? "" : " (no dinp)")};
}

OpCost copy(size_t nbytes) {
  return {0.0, 2.0 * static_cast<double>(nbytes), fmt::format("bytes={}", nbytes)};
}

OpCost fill(const Tensor& t) {
  return {0.0, static_cast<double>(t.nbytes()), fmt::format("n={}", t.numel())};
}
}  // namespace cost

ProfilingBackend::ProfilingBackend(Backend& inner, Tracer& tracer, OpTiming timing)
    : inner_(inner), tracer_(tracer), timing_(timing) {}

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner, Tracer& tracer,
                                   OpTiming timing)
    : owned_(std::move(inner)), inner_(*owned_), tracer_(tracer), timing_(timing) {}

void ProfilingBackend::finish(const char* name, const char* category, Stream s,
                              Clock::time_point t0, int64_t marker, const OpCost& c) {
  const std::string full =
      current_op_region ? fmt::format("{} [{}]", name, current_op_region) : std::string(name);
  if (marker >= 0) {
    pending_.push_back({full, category, c, t0, marker, inner_.record_marker(s),
                        tracer_.thread_id()});
    return;
  }
  if (timing_ == OpTiming::Synchronize) inner_.synchronize(s);
  tracer_.record_complete(full, category, t0, Clock::now(), c.flops, c.bytes, c.shape);
}

OpTiming op_timing(std::string_view timing) {
  KILN_CHECK(timing == "sync" || timing == "events",
             "profile.timing = '{}': expected sync or events", timing);
  return timing == "events" ? OpTiming::DeviceEvents : OpTiming::Synchronize;
}

std::unique_ptr<ProfilingBackend> profiled(std::unique_ptr<Backend> inner,
                                           std::string_view timing) {
  return std::make_unique<ProfilingBackend>(std::move(inner), Tracer::global(),
                                            op_timing(timing));
}

void ProfilingBackend::flush() {
  if (pending_.empty()) return;
  const Pending& first = pending_.front();
  const int64_t base_ns = tracer_.to_ns(first.launched);
  for (Pending& p : pending_) {
    TraceEvent e;
    e.name = std::move(p.name);
    e.category = p.category;
    e.ts_ns = base_ns + static_cast<int64_t>(inner_.marker_elapsed_ms(first.begin, p.begin) * 1e6);
    e.dur_ns = static_cast<int64_t>(inner_.marker_elapsed_ms(p.begin, p.end) * 1e6);
    e.tid = p.tid;
    e.flops = p.cost.flops;
    e.bytes = p.cost.bytes;
    e.detail = std::move(p.cost.shape);
    tracer_.record(std::move(e));
  }
  pending_.clear();
  inner_.release_markers();
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
    const int64_t m0_ = start_marker(s);          \
    CALL;                                         \
    finish(NAME, CATEGORY, s, t0_, m0_, COST);    \
  } while (0)

void ProfilingBackend::copy_from_host(Stream s, const Tensor& dst, const void* src) {
  KILN_PROFILED("copy_from_host", "memory", inner_.copy_from_host(s, dst, src),
                cost::copy(dst.nbytes()));
}
void ProfilingBackend::copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src,
                                             uint64_t seed, uint64_t stream,
                                             const GlobalIndices& at) {
  KILN_PROFILED("copy_stochastic_round", "memory",
                inner_.copy_stochastic_round(s, dst, src, seed, stream, at),
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

#define KILN_PROFILE_OP(Call, method, family, category, params, args)           \
  void ProfilingBackend::method(Stream s, KILN_PARAMS params) {                 \
    KILN_PROFILED(#method, category, inner_.method(s, KILN_PARAMS args), cost::method args); \
  }
KILN_BACKEND_OPS(KILN_PROFILE_OP)
#undef KILN_PROFILE_OP

#undef KILN_PROFILED

}  // namespace kiln::profile
