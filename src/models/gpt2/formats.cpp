#include "models/gpt2/formats.h"

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "models/hf_formats.h"
#include "core/error.h"

#include <array>
#include <cstring>
#include <fstream>
#include <set>

namespace kiln {

namespace fs = std::filesystem;

namespace {

// Per-layer parameter suffixes, in kiln's (and llm.c's) order.
constexpr std::array<const char*, 12> kLayerSuffixes = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};

std::string layer_name(int l, const char* suffix) {
  return fmt::format("transformer.h.{}.{}", l, suffix);
}

// Hugging Face's Conv1D weights, stored [in, out].
bool is_conv1d_weight(std::string_view suffix) {
  return suffix == "attn.c_attn.weight" || suffix == "attn.c_proj.weight" ||
         suffix == "mlp.c_fc.weight" || suffix == "mlp.c_proj.weight";
}

// The part after "transformer.h.<l>." of a block parameter's name; "" for other names.
std::string block_suffix(const std::string& name) {
  constexpr std::string_view kPrefix = "transformer.h.";
  if (!name.starts_with(kPrefix)) return "";
  const size_t dot = name.find('.', kPrefix.size());
  return dot == std::string::npos ? "" : name.substr(dot + 1);
}

// The [model] options of `c` (its shape; arch gpt2).
ModelOptions options_of(const GPT2Config& c) {
  ModelOptions o;
  o.n_layer = c.n_layer, o.n_head = c.n_head, o.n_embd = c.n_embd, o.block_size = c.block_size;
  o.vocab_size = c.vocab_size;
  return o;
}

const std::vector<float>& tensor_of(const GPT2Weights& w, const std::string& name) {
  auto it = w.tensors.find(name);
  KILN_CHECK(it != w.tensors.end(), "GPT-2 weights: missing tensor '{}'", name);
  return it->second;
}

int parse_int_metadata(const safetensors::Reader& r, const std::string& key) {
  const std::string& v = r.metadata(key);
  try {
    size_t pos = 0;
    const int x = std::stoi(v, &pos);
    if (pos == v.size()) return x;
  } catch (const std::exception&) {
  }
  KILN_FAIL("{}: metadata '{}' is '{}', not an integer", r.path(), key, v);
}

}  // namespace

GPT2Weights gpt2_zero_weights(const GPT2Config& config) {
  GPT2Weights w;
  w.config = config;
  for (const ParamSpec& p : gpt2_param_specs(config))
    w.tensors[p.name].assign(static_cast<size_t>(p.shape.numel()), 0.f);
  return w;
}

void check_gpt2_weights(const GPT2Weights& w) {
  const auto specs = gpt2_param_specs(w.config);
  std::set<std::string> known;
  for (const ParamSpec& p : specs) {
    known.insert(p.name);
    const auto& t = tensor_of(w, p.name);
    KILN_CHECK(static_cast<int64_t>(t.size()) == p.shape.numel(),
               "GPT-2 weights: tensor '{}' has {} values, shape {} needs {}", p.name, t.size(),
               p.shape.str(), p.shape.numel());
  }
  for (const auto& [name, t] : w.tensors)
    KILN_CHECK(known.count(name), "GPT-2 weights: unknown tensor '{}' for config {}", name,
               w.config.str());
}

// ---------------------------------------------------------------------------------------
// llm.c

namespace {
constexpr int32_t kLlmcMagic = 20240326;
constexpr int kLlmcHeaderInts = 256;

// The 16 llm.c tensors as lists of kiln tensor names (stacked over layers).
std::vector<std::vector<std::string>> llmc_groups(int n_layer) {
  std::vector<std::vector<std::string>> g;
  g.push_back({"transformer.wte.weight"});
  g.push_back({"transformer.wpe.weight"});
  for (const char* suffix : kLayerSuffixes) {
    std::vector<std::string> names;
    for (int l = 0; l < n_layer; ++l) names.push_back(layer_name(l, suffix));
    g.push_back(std::move(names));
  }
  g.push_back({"transformer.ln_f.weight"});
  g.push_back({"transformer.ln_f.bias"});
  return g;
}
}  // namespace

