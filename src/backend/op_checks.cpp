#include "backend/op_checks.h"

namespace kiln::checks {

namespace {
int64_t rows(const Tensor& t) { return t.ndim() == 0 ? 0 : t.numel() / t.size(-1); }
}  // namespace

void positions(const Tensor& positions, int64_t B, int64_t T, const char* op) {
  if (!positions) return;
  check_dtype(positions, DType::I32, op);
  check_shape(positions, Shape{B, T}, op);
}

EmbeddingDims embedding(const Tensor& out, const Tensor& tokens, const Tensor& pos,
                        const Tensor& wte, const Tensor& wpe) {
  KILN_CHECK(tokens.ndim() == 2, "embedding: tokens must be [B,T], got {}", tokens.str());
  check_dtype(tokens, DType::I32, "embedding tokens");
  KILN_CHECK(wte.ndim() == 2, "embedding: wte {} must be [Vp,C]", wte.str());
  EmbeddingDims d{tokens.size(0), tokens.size(1), wte.size(-1), wte.size(0),
                  wpe ? wpe.size(0) : 0};
  positions(pos, d.B, d.T, "embedding positions");
  if (wpe) {
    KILN_CHECK(wpe.ndim() == 2 && wpe.size(1) == d.C, "embedding: wpe {} must be [maxT,{}]",
               wpe.str(), d.C);
    KILN_CHECK(pos || d.T <= d.maxT,
               "embedding: sequence length {} exceeds the position table ({})", d.T, d.maxT);
  }
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
  KILN_CHECK((!weight || weight.numel() == d.C) && (!bias || bias.numel() == d.C),
             "layernorm: weight {} / bias {} must have C = {} elements (or be empty)",
             weight.str(), bias.str(), d.C);
  return d;
}

RowDims layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd) {
  const RowDims d = layernorm(dout, mean, rstd, inp, weight, dbias);
  same_size(dinp, inp, "layernorm_backward dinp");
  KILN_CHECK(static_cast<bool>(dweight) == static_cast<bool>(weight),
             "layernorm_backward: dweight {} must be given exactly when weight {} is",
             dweight.str(), weight.str());
  if (weight) grad_of(dweight, weight, "layernorm_backward dweight");
  return d;
}

RowDims rmsnorm(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight) {
  RowDims d{rows(inp), inp.size(-1)};
  same_size(out, inp, "rmsnorm out");
  KILN_CHECK(rstd.numel() == d.N, "rmsnorm: rstd {} must have {} elements", rstd.str(), d.N);
  check_dtype(rstd, DType::F32, "rmsnorm rstd");
  KILN_CHECK(!weight || weight.numel() == d.C, "rmsnorm: weight {} must have C = {} elements",
             weight.str(), d.C);
  return d;
}

RowDims rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout,
                         const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  const RowDims d = rmsnorm(dout, rstd, inp, weight);
  same_size(dinp, inp, "rmsnorm_backward dinp");
  KILN_CHECK(static_cast<bool>(dweight) == static_cast<bool>(weight),
             "rmsnorm_backward: dweight {} must be given exactly when weight {} is",
             dweight.str(), weight.str());
  if (weight) grad_of(dweight, weight, "rmsnorm_backward dweight");
  return d;
}

GluDims swiglu(const Tensor& out, const Tensor& inp) {
  KILN_CHECK(inp.ndim() >= 1 && inp.size(-1) % 2 == 0,
             "swiglu: inp {} must be [N, 2H] (gate, then up)", inp.str());
  GluDims d{rows(inp), inp.size(-1) / 2};
  KILN_CHECK(out.size(-1) == d.H && rows(out) == d.N && out.dtype() == inp.dtype(),
             "swiglu: out {} must be [{}, {}] of inp's dtype", out.str(), d.N, d.H);
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

void fp8_amax(const Tensor& amax, const Tensor& x) {
  check_dtype(amax, DType::F32, "fp8_amax amax");
  KILN_CHECK(amax.numel() == 1, "fp8_amax: amax {} must be [1]", amax.str());
  KILN_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16 || x.dtype() == DType::F16,
             "fp8_amax: x {} must be fp32, bf16 or fp16", x.str());
}

