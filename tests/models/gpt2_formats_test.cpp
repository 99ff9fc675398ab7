// GPT-2 interop formats: parameter specs vs the model, llm.c and Hugging Face round trips,
// the file layouts (llm.c order, Conv1D transposes, vocabulary padding) and rejections.
#include "models/gpt2/formats.h"

#include "backend/registry.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "models/gpt2/gpt2.h"

#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <random>

namespace kiln {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            fmt::format("kiln_gpt2fmt_{}_{}_{}", ::getpid(), counter++, std::random_device{}());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

GPT2Config tiny_config() {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = 50;
  c.padded_vocab_size = 64;
  c.block_size = 16;
  return c;
}

// Distinct random values everywhere; padded vocabulary rows zero (as kiln keeps them).
GPT2Weights random_weights(const GPT2Config& c, unsigned seed = 1) {
  GPT2Weights w = gpt2_zero_weights(c);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& [name, t] : w.tensors) {
    for (auto& x : t) x = nd(rng);
  }
  auto& wte = w.tensors["transformer.wte.weight"];
  std::fill(wte.begin() + static_cast<int64_t>(c.vocab_size) * c.n_embd, wte.end(), 0.f);
  return w;
}

void expect_same(const GPT2Weights& a, const GPT2Weights& b) {
  EXPECT_EQ(a.config.str(), b.config.str());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << name;
    EXPECT_EQ(t, b.tensors.at(name)) << name;
  }
}

TEST(GPT2Formats, ParamSpecsMatchTheModel) {
  GPT2Config other = GPT2Config::preset("gpt2");
  other.n_layer = 3, other.n_embd = 32, other.n_head = 4, other.vocab_size = 1000;
  other.padded_vocab_size = GPT2Config::pad_vocab(1000), other.block_size = 64;
  for (const GPT2Config& c : {tiny_config(), other}) {
    auto backend = make_backend("cpu");
    GPT2 model(c, *backend);
    const auto specs = gpt2_param_specs(c);
    ASSERT_EQ(specs.size(), model.params().size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& a = specs[i];
      const ParamSpec& b = model.params()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.shape, b.shape) << a.name;
      EXPECT_EQ(a.offset, b.offset) << a.name;
      EXPECT_EQ(a.weight_decay, b.weight_decay) << a.name;
      EXPECT_EQ(a.part, b.part) << a.name;
    }
    EXPECT_EQ(specs.back().offset + specs.back().shape.numel(), model.flat_size());
  }
}

