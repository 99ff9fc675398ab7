// kiln_gpu_bf16: checks the CUDA backend's bf16 paths, which the cross-backend op test
// does not exercise (it tests fp32). For each op, random inputs are rounded to bf16 and
// the op runs twice on the CUDA backend: in fp32 on those rounded values (the fp32 path
// is checked against the CPU backend by backend_op_test) and in bf16. Outputs that are
// accumulated into (+=) start from the same rounded values in both. Reported per output:
// rel = ||bf16 - fp32|| / ||fp32|| over all elements; it passes below 2e-2 (bf16 storage
// of the outputs alone gives ~2e-3; intermediate activations stored in bf16 add more)
// and fails on any NaN/Inf. Mixed precision (the bf16 GPT-2): the layers' parameter
// gradients in fp32 with bf16 activations, against the fp32 path; AdamW on fp32 master
// weights with bf16 gradients; copy's conversions between fp32, bf16 and fp16 bit for bit
// against core/dtype.h (NaN, Inf, ties, subnormals, fp16 overflow). Prints one line per
// output and a final "bf16 check: P passed, F failed"; exit status 1 when anything failed.
// Usage: kiln_gpu_bf16 [backend]   (default cuda; "cpu" checks the program itself)
#include "backend/registry.h"
#include "core/dtype.h"
#include "core/rng.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace kiln;

namespace {

Backend* g_be = nullptr;
Philox g_rng(4242, 11);
int g_pass = 0, g_fail = 0;
constexpr float kTol = 2e-2f;

float uniform_pm1() { return 2.f * (static_cast<float>(g_rng.next_u32() >> 8) * 0x1p-24f) - 1.f; }

// The same values in an fp32 and a bf16 tensor.
struct Pair {
  Tensor f, h;
};

Pair upload(const Shape& shape, const std::vector<float>& x) {
  Backend& be = *g_be;
  Pair p{be.empty(shape, DType::F32, MemCategory::Activations),
         be.empty(shape, DType::BF16, MemCategory::Activations)};
  std::vector<float> xf(x.size());
  std::vector<uint16_t> xh(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xh[i] = f32_to_bf16(x[i]);
    xf[i] = bf16_to_f32(xh[i]);
  }
  be.copy_from_host(be.default_stream(), p.f, xf.data());
  be.copy_from_host(be.default_stream(), p.h, xh.data());
  return p;
}

Pair rand_pair(const Shape& shape, float scale = 1.f, float offset = 0.f) {
  std::vector<float> x(static_cast<size_t>(shape.numel()));
  for (auto& v : x) v = offset + scale * uniform_pm1();
  return upload(shape, x);
}

std::vector<float> download(const Tensor& t) {
  Backend& be = *g_be;
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::F32) {
    be.copy_to_host(be.default_stream(), out.data(), t);
  } else {
    std::vector<uint16_t> h(out.size());
    be.copy_to_host(be.default_stream(), h.data(), t);
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  }
  return out;
}