void fp8_amax_history(const Tensor& amax, const Tensor& history, const Tensor& step_amax,
                      int64_t slot) {
  for (const Tensor* t : {&amax, &history, &step_amax}) check_dtype(*t, DType::F32, "fp8_amax_history");
  KILN_CHECK(history.ndim() == 3 && amax.ndim() == 2 && amax.size(0) == history.size(0) &&
                 amax.size(1) == history.size(2) && step_amax.shape() == amax.shape(),
             "fp8_amax_history: history {} must be [n,H,k], amax {} and step_amax {} [n,k]",
             history.str(), amax.str(), step_amax.str());
  KILN_CHECK(slot >= 0 && slot < history.size(1), "fp8_amax_history: slot {} outside [0, {})",
             slot, history.size(1));
}

namespace {
void fp8_operands(const Tensor& inp, const Tensor& amax, const char* op) {
  KILN_CHECK(inp.dtype() == DType::F32 || inp.dtype() == DType::BF16,
             "{}: inp {} must be fp32 or bf16 (fp8 values are exact in both)", op, inp.str());
  check_dtype(amax, DType::F32, op);
  KILN_CHECK(amax.numel() == 3, "{}: amax {} must be [3] (inp, weight, dout)", op, amax.str());
}
}  // namespace

LinearDims fp8_linear(const Tensor& out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias, const Tensor& amax) {
  fp8_operands(inp, amax, "fp8_linear_forward");
  return linear(out, inp, weight, bias);
}

LinearDims fp8_linear_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dout, const Tensor& inp, const Tensor& weight,
                               const Tensor& amax) {
  fp8_operands(inp, amax, "fp8_linear_backward");
  return linear_backward(dinp, dweight, dbias, dout, inp, weight);
}

AttentionDims qkv(const Tensor& qkv, const AttentionShape& a, const char* op) {
  KILN_CHECK(a.n_head > 0 && a.head_dim > 0 && a.kv_heads() > 0 && a.n_head % a.kv_heads() == 0,
             "{}: {} query heads, {} key/value heads of size {}: need NH > 0, HD > 0 and NH a "
             "multiple of NKV", op, a.n_head, a.kv_heads(), a.head_dim);
  KILN_CHECK(qkv.ndim() == 3 && qkv.size(2) == a.qkv_width(),
             "{}: qkv must be [B, T, (NH + 2 NKV) * HD = {}], got {}", op, a.qkv_width(),
             qkv.str());
  return {qkv.size(0), qkv.size(1), a.n_head, a.kv_heads(), a.head_dim, a.qkv_width()};
}

AttentionDims attention(const Tensor& out, const Tensor& lse, const Tensor& qkv_,
                        const AttentionShape& a) {
  const AttentionDims d = qkv(qkv_, a, "attention");
  check_shape(out, Shape{d.B, d.T, d.NH * d.HD}, "attention out");
  KILN_CHECK(out.dtype() == qkv_.dtype(), "attention: out {} must have qkv's dtype", out.str());
  check_shape(lse, Shape{d.B, d.NH, d.T}, "attention lse");
  check_dtype(lse, DType::F32, "attention lse");
  return d;
}

AttentionDims attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv_,
                                 const Tensor& out, const Tensor& lse, const AttentionShape& a) {
  const AttentionDims d = attention(out, lse, qkv_, a);
  same_size(dqkv, qkv_, "attention_backward dqkv");
  same_size(dout, out, "attention_backward dout");
  return d;
}

void documents(const Tensor& cu_seqlens, const char* op) {
  KILN_CHECK(cu_seqlens.ndim() == 1 && cu_seqlens.numel() >= 2 &&
                 cu_seqlens.dtype() == DType::I32,
             "{}: cu_seqlens must be int32 [D + 1] with D >= 1 documents, got {}", op,
             cu_seqlens.str());
}

AttentionDims attention_varlen(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                               const Tensor& cu_seqlens, const AttentionShape& a) {
  documents(cu_seqlens, "attention_varlen");
  return attention(out, lse, qkv, a);
}

AttentionDims attention_varlen_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                        const Tensor& out, const Tensor& lse,
                                        const Tensor& cu_seqlens, const AttentionShape& a) {
  documents(cu_seqlens, "attention_varlen_backward");
  return attention_backward(dqkv, dout, qkv, out, lse, a);
}