TEST(GPT2Formats, LlmcRoundTripAndLayout) {
  TempDir tmp;
  const GPT2Config c = tiny_config();
  const GPT2Weights w = random_weights(c);
  const fs::path p = tmp.path() / "model.bin";
  save_llmc(p, w);
  expect_same(load_llmc(p), w);

  // The layout by hand: header, then the 16 tensors stacked over layers.
  const int64_t C = 8, L = 2, Vp = 64, T = 16;
  std::ifstream in(p, std::ios::binary);
  std::vector<int32_t> h(256);
  in.read(reinterpret_cast<char*>(h.data()), 1024);
  EXPECT_EQ(h[0], 20240326);
  EXPECT_EQ(h[1], 3);
  EXPECT_EQ(h[2], T);
  EXPECT_EQ(h[3], 50);
  EXPECT_EQ(h[4], L);
  EXPECT_EQ(h[5], 2);
  EXPECT_EQ(h[6], C);
  EXPECT_EQ(h[7], Vp);
  const int64_t n = c.num_parameters() + (Vp - 50) * C;
  std::vector<float> all(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(n * 4));
  ASSERT_EQ(in.gcount(), n * 4);
  EXPECT_EQ(fs::file_size(p), static_cast<uintmax_t>(1024 + n * 4));
  // Offsets of llm.c's tensors.
  const int64_t wte = 0, wpe = Vp * C, ln1w = wpe + T * C, ln1b = ln1w + L * C,
                qkvw = ln1b + L * C, qkvb = qkvw + L * 3 * C * C, attprojw = qkvb + L * 3 * C,
                attprojb = attprojw + L * C * C, ln2w = attprojb + L * C, ln2b = ln2w + L * C,
                fcw = ln2b + L * C, fcb = fcw + L * 4 * C * C, fcprojw = fcb + L * 4 * C,
                fcprojb = fcprojw + L * C * 4 * C, lnfw = fcprojb + L * C, lnfb = lnfw + C;
  EXPECT_EQ(lnfb + C, n);
  auto at = [&](int64_t off) { return all[static_cast<size_t>(off)]; };
  auto param = [&](const std::string& name, int64_t i) { return w.tensors.at(name)[static_cast<size_t>(i)]; };
  EXPECT_EQ(at(wte + 5), param("transformer.wte.weight", 5));
  EXPECT_EQ(at(wpe + 3), param("transformer.wpe.weight", 3));
  EXPECT_EQ(at(ln1w + C + 1), param("transformer.h.1.ln_1.weight", 1));
  EXPECT_EQ(at(ln1b + 2), param("transformer.h.0.ln_1.bias", 2));
  // Row 17, column 3 of layer 1's qkv weight ([3C, C], [out, in]).
  EXPECT_EQ(at(qkvw + 3 * C * C + 17 * C + 3), param("transformer.h.1.attn.c_attn.weight", 17 * C + 3));
  EXPECT_EQ(at(qkvb + 3 * C + 20), param("transformer.h.1.attn.c_attn.bias", 20));
  EXPECT_EQ(at(attprojw + 9), param("transformer.h.0.attn.c_proj.weight", 9));
  EXPECT_EQ(at(attprojb + C), param("transformer.h.1.attn.c_proj.bias", 0));
  EXPECT_EQ(at(ln2w + 4), param("transformer.h.0.ln_2.weight", 4));
  EXPECT_EQ(at(ln2b + C + 4), param("transformer.h.1.ln_2.bias", 4));
  EXPECT_EQ(at(fcw + 4 * C * C + 100), param("transformer.h.1.mlp.c_fc.weight", 100));
  EXPECT_EQ(at(fcb + 31), param("transformer.h.0.mlp.c_fc.bias", 31));
  EXPECT_EQ(at(fcprojw + C * 4 * C + 5 * 4 * C + 30), param("transformer.h.1.mlp.c_proj.weight", 5 * 4 * C + 30));
  EXPECT_EQ(at(fcprojb + C + 7), param("transformer.h.1.mlp.c_proj.bias", 7));
  EXPECT_EQ(at(lnfw + 6), param("transformer.ln_f.weight", 6));
  EXPECT_EQ(at(lnfb + 7), param("transformer.ln_f.bias", 7));
}

