// kiln_bench_ops: one Google Benchmark per op of the Backend interface, forward and
// backward separately, at the shapes of one GPT-2 (124M by default) training step, on
// every backend of available_backends() and every dtype the backend supports.
//
// Shapes (defaults: --model=gpt2 --B=4 --T=64): N = B*T rows, C = 768, NH = 12,
// V = 50257, Vp = 50304. The linear layers run at their four per-block shapes
//   qkv 768->2304, attn_proj 768->768, fc 768->3072, fc_proj 3072->768
// and the tied output projection ("lm_head", C->Vp, no bias) at one classifier chunk of
// R = nn::classifier_chunk_rows(N, Vp, 16 MiB) rows (83 for Vp = 50304), the chunk the
// model's fused classifier + cross-entropy runs at by default (train.classifier_chunk_mb);
// softmax_cross_entropy runs at [R, Vp] too.
// AdamW runs over one tensor of num_parameters() elements (124,439,808 for gpt2).
//
// Counters (all rates use real, wall-clock time, so OpenMP threads and GPU work count):
//   FLOP/s            GEMM-based and attention ops. FLOPs per call:
//     linear_forward    2*N*IC*OC                 (bias add not counted)
//     linear_backward   4*N*IC*OC                 (dinp 2*N*IC*OC + dweight 2*N*IC*OC;
//                                                  dbias not counted)
//     attention_forward 4*B*T*T*C                 (Q K^T 2*B*T*T*C + P V 2*B*T*T*C,
//                                                  counted without the causal halving,
//                                                  softmax not counted)
//     attention_backward 8*B*T*T*C                (dV, dP, dQ, dK 2*B*T*T*C each, without
//                                                  the causal halving or the recomputation
//                                                  of Q K^T: model FLOPs, 2x forward)
//     classifier_cross_entropy (nn, fused, with grad) 6*N*C*Vp (lm_head fwd 2 + bwd 4)
//   bytes_per_second  memory-bound ops: the minimum bytes each call must move (every
//                     input read once, every output written once, a read-modify-write
//                     counted twice; s = bytes per element of the dtype, 4 for fp32
//                     statistics, ids, m and v). The formula is next to each benchmark.
#include "bench_util.h"