TileDims attention_tile(const Tensor& out_acc, const Tensor& lse, const Tensor& qkv_,
                        const Tensor& kv, const Tensor& cu_seqlens, const AttentionShape& a,
                        const AttentionTile& t) {
  const AttentionDims d = qkv(qkv_, a, "attention_tile");
  check_shape(out_acc, Shape{d.B, d.T, d.NH * d.HD}, "attention_tile out_acc");
  check_dtype(out_acc, DType::F32, "attention_tile out_acc");
  check_shape(lse, Shape{d.B, d.NH, d.T}, "attention_tile lse");
  check_dtype(lse, DType::F32, "attention_tile lse");
  KILN_CHECK(kv.ndim() == 3 && kv.size(0) == d.B && kv.size(2) == 2 * d.NKV * d.HD,
             "attention_tile: kv {} must be [{}, Tk, 2 NKV HD = {}]", kv.str(), d.B,
             2 * d.NKV * d.HD);
  KILN_CHECK(kv.dtype() == qkv_.dtype(), "attention_tile: kv {} must have qkv's dtype", kv.str());
  const int64_t Tk = kv.size(1);
  KILN_CHECK(t.q_begin >= 0 && t.q_len >= 0 && t.q_begin + t.q_len <= d.T && t.k_begin >= 0 &&
                 t.k_len >= 0 && t.k_begin + t.k_len <= Tk && (!t.causal || t.q_len == t.k_len),
             "attention_tile: tile q [{}, +{}) k [{}, +{}){} outside q rows {} and kv rows {}",
             t.q_begin, t.q_len, t.k_begin, t.k_len, t.causal ? " causal" : "", d.T, Tk);
  if (cu_seqlens) {
    documents(cu_seqlens, "attention_tile");
    KILN_CHECK(t.q_pos >= 0 && t.k_pos >= 0 && t.q_pos + t.q_len <= t.seq_len &&
                   t.k_pos + t.k_len <= t.seq_len,
               "attention_tile: tile positions q {}+{} k {}+{} outside sequences of {}", t.q_pos,
               t.q_len, t.k_pos, t.k_len, t.seq_len);
  }
  return {d, Tk};
}

TileDims attention_tile_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout,
                                 const Tensor& qkv_, const Tensor& kv, const Tensor& out,
                                 const Tensor& lse, const Tensor& cu_seqlens,
                                 const AttentionShape& a, const AttentionTile& t) {
  const TileDims d = attention_tile(dq, lse, qkv_, kv, cu_seqlens, a, t);
  check_shape(dkv, kv.shape(), "attention_tile_backward dkv");
  check_dtype(dkv, DType::F32, "attention_tile_backward dkv");
  for (const Tensor* x : {&dout, &out}) {
    check_shape(*x, dq.shape(), "attention_tile_backward dout/out");
    KILN_CHECK(x->dtype() == qkv_.dtype(), "attention_tile_backward: {} must have qkv's dtype",
               x->str());
  }
  return d;
}

ColumnDims copy_columns(const Tensor& dst, const Tensor& src, int64_t dst_col, int64_t src_col,
                        int64_t ncols) {
  KILN_CHECK(dst.ndim() >= 1 && src.ndim() >= 1, "copy_columns: dst {} and src {} need a last "
             "dimension", dst.str(), src.str());
  const ColumnDims d{rows(dst), dst.size(-1), src.size(-1)};
  KILN_CHECK(rows(src) == d.N, "copy_columns: dst {} and src {} have different row counts",
             dst.str(), src.str());
  KILN_CHECK(ncols >= 0 && dst_col >= 0 && src_col >= 0 && dst_col + ncols <= d.Wd &&
                 src_col + ncols <= d.Ws,
             "copy_columns: columns [{}, +{}) of dst {} or [{}, +{}) of src {} out of range",
             dst_col, ncols, dst.str(), src_col, ncols, src.str());
  return d;
}

ColumnDims add_columns(const Tensor& out, const Tensor& src, int64_t out_col) {
  KILN_CHECK(out.ndim() >= 1 && src.ndim() >= 1 && out.size(-1) > 0 && src.size(-1) > 0,
             "add_columns: out {} and src {} need a last dimension of at least one column",
             out.str(), src.str());
  KILN_CHECK(out.dtype() == src.dtype(), "add_columns: out {} and src {} have different dtypes",
             out.str(), src.str());
  const ColumnDims d{rows(out), out.size(-1), src.size(-1)};
  KILN_CHECK(rows(src) == d.N, "add_columns: out {} and src {} have different row counts",
             out.str(), src.str());
  KILN_CHECK(out_col >= 0 && out_col <= d.Wd - d.Ws,
             "add_columns: columns [{}, {}) of out {} out of range (src {})", out_col,
             out_col + d.Ws, out.str(), src.str());
  const auto o = reinterpret_cast<uintptr_t>(out.raw());
  const auto i = reinterpret_cast<uintptr_t>(src.raw());
  KILN_CHECK(o + out.nbytes() <= i || i + src.nbytes() <= o,
             "add_columns: src {} overlaps out {}", src.str(), out.str());
  return d;
}

