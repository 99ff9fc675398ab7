// Hugging Face model folders (models/hf_formats.h) for GPT-2 and Llama: the layouts against
// the models' parameters, bitwise round trips (fp32, bf16, one file and shards), the names
// and shapes transformers' GPT2LMHeadModel / LlamaForCausalLM hold, a folder in HF's own
// GPT-2 layout written here by hand, and one-line errors for corrupt or unsupported folders.
#include "models/hf_formats.h"

#include "backend/registry.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors_folder.h"
#include "core/error.h"
#include "models/registry.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <random>

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using Json = nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() /
           fmt::format("kiln-hf-test-{}-{}-{}", ::getpid(), n++, std::random_device{}());
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

ModelOptions gpt2_options() {
  ModelOptions o;
  o.arch = "gpt2";
  o.n_layer = 2, o.n_head = 2, o.n_embd = 8, o.block_size = 16, o.vocab_size = 50;
  return o;
}

ModelOptions llama_options(bool tied, int n_kv_head) {
  ModelOptions o;
  o.arch = "llama";
  o.n_layer = 2, o.n_head = 4, o.n_embd = 16, o.block_size = 32, o.vocab_size = 70;
  o.family = {{"n_kv_head", n_kv_head}, {"ffn_hidden_size", 24}, {"norm_eps", 1e-5f},
              {"rope_theta", 500000.0}, {"tie_embeddings", tied ? 1 : 0}};
  if (tied) o.family["rope_scaling.factor"] = 8.0, o.family["rope_scaling.original_max_position"] = 64.0;
  return o;
}

// Heads of 6 over n_embd 16 / 4 heads (config.json's head_dim: model.head_dim).
ModelOptions llama_wide_heads() {
  ModelOptions o = llama_options(false, 2);
  o.family["head_dim"] = 6;
  return o;
}

std::vector<ParamSpec> params_of(const ModelOptions& o) {
  auto backend = make_backend("cpu");
  return make_model(o, *backend)->params();
}

// Random values, the padded vocabulary rows zero; rounded to bf16 when asked (so that a
// bf16 folder holds them exactly).
HostWeights random_weights(const ModelOptions& o, bool bf16 = false, unsigned seed = 7) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  HostWeights w;
  for (const ParamSpec& p : params_of(o)) {
    auto& v = w[p.name];
    v.resize(static_cast<size_t>(p.shape.numel()));
    for (auto& x : v) x = bf16 ? bf16_to_f32(f32_to_bf16(nd(rng))) : nd(rng);
    const bool vocab = p.name.ends_with("wte.weight") || p.name.ends_with("embed_tokens.weight") ||
                       p.name == "lm_head.weight";
    if (vocab) std::fill(v.begin() + int64_t{o.vocab_size} * p.shape[1], v.end(), 0.f);
  }
  return w;
}

void write(const ModelOptions& o, const HostWeights& w, const fs::path& dir,
           DType dtype = DType::F32, uint64_t shard = 5'000'000'000) {
  write_hf_folder(o, [&](const std::string& n) { return w.at(n); }, dtype, shard, dir);
}

void expect_reads_back(const ModelOptions& o, const HostWeights& w, const fs::path& dir) {
  const HfFolderReader r(dir, o);
  std::mt19937 rng(3);
  for (const ParamSpec& p : params_of(o)) {
    const auto& want = w.at(p.name);
    std::vector<float> got(want.size());
    r.read(p.name, 0, p.shape.numel(), got.data());
    EXPECT_EQ(got, want) << p.name;
    // A rank's slice: any range reads the same elements.
    const int64_t a = static_cast<int64_t>(rng() % want.size());
    const int64_t b = a + static_cast<int64_t>(rng() % (want.size() - a + 1));
    std::vector<float> part(static_cast<size_t>(b - a));
    r.read(p.name, a, b, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + a)) << p.name << " [" << a
                                                                        << ", " << b << ")";
  }
}