#include "backend/registry.h"
#include "models/gpt2/config.h"
#include "nn/classifier.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace kiln::bench {
namespace {

struct Dims {
  int64_t B, T, C, NH, V, Vp, maxT, N, R, adamw_n;
};

struct Linear {
  const char* name;
  int64_t IC, OC;
};

using benchmark::State;

std::string bench_name(Backend& be, DType dt, const std::string& op, const std::string& shape) {
  return be.name() + "/" + std::string(dtype_name(dt)) + "/" + op + "/" + shape;
}

std::string dim(const char* name, int64_t v) { return std::string(name) + ":" + std::to_string(v); }

void register_all(Backend& be, DType dt, const Dims& d) {
  const double s = static_cast<double>(dtype_size(dt));  // bytes per activation element
  const int64_t N = d.N, C = d.C, B = d.B, T = d.T, NH = d.NH, R = d.R, Vp = d.Vp;
  const std::string nc = dim("N", N) + "/" + dim("C", C);
  std::vector<std::string> skipped;

  auto add = [&](OpFamily op, const std::string& opname, const std::string& shape, auto fn) {
    if (!be.supports(op, dt)) {
      skipped.push_back(opname);
      return;
    }
    const std::string name = bench_name(be, dt, opname, shape);
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  };

  // ---- embedding -------------------------------------------------------------------
  // forward bytes: tokens 4*N + wte rows s*N*C + wpe rows s*T*C + out s*N*C.
  add(OpFamily::Embedding, "embedding_forward",
      dim("B", B) + "/" + dim("T", T) + "/" + dim("C", C),
      [&be = be, dt, d, s](State& st) {
        Tensor tokens = random_ids(be, {d.B, d.T}, static_cast<int>(d.V), 1);
        Tensor wte = randn(be, {d.Vp, d.C}, dt, 0.02f, 2, MemCategory::Parameters);
        Tensor wpe = randn(be, {d.maxT, d.C}, dt, 0.02f, 3, MemCategory::Parameters);
        Tensor out = be.empty({d.B, d.T, d.C}, dt, MemCategory::Activations);
        run(st, be, [&] { be.embedding_forward(be.default_stream(), out, tokens, Tensor(), wte, wpe); });
        set_bytes(st, 4.0 * d.N + s * (2.0 * d.N * d.C + 1.0 * d.T * d.C));
      });
  // backward bytes: tokens 4*N + dout s*N*C + dwte rows read+write 2*s*N*C + dwpe rows
  // read+write 2*s*T*C.
  add(OpFamily::Embedding, "embedding_backward",
      dim("B", B) + "/" + dim("T", T) + "/" + dim("C", C),
      [&be = be, dt, d, s](State& st) {
        Tensor tokens = random_ids(be, {d.B, d.T}, static_cast<int>(d.V), 1);
        Tensor dout = randn(be, {d.B, d.T, d.C}, dt, 1.f, 4);
        Tensor dwte = full(be, {d.Vp, d.C}, dt, 0.f, MemCategory::Gradients);
        Tensor dwpe = full(be, {d.maxT, d.C}, dt, 0.f, MemCategory::Gradients);
        run(st, be, [&] { be.embedding_backward(be.default_stream(), dwte, dwpe, dout, tokens, Tensor()); });
        set_bytes(st, 4.0 * d.N + s * (3.0 * d.N * d.C + 2.0 * d.T * d.C));
      });

  // ---- layernorm -------------------------------------------------------------------
  // forward bytes: inp s*N*C + weight, bias 2*s*C + out s*N*C + mean, rstd 2*4*N.
  add(OpFamily::LayerNorm, "layernorm_forward", nc, [&be = be, dt, d, s](State& st) {
    Tensor inp = randn(be, {d.N, d.C}, dt, 1.f, 5);
    Tensor w = randn(be, {d.C}, dt, 0.1f, 6, MemCategory::Parameters);
    Tensor b = randn(be, {d.C}, dt, 0.1f, 7, MemCategory::Parameters);
    Tensor out = be.empty({d.N, d.C}, dt, MemCategory::Activations);
    Tensor mean = be.empty({d.N}, DType::F32, MemCategory::Activations);
    Tensor rstd = be.empty({d.N}, DType::F32, MemCategory::Activations);
    run(st, be, [&] {
      be.layernorm_forward(be.default_stream(), out, mean, rstd, inp, w, b, 1e-5f);
    });
    set_bytes(st, s * (2.0 * d.N * d.C + 2.0 * d.C) + 8.0 * d.N);
  });
  // backward bytes: dout, inp s*N*C each + dinp read+write 2*s*N*C + weight s*C +
  // dweight, dbias read+write 4*s*C + mean, rstd 2*4*N.
  add(OpFamily::LayerNorm, "layernorm_backward", nc, [&be = be, dt, d, s](State& st) {
    Tensor inp = randn(be, {d.N, d.C}, dt, 1.f, 5);
    Tensor w = randn(be, {d.C}, dt, 0.1f, 6, MemCategory::Parameters);
    Tensor b = randn(be, {d.C}, dt, 0.1f, 7, MemCategory::Parameters);
    Tensor out = be.empty({d.N, d.C}, dt, MemCategory::Activations);
    Tensor mean = be.empty({d.N}, DType::F32, MemCategory::Activations);
    Tensor rstd = be.empty({d.N}, DType::F32, MemCategory::Activations);
    be.layernorm_forward(be.default_stream(), out, mean, rstd, inp, w, b, 1e-5f);
    Tensor dout = randn(be, {d.N, d.C}, dt, 1.f, 8);
    Tensor dinp = full(be, {d.N, d.C}, dt, 0.f);
    Tensor dw = full(be, {d.C}, dt, 0.f, MemCategory::Gradients);
    Tensor db = full(be, {d.C}, dt, 0.f, MemCategory::Gradients);
    run(st, be, [&] {
      be.layernorm_backward(be.default_stream(), dinp, dw, db, dout, inp, w, mean, rstd);
    });
    set_bytes(st, s * (4.0 * d.N * d.C + 5.0 * d.C) + 8.0 * d.N);
  });

  // ---- linear ----------------------------------------------------------------------
  const Linear linears[] = {
      {"qkv", C, 3 * C}, {"attn_proj", C, C}, {"fc", C, 4 * C}, {"fc_proj", 4 * C, C}};
  for (const Linear& L : linears) {
    const std::string shape =
        std::string(L.name) + "/" + dim("N", N) + "/" + dim("IC", L.IC) + "/" + dim("OC", L.OC);
    // FLOPs: 2*N*IC*OC.
    add(OpFamily::Linear, "linear_forward", shape, [&be = be, dt, d, L](State& st) {
      Tensor inp = randn(be, {d.N, L.IC}, dt, 1.f, 9);
      Tensor w = randn(be, {L.OC, L.IC}, dt, 0.02f, 10, MemCategory::Parameters);
      Tensor b = randn(be, {L.OC}, dt, 0.02f, 11, MemCategory::Parameters);
      Tensor out = be.empty({d.N, L.OC}, dt, MemCategory::Activations);
      run(st, be, [&] { be.linear_forward(be.default_stream(), out, inp, w, b); });
      set_flops(st, 2.0 * d.N * L.IC * L.OC);
    });
    // FLOPs: 4*N*IC*OC (dinp and dweight GEMMs).
    add(OpFamily::Linear, "linear_backward", shape, [&be = be, dt, d, L](State& st) {
      Tensor inp = randn(be, {d.N, L.IC}, dt, 1.f, 9);
      Tensor w = randn(be, {L.OC, L.IC}, dt, 0.02f, 10, MemCategory::Parameters);
      Tensor dout = randn(be, {d.N, L.OC}, dt, 1.f, 12);
      Tensor dinp = be.empty({d.N, L.IC}, dt, MemCategory::Activations);
      Tensor dw = full(be, {L.OC, L.IC}, dt, 0.f, MemCategory::Gradients);
      Tensor db = full(be, {L.OC}, dt, 0.f, MemCategory::Gradients);
      run(st, be, [&] { be.linear_backward(be.default_stream(), dinp, dw, db, dout, inp, w); });
      set_flops(st, 4.0 * d.N * L.IC * L.OC);
    });
  }
  // The tied output projection over one classifier chunk: [R,C] x [Vp,C]^T, no bias.
  const std::string head = "lm_head/" + dim("N", R) + "/" + dim("IC", C) + "/" + dim("OC", Vp);
  add(OpFamily::Linear, "linear_forward", head, [&be = be, dt, d](State& st) {
    Tensor x = randn(be, {d.R, d.C}, dt, 1.f, 13);
    Tensor wte = randn(be, {d.Vp, d.C}, dt, 0.02f, 2, MemCategory::Parameters);
    Tensor logits = be.empty({d.R, d.Vp}, dt, MemCategory::Activations);
    run(st, be, [&] { be.linear_forward(be.default_stream(), logits, x, wte, Tensor()); });
    set_flops(st, 2.0 * d.R * d.C * d.Vp);
  });
  add(OpFamily::Linear, "linear_backward", head, [&be = be, dt, d](State& st) {
    Tensor x = randn(be, {d.R, d.C}, dt, 1.f, 13);
    Tensor wte = randn(be, {d.Vp, d.C}, dt, 0.02f, 2, MemCategory::Parameters);
    Tensor dlogits = randn(be, {d.R, d.Vp}, dt, 1e-4f, 14);
    Tensor dx = be.empty({d.R, d.C}, dt, MemCategory::Activations);
    Tensor dwte = full(be, {d.Vp, d.C}, dt, 0.f, MemCategory::Gradients);
    run(st, be, [&] {
      be.linear_backward(be.default_stream(), dx, dwte, Tensor(), dlogits, x, wte);
    });
    set_flops(st, 4.0 * d.R * d.C * d.Vp);
  });

  // ---- attention -------------------------------------------------------------------
  const std::string bthc =
      dim("B", B) + "/" + dim("T", T) + "/" + dim("NH", NH) + "/" + dim("C", C);
  // FLOPs: 4*B*T*T*C (no causal halving).
  add(OpFamily::Attention, "attention_forward", bthc, [&be = be, dt, d](State& st) {
    Tensor qkv = randn(be, {d.B, d.T, 3 * d.C}, dt, 1.f, 15);
    Tensor out = be.empty({d.B, d.T, d.C}, dt, MemCategory::Activations);
    Tensor lse = be.empty({d.B, d.NH, d.T}, DType::F32, MemCategory::Activations);
    run(st, be, [&] {
      be.attention_forward(be.default_stream(), out, lse, qkv, AttentionShape::mha(static_cast<int>(d.NH), d.C), {});
    });
    set_flops(st, 4.0 * d.B * d.T * d.T * d.C);
  });
  // FLOPs: 8*B*T*T*C (no causal halving, recomputation of Q K^T not counted).
  add(OpFamily::Attention, "attention_backward", bthc, [&be = be, dt, d](State& st) {
    Tensor qkv = randn(be, {d.B, d.T, 3 * d.C}, dt, 1.f, 15);
    Tensor out = be.empty({d.B, d.T, d.C}, dt, MemCategory::Activations);
    Tensor lse = be.empty({d.B, d.NH, d.T}, DType::F32, MemCategory::Activations);
    be.attention_forward(be.default_stream(), out, lse, qkv, AttentionShape::mha(static_cast<int>(d.NH), d.C), {});
    Tensor dout = randn(be, {d.B, d.T, d.C}, dt, 1.f, 16);
    Tensor dqkv = be.empty({d.B, d.T, 3 * d.C}, dt, MemCategory::Activations);
    run(st, be, [&] {
      be.attention_backward(be.default_stream(), dqkv, dout, qkv, out, lse,
                            AttentionShape::mha(static_cast<int>(d.NH), d.C), {});
    });
    set_flops(st, 8.0 * d.B * d.T * d.T * d.C);
  });

  // ---- gelu (on the MLP hidden [N, 4C]) --------------------------------------------
  const std::string n4c = dim("N", N) + "/" + dim("C", 4 * C);
  // forward bytes: inp + out, s*N*4C each.
  add(OpFamily::Gelu, "gelu_forward", n4c, [&be = be, dt, d, s](State& st) {
    Tensor inp = randn(be, {d.N, 4 * d.C}, dt, 1.f, 17);
    Tensor out = be.empty({d.N, 4 * d.C}, dt, MemCategory::Activations);
    run(st, be, [&] { be.gelu_forward(be.default_stream(), out, inp); });
    set_bytes(st, s * 2.0 * d.N * 4 * d.C);
  });
  // backward bytes: dout + inp + dinp, s*N*4C each.
  add(OpFamily::Gelu, "gelu_backward", n4c, [&be = be, dt, d, s](State& st) {
    Tensor inp = randn(be, {d.N, 4 * d.C}, dt, 1.f, 17);
    Tensor dout = randn(be, {d.N, 4 * d.C}, dt, 1.f, 18);
    Tensor dinp = be.empty({d.N, 4 * d.C}, dt, MemCategory::Activations);
    run(st, be, [&] { be.gelu_backward(be.default_stream(), dinp, dout, inp); });
    set_bytes(st, s * 3.0 * d.N * 4 * d.C);
  });

  // ---- residual add (its backward is a copy of dout into both branches, which the
  // model does without an op: no separate benchmark) ---------------------------------
  // bytes: a + b + out, s*N*C each.
  add(OpFamily::Add, "add_forward", nc, [&be = be, dt, d, s](State& st) {
    Tensor a = randn(be, {d.N, d.C}, dt, 1.f, 19);
    Tensor b = randn(be, {d.N, d.C}, dt, 1.f, 20);
    Tensor out = be.empty({d.N, d.C}, dt, MemCategory::Activations);
    run(st, be, [&] { be.add(be.default_stream(), out, a, b); });
    set_bytes(st, s * 3.0 * d.N * d.C);
  });

  // ---- dropout (p = 0.1; GPT-2's default config trains with p = 0) -----------------
  // bytes: inp + out, s*N*C each (the mask is recomputed from Philox, not read).
  const DropoutSpec spec{0.1f, 1234, 7};
  add(OpFamily::Dropout, "dropout_forward", nc + "/p:0.1", [&be = be, dt, d, s, spec](State& st) {
    Tensor inp = randn(be, {d.N, d.C}, dt, 1.f, 21);
    Tensor out = be.empty({d.N, d.C}, dt, MemCategory::Activations);
    run(st, be, [&] { be.dropout_forward(be.default_stream(), out, inp, spec); });
    set_bytes(st, s * 2.0 * d.N * d.C);
  });
  add(OpFamily::Dropout, "dropout_backward", nc + "/p:0.1", [&be = be, dt, d, s, spec](State& st) {
    Tensor dout = randn(be, {d.N, d.C}, dt, 1.f, 22);
    Tensor dinp = be.empty({d.N, d.C}, dt, MemCategory::Activations);
    run(st, be, [&] { be.dropout_backward(be.default_stream(), dinp, dout, spec); });
    set_bytes(st, s * 2.0 * d.N * d.C);
  });

  // ---- softmax cross-entropy over one classifier chunk [R, Vp] ---------------------
  const std::string rv = dim("N", R) + "/" + dim("Vp", Vp);
  // forward (losses only) bytes: logits s*R*Vp + targets 4*R + losses 4*R.
  add(OpFamily::SoftmaxCrossEntropy, "softmax_cross_entropy_forward", rv, [&be = be, dt, d, s](State& st) {
    Tensor logits = randn(be, {d.R, d.Vp}, dt, 2.f, 23);
    Tensor targets = random_ids(be, {d.R}, static_cast<int>(d.V), 24);
    Tensor losses = be.empty({d.R}, DType::F32, MemCategory::Activations);
    run(st, be, [&] {
      be.softmax_cross_entropy(be.default_stream(), losses, Tensor(), logits, targets,
                               static_cast<int>(d.V), -1, 1.f);
    });
    set_bytes(st, s * d.R * d.Vp + 8.0 * d.R);
  });
  // backward (losses and dlogits, in place over the logits as the model does) bytes:
  // logits read s*R*Vp + dlogits written s*R*Vp + targets, losses 8*R. In place, later
  // iterations run on the previous gradient: the same work, other values.
  add(OpFamily::SoftmaxCrossEntropy, "softmax_cross_entropy_backward", rv, [&be = be, dt, d, s](State& st) {
    Tensor logits = randn(be, {d.R, d.Vp}, dt, 2.f, 23);
    Tensor targets = random_ids(be, {d.R}, static_cast<int>(d.V), 24);
    Tensor losses = be.empty({d.R}, DType::F32, MemCategory::Activations);
    run(st, be, [&] {
      be.softmax_cross_entropy(be.default_stream(), losses, logits, logits, targets,
                               static_cast<int>(d.V), -1, 1.f / static_cast<float>(d.N));
    });
    set_bytes(st, s * 2.0 * d.R * d.Vp + 8.0 * d.R);
  });

  // ---- the fused classifier + cross-entropy of nn/classifier.h over all N rows -----
  // (not a Backend op: the sum of the lm_head and softmax_cross_entropy ops above over
  // ceil(N/R) chunks, with its loss sums on the device). FLOPs: 6*N*C*Vp.
  add(OpFamily::SoftmaxCrossEntropy, "classifier_cross_entropy_fwd_bwd",
      dim("N", N) + "/" + dim("C", C) + "/" + dim("Vp", Vp), [&be = be, dt, d](State& st) {
        Tensor x = randn(be, {d.N, d.C}, dt, 1.f, 13);
        Tensor wte = randn(be, {d.Vp, d.C}, dt, 0.02f, 2, MemCategory::Parameters);
        Tensor targets = random_ids(be, {d.N}, static_cast<int>(d.V), 24);
        Tensor dx = be.empty({d.N, d.C}, dt, MemCategory::Activations);
        Tensor dwte = full(be, {d.Vp, d.C}, dt, 0.f, MemCategory::Gradients);
        Tensor logits = be.empty({d.R, d.Vp}, dt, MemCategory::Activations);
        Tensor losses = be.empty({d.R}, DType::F32, MemCategory::Activations);
        Tensor loss = full(be, {2}, DType::F64, 0.f, MemCategory::Activations);
        run(st, be, [&] {
          nn::classifier_cross_entropy(be, be.default_stream(), x, wte, targets,
                                       static_cast<int>(d.V), 1.f / static_cast<float>(d.N), dx,
                                       dwte, logits, losses, loss);
        });
        set_flops(st, 6.0 * d.N * d.C * d.Vp);
      });

  // ---- AdamW over the whole model's parameters (one flat tensor) -------------------
  // bytes: param read+write 2*s*n + grad s*n + m, v read+write 16*n (28 bytes/param fp32).
  add(OpFamily::AdamW, "adamw_step", dim("params", d.adamw_n), [&be = be, dt, d, s](State& st) {
    const Shape shape{d.adamw_n};
    Tensor p = full(be, shape, dt, 0.02f, MemCategory::Parameters);
    Tensor g = full(be, shape, dt, 1e-3f, MemCategory::Gradients);
    Tensor m = full(be, shape, DType::F32, 0.f, MemCategory::OptimizerState);
    Tensor v = full(be, shape, DType::F32, 0.f, MemCategory::OptimizerState);
    AdamWParams hp;
    hp.lr = 6e-4f;
    hp.weight_decay = 0.1f;
    run(st, be, [&] {
      be.adamw_step(be.default_stream(), p, g, m, v, Tensor(), hp);
      ++hp.step;
    });
    set_bytes(st, (3.0 * s + 16.0) * static_cast<double>(d.adamw_n));
  });

  if (!skipped.empty()) {
    std::string list;
    for (const auto& n : skipped) list += (list.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "[%s/%s] not supported, skipped: %s\n", be.name().c_str(),
                 std::string(dtype_name(dt)).c_str(), list.c_str());
  }
}

}  // namespace
}  // namespace kiln::bench