AttentionDims rope(const Tensor& qkv_, const Tensor& pos, const AttentionShape& a) {
  const AttentionDims d = qkv(qkv_, a, "rope");
  KILN_CHECK(d.HD % 2 == 0, "rope: head size {} must be even", d.HD);
  positions(pos, d.B, d.T, "rope positions");
  return d;
}

DecodeDims attention_decode(const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& qkv_, int64_t past, const AttentionShape& a) {
  const AttentionDims q = qkv(qkv_, a, "attention_decode");
  KILN_CHECK(a.causal, "attention_decode: a KV cache needs causal attention");
  DecodeDims d{q.B, q.T, q.NH, q.NKV, q.HD, q.W, k_cache.ndim() == 3 ? k_cache.size(1) : 0};
  check_shape(out, Shape{d.B, d.T, d.NH * d.HD}, "attention_decode out");
  KILN_CHECK(k_cache.ndim() == 3 && k_cache.size(0) == d.B && k_cache.size(2) == d.NKV * d.HD,
             "attention_decode: k_cache {} must be [{}, Tmax, {}]", k_cache.str(), d.B,
             d.NKV * d.HD);
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

CrossEntropyDims cross_entropy_shard(const Tensor& stats, const Tensor& dlogits,
                                     const Tensor& logits, const Tensor& targets,
                                     const Tensor& lse, int64_t vocab_begin, int valid) {
  const char* op = stats ? "cross_entropy_shard_stats" : "cross_entropy_shard_backward";
  KILN_CHECK(logits.ndim() >= 1, "{}: logits {} must be [N, Vl]", op, logits.str());
  CrossEntropyDims d{rows(logits), logits.size(-1)};
  KILN_CHECK(0 <= valid && valid <= d.Vp && vocab_begin >= 0,
             "{}: valid columns {} outside [0, {}] or vocab_begin {} < 0", op, valid, d.Vp,
             vocab_begin);
  KILN_CHECK(targets.numel() == d.N, "{}: targets {} must have {} elements", op, targets.str(), d.N);
  check_dtype(targets, DType::I32, "cross_entropy_shard targets");
  if (stats) {
    check_shape(stats, Shape{d.N, 3}, "cross_entropy_shard_stats stats");
    check_dtype(stats, DType::F32, "cross_entropy_shard_stats stats");
  } else {
    KILN_CHECK(dlogits.numel() == logits.numel() && dlogits.dtype() == logits.dtype(),
               "{}: dlogits {} vs logits {}", op, dlogits.str(), logits.str());
    KILN_CHECK(lse.numel() == d.N, "{}: lse {} must have {} elements", op, lse.str(), d.N);
    check_dtype(lse, DType::F32, "cross_entropy_shard_backward lse");
  }
  return d;
}

void shard_ids(const Tensor& out, const Tensor& ids, int64_t begin, int64_t count) {
  check_dtype(ids, DType::I32, "shard_ids ids");
  check_dtype(out, DType::I32, "shard_ids out");
  KILN_CHECK(out.numel() == ids.numel(), "shard_ids: out {} vs ids {}", out.str(), ids.str());
  KILN_CHECK(begin >= 0 && count >= 0, "shard_ids: range [{}, {} + {}) is negative", begin, begin,
             count);
}

namespace {
// images fp32 [B,H,W,C] and rows [B, T >= N, C*P*P] (`rows_name`) of any float dtype.
int64_t patch_rows(const Tensor& rows, const Tensor& images, int patch, const char* op,
                   const char* rows_name) {
  KILN_CHECK(images.dtype() == DType::F32, "{}: images {} must be fp32", op, images.str());
  KILN_CHECK(images.ndim() == 4 && patch > 0 && images.size(1) % patch == 0 &&
                 images.size(2) % patch == 0,
             "{}: images {} must be [B,H,W,C] with H and W multiples of the patch size {}", op,
             images.str(), patch);
  const int64_t n = (images.size(1) / patch) * (images.size(2) / patch);
  const int64_t d = images.size(3) * patch * patch;
  KILN_CHECK(rows.ndim() == 3 && rows.size(0) == images.size(0) && rows.size(1) >= n &&
                 rows.size(2) == d && rows.dtype() != DType::I32,
             "{}: {} {} must be float [B, T >= {}, {}] for images {} and patch size {}", op,
             rows_name, rows.str(), n, d, images.str(), patch);
  return n;
}
}  // namespace

int64_t patchify(const Tensor& out, const Tensor& images, int patch) {
  return patch_rows(out, images, patch, "patchify", "out");
}

int64_t unpatchify(const Tensor& images, const Tensor& patches, int patch) {
  return patch_rows(patches, images, patch, "unpatchify", "patches");
}

ModulateDims modulate(const Tensor& out, const Tensor& x, const Tensor& mod, int scale_index,
                      int shift_index) {
  KILN_CHECK(x.ndim() == 3 && x.dtype() != DType::I32,
             "modulate: x {} must be float [B,T,C]", x.str());
  const ModulateDims d{x.size(0), x.size(1), x.size(2), mod.ndim() == 3 ? mod.size(1) : 0};
  KILN_CHECK(out.shape() == x.shape() && out.dtype() == x.dtype(),
             "modulate: out {} must have the shape and dtype of x {}", out.str(), x.str());
  KILN_CHECK(mod.ndim() == 3 && mod.size(0) == d.B && mod.size(2) == d.C &&
                 mod.dtype() == x.dtype(),
             "modulate: mod {} must be [{}, M, {}] of x's dtype ({})", mod.str(), d.B, d.C,
             x.str());
  KILN_CHECK(scale_index >= 0 && scale_index < d.M &&
                 (shift_index == -1 || (shift_index >= 0 && shift_index < d.M)) &&
                 shift_index != scale_index,
             "modulate: scale chunk {} must be in [0, {}) and shift chunk {} -1 or another "
             "chunk of mod {}", scale_index, d.M, shift_index, mod.str());
  return d;
}

ModulateDims modulate_backward(const Tensor& dx, const Tensor& dmod, const Tensor& dout,
                               const Tensor& x, const Tensor& mod, int scale_index,
                               int shift_index) {
  const ModulateDims d = modulate(dout, x, mod, scale_index, shift_index);
  if (dx)
    KILN_CHECK(dx.shape() == x.shape() && dx.dtype() == x.dtype(),
               "modulate_backward: dx {} must have the shape and dtype of x {}", dx.str(), x.str());
  KILN_CHECK(dmod.shape() == mod.shape() && dmod.dtype() == mod.dtype(),
             "modulate_backward: dmod {} must have the shape and dtype of mod {}", dmod.str(),
             mod.str());
  return d;
}

SampleDims rectified_flow_inputs(const Tensor& xt, const Tensor& target, const Tensor& images,
                                 const Tensor& noise, const Tensor& t) {
  KILN_CHECK(images.ndim() >= 1, "rectified_flow_inputs: images {} must be [B, ...]",
             images.str());
  for (const Tensor* a : {&xt, &target, &images, &noise})
    KILN_CHECK(a->dtype() == DType::F32 && a->shape() == images.shape(),
               "rectified_flow_inputs: {} must be fp32 of the shape of images {}", a->str(),
               images.str());
  const int64_t B = images.size(0);
  KILN_CHECK(t.dtype() == DType::F32 && t.ndim() == 1 && t.size(0) == B,
             "rectified_flow_inputs: t {} must be fp32 [{}]", t.str(), B);
  KILN_CHECK(xt.raw() != target.raw() || xt.numel() == 0,
             "rectified_flow_inputs: xt and target must be distinct tensors");
  return {B, B > 0 ? images.numel() / B : 0};
}

SampleDims mse_loss(const Tensor& losses, const Tensor& dpred, const Tensor& pred,
                    const Tensor& target) {
  KILN_CHECK(pred.ndim() >= 1 && pred.dtype() != DType::I32,
             "mse_loss: pred {} must be float [B, ...]", pred.str());
  const int64_t B = pred.size(0), n = B > 0 ? pred.numel() / B : 0;
  KILN_CHECK(B == 0 || n > 0, "mse_loss: pred {} has no elements per sample", pred.str());
  KILN_CHECK(target.dtype() == DType::F32 && target.shape() == pred.shape(),
             "mse_loss: target {} must be fp32 of pred's shape {}", target.str(), pred.str());
  KILN_CHECK(losses.dtype() == DType::F32 && losses.ndim() == 1 && losses.size(0) == B,
             "mse_loss: losses {} must be fp32 [{}]", losses.str(), B);
  if (dpred)
    KILN_CHECK(dpred.shape() == pred.shape() && dpred.dtype() == pred.dtype(),
               "mse_loss: dpred {} must have the shape and dtype of pred {}", dpred.str(),
               pred.str());
  return {B, n};
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

void ema_update(const Tensor& ema, const Tensor& param, float decay) {
  check_dtype(ema, DType::F32, "ema_update ema");
  KILN_CHECK(param.dtype() == DType::F32 || param.dtype() == DType::BF16 ||
                 param.dtype() == DType::F16,
             "ema_update: param {} must be fp32, bf16 or fp16", param.str());
  KILN_CHECK(ema.numel() == param.numel(), "ema_update: ema {} and param {} differ in size",
             ema.str(), param.str());
  KILN_CHECK(decay >= 0.f && decay <= 1.f, "ema_update: decay {} must be in [0, 1]", decay);
}

int64_t accumulate_loss(const Tensor& acc, const Tensor& losses, const Tensor& targets) {
  check_dtype(acc, DType::F64, "accumulate_loss acc");
  check_dtype(losses, DType::F32, "accumulate_loss losses");
  check_dtype(targets, DType::I32, "accumulate_loss targets");
  KILN_CHECK(acc.numel() == 2, "accumulate_loss: acc {} must be [2] (sum, count)", acc.str());
  KILN_CHECK(losses.numel() == targets.numel(), "accumulate_loss: losses {} and targets {} "
             "differ in size", losses.str(), targets.str());
  return losses.numel();
}

CrossEntropyDims cross_entropy_shard_combine(const Tensor& lse, const Tensor& acc,
                                             const Tensor& stats, const Tensor& targets) {
  check_dtype(lse, DType::F32, "cross_entropy_shard_combine lse");
  check_dtype(acc, DType::F64, "cross_entropy_shard_combine acc");
  check_dtype(stats, DType::F32, "cross_entropy_shard_combine stats");
  check_dtype(targets, DType::I32, "cross_entropy_shard_combine targets");
  const int64_t N = targets.numel();
  KILN_CHECK(acc.numel() == 2, "cross_entropy_shard_combine: acc {} must be [2]", acc.str());
  KILN_CHECK(lse.numel() == N, "cross_entropy_shard_combine: lse {} must have the {} elements "
             "of targets", lse.str(), N);
  KILN_CHECK(N > 0 && stats.numel() % (3 * N) == 0 && stats.numel() >= 3 * N,
             "cross_entropy_shard_combine: stats {} must be [tp*{}, 3]", stats.str(), N);
  return {N, stats.numel() / (3 * N)};
}

void sum_squares(const Tensor& acc, const Tensor& x) {
  check_dtype(acc, DType::F64, "sum_squares acc");
  KILN_CHECK(acc.numel() == 1, "sum_squares: acc {} must be [1]", acc.str());
  KILN_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16 || x.dtype() == DType::F16,
             "sum_squares: x {} must be fp32, bf16 or fp16", x.str());
}

void clip_coefficient(const Tensor& coef, const Tensor& sumsq, const Tensor& check,
                      float loss_scale) {
  check_dtype(coef, DType::F32, "clip_coefficient coef");
  check_dtype(sumsq, DType::F64, "clip_coefficient sumsq");
  KILN_CHECK(coef.numel() == 1 && sumsq.numel() == 1, "clip_coefficient: coef {} and sumsq {} "
             "must be [1]", coef.str(), sumsq.str());
  if (check) {
    check_dtype(check, DType::F64, "clip_coefficient check");
    KILN_CHECK(check.numel() == 1, "clip_coefficient: check {} must be [1]", check.str());
  }
  KILN_CHECK(loss_scale > 0.f, "clip_coefficient: loss_scale {} must be > 0", loss_scale);
}

void adamw_scale(const Tensor& scale) {
  if (!scale) return;
  check_dtype(scale, DType::F32, "adamw scale");
  KILN_CHECK(scale.numel() == 1, "adamw: scale {} must be [1]", scale.str());
}

void adamw_multi(std::span<const AdamWTensor> tensors, const Tensor& scale) {
  adamw_scale(scale);
  for (const AdamWTensor& t : tensors) {
    const int64_t n = t.param.numel();
    KILN_CHECK(t.grad.numel() == n && t.m.numel() == n && t.v.numel() == n &&
                   (!t.master || t.master.numel() == n),
               "adamw_multi_step: grad {}, m {}, v {} and master {} must have the {} elements "
               "of param {}", t.grad.str(), t.m.str(), t.v.str(),
               t.master ? t.master.str() : "(none)", n, t.param.str());
    check_dtype(t.m, DType::F32, "adamw m");
    check_dtype(t.v, DType::F32, "adamw v");
    if (t.master) check_dtype(t.master, DType::F32, "adamw master");
  }
}

namespace {
bool float_dtype(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

// t is exactly `dtype` [shape...], else "<op> <name>: expected ..., got ...".
void check_tensor(const Tensor& t, const Shape& shape, DType dtype, const char* op,
                  const char* name) {
  KILN_CHECK(t.shape() == shape && t.dtype() == dtype, "{}: {} {} must be {}{}", op, name,
             t.str(), dtype_name(dtype), shape.str());
}

// A router's tensors: `rows` fp32 [N, E] (named first, its sizes are the others'), `like`
// (and `optional`, when given) fp32 [N, E], expert_idx int32 [N, k], `per_choice` fp32
// [N, k], 1 <= k <= E.
struct RouterArgs {
  const Tensor &rows, &like, &optional, &per_choice;
  const char *rows_name, *like_name, *optional_name, *per_choice_name;
};
MoeRouterDims router(const RouterArgs& a, const Tensor& expert_idx, const MoeRouterSpec& spec,
                     const char* op) {
  KILN_CHECK(a.rows.ndim() == 2 && a.rows.dtype() == DType::F32, "{}: {} {} must be fp32 [N, E]",
             op, a.rows_name, a.rows.str());
  const MoeRouterDims d{a.rows.size(0), a.rows.size(1), spec.k};
  KILN_CHECK(d.k >= 1 && d.k <= d.E, "{}: k = {} must be in [1, E = {}]", op, d.k, d.E);
  check_tensor(expert_idx, Shape{d.N, d.k}, DType::I32, op, "expert_idx");
  check_tensor(a.like, Shape{d.N, d.E}, DType::F32, op, a.like_name);
  if (a.optional) check_tensor(a.optional, Shape{d.N, d.E}, DType::F32, op, a.optional_name);
  check_tensor(a.per_choice, Shape{d.N, d.k}, DType::F32, op, a.per_choice_name);
  return d;
}
}  // namespace

MoeRouterDims moe_router(const Tensor& scores, const Tensor& expert_idx,
                         const Tensor& expert_weight, const Tensor& logits, const Tensor& bias,
                         const MoeRouterSpec& spec) {
  const MoeRouterDims d =
      router({logits, scores, Tensor(), expert_weight, "logits", "scores", "", "expert_weight"},
             expert_idx, spec, "moe_router_forward");
  if (bias) check_tensor(bias, Shape{d.E}, DType::F32, "moe_router_forward", "bias");
  return d;
}

MoeRouterDims moe_router_backward(const Tensor& dlogits, const Tensor& dexpert_weight,
                                  const Tensor& dscores, const Tensor& scores,
                                  const Tensor& expert_idx, const MoeRouterSpec& spec) {
  return router({scores, dlogits, dscores, dexpert_weight, "scores", "dlogits", "dscores",
                 "dexpert_weight"},
                expert_idx, spec, "moe_router_backward");
}

namespace {
MoeRouterDims balance_logits(const Tensor& logits, const Tensor& load, const char* op) {
  KILN_CHECK(logits.ndim() == 2 && logits.dtype() == DType::F32 && logits.size(1) >= 1,
             "{}: logits {} must be fp32 [N, E]", op, logits.str());
  const MoeRouterDims d{logits.size(0), logits.size(1), 0};
  if (load) check_tensor(load, Shape{d.E}, DType::F32, op, "load");
  return d;
}
}  // namespace

MoeRouterDims moe_balance_stats(const Tensor& load, const Tensor& prob, const Tensor& z,
                                const Tensor& logits, const Tensor& expert_idx) {
  const char* op = "moe_balance_stats";
  MoeRouterDims d = balance_logits(logits, load, op);
  KILN_CHECK(expert_idx.ndim() == 2 && expert_idx.size(0) == d.N && expert_idx.size(1) <= d.E,
             "{}: expert_idx {} must be [N = {}, k <= E = {}]", op, expert_idx.str(), d.N, d.E);
  check_tensor(expert_idx, expert_idx.shape(), DType::I32, op, "expert_idx");
  d.k = expert_idx.size(1);
  if (prob) check_tensor(prob, Shape{d.E}, DType::F32, op, "prob");
  if (z) check_tensor(z, Shape{1}, DType::F32, op, "z");
  return d;
}

MoeRouterDims moe_balance_backward(const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& load) {
  const char* op = "moe_balance_backward";
  const MoeRouterDims d = balance_logits(logits, load, op);
  check_tensor(dlogits, logits.shape(), DType::F32, op, "dlogits");
  return d;
}

MoeRouterDims moe_permute_plan(const Tensor& offsets, const Tensor& rows,
                               const Tensor& expert_idx, int64_t capacity) {
  const char* op = "moe_permute_plan";
  KILN_CHECK(capacity >= 0, "{}: capacity {} must be >= 0 (0: dropless)", op, capacity);
  KILN_CHECK(expert_idx.ndim() == 2 && expert_idx.dtype() == DType::I32,
             "{}: expert_idx {} must be int32 [N, k]", op, expert_idx.str());
  KILN_CHECK(offsets.ndim() == 1 && offsets.size(0) >= 2 && offsets.dtype() == DType::I32,
             "{}: offsets {} must be int32 [E + 1] with E >= 1", op, offsets.str());
  check_tensor(rows, expert_idx.shape(), DType::I32, op, "rows");
  return {expert_idx.size(0), offsets.size(0) - 1, expert_idx.size(1)};
}

MoePermuteDims moe_permute(const Tensor& tokens, const Tensor& expert_rows, const Tensor& rows,
                           const char* op) {
  KILN_CHECK(rows.ndim() == 2 && rows.dtype() == DType::I32, "{}: rows {} must be int32 [N, k]",
             op, rows.str());
  KILN_CHECK(tokens.ndim() == 2 && tokens.size(0) == rows.size(0) && float_dtype(tokens.dtype()),
             "{}: the tokens {} must be float [N = {}, C]", op, tokens.str(), rows.size(0));
  const MoePermuteDims d{rows.size(0), rows.size(1), tokens.size(1)};
  check_tensor(expert_rows, Shape{d.N * d.k, d.C}, tokens.dtype(), op, "the expert rows");
  return d;
}

MoePermuteDims moe_unpermute(const Tensor& out, const Tensor& expert_out,
                             const Tensor& expert_weight, const Tensor& rows) {
  const MoePermuteDims d = moe_permute(out, expert_out, rows, "moe_unpermute");
  check_tensor(expert_weight, Shape{d.N, d.k}, DType::F32, "moe_unpermute", "expert_weight");
  return d;
}

MoePermuteDims moe_unpermute_backward(const Tensor& dexpert_out, const Tensor& dexpert_weight,
                                      const Tensor& dout, const Tensor& expert_out,
                                      const Tensor& expert_weight, const Tensor& rows) {
  const char* op = "moe_unpermute_backward";
  const MoePermuteDims d = moe_permute(dout, expert_out, rows, op);
  check_tensor(expert_weight, Shape{d.N, d.k}, DType::F32, op, "expert_weight");
  if (dexpert_out)
    check_tensor(dexpert_out, expert_out.shape(), expert_out.dtype(), op, "dexpert_out");
  if (dexpert_weight) check_tensor(dexpert_weight, Shape{d.N, d.k}, DType::F32, op, "dexpert_weight");
  return d;
}

GroupedLinearDims grouped_linear(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& offsets) {
  const char* op = "grouped_linear";
  KILN_CHECK(weight.ndim() == 3 && float_dtype(weight.dtype()),
             "{}: weight {} must be float [E, O, I]", op, weight.str());
  const int64_t E = weight.size(0), O = weight.size(1), I = weight.size(2);
  KILN_CHECK(inp.ndim() == 2 && inp.size(1) == I, "{}: inp {} must be [M, I = {}] (weight {})",
             op, inp.str(), I, weight.str());
  const GroupedLinearDims d{inp.size(0), I, O, E};
  check_tensor(inp, Shape{d.M, I}, weight.dtype(), op, "inp");
  check_tensor(out, Shape{d.M, O}, weight.dtype(), op, "out");
  check_tensor(offsets, Shape{E + 1}, DType::I32, op, "offsets");
  return d;
}

void grouped_linear_offsets(const int32_t* offsets, int64_t M, int64_t E, const char* op) {
  KILN_CHECK(offsets[0] == 0 && offsets[E] <= M,
             "{}: offsets must run from 0 to at most M = {}, got {} .. {}", op, M, offsets[0],
             offsets[E]);
  for (int64_t e = 0; e < E; ++e)
    KILN_CHECK(offsets[e] <= offsets[e + 1], "{}: offsets[{}] = {} > offsets[{}] = {}", op, e,
               offsets[e], e + 1, offsets[e + 1]);
}

GroupedLinearDims grouped_linear_backward(const Tensor& dinp, const Tensor& dweight,
                                          const Tensor& dout, const Tensor& inp,
                                          const Tensor& weight, const Tensor& offsets) {
  const GroupedLinearDims d = grouped_linear(dout, inp, weight, offsets);
  if (dinp) same_size(dinp, inp, "grouped_linear_backward dinp");
  if (dweight) grad_of(dweight, weight, "grouped_linear_backward dweight");
  return d;
}

}  // namespace kiln::checks