GPT2Weights load_llmc(const fs::path& path) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: cannot open llm.c checkpoint: {}", file, checkpoint::detail::errno_text());
  std::array<int32_t, kLlmcHeaderInts> h{};
  in.read(reinterpret_cast<char*>(h.data()), sizeof(h));
  KILN_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof(h)),
             "{}: too short for an llm.c checkpoint header (1024 bytes)", file);
  KILN_CHECK(h[0] == kLlmcMagic, "{}: bad magic {} (an llm.c model checkpoint has {})", file, h[0],
             kLlmcMagic);
  const int version = h[1];
  KILN_CHECK(version == 1 || version == 3 || version == 5,
             "{}: llm.c checkpoint version {} not supported (1 and 3: fp32, 5: bf16)", file, version);
  GPT2Config c;
  c.block_size = h[2];
  c.vocab_size = h[3];
  c.n_layer = h[4];
  c.n_head = h[5];
  c.n_embd = h[6];
  const int file_vp = version == 1 ? h[3] : h[7];
  c.padded_vocab_size = version == 1 ? GPT2Config::pad_vocab(c.vocab_size) : h[7];
  try {
    c.validate();
  } catch (const Error& e) {
    KILN_FAIL("{}: bad llm.c header: {}", file, e.what());
  }
  KILN_CHECK(file_vp >= c.vocab_size, "{}: padded vocab {} < vocab {}", file, file_vp, c.vocab_size);

  // The file's size is checked against the header before anything is allocated, so a
  // header claiming a huge model is refused by its size (128-bit: no int32 header overflows).
  const DType file_dtype = version == 5 ? DType::BF16 : DType::F32;
  const size_t es = dtype_size(file_dtype);
  const __int128 C = c.n_embd, L = c.n_layer;
  const __int128 params = (__int128{file_vp} + c.block_size) * C + L * (12 * C * C + 13 * C) + 2 * C;
  const __int128 expected = sizeof(h) + params * static_cast<__int128>(es);
  auto count = [](__int128 n) {
    return n <= INT64_MAX ? std::to_string(static_cast<int64_t>(n)) : std::string("over 2^63");
  };
  std::error_code ec;
  const uint64_t actual = fs::file_size(path, ec);
  KILN_CHECK(!ec && static_cast<__int128>(actual) == expected,
             "{}: {} bytes, but an llm.c checkpoint of this header ({} parameters, {}) has {}",
             file, actual, count(params), dtype_name(file_dtype), count(expected));

  GPT2Weights w = gpt2_zero_weights(c);
  int64_t total = 0;
  for (const auto& [name, t] : w.tensors) total += static_cast<int64_t>(t.size());
  total -= static_cast<int64_t>(c.padded_vocab_size - file_vp) * c.n_embd;
  KILN_CHECK(total == static_cast<int64_t>(params), "{}: {} parameters in the header's shapes, {} "
             "in its tensors", file, static_cast<int64_t>(params), total);

  std::vector<char> buf;
  for (const auto& group : llmc_groups(c.n_layer)) {
    for (const std::string& name : group) {
      std::vector<float>& t = w.tensors[name];
      size_t n = t.size();
      if (name == "transformer.wte.weight") n = static_cast<size_t>(file_vp) * c.n_embd;
      buf.resize(n * es);
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      KILN_CHECK(in.gcount() == static_cast<std::streamsize>(buf.size()),
                 "{}: truncated while reading '{}'", file, name);
      convert(buf.data(), file_dtype, t.data(), DType::F32, n);
    }
  }
  return w;
}