int main(int argc, char** argv) {
  using namespace kiln;
  bench::Flags flags(
      {{"model", "gpt2"}, {"B", "4"}, {"T", "64"}, {"backend", "all"}, {"dtype", "all"},
       {"adamw_params", "0"}},
      {{"model", "GPT-2 preset giving C, NH, V, Vp (gpt2, gpt2-medium, ...)"},
       {"B", "batch size"},
       {"T", "sequence length"},
       {"backend", "a backend name (cpu, cuda) or all"},
       {"dtype", "fp32, bf16, fp16 or all (those the backend supports)"},
       {"adamw_params", "elements of the AdamW benchmark; 0 = the model's num_parameters()"}});
  flags.parse(&argc, argv);

  const GPT2Config cfg = GPT2Config::preset(flags.str("model"));
  bench::Dims d{};
  d.B = flags.i64("B");
  d.T = flags.i64("T");
  d.C = cfg.n_embd;
  d.NH = cfg.n_head;
  d.V = cfg.vocab_size;
  d.Vp = cfg.padded_vocab_size;
  d.maxT = std::max<int64_t>(d.T, cfg.block_size);
  d.N = d.B * d.T;
  d.R = nn::classifier_chunk_rows(d.N, d.Vp, nn::kDefaultClassifierChunkMb);
  d.adamw_n = flags.i64("adamw_params") > 0 ? flags.i64("adamw_params") : cfg.num_parameters();

  // Backends live until the end of main: the registered benchmarks refer to them.
  std::vector<std::unique_ptr<Backend>> backends;
  if (flags.str("backend") == "all") {
    backends = available_backends();
    for (const auto& why : skipped_backends()) std::fprintf(stderr, "skipped backend: %s\n", why.c_str());
  } else {
    backends.push_back(make_backend(flags.str("backend")));
  }
  std::vector<DType> dtypes;
  if (flags.str("dtype") == "all") {
    dtypes = {DType::F32, DType::BF16, DType::F16};
  } else {
    dtypes = {parse_dtype(flags.str("dtype"))};
  }
  for (auto& be : backends) {
    for (DType dt : dtypes) {
      bool any = false;
      for (Op op : kAllOps) any |= be->supports(op, dt);
      if (any) bench::register_all(*be, dt, d);
    }
  }

  benchmark::AddCustomContext("model", flags.str("model"));
  benchmark::AddCustomContext("shape", "B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) +
                                           " C=" + std::to_string(d.C) + " NH=" + std::to_string(d.NH) +
                                           " Vp=" + std::to_string(d.Vp) + " R=" + std::to_string(d.R));
  bench::add_thread_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