// The message of the kiln::Error `f` throws (fails the test when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no kiln::Error";
  return "";
}

Json read_json(const fs::path& file) { return Json::parse(checkpoint::detail::read_file(file)); }
void write_json(const fs::path& file, const Json& j) {
  checkpoint::detail::atomic_write_file(file, j.dump(2));
}

// `dir`/model.safetensors rewritten: each tensor passed through `edit`, which may rename,
// reshape (by returning another shape) or drop it (returning false).
void rewrite_single(const fs::path& dir,
                    const std::function<bool(std::string&, std::vector<int64_t>&)>& edit) {
  const fs::path file = dir / st::kSingleFile;
  std::vector<std::pair<st::TensorInfo, std::vector<std::byte>>> tensors;
  {
    const st::Reader r(file.string());
    for (const auto& t : r.tensors()) tensors.emplace_back(t, r.read_bytes(t.name));
  }
  st::Writer w(file.string());
  for (auto& [t, bytes] : tensors) {
    std::string name = t.name;
    std::vector<int64_t> shape = t.shape;
    if (!edit(name, shape)) continue;
    if (shape != t.shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      bytes.resize(static_cast<size_t>(n) * st::st_dtype_size(t.dtype));
    }
    w.add(name, t.dtype, shape, bytes.data(), bytes.size());
  }
  w.write();
}

TEST(HfFolder, LayoutsMatchTheModels) {
  for (const ModelOptions& o : {gpt2_options(), llama_options(false, 2), llama_options(true, 4),
                                llama_wide_heads()}) {
    const auto params = params_of(o);
    const HfLayout layout = model_arch(o.arch).hf_layout(o);
    ASSERT_EQ(layout.params.size(), params.size()) << o.arch;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(layout.params[i].name, params[i].name);
      EXPECT_EQ(layout.params[i].shape, params[i].shape) << params[i].name;
    }
  }
}

TEST(HfFolder, RoundTripsBitwise) {
  for (const ModelOptions& o : {gpt2_options(), llama_options(false, 2), llama_options(true, 4),
                                llama_wide_heads()}) {
    SCOPED_TRACE(o.arch + (o.family.contains("tie_embeddings") && o.family.at("tie_embeddings") ? " tied" : ""));
    TempDir tmp;
    const HostWeights w = random_weights(o);
    write(o, w, tmp.path / "one");
    EXPECT_TRUE(fs::exists(tmp.path / "one" / "model.safetensors"));
    EXPECT_FALSE(fs::exists(tmp.path / "one" / "model.safetensors.index.json"));
    expect_reads_back(o, w, tmp.path / "one");
    // Shards of at most 2 KB: an index, several files, each within the limit.
    write(o, w, tmp.path / "sharded", DType::F32, 2048);
    const Json index = read_json(tmp.path / "sharded" / "model.safetensors.index.json");
    std::set<std::string> files;
    uint64_t total = 0;
    for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
    EXPECT_GT(files.size(), 2u);
    for (const std::string& f : files) {
      const st::Reader r((tmp.path / "sharded" / f).string());
      uint64_t bytes = 0;
      for (const auto& t : r.tensors()) bytes += t.nbytes();
      EXPECT_TRUE(bytes <= 2048 || r.tensors().size() == 1) << f;
      EXPECT_TRUE(f.find(fmt::format("-of-{:05d}.safetensors", files.size())) != std::string::npos) << f;
      total += bytes;
    }
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    expect_reads_back(o, w, tmp.path / "sharded");
    // bf16 values stay bf16: written as BF16, read back exactly.
    const HostWeights b = random_weights(o, /*bf16=*/true);
    write(o, b, tmp.path / "bf16", DType::BF16);
    EXPECT_EQ(read_json(tmp.path / "bf16" / "config.json")["torch_dtype"], "bfloat16");
    const st::FolderReader f(tmp.path / "bf16");
    for (const auto& name : f.names()) EXPECT_EQ(f.info(name).dtype, st::StDType::BF16) << name;
    expect_reads_back(o, b, tmp.path / "bf16");
    // Written again over itself: replaced whole.
    write(o, b, tmp.path / "bf16", DType::F32);
    expect_reads_back(o, b, tmp.path / "bf16");
    EXPECT_EQ(read_json(tmp.path / "bf16" / "config.json")["torch_dtype"], "float32");
  }
}