void save_llmc(const fs::path& path, const GPT2Weights& w, DType dtype) {
  check_gpt2_weights(w);
  KILN_CHECK(dtype == DType::F32 || dtype == DType::BF16,
             "{}: llm.c checkpoints are fp32 (version 3) or bf16 (version 5), not {}", path.string(),
             dtype_name(dtype));
  const GPT2Config& c = w.config;
  std::array<int32_t, kLlmcHeaderInts> h{};
  h[0] = kLlmcMagic;
  h[1] = dtype == DType::F32 ? 3 : 5;
  h[2] = c.block_size;
  h[3] = c.vocab_size;
  h[4] = c.n_layer;
  h[5] = c.n_head;
  h[6] = c.n_embd;
  h[7] = c.padded_vocab_size;
  std::vector<std::string_view> pieces;
  pieces.emplace_back(reinterpret_cast<const char*>(h.data()), sizeof(h));
  std::vector<std::vector<uint16_t>> converted;  // bf16 copies, alive until written
  for (const auto& group : llmc_groups(c.n_layer)) {
    for (const std::string& name : group) {
      const std::vector<float>& t = tensor_of(w, name);
      if (dtype == DType::F32) {
        pieces.emplace_back(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
      } else {
        converted.emplace_back(t.size());
        convert(t.data(), DType::F32, converted.back().data(), DType::BF16, t.size());
        pieces.emplace_back(reinterpret_cast<const char*>(converted.back().data()),
                            t.size() * sizeof(uint16_t));
      }
    }
  }
  checkpoint::detail::atomic_write_pieces(path, pieces);
}

// ---------------------------------------------------------------------------------------
// Hugging Face safetensors

GPT2Weights load_hf_safetensors(const fs::path& path, int default_n_head) {
  const safetensors::Reader r(path.string());
  const std::string& file = r.path();
  // Short (unprefixed) name -> name in the file.
  std::map<std::string, std::string> names;
  for (const auto& t : r.tensors()) {
    std::string s = t.name;
    if (s.starts_with("transformer.")) s = s.substr(12);
    KILN_CHECK(names.emplace(s, t.name).second, "{}: tensor '{}' present with and without the "
               "'transformer.' prefix", file, s);
  }
  auto shape_of = [&](const std::string& short_name) -> std::vector<int64_t> {
    auto it = names.find(short_name);
    KILN_CHECK(it != names.end(), "{}: no tensor '{}' (nor 'transformer.{}')", file, short_name,
               short_name);
    return r.info(it->second).shape;
  };
  const auto wte = shape_of("wte.weight");
  const auto wpe = shape_of("wpe.weight");
  KILN_CHECK(wte.size() == 2 && wpe.size() == 2 && wte[1] == wpe[1],
             "{}: wte {} and wpe {} are not [V, C] and [T, C]", file, r.info(names["wte.weight"]).shape_str(),
             r.info(names["wpe.weight"]).shape_str());
  GPT2Config c;
  c.vocab_size = static_cast<int>(wte[0]);
  c.n_embd = static_cast<int>(wte[1]);
  c.block_size = static_cast<int>(wpe[0]);
  c.n_layer = 0;
  while (names.count(fmt::format("h.{}.ln_1.weight", c.n_layer))) ++c.n_layer;
  KILN_CHECK(c.n_layer > 0, "{}: no transformer blocks (no 'h.0.ln_1.weight')", file);
  if (r.metadata().count("n_head")) {
    c.n_head = parse_int_metadata(r, "n_head");
  } else if (default_n_head > 0) {
    c.n_head = default_n_head;
  } else {
    KILN_CHECK(c.n_embd % 64 == 0, "{}: n_head is not in the metadata and n_embd {} is not a "
               "multiple of 64: pass the number of heads", file, c.n_embd);
    c.n_head = c.n_embd / 64;
  }
  c.padded_vocab_size = r.metadata().count("padded_vocab_size")
                            ? parse_int_metadata(r, "padded_vocab_size")
                            : GPT2Config::pad_vocab(c.vocab_size);
  try {
    c.validate();
  } catch (const Error& e) {
    KILN_FAIL("{}: inferred config {} is invalid: {}", file, c.str(), e.what());
  }

  // The tensors as a folder's (names, Conv1D transposes, the buffers ignored).
  const HfFolderReader reader(path, gpt2_hf_layout(options_of(c)));
  GPT2Weights w = gpt2_zero_weights(c);
  for (const ParamSpec& p : gpt2_param_specs(c)) {
    const bool wte_rows = p.name == "transformer.wte.weight";  // the padded rows stay zero
    reader.read(p.name, 0, wte_rows ? int64_t{c.vocab_size} * c.n_embd : p.shape.numel(),
                w.tensors[p.name].data());
  }
  // Without a config.json that says it is tied, a head must be wte itself.
  if (names.count("lm_head.weight")) {
    KILN_CHECK(r.info("lm_head.weight").shape == wte,
               "{}: lm_head.weight has shape {}, wte {}: kiln ties the output head to wte", file,
               r.info("lm_head.weight").shape_str(), r.info(names["wte.weight"]).shape_str());
    const std::vector<float> head = r.read_f32("lm_head.weight");
    const std::vector<float>& emb = w.tensors["transformer.wte.weight"];
    KILN_CHECK(std::equal(head.begin(), head.end(), emb.begin()),
               "{}: lm_head.weight differs from wte.weight: untied output heads are not supported",
               file);
  }
  return w;
}

void save_hf_safetensors(const fs::path& path, const GPT2Weights& w) {
  check_gpt2_weights(w);
  const GPT2Config& c = w.config;
  safetensors::Writer wr(path.string());
  wr.set_metadata("format", "pt");
  wr.set_metadata("n_head", std::to_string(c.n_head));
  wr.set_metadata("n_layer", std::to_string(c.n_layer));
  wr.set_metadata("n_embd", std::to_string(c.n_embd));
  wr.set_metadata("n_positions", std::to_string(c.block_size));
  wr.set_metadata("vocab_size", std::to_string(c.vocab_size));
  wr.set_metadata("padded_vocab_size", std::to_string(c.padded_vocab_size));
  // The folder's tensors (Conv1D transposes, wte's real rows), without the prefix.
  for (HfParam p : gpt2_hf_layout(options_of(c)).params) {
    if (p.name == "transformer.wte.weight") p.shape = Shape{c.padded_vocab_size, c.n_embd};
    const HfPiece& piece = p.pieces.front();
    const std::vector<float>& t = tensor_of(w, p.name);
    wr.add_produced(piece.name.substr(12), safetensors::StDType::F32, hf_piece_shape(p, piece),
                    [p, piece, &t](void* dst) { hf_piece_bytes(p, piece, 0, t, DType::F32, dst); });
  }
  wr.write();
}

// ---------------------------------------------------------------------------------------
// The registry's import and export

HostWeights gpt2_import_weights(const fs::path& path, const ModelOptions& expect_options) {
  KILN_CHECK(fs::exists(path), "model.init_from: {} does not exist", path.string());
  const GPT2Config expect = gpt2_config_of(expect_options);
  GPT2Weights w = path.extension() == ".safetensors" ? load_hf_safetensors(path, expect.n_head)
                                                     : load_llmc(path);
  const GPT2Config& got = w.config;
  // (A Hugging Face file does not record n_head: it was read with the config's.)
  KILN_CHECK(expect.n_layer == got.n_layer && expect.n_head == got.n_head &&
                 expect.n_embd == got.n_embd && expect.block_size == got.block_size &&
                 expect.vocab_size == got.vocab_size,
             "{}: holds a model with n_layer={} n_head={} n_embd={} block_size={} vocab_size={}, "
             "the config asks for n_layer={} n_head={} n_embd={} block_size={} vocab_size={}",
             path.string(), got.n_layer, got.n_head, got.n_embd, got.block_size, got.vocab_size,
             expect.n_layer, expect.n_head, expect.n_embd, expect.block_size, expect.vocab_size);
  // Vocabulary padding may differ between files (llm.c pads to 50304, Hugging Face not
  // at all): keep the real rows, pad with zero rows to this model's padded size.
  auto& wte = w.tensors.at("transformer.wte.weight");
  const auto want = static_cast<size_t>(expect.padded_vocab_size) * expect.n_embd;
  if (wte.size() != want) {
    std::vector<float> padded(want, 0.f);
    const auto rows = static_cast<size_t>(expect.vocab_size) * expect.n_embd;
    std::copy(wte.begin(), wte.begin() + static_cast<std::ptrdiff_t>(rows), padded.begin());
    wte.swap(padded);
  }
  return std::move(w.tensors);
}

void gpt2_export_weights(const nlohmann::json& config, const TensorSource& read,
                         const std::string& format, const fs::path& out) {
  KILN_CHECK(format == "llmc" || format == "safetensors",
             "export: unknown format '{}' (expected llmc or safetensors)", format);
  GPT2Weights w;
  w.config = gpt2_config_from_json(config);
  for (const ParamSpec& p : gpt2_param_specs(w.config)) w.tensors[p.name] = read(p.name);
  if (format == "llmc") {
    save_llmc(out, w);
  } else {
    save_hf_safetensors(out, w);
  }
}

// ---------------------------------------------------------------------------------------
// Hugging Face folders

ModelOptions gpt2_options_from_hf(const nlohmann::json& cfg, const std::string& file) {
  ModelOptions o;
  o.arch = "gpt2";
  o.n_embd = hf_int(cfg, "n_embd", file);
  o.n_layer = hf_int(cfg, "n_layer", file);
  o.n_head = hf_int(cfg, "n_head", file);
  o.vocab_size = hf_int(cfg, "vocab_size", file);
  o.block_size = hf_int(cfg, "n_positions", file);
  const std::string act = hf_string(cfg, "activation_function", file, "gelu_new");
  KILN_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
             "{}: activation_function = '{}': kiln's GPT-2 computes gelu_new (the tanh GELU)",
             file, act);
  const int inner = hf_int(cfg, "n_inner", file, 4 * o.n_embd);
  KILN_CHECK(inner == 4 * o.n_embd, "{}: n_inner = {}: kiln's GPT-2 MLP is 4 * n_embd = {} wide",
             file, inner, 4 * o.n_embd);
  const double eps = hf_double(cfg, "layer_norm_epsilon", file, 1e-5);
  KILN_CHECK(static_cast<float>(eps) == 1e-5f,
             "{}: layer_norm_epsilon = {}: kiln's GPT-2 LayerNorm epsilon is 1e-5", file, eps);
  KILN_CHECK(hf_bool(cfg, "tie_word_embeddings", file, true),
             "{}: tie_word_embeddings = false: kiln's GPT-2 ties its output head to wte", file);
  KILN_CHECK(hf_bool(cfg, "scale_attn_weights", file, true),
             "{}: scale_attn_weights = false: kiln scales attention by 1/sqrt(head size)", file);
  KILN_CHECK(!hf_bool(cfg, "scale_attn_by_inverse_layer_idx", file, false),
             "{}: scale_attn_by_inverse_layer_idx = true: not supported", file);
  try {
    gpt2_config_of(o).validate();
  } catch (const Error& e) {
    KILN_FAIL("{}: {}", file, e.what());
  }
  return o;
}

nlohmann::json gpt2_hf_config(const ModelOptions& options) {
  const GPT2Config c = gpt2_config_of(options);
  const double p = hf_float_value(c.dropout);
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.block_size},
          {"n_ctx", c.block_size},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", p},
          {"embd_pdrop", p},
          {"attn_pdrop", p},
          {"layer_norm_epsilon", hf_float_value(c.layernorm_eps)},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"use_cache", true}};
}

HfLayout gpt2_hf_layout(const ModelOptions& options) {
  const GPT2Config c = gpt2_config_of(options);
  HfLayout layout;
  for (const ParamSpec& p : gpt2_param_specs(c)) {
    const bool conv = is_conv1d_weight(block_suffix(p.name));
    const int64_t rows = p.name == "transformer.wte.weight" ? c.vocab_size : p.shape[0];
    layout.params.push_back({p.name, p.shape, {{p.name, rows, conv}}});
  }
  layout.optional_prefix = "transformer.";
  layout.ignored = [](const std::string& name) {
    return name == "lm_head.weight" ||  // tied: transformers ties it to wte as kiln does
           (name.starts_with("transformer.h.") &&
            (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")));
  };
  return layout;
}

}  // namespace kiln