void compare(const std::string& name, const Tensor& ref, const Tensor& got, float tol = kTol) {
  const std::vector<float> r = download(ref), g = download(got);
  double num = 0, den = 0;
  bool finite = true;
  for (size_t i = 0; i < r.size(); ++i) {
    if (!std::isfinite(g[i]) || !std::isfinite(r[i])) finite = false;
    const double d = static_cast<double>(g[i]) - r[i];
    num += d * d;
    den += static_cast<double>(r[i]) * r[i];
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool ok = finite && rel < tol;
  (ok ? g_pass : g_fail)++;
  std::printf("  bf16 %-40s rel %.3e %s%s\n", name.c_str(), rel, ok ? "ok" : "FAIL",
              finite ? "" : " (NaN/Inf)");
}

// compare() on each of the three parts (q, k, v) of a [.., 3C] tensor's rows.
// qkv rows of qw query columns, then kvw key and kvw value columns (AttentionShape).
void compare_qkv(const std::string& name, const Tensor& ref, const Tensor& got, int qw, int kvw,
                 float tol) {
  const std::vector<float> r = download(ref), g = download(got);
  const size_t W = static_cast<size_t>(qw) + 2 * static_cast<size_t>(kvw);
  for (int part = 0; part < 3; ++part) {
    double num = 0, den = 0;
    bool finite = true;
    for (size_t i = 0; i < r.size(); ++i) {
      const int col = static_cast<int>(i % W);
      if ((col < qw ? 0 : col < qw + kvw ? 1 : 2) != part) continue;
      if (!std::isfinite(g[i]) || !std::isfinite(r[i])) finite = false;
      const double d = static_cast<double>(g[i]) - r[i];
      num += d * d;
      den += static_cast<double>(r[i]) * r[i];
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const bool ok = finite && rel < tol;
    (ok ? g_pass : g_fail)++;
    std::printf("  bf16 %-40s rel %.3e %s%s\n", (name + " d" + "qkv"[part]).c_str(), rel,
                ok ? "ok" : "FAIL", finite ? "" : " (NaN/Inf)");
  }
}

// A new fp32 tensor holding t's values (the fp32 start of a mixed-precision accumulator).
Tensor clone_f32(const Tensor& t) {
  Tensor c = g_be->empty(t.shape(), DType::F32, MemCategory::Activations);
  g_be->copy(g_be->default_stream(), c, t);
  return c;
}

// Runs `body` and reports an exception as one failure named `what`.
template <class F>
void guarded(const char* what, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    ++g_fail;
    std::printf("  bf16 %-40s FAIL (error: %s)\n", what, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto be_owned = make_backend(argc > 1 ? argv[1] : "cuda");
    Backend& be = *be_owned;
    g_be = &be;
    const Stream s = be.default_stream();
    const int B = 4, T = 256, C = 768, NH = 12, V = 1000, Vp = 1024;
    const int N = B * T;

    guarded("linear", [&] {
      const int IC = C, OC = 3 * C;
      Pair x = rand_pair({N, IC}), w = rand_pair({OC, IC}, 0.05f), b = rand_pair({OC}, 0.1f);
      Pair y = rand_pair({N, OC});
      be.linear_forward(s, y.f, x.f, w.f, b.f);
      be.linear_forward(s, y.h, x.h, w.h, b.h);
      compare("linear_forward out", y.f, y.h);
      Pair dy = rand_pair({N, OC}), dx = rand_pair({N, IC}), dw = rand_pair({OC, IC}),
           db = rand_pair({OC});
      be.linear_backward(s, dx.f, dw.f, db.f, dy.f, x.f, w.f);
      be.linear_backward(s, dx.h, dw.h, db.h, dy.h, x.h, w.h);
      compare("linear_backward dinp", dx.f, dx.h);
      compare("linear_backward dweight (+=)", dw.f, dw.h);
      compare("linear_backward dbias (+=)", db.f, db.h);
      // An odd bias offset (not 16-byte aligned): the GEMM + bias-kernel fallback.
      Pair b2 = rand_pair({OC + 1}, 0.1f);
      be.linear_forward(s, y.f, x.f, w.f, b2.f.view_at(1, {OC}));
      be.linear_forward(s, y.h, x.h, w.h, b2.h.view_at(1, {OC}));
      compare("linear_forward out (unaligned bias)", y.f, y.h);
    });

    guarded("layernorm", [&] {
      Pair x = rand_pair({N, C}, 1.f, 0.3f), w = rand_pair({C}, 0.5f, 1.f), b = rand_pair({C}, 0.1f);
      Pair y = rand_pair({N, C});
      Tensor mf = be.empty({N}, DType::F32, MemCategory::Activations);
      Tensor rf = be.empty({N}, DType::F32, MemCategory::Activations);
      Tensor mh = be.empty({N}, DType::F32, MemCategory::Activations);
      Tensor rh = be.empty({N}, DType::F32, MemCategory::Activations);
      be.layernorm_forward(s, y.f, mf, rf, x.f, w.f, b.f, 1e-5f);
      be.layernorm_forward(s, y.h, mh, rh, x.h, w.h, b.h, 1e-5f);
      compare("layernorm_forward out", y.f, y.h);
      compare("layernorm_forward mean", mf, mh);
      compare("layernorm_forward rstd", rf, rh);
      Pair dy = rand_pair({N, C}), dx = rand_pair({N, C}), dw = rand_pair({C}), db = rand_pair({C});
      be.layernorm_backward(s, dx.f, dw.f, db.f, dy.f, x.f, w.f, mf, rf);
      be.layernorm_backward(s, dx.h, dw.h, db.h, dy.h, x.h, w.h, mf, rf);
      compare("layernorm_backward dinp (+=)", dx.f, dx.h);
      compare("layernorm_backward dweight (+=)", dw.f, dw.h);
      compare("layernorm_backward dbias (+=)", db.f, db.h);
    });

    guarded("attention", [&] {
      const AttentionShape mha = AttentionShape::mha(NH, C);
      Pair qkv = rand_pair({B, T, 3 * C});
      Pair out = rand_pair({B, T, C});
      Tensor lf = be.empty({B, NH, T}, DType::F32, MemCategory::Activations);
      Tensor lh = be.empty({B, NH, T}, DType::F32, MemCategory::Activations);
      be.attention_forward(s, out.f, lf, qkv.f, mha, DropoutSpec{});
      be.attention_forward(s, out.h, lh, qkv.h, mha, DropoutSpec{});
      compare("attention_forward out", out.f, out.h);
      compare("attention_forward lse", lf, lh);
      Pair dout = rand_pair({B, T, C}), dqkv = rand_pair({B, T, 3 * C});
      be.attention_backward(s, dqkv.f, dout.f, qkv.f, out.f, lf, mha, DropoutSpec{});
      be.attention_backward(s, dqkv.h, dout.h, qkv.h, out.h, lh, mha, DropoutSpec{});
      compare("attention_backward dqkv", dqkv.f, dqkv.h);
      DropoutSpec dr{0.1f, 99, 3};
      be.attention_forward(s, out.f, lf, qkv.f, mha, dr);
      be.attention_forward(s, out.h, lh, qkv.h, mha, dr);
      compare("attention_forward out (dropout 0.1)", out.f, out.h);
    });

    // The tensor-core kernels (bf16, no dropout, HD 32/64/128; attention_tc.cu) against
    // the fp32 CUDA-core kernels (which backend_op_test checks against the CPU), with a
    // tighter bound (1e-2): ragged T (partial tiles), each head size, peaky softmax,
    // grouped-query (NKV < NH) and bidirectional shapes.
    struct AttnCase {
      int B, T, NH, NKV, HD;
      float scale;
      bool causal = true;
    };
    for (const AttnCase& c :
         {AttnCase{2, 200, 12, 12, 64, 1.f}, AttnCase{1, 1024, 2, 2, 64, 3.f},
          AttnCase{2, 130, 8, 8, 32, 2.f}, AttnCase{2, 160, 4, 4, 128, 1.f},
          AttnCase{3, 64, 3, 3, 64, 1.f}, AttnCase{1, 37, 2, 2, 128, 2.f},
          AttnCase{2, 200, 12, 4, 64, 1.f}, AttnCase{1, 97, 6, 1, 64, 2.f},
          AttnCase{2, 130, 8, 2, 32, 2.f, false}, AttnCase{1, 160, 4, 4, 128, 1.f, false},
          AttnCase{2, 75, 4, 2, 64, 3.f, false}}) {
      const std::string tag = " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " HD" +
                              std::to_string(c.HD) + " NH" + std::to_string(c.NH) + " NKV" +
                              std::to_string(c.NKV) + (c.causal ? "" : " bidir");
      guarded(("attention tc" + tag).c_str(), [&] {
        const AttentionShape shape{c.NH, c.NKV, c.HD, c.causal};
        const int Cc = c.NH * c.HD, KVc = c.NKV * c.HD;
        Pair qkv = rand_pair({c.B, c.T, Cc + 2 * KVc}, c.scale);
        Pair out = rand_pair({c.B, c.T, Cc});
        Tensor lf = be.empty({c.B, c.NH, c.T}, DType::F32, MemCategory::Activations);
        Tensor lh = be.empty({c.B, c.NH, c.T}, DType::F32, MemCategory::Activations);
        be.attention_forward(s, out.f, lf, qkv.f, shape, DropoutSpec{});
        be.attention_forward(s, out.h, lh, qkv.h, shape, DropoutSpec{});
        compare("attn tc fwd out" + tag, out.f, out.h, 1e-2f);
        compare("attn tc fwd lse" + tag, lf, lh, 1e-2f);
        Pair dout = rand_pair({c.B, c.T, Cc}), dqkv = rand_pair({c.B, c.T, Cc + 2 * KVc});
        be.attention_backward(s, dqkv.f, dout.f, qkv.f, out.f, lf, shape, DropoutSpec{});
        be.attention_backward(s, dqkv.h, dout.h, qkv.h, out.h, lh, shape, DropoutSpec{});
        compare_qkv("attn tc bwd" + tag, dqkv.f, dqkv.h, Cc, KVc, 1e-2f);
      });
    }

    guarded("elementwise", [&] {
      Pair x = rand_pair({N, 4 * C}, 3.f), y = rand_pair({N, 4 * C});
      be.gelu_forward(s, y.f, x.f);
      be.gelu_forward(s, y.h, x.h);
      compare("gelu_forward", y.f, y.h);
      Pair dy = rand_pair({N, 4 * C}), dx = rand_pair({N, 4 * C});
      be.gelu_backward(s, dx.f, dy.f, x.f);
      be.gelu_backward(s, dx.h, dy.h, x.h);
      compare("gelu_backward", dx.f, dx.h);
      Pair a = rand_pair({N, C}), b = rand_pair({N, C}), o = rand_pair({N, C});
      be.add(s, o.f, a.f, b.f);
      be.add(s, o.h, a.h, b.h);
      compare("add", o.f, o.h);
      DropoutSpec dr{0.2f, 7, 1};
      be.dropout_forward(s, o.f, a.f, dr);
      be.dropout_forward(s, o.h, a.h, dr);
      compare("dropout_forward (same mask)", o.f, o.h);
    });

    guarded("cross_entropy", [&] {
      Pair logits = rand_pair({N, Vp}, 4.f), dl = rand_pair({N, Vp});
      std::vector<int32_t> tg(N);
      for (auto& t : tg) t = static_cast<int32_t>(g_rng.next_u32() % V);
      tg[5] = -1;  // one ignored row
      Tensor targets = be.empty({N}, DType::I32, MemCategory::Activations);
      be.copy_from_host(s, targets, tg.data());
      Tensor lossf = be.empty({N}, DType::F32, MemCategory::Activations);
      Tensor lossh = be.empty({N}, DType::F32, MemCategory::Activations);
      be.softmax_cross_entropy(s, lossf, dl.f, logits.f, targets, V, -1, 1.f / N);
      be.softmax_cross_entropy(s, lossh, dl.h, logits.h, targets, V, -1, 1.f / N);
      compare("softmax_cross_entropy losses", lossf, lossh);
      compare("softmax_cross_entropy dlogits", dl.f, dl.h);
    });

    guarded("embedding", [&] {
      std::vector<int32_t> tk(N);
      for (auto& t : tk) t = static_cast<int32_t>(g_rng.next_u32() % V);
      Tensor tokens = be.empty({B, T}, DType::I32, MemCategory::Activations);
      be.copy_from_host(s, tokens, tk.data());
      Pair wte = rand_pair({Vp, C}), wpe = rand_pair({1024, C}), out = rand_pair({B, T, C});
      be.embedding_forward(s, out.f, tokens, Tensor(), wte.f, wpe.f);
      be.embedding_forward(s, out.h, tokens, Tensor(), wte.h, wpe.h);
      compare("embedding_forward", out.f, out.h);
      Pair dout = rand_pair({B, T, C}), dwte = rand_pair({Vp, C}), dwpe = rand_pair({1024, C});
      be.embedding_backward(s, dwte.f, dwpe.f, dout.f, tokens, Tensor());
      be.embedding_backward(s, dwte.h, dwpe.h, dout.h, tokens, Tensor());
      compare("embedding_backward dwte (+=)", dwte.f, dwte.h);
      compare("embedding_backward dwpe (+=)", dwpe.f, dwpe.h);
    });

    // bf16 parameters updated in place (the CUDA backend's own path; the CPU backend
    // updates fp32 parameters only: bf16 models go through fp32 master weights, below).
    if (be.name() == "cuda") guarded("adamw", [&] {
      const int n = 1 << 20;
      Pair p = rand_pair({n}), g = rand_pair({n}, 0.1f);
      Pair m = rand_pair({n}, 0.01f), v = rand_pair({n}, 0.01f, 0.011f);
      Tensor mh = be.empty({n}, DType::F32, MemCategory::Activations);
      Tensor vh = be.empty({n}, DType::F32, MemCategory::Activations);
      be.copy(s, mh, m.f);
      be.copy(s, vh, v.f);
      AdamWParams hp;
      hp.lr = 1e-2f;
      hp.weight_decay = 0.1f;
      hp.step = 3;
      be.adamw_step(s, p.f, g.f, m.f, v.f, Tensor(), hp);
      be.adamw_step(s, p.h, g.h, mh, vh, Tensor(), hp);
      compare("adamw param", p.f, p.h);
      compare("adamw m", m.f, mh, 1e-5f);
      compare("adamw v", v.f, vh, 1e-5f);
    });

    guarded("copy (convert)", [&] {
      // Specials first, then random values over a wide exponent range.
      std::vector<float> x = {0.f, -0.f, 1.f, -1.f, NAN, -NAN, INFINITY, -INFINITY, 65504.f,
                              65520.f, 1e6f, -1e6f, 1e-8f, 6e-8f, 3e-5f, 1e-40f, 3.4e38f,
                              bits_f32(0x3f808000u), bits_f32(0x3f818000u),  // bf16 ties
                              bits_f32(0x3f801000u), bits_f32(0x3f803000u)};  // fp16 ties
      while (x.size() < 100003) {
        const float e = std::ldexp(1.f, static_cast<int>(g_rng.next_u32() % 60) - 30);
        x.push_back(uniform_pm1() * e);
      }
      const int64_t n = static_cast<int64_t>(x.size());
      auto bits_equal = [](uint32_t a, uint32_t b, bool nan_a, bool nan_b) {
        return (nan_a && nan_b) || (!nan_a && !nan_b && a == b);
      };
      auto report = [&](const char* name, int64_t bad) {
        (bad == 0 ? g_pass : g_fail)++;
        std::printf("  bf16 %-40s %lld of %lld differ %s\n", name, static_cast<long long>(bad),
                    static_cast<long long>(n), bad == 0 ? "ok" : "FAIL");
      };
      Tensor f = be.empty({n}, DType::F32, MemCategory::Activations);
      Tensor h = be.empty({n}, DType::BF16, MemCategory::Activations);
      Tensor q = be.empty({n}, DType::F16, MemCategory::Activations);
      Tensor f2 = be.empty({n}, DType::F32, MemCategory::Activations);
      be.copy_from_host(s, f, x.data());
      std::vector<uint16_t> got16(x.size());
      std::vector<float> got32(x.size());
      int64_t bad = 0;
      // fp32 -> bf16 and back.
      be.copy(s, h, f);
      be.copy_to_host(s, got16.data(), h);
      for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t w = f32_to_bf16(x[i]);
        bad += !bits_equal(got16[i], w, std::isnan(bf16_to_f32(got16[i])), std::isnan(x[i]));
      }
      report("copy fp32 -> bf16 (bitwise)", bad);
      be.copy(s, f2, h);
      be.copy_to_host(s, got32.data(), f2);
      bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const float w = bf16_to_f32(got16[i]);
        bad += !bits_equal(f32_bits(got32[i]), f32_bits(w), std::isnan(got32[i]), std::isnan(w));
      }
      report("copy bf16 -> fp32 (bitwise)", bad);
      // fp32 -> fp16 and back.
      be.copy(s, q, f);
      be.copy_to_host(s, got16.data(), q);
      bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t w = f32_to_f16(x[i]);
        bad += !bits_equal(got16[i], w, std::isnan(f16_to_f32(got16[i])), std::isnan(x[i]));
      }
      report("copy fp32 -> fp16 (bitwise)", bad);
      std::vector<uint16_t> q_host = got16;
      be.copy(s, f2, q);
      be.copy_to_host(s, got32.data(), f2);
      bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const float w = f16_to_f32(q_host[i]);
        bad += !bits_equal(f32_bits(got32[i]), f32_bits(w), std::isnan(got32[i]), std::isnan(w));
      }
      report("copy fp16 -> fp32 (bitwise)", bad);
      // fp16 -> bf16 (through fp32, as the CPU backend).
      be.copy(s, h, q);
      be.copy_to_host(s, got16.data(), h);
      bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const uint16_t w = f32_to_bf16(f16_to_f32(q_host[i]));
        bad += !bits_equal(got16[i], w, std::isnan(bf16_to_f32(got16[i])), std::isnan(bf16_to_f32(w)));
      }
      report("copy fp16 -> bf16 (bitwise)", bad);
    });

    guarded("mixed precision (fp32 grads)", [&] {
      // bf16 activations and parameters, fp32 parameter gradients (ModelStorage's default
      // for a bf16 model), against the fp32 path on the same rounded values.
      {
        const int IC = C, OC = 3 * C;
        Pair x = rand_pair({N, IC}), w = rand_pair({OC, IC}, 0.05f);
        Pair dy = rand_pair({N, OC}), dx = rand_pair({N, IC}), dw = rand_pair({OC, IC}),
             db = rand_pair({OC});
        Tensor dwm = clone_f32(dw.f), dbm = clone_f32(db.f);
        be.linear_backward(s, dx.f, dw.f, db.f, dy.f, x.f, w.f);
        be.linear_backward(s, dx.h, dwm, dbm, dy.h, x.h, w.h);
        compare("mixed linear_backward dinp", dx.f, dx.h);
        compare("mixed linear_backward dweight fp32 (+=)", dw.f, dwm, 1e-4f);
        compare("mixed linear_backward dbias fp32 (+=)", db.f, dbm, 1e-4f);
        // dweight only (the tied output projection: no bias).
        Tensor dwm2 = clone_f32(dw.f);
        be.linear_backward(s, Tensor(), dw.f, Tensor(), dy.f, x.f, w.f);
        be.linear_backward(s, Tensor(), dwm2, Tensor(), dy.h, x.h, w.h);
        compare("mixed linear_backward dweight only", dw.f, dwm2, 1e-4f);
      }
      {
        Pair x = rand_pair({N, C}, 1.f, 0.3f), w = rand_pair({C}, 0.5f, 1.f), b = rand_pair({C}, 0.1f);
        Pair y = rand_pair({N, C});
        Tensor mf = be.empty({N}, DType::F32, MemCategory::Activations);
        Tensor rf = be.empty({N}, DType::F32, MemCategory::Activations);
        be.layernorm_forward(s, y.f, mf, rf, x.f, w.f, b.f, 1e-5f);
        Pair dy = rand_pair({N, C}), dx = rand_pair({N, C}), dw = rand_pair({C}), db = rand_pair({C});
        Tensor dwm = clone_f32(dw.f), dbm = clone_f32(db.f);
        be.layernorm_backward(s, dx.f, dw.f, db.f, dy.f, x.f, w.f, mf, rf);
        be.layernorm_backward(s, dx.h, dwm, dbm, dy.h, x.h, w.h, mf, rf);
        compare("mixed layernorm_backward dinp (+=)", dx.f, dx.h);
        compare("mixed layernorm_backward dweight fp32", dw.f, dwm, 1e-4f);
        compare("mixed layernorm_backward dbias fp32", db.f, dbm, 1e-4f);
      }
      {
        std::vector<int32_t> tk(N);
        for (auto& t : tk) t = static_cast<int32_t>(g_rng.next_u32() % 50);  // many repeats
        Tensor tokens = be.empty({B, T}, DType::I32, MemCategory::Activations);
        be.copy_from_host(s, tokens, tk.data());
        Pair dout = rand_pair({B, T, C}), dwte = rand_pair({Vp, C}), dwpe = rand_pair({1024, C});
        Tensor dwtem = clone_f32(dwte.f), dwpem = clone_f32(dwpe.f);
        be.embedding_backward(s, dwte.f, dwpe.f, dout.f, tokens, Tensor());
        be.embedding_backward(s, dwtem, dwpem, dout.h, tokens, Tensor());
        compare("mixed embedding_backward dwte fp32", dwte.f, dwtem, 1e-5f);
        compare("mixed embedding_backward dwpe fp32", dwpe.f, dwpem, 1e-5f);
      }
      {
        // AdamW on fp32 master weights: bf16 gradients against the same values in fp32.
        const int n = 1 << 20;
        Pair p = rand_pair({n}), g = rand_pair({n}, 0.1f);
        Tensor pm = clone_f32(p.f);
        Pair m = rand_pair({n}, 0.01f), v = rand_pair({n}, 0.01f, 0.011f);
        Tensor mm = clone_f32(m.f), vm = clone_f32(v.f);
        AdamWParams hp;
        hp.lr = 1e-2f;
        hp.weight_decay = 0.1f;
        hp.step = 3;
        be.adamw_step(s, p.f, g.f, m.f, v.f, Tensor(), hp);
        be.adamw_step(s, pm, g.h, mm, vm, Tensor(), hp);
        compare("mixed adamw fp32 master, bf16 grad", p.f, pm, 1e-6f);
        // The optimizer's master -> parameter copy (fp32 -> bf16) after the step.
        be.copy(s, p.h, pm);
        compare("mixed adamw master -> bf16 param", p.f, p.h);
      }
    });

    guarded("sum_squares", [&] {
      Pair x = rand_pair({N, C});
      const double a = read_sum_squares(be, x.f), b = read_sum_squares(be, x.h);
      const double rel = std::fabs(a - b) / a;
      const bool ok = rel < 1e-6;
      (ok ? g_pass : g_fail)++;
      std::printf("  bf16 %-40s rel %.3e %s\n", "sum_squares (exact inputs)", rel, ok ? "ok" : "FAIL");
    });

    be.synchronize(s);
    std::printf("bf16 check: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("kiln_gpu_bf16: error: %s\n", e.what());
    return 1;
  }
}