// An export reads each parameter once, however many folder tensors it is stacked from
// (Llama's q/k/v, gate/up; an MoE layer's 2E expert tensors).
TEST(HfFolder, ExportReadsEachParameterOnce) {
  const ModelOptions o = llama_options(false, 2);
  const HostWeights w = random_weights(o);
  std::map<std::string, int> reads;
  TempDir tmp;
  write_hf_folder(o, [&](const std::string& n) { ++reads[n]; return w.at(n); }, DType::F32, 2048,
                  tmp.path / "out");
  EXPECT_EQ(reads.size(), w.size());
  for (const auto& [name, n] : reads) EXPECT_EQ(n, 1) << name;
  expect_reads_back(o, w, tmp.path / "out");
}

// The names and shapes transformers' models hold (their state_dict, nn.Linear weights
// [out, in], GPT-2's Conv1D [in, out], the real vocabulary), listed here by hand.
TEST(HfFolder, NamesAndShapesAreTransformers) {
  using Spec = std::map<std::string, std::vector<int64_t>>;
  auto folder_specs = [](const fs::path& dir) {
    const st::FolderReader f(dir);
    Spec out;
    for (const auto& n : f.names()) out[n] = f.info(n).shape;
    return out;
  };
  TempDir tmp;
  ModelOptions l = llama_options(false, 2);
  l.n_layer = 1;
  write(l, random_weights(l), tmp.path / "llama");
  const std::string p = "model.layers.0.";
  EXPECT_EQ(folder_specs(tmp.path / "llama"),
            (Spec{{"model.embed_tokens.weight", {70, 16}}, {p + "input_layernorm.weight", {16}},
                  {p + "self_attn.q_proj.weight", {16, 16}}, {p + "self_attn.k_proj.weight", {8, 16}},
                  {p + "self_attn.v_proj.weight", {8, 16}}, {p + "self_attn.o_proj.weight", {16, 16}},
                  {p + "post_attention_layernorm.weight", {16}}, {p + "mlp.gate_proj.weight", {24, 16}},
                  {p + "mlp.up_proj.weight", {24, 16}}, {p + "mlp.down_proj.weight", {16, 24}},
                  {"model.norm.weight", {16}}, {"lm_head.weight", {70, 16}}}));
  const Json lc = read_json(tmp.path / "llama" / "config.json");
  EXPECT_EQ(lc["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(lc["model_type"], "llama");
  EXPECT_EQ(lc["num_key_value_heads"], 2);
  EXPECT_EQ(lc["intermediate_size"], 24);
  EXPECT_EQ(lc["head_dim"], 4);
  EXPECT_EQ(lc["rms_norm_eps"], 1e-5);
  EXPECT_EQ(lc["tie_word_embeddings"], false);
  EXPECT_TRUE(lc["rope_scaling"].is_null());
  EXPECT_TRUE(fs::exists(tmp.path / "llama" / "generation_config.json"));
  EXPECT_FALSE(hf_folder_options(tmp.path / "llama").family.contains("head_dim"));  // the default
  ModelOptions wide = llama_wide_heads();
  wide.n_layer = 1;
  write(wide, random_weights(wide), tmp.path / "wide");
  EXPECT_EQ(read_json(tmp.path / "wide" / "config.json")["head_dim"], 6);
  const Spec ws = folder_specs(tmp.path / "wide");
  EXPECT_EQ(ws.at(p + "self_attn.q_proj.weight"), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(ws.at(p + "self_attn.k_proj.weight"), (std::vector<int64_t>{12, 16}));
  EXPECT_EQ(ws.at(p + "self_attn.o_proj.weight"), (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(hf_folder_options(tmp.path / "wide").family.at("head_dim"), 6);

  ModelOptions g = gpt2_options();
  g.n_layer = 1;
  write(g, random_weights(g), tmp.path / "gpt2");
  const std::string h = "transformer.h.0.";
  EXPECT_EQ(folder_specs(tmp.path / "gpt2"),
            (Spec{{"transformer.wte.weight", {50, 8}}, {"transformer.wpe.weight", {16, 8}},
                  {h + "ln_1.weight", {8}}, {h + "ln_1.bias", {8}},
                  {h + "attn.c_attn.weight", {8, 24}}, {h + "attn.c_attn.bias", {24}},
                  {h + "attn.c_proj.weight", {8, 8}}, {h + "attn.c_proj.bias", {8}},
                  {h + "ln_2.weight", {8}}, {h + "ln_2.bias", {8}},
                  {h + "mlp.c_fc.weight", {8, 32}}, {h + "mlp.c_fc.bias", {32}},
                  {h + "mlp.c_proj.weight", {32, 8}}, {h + "mlp.c_proj.bias", {8}},
                  {"transformer.ln_f.weight", {8}}, {"transformer.ln_f.bias", {8}}}));
  const Json gc = read_json(tmp.path / "gpt2" / "config.json");
  EXPECT_EQ(gc["architectures"], Json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(gc["n_positions"], 16);
  EXPECT_EQ(gc["activation_function"], "gelu_new");
  EXPECT_EQ(gc["layer_norm_epsilon"], 1e-5);
}

// A GPT-2 folder as transformers' released "gpt2" files are: GPT2Model names without the
// "transformer." prefix, Conv1D weights [in, out], the attn.bias / attn.masked_bias
// buffers, config.json with HF's own fields. Written here without kiln's export.
TEST(HfFolder, ReadsHuggingFaceGPT2Layout) {
  const ModelOptions o = gpt2_options();
  const HostWeights w = random_weights(o);
  for (const bool prefixed : {false, true}) {
    TempDir tmp;
    write_json(tmp.path / "config.json",
               {{"activation_function", "gelu_new"}, {"architectures", {"GPT2LMHeadModel"}},
                {"attn_pdrop", 0.1}, {"bos_token_id", 49}, {"embd_pdrop", 0.1},
                {"eos_token_id", 49}, {"initializer_range", 0.02}, {"layer_norm_epsilon", 1e-05},
                {"model_type", "gpt2"}, {"n_ctx", 16}, {"n_embd", 8}, {"n_head", 2},
                {"n_layer", 2}, {"n_positions", 16}, {"resid_pdrop", 0.1},
                {"summary_type", "cls_index"}, {"vocab_size", 50}});
    st::Writer f((tmp.path / "model.safetensors").string());
    const std::string pre = prefixed ? "transformer." : "";
    for (const auto& [name, v] : w) {
      const std::string short_name = name.substr(12);  // "transformer." off
      const bool conv = short_name.ends_with("c_attn.weight") || short_name.ends_with("c_proj.weight") ||
                        short_name.ends_with("c_fc.weight");
      if (short_name == "wte.weight") {
        f.add_f32(pre + short_name, {50, 8}, std::vector<float>(v.begin(), v.begin() + 50 * 8));
        if (prefixed) f.add_f32("lm_head.weight", {50, 8}, std::vector<float>(v.begin(), v.begin() + 400));
      } else if (conv) {
        const int64_t out = short_name.ends_with("c_attn.weight") ? 24
                            : short_name.ends_with("c_fc.weight") ? 32 : 8;
        const int64_t in = static_cast<int64_t>(v.size()) / out;
        std::vector<float> t(v.size());
        for (int64_t i = 0; i < in; ++i)
          for (int64_t j = 0; j < out; ++j) t[i * out + j] = v[j * in + i];  // [in, out]
        f.add_f32(pre + short_name, {in, out}, t);
      } else {
        const std::vector<int64_t> shape = short_name == "wpe.weight"
                                               ? std::vector<int64_t>{16, 8}
                                               : std::vector<int64_t>{static_cast<int64_t>(v.size())};
        f.add_f32(pre + short_name, shape, v);
      }
    }
    for (int l = 0; l < 2; ++l) {
      f.add_f32(fmt::format("{}h.{}.attn.bias", pre, l), {1, 1, 16, 16}, std::vector<float>(256, 1.f));
      f.add_f32(fmt::format("{}h.{}.attn.masked_bias", pre, l), {}, {-1e4f});
    }
    f.write();
    EXPECT_EQ(hf_folder_options(tmp.path).n_embd, 8);
    expect_reads_back(o, w, tmp.path);
  }
}

TEST(HfFolder, CorruptOrUnsupportedFoldersAreOneLineErrors) {
  const ModelOptions o = llama_options(false, 2);
  const HostWeights w = random_weights(o);
  TempDir tmp;
  int n = 0;
  // A fresh good folder (sharded when `shard` is small) for each case.
  auto fresh = [&](uint64_t shard = 5'000'000'000) {
    const fs::path d = tmp.path / std::to_string(n++);
    write(o, w, d, DType::F32, shard);
    return d;
  };
  auto open = [&](const fs::path& d) { return [d, &o] { HfFolderReader r(d, o); }; };
  auto edit_config = [&](const fs::path& d, const std::function<void(Json&)>& f) {
    Json j = read_json(d / "config.json");
    f(j);
    write_json(d / "config.json", j);
  };
  auto expect_error = [&](const fs::path& d, const std::string& part) {
    const std::string e = error_of(open(d));
    EXPECT_NE(e.find(part), std::string::npos) << "'" << e << "' lacks '" << part << "'";
  };

  fs::path d = fresh();
  checkpoint::detail::atomic_write_file(d / "config.json", "{\"model_type\": \"llama\",");
  expect_error(d, "config.json: not valid JSON");
  d = fresh();
  edit_config(d, [](Json& j) { j["model_type"] = "mistral"; });
  expect_error(d, (d / "config.json").string() +
                      ": model_type = 'mistral': expected gpt2, llama, mixtral, qwen3 or "
                      "qwen3_moe");
  d = fresh();
  edit_config(d, [](Json& j) { j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; });
  expect_error(d, "rope_scaling.rope_type = 'linear': expected llama3");
  d = fresh();
  edit_config(d, [](Json& j) { j["attention_bias"] = true; });
  expect_error(d, "attention_bias = true");
  d = fresh();
  edit_config(d, [](Json& j) { j["mlp_bias"] = true; });
  expect_error(d, "mlp_bias = true");
  d = fresh();
  edit_config(d, [](Json& j) { j["hidden_act"] = "gelu"; });
  expect_error(d, "hidden_act = 'gelu'");
  d = fresh();
  edit_config(d, [](Json& j) { j["head_dim"] = 5; });
  expect_error(d, (d / "config.json").string() + ": model.head_dim (5) must be even");
  d = fresh();
  edit_config(d, [](Json& j) { j["head_dim"] = 8; });
  expect_error(d, "holds another model than the config asks for: head_dim = 8 (the folder) vs 4");
  d = fresh();
  edit_config(d, [](Json& j) { j["num_hidden_layers"] = 3; });
  expect_error(d, "holds another model than the config asks for: num_hidden_layers = 3 (the folder) vs 2");
  d = fresh();
  edit_config(d, [](Json& j) { j.erase("hidden_size"); });
  expect_error(d, "config.json: no \"hidden_size\"");
  d = fresh();
  edit_config(d, [](Json& j) { j["tie_word_embeddings"] = true; });  // lm_head.weight then unexpected
  expect_error(d, "tie_word_embeddings = true (the folder) vs false");

  d = fresh();
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 10);
  expect_error(d, (d / "model.safetensors").string());
  d = fresh();
  rewrite_single(d, [](std::string& name, std::vector<int64_t>& shape) {
    if (name == "model.layers.1.mlp.up_proj.weight") shape = {16, 16};
    return true;
  });
  expect_error(d, "tensor 'model.layers.1.mlp.up_proj.weight' has shape [16, 16], expected [24, 16]");
  d = fresh();
  rewrite_single(d, [](std::string& name, std::vector<int64_t>&) {
    return name != "model.layers.0.self_attn.k_proj.weight";
  });
  expect_error(d, "no tensor 'model.layers.0.self_attn.k_proj.weight'");
  d = fresh();
  rewrite_single(d, [](std::string& name, std::vector<int64_t>&) {
    if (name == "model.norm.weight") name = "model.final_norm.weight";
    return true;
  });
  expect_error(d, "unexpected tensor 'model.final_norm.weight'");

  d = fresh(4096);
  int removed = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().starts_with("model-00002-of-")) removed += fs::remove(e.path());
  ASSERT_EQ(removed, 1);
  expect_error(d, "shard 'model-00002-of-");
  d = fresh(4096);
  checkpoint::detail::atomic_write_file(d / "model.safetensors.index.json", "{\"weight_map\": [");
  expect_error(d, "model.safetensors.index.json: not valid JSON");
  d = fresh();
  fs::remove(d / "model.safetensors");
  expect_error(d, "no model.safetensors.index.json nor model.safetensors");

  // GPT-2 options kiln does not compute.
  const ModelOptions g = gpt2_options();
  for (const auto& [key, value, part] :
       std::vector<std::tuple<std::string, Json, std::string>>{
           {"tie_word_embeddings", false, "tie_word_embeddings = false"},
           {"activation_function", "relu", "activation_function = 'relu'"},
           {"n_inner", 64, "n_inner = 64"},
           {"layer_norm_epsilon", 1e-6, "layer_norm_epsilon = 1e-06"}}) {
    d = tmp.path / std::to_string(n++);
    write(g, random_weights(g), d);
    edit_config(d, [&](Json& j) { j[key] = value; });
    const std::string e = error_of([&] { HfFolderReader r(d, g); });
    EXPECT_NE(e.find(part), std::string::npos) << e;
  }
  // Not a folder to replace: an export refuses to write over other files.
  d = tmp.path / "other";
  fs::create_directories(d);
  checkpoint::detail::atomic_write_file(d / "notes.txt", "mine");
  EXPECT_NE(error_of([&] { write(o, w, d); }).find("holds 'notes.txt', which is not a model folder"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(d / "notes.txt"));
  // Not even a model folder holding a user's own file (a re-export would delete it)...
  write(o, w, d = tmp.path / "model");
  checkpoint::detail::atomic_write_file(d / "README.md", "mine");
  EXPECT_NE(error_of([&] { write(o, w, d); }).find("holds 'README.md'"), std::string::npos);
  EXPECT_TRUE(fs::exists(d / "README.md"));
  // ... while a folder of only a model's files is replaced.
  fs::remove(d / "README.md");
  write(o, w, d);
  EXPECT_TRUE(fs::exists(d / "config.json"));
  // An interrupted export's temporary folder (its process gone) is removed by the next
  // export; one of a live process (this one) is kept.
  const fs::path stale = d.string() + ".tmp.999999999.0", live = d.string() + ".tmp." +
                         std::to_string(::getpid()) + ".999";
  fs::create_directories(stale);
  fs::create_directories(live);
  write(o, w, d);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  fs::remove(live);
  // config.json integers beyond int are refused, not cut to 32 bits.
  edit_config(d, [&](Json& j) { j["hidden_size"] = int64_t{1} << 40; });
  EXPECT_NE(error_of([&] { HfFolderReader r(d, o); }).find("\"hidden_size\" = 1099511627776 is out of range"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