TEST(GPT2Formats, LlmcBf16AndOldVersion) {
  TempDir tmp;
  const GPT2Config c = tiny_config();
  const GPT2Weights w = random_weights(c, 2);
  save_llmc(tmp.path() / "bf16.bin", w, DType::BF16);
  EXPECT_EQ(fs::file_size(tmp.path() / "bf16.bin"),
            static_cast<uintmax_t>(1024 + 2 * (c.num_parameters() + 14 * 8)));
  const GPT2Weights b = load_llmc(tmp.path() / "bf16.bin");
  for (const auto& [name, t] : w.tensors)
    for (size_t i = 0; i < t.size(); ++i)
      ASSERT_EQ(b.tensors.at(name)[i], bf16_to_f32(f32_to_bf16(t[i]))) << name << " " << i;

  // Version 1 (no padded vocabulary in the file): padded here to a multiple of 128.
  {
    std::vector<int32_t> h(256, 0);
    h[0] = 20240326, h[1] = 1, h[2] = 16, h[3] = 50, h[4] = 2, h[5] = 2, h[6] = 8;
    std::ofstream out(tmp.path() / "v1.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(h.data()), 1024);
    const GPT2Weights wt = random_weights(c, 3);
    for (const char* nm : {"transformer.wte.weight"}) {
      out.write(reinterpret_cast<const char*>(wt.tensors.at(nm).data()), 50 * 8 * 4);
    }
    const std::vector<float> rest(static_cast<size_t>(c.num_parameters() - 50 * 8), 0.5f);
    out.write(reinterpret_cast<const char*>(rest.data()), static_cast<std::streamsize>(rest.size() * 4));
  }
  const GPT2Weights v1 = load_llmc(tmp.path() / "v1.bin");
  EXPECT_EQ(v1.config.padded_vocab_size, 128);
  EXPECT_EQ(v1.tensors.at("transformer.wte.weight").size(), 128u * 8);
  EXPECT_EQ(v1.tensors.at("transformer.wte.weight")[50 * 8], 0.f);
  EXPECT_EQ(v1.tensors.at("transformer.ln_f.bias")[7], 0.5f);
}

TEST(GPT2Formats, LlmcRejectsBadFiles) {
  TempDir tmp;
  const fs::path p = tmp.path() / "m.bin";
  save_llmc(p, random_weights(tiny_config()));
  auto expect_error = [&](const char* what) {
    try {
      load_llmc(p);
      FAIL() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  };
  fs::resize_file(p, fs::file_size(p) - 4);
  expect_error("truncated");
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t v = 7;
    f.seekp(4);
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  expect_error("version 7");
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t v = 1234;
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  expect_error("magic");
  EXPECT_THROW(load_llmc(tmp.path() / "missing.bin"), Error);
  GPT2Weights bad = random_weights(tiny_config());
  bad.tensors["transformer.h.1.ln_2.bias"].pop_back();
  EXPECT_THROW(save_llmc(p, bad), Error);
}

// Found by fuzz/llmc_fuzz.cpp (fuzz/regressions/llmc/): a 1024-byte header claiming a
// 50-billion-parameter model is refused by the file's size before any weight is allocated.
TEST(GPT2Formats, LlmcHugeHeaderRefusedBeforeAllocation) {
  TempDir tmp;
  const fs::path p = tmp.path() / "huge.bin";
  std::array<int32_t, 256> h{};
  h[0] = 20240326;
  h[1] = 3;
  h[2] = 1024, h[3] = 50257, h[4] = 1000, h[5] = 64, h[6] = 65536, h[7] = 50304;
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(h.data()), sizeof(h));
  try {
    load_llmc(p);
    FAIL() << "no error for a huge header";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1024 bytes, but an llm.c checkpoint"), std::string::npos)
        << e.what();
  }
}

TEST(GPT2Formats, HfRoundTripTransposesAndPadding) {
  TempDir tmp;
  const GPT2Config c = tiny_config();
  const GPT2Weights w = random_weights(c, 4);
  const fs::path p = tmp.path() / "model.safetensors";
  save_hf_safetensors(p, w);
  expect_same(load_hf_safetensors(p), w);

  const safetensors::Reader r(p.string());
  EXPECT_FALSE(r.contains("transformer.wte.weight"));
  EXPECT_EQ(r.info("wte.weight").shape, (std::vector<int64_t>{50, 8}));  // padding stripped
  EXPECT_EQ(r.info("wpe.weight").shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(r.info("h.1.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(r.info("h.1.attn.c_attn.bias").shape, (std::vector<int64_t>{24}));
  EXPECT_EQ(r.info("h.0.mlp.c_fc.weight").shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(r.info("h.0.mlp.c_proj.weight").shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(r.metadata("n_head"), "2");
  EXPECT_EQ(r.metadata("format"), "pt");
  EXPECT_EQ(r.tensors().size(), 2u + 12u * 2u + 2u);
  // HF [in, out][i][o] == kiln [out, in][o][i].
  const auto attn = r.read_f32("h.1.attn.c_attn.weight");
  const auto& k_attn = w.tensors.at("transformer.h.1.attn.c_attn.weight");
  for (int i = 0; i < 8; ++i)
    for (int o = 0; o < 24; ++o) ASSERT_EQ(attn[i * 24 + o], k_attn[o * 8 + i]);
  const auto proj = r.read_f32("h.0.mlp.c_proj.weight");
  const auto& k_proj = w.tensors.at("transformer.h.0.mlp.c_proj.weight");
  for (int i = 0; i < 32; ++i)
    for (int o = 0; o < 8; ++o) ASSERT_EQ(proj[i * 8 + o], k_proj[o * 32 + i]);
  const auto aproj = r.read_f32("h.0.attn.c_proj.weight");
  EXPECT_EQ(aproj[1 * 8 + 2], w.tensors.at("transformer.h.0.attn.c_proj.weight")[2 * 8 + 1]);
  const auto wte = r.read_f32("wte.weight");
  EXPECT_TRUE(std::equal(wte.begin(), wte.end(), w.tensors.at("transformer.wte.weight").begin()));
}

// Rewrites an HF file as GPT2LMHeadModel would: "transformer." prefix, attention-mask
// buffers, a tied lm_head, fp16 storage, no kiln metadata.
void write_lm_head_variant(const fs::path& src, const fs::path& dst, bool tie, bool extra,
                           bool metadata) {
  const safetensors::Reader r(src.string());
  safetensors::Writer w(dst.string());
  if (metadata) w.set_metadata("n_head", "4");
  for (const auto& t : r.tensors()) {
    const auto v = r.read_f32(t.name);
    std::vector<uint16_t> h(v.size());
    convert(v.data(), DType::F32, h.data(), DType::F16, v.size());
    w.add("transformer." + t.name, safetensors::StDType::F16, t.shape, h.data(), h.size() * 2);
  }
  for (int l = 0; l < 2; ++l) {
    const std::vector<float> mask(16 * 16, 1.f);
    w.add_f32(fmt::format("transformer.h.{}.attn.bias", l), {1, 1, 16, 16}, mask);
    w.add_f32(fmt::format("transformer.h.{}.attn.masked_bias", l), {}, {-1e4f});
  }
  auto head = r.read_f32("wte.weight");
  if (!tie) head[3] += 1.f;
  std::vector<uint16_t> hh(head.size());
  convert(head.data(), DType::F32, hh.data(), DType::F16, head.size());
  w.add("lm_head.weight", safetensors::StDType::F16, {50, 8}, hh.data(), hh.size() * 2);
  if (extra) w.add_f32("transformer.h.0.attn.rotary", {2}, {1.f, 2.f});
  w.write();
}

TEST(GPT2Formats, HfLmHeadModelVariant) {
  TempDir tmp;
  GPT2Config c = tiny_config();
  c.padded_vocab_size = GPT2Config::pad_vocab(c.vocab_size);  // no metadata says otherwise
  GPT2Weights w = random_weights(c, 5);
  // Values exact in fp16.
  for (auto& [name, t] : w.tensors)
    for (auto& x : t) x = f16_to_f32(f32_to_f16(x));
  const fs::path base = tmp.path() / "base.safetensors";
  save_hf_safetensors(base, w);
  const fs::path lm = tmp.path() / "lm.safetensors";
  write_lm_head_variant(base, lm, true, false, false);
  // n_embd 8 is not a multiple of 64 and there is no n_head metadata: the caller must say.
  EXPECT_THROW(load_hf_safetensors(lm), Error);
  const GPT2Weights got = load_hf_safetensors(lm, 2);
  expect_same(got, w);

  write_lm_head_variant(base, lm, true, false, true);
  EXPECT_EQ(load_hf_safetensors(lm, 2).config.n_head, 4);  // metadata wins

  write_lm_head_variant(base, lm, false, false, false);
  try {
    load_hf_safetensors(lm, 2);
    FAIL() << "untied head accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
  write_lm_head_variant(base, lm, true, true, false);
  try {
    load_hf_safetensors(lm, 2);
    FAIL() << "unexpected tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn.rotary"), std::string::npos) << e.what();
  }
}

TEST(GPT2Formats, HfDefaultsAndShapeErrors) {
  TempDir tmp;
  GPT2Config c = tiny_config();
  c.n_embd = 128;
  c.n_head = 4;
  const GPT2Weights w = random_weights(c, 6);
  const fs::path p = tmp.path() / "m.safetensors";
  {  // no metadata: n_head = n_embd / 64, padded vocab = pad_vocab(V)
    safetensors::Writer wr(p.string());
    save_hf_safetensors(tmp.path() / "full.safetensors", w);
    const safetensors::Reader r((tmp.path() / "full.safetensors").string());
    for (const auto& t : r.tensors()) wr.add_f32(t.name, t.shape, r.read_f32(t.name));
    wr.write();
  }
  const GPT2Weights got = load_hf_safetensors(p);
  EXPECT_EQ(got.config.n_head, 2);
  EXPECT_EQ(got.config.padded_vocab_size, 128);
  EXPECT_EQ(got.config.n_layer, 2);
  EXPECT_EQ(got.config.block_size, 16);
  EXPECT_EQ(got.tensors.at("transformer.wte.weight").size(), 128u * 128);
  EXPECT_EQ(load_hf_safetensors(p, 8).config.n_head, 8);

  {  // a Conv1D weight stored [out, in] (not transposed) is rejected, naming it
    const safetensors::Reader r(p.string());
    safetensors::Writer wr(p.string() + ".bad");
    for (const auto& t : r.tensors()) {
      auto shape = t.shape;
      if (t.name == "h.1.mlp.c_fc.weight") std::swap(shape[0], shape[1]);
      wr.add_f32(t.name, shape, r.read_f32(t.name));
    }
    wr.write();
  }
  try {
    load_hf_safetensors(p.string() + ".bad");
    FAIL() << "bad shape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.1.mlp.c_fc.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
