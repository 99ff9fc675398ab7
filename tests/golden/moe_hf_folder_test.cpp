// Hugging Face folders of the two mixture-of-experts layouts (src/models/llama/moe_formats.h)
// and of dense Qwen3 (src/models/llama/formats.h) against the hand-written folders of
// tests/golden/moe_hf (make_moe_hf_folders.py): a Mixtral in F32, a Qwen3-MoE in BF16,
// sharded, with dense blocks, and a dense Qwen3 in BF16, both with QK-norm and a head_dim
// that is not hidden_size / heads. Their config.json mapped to the [model] keys, every
// tensor read to its kiln name and offset (against the generator's own stacking and against
// the folder's tensors by hand), the export's bytes and config.json equal to the folder's,
// the errors; and the model's round trip HF -> kiln -> HF.
#include "backend/registry.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors_folder.h"
#include "config/components.h"
#include "config/config.h"
#include "core/error.h"
#include "golden_compare.h"
#include "models/hf_formats.h"
#include "models/llama_config.h"
#include "models/llama/formats.h"
#include "models/llama/moe_formats.h"
#include "models/registry.h"
#include "support/error_of.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <map>
#include <random>
#include <set>

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using Json = nlohmann::json;

Json config_of(const std::string& name) {
  return Json::parse(checkpoint::detail::read_file(golden::golden_path("moe_hf/" + name + "/config.json")));
}
fs::path folder_of(const std::string& name) { return golden::golden_path("moe_hf/" + name); }

// The folder's model (its config.json read as a model.init_from does).
LlamaConfig config_of_folder(const std::string& name) {
  return llama_config_of(hf_folder_options(folder_of(name)));
}

// The MoE shape of config.json `cfg` of `name`'s type, for a model of its blocks.
LlamaConfig moe_of(const Json& cfg, const std::string& name) {
  LlamaConfig c;
  c.n_layer = cfg["num_hidden_layers"];
  read_moe_hf_config(c, cfg, name + "/config.json", cfg["model_type"]);
  return c;
}

HfLayout layout_of(const std::string& name) { return llama_hf_layout_of(config_of_folder(name)); }

// `stmt` throws a one-line kiln::Error holding `part`.
#define EXPECT_ERROR(stmt, part)                                                       \
  do {                                                                                 \
    const std::string e_ = testing::error_of([&] { stmt; });                           \
    EXPECT_NE(e_.find(part), std::string::npos) << "'" << e_ << "' lacks '" << (part) << "'"; \
    EXPECT_EQ(e_.find('\n'), std::string::npos) << "one line: " << e_;                \
  } while (0)

TEST(MoeHfFolders, ConfigJsonGivesTheKeys) {
  LlamaMoeConfig mixtral;
  mixtral.num_experts = 4, mixtral.top_k = 2, mixtral.ffn_hidden_size = 6;
  mixtral.aux_loss_coef = 0.02, mixtral.aux_loss_type = "hf";
  const LlamaConfig m = config_of_folder("mixtral");
  EXPECT_EQ(m.moe, mixtral);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(llama_hf_kind(m), LlamaHfKind::Mixtral);

  LlamaMoeConfig qwen;
  qwen.num_experts = 3, qwen.top_k = 2, qwen.ffn_hidden_size = 5, qwen.norm_topk_prob = true;
  qwen.sparse_step = 2, qwen.dense_layers = {3};
  qwen.aux_loss_coef = 0.001, qwen.aux_loss_type = "hf";
  const LlamaConfig q = config_of_folder("qwen3_moe");
  EXPECT_EQ(q.moe, qwen);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.head_dim(), 6);
  EXPECT_EQ(llama_hf_kind(q), LlamaHfKind::Qwen3Moe);
  std::vector<int> moe_blocks;
  for (int l = 0; l < q.n_layer; ++l)
    if (q.is_moe_block(l)) moe_blocks.push_back(l);
  EXPECT_EQ(moe_blocks, (std::vector<int>{1, 5}));

  // transformers' defaults for what a config.json leaves out: Qwen3MoeConfig's
  // norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers [], router_aux_loss_coef
  // 0.001, head_dim hidden_size / heads.
  Json c = config_of("qwen3_moe");
  for (const char* key : {"norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                          "router_aux_loss_coef", "head_dim"})
    c.erase(key);
  const LlamaMoeConfig d = moe_of(c, "qwen3_moe").moe;
  EXPECT_FALSE(d.norm_topk_prob);
  EXPECT_EQ(d.sparse_step, 1);
  EXPECT_TRUE(d.dense_layers.empty());
  EXPECT_EQ(d.aux_loss_coef, 0.001);
  EXPECT_EQ(llama_config_of(llama_options_from_hf(c, "config.json")).explicit_head_dim, 0);
}

// Every kiln parameter of the layout read from the folder equals the generator's stacking
// (moe_hf/<name>_kiln.safetensors), whole and in random ranges (a rank's ZeRO-3 slice
// crossing experts and pieces).
TEST(MoeHfFolders, EveryTensorLandsAtItsKilnNameAndOffset) {
  for (const std::string name : {"mixtral", "qwen3_moe", "qwen3"}) {
    SCOPED_TRACE(name);
    const HfLayout layout = layout_of(name);
    const HfFolderReader r(folder_of(name), layout);
    const st::Reader want(golden::golden_path("moe_hf/" + name + "_kiln.safetensors"));
    std::set<std::string> names;
    std::mt19937 rng(5);
    for (const HfParam& p : layout.params) {
      names.insert(p.name);
      ASSERT_TRUE(want.contains(p.name)) << p.name;
      const auto& stored = want.info(p.name).shape;
      EXPECT_EQ(Shape(stored.begin(), stored.end()), p.shape) << p.name;
      const std::vector<float> values = want.read_f32(p.name);
      std::vector<float> got(values.size());
      r.read(p.name, 0, p.shape.numel(), got.data());
      EXPECT_EQ(got, values) << p.name;
      for (int i = 0; i < 4; ++i) {
        const int64_t a = static_cast<int64_t>(rng() % values.size());
        const int64_t b = a + static_cast<int64_t>(rng() % (values.size() - a + 1));
        std::vector<float> part(static_cast<size_t>(b - a));
        r.read(p.name, a, b, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), values.begin() + a))
            << p.name << " [" << a << ", " << b << ")";
      }
    }
    const auto stored = want.names();
    EXPECT_EQ(names, std::set<std::string>(stored.begin(), stored.end()));
  }
}

// The experts by hand: expert e's gate / up / down of MoE block l at their offsets in
// kiln's stacked [E, 2F, C] and [E, C, F], the router as is.
TEST(MoeHfFolders, ExpertsStackAsTheDesignSays) {
  for (const std::string name : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(name);
    const Json c = config_of(name);
    const LlamaConfig k = config_of_folder(name);
    const HfFolderReader r(folder_of(name), layout_of(name));
    const st::FolderReader f(folder_of(name));
    const bool mixtral = name == "mixtral";
    const int64_t E = k.moe.num_experts, F = k.moe.ffn_hidden_size, C = c["hidden_size"];
    int moe_blocks = 0;
    for (int l = 0; l < c["num_hidden_layers"].get<int>(); ++l) {
      if (!k.is_moe_block(l)) continue;
      ++moe_blocks;
      const std::string p = fmt::format("model.layers.{}.", l);
      const std::string hf = p + (mixtral ? "block_sparse_moe." : "mlp.");
      std::vector<float> gate_up(static_cast<size_t>(E * 2 * F * C)), down(static_cast<size_t>(E * C * F)),
          router(static_cast<size_t>(E * C));
      r.read(p + "mlp.experts.gate_up_proj.weight", 0, E * 2 * F * C, gate_up.data());
      r.read(p + "mlp.experts.down_proj.weight", 0, E * C * F, down.data());
      r.read(p + "mlp.router.weight", 0, E * C, router.data());
      EXPECT_EQ(router, f.file_of(hf + "gate.weight").read_f32(hf + "gate.weight"));
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = fmt::format("{}experts.{}.", hf, e);
        auto hf_tensor = [&](const char* m, const char* q) {
          const std::string n = x + (mixtral ? m : q);
          return f.file_of(n).read_f32(n);
        };
        const auto gate = hf_tensor("w1.weight", "gate_proj.weight");
        const auto up = hf_tensor("w3.weight", "up_proj.weight");
        const auto dn = hf_tensor("w2.weight", "down_proj.weight");
        for (int64_t i = 0; i < F; ++i)
          for (int64_t j = 0; j < C; ++j) {
            EXPECT_EQ(gate_up[(e * 2 * F + i) * C + j], gate[i * C + j]) << l << " " << e;
            EXPECT_EQ(gate_up[(e * 2 * F + F + i) * C + j], up[i * C + j]) << l << " " << e;
            EXPECT_EQ(down[(e * C + j) * F + i], dn[j * F + i]) << l << " " << e;
          }
      }
    }
    EXPECT_EQ(moe_blocks, 2);  // Mixtral's both, Qwen3-MoE's 1 and 5
  }
}

// Export: each folder tensor's bytes made from kiln's values (hf_piece_bytes, in the
// folder's dtype) are the folder's bytes.
TEST(MoeHfFolders, ExportWritesTheFoldersBytes) {
  for (const std::string name : {"mixtral", "qwen3_moe", "qwen3"}) {
    SCOPED_TRACE(name);
    const HfLayout layout = layout_of(name);
    const st::FolderReader f(folder_of(name));
    const st::Reader kiln(golden::golden_path("moe_hf/" + name + "_kiln.safetensors"));
    size_t pieces = 0;
    for (const HfParam& p : layout.params) {
      const std::vector<float> values = kiln.read_f32(p.name);
      int64_t row0 = 0;
      for (const HfPiece& piece : p.pieces) {
        const st::Reader& file = f.file_of(piece.name);
        const DType dtype = *st::to_kiln_dtype(file.info(piece.name).dtype);
        EXPECT_EQ(hf_piece_shape(p, piece), file.info(piece.name).shape) << piece.name;
        const std::vector<std::byte> want = file.read_bytes(piece.name);
        std::vector<std::byte> got(want.size());
        hf_piece_bytes(p, piece, row0, values, dtype, got.data());
        EXPECT_TRUE(got == want) << piece.name;
        row0 += piece.rows;
        ++pieces;
      }
    }
    EXPECT_EQ(pieces, f.names().size());
  }
}

// The MoE fields of the exported config.json are the folder's (the dense fields are
// llama_hf_config's, hf_folder_test).
TEST(MoeHfFolders, ExportConfigHoldsTheFoldersMoeFields) {
  for (const std::string name : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(name);
    const Json in = config_of(name);
    const LlamaConfig k = config_of_folder(name);
    const Json out = moe_hf_config(Json::object(), llama_hf_kind(k), k);
    std::vector<std::string> fields = {"architectures", "model_type", "intermediate_size",
                                       "num_experts_per_tok", "router_aux_loss_coef", "sliding_window"};
    if (name == "mixtral") {
      fields.push_back("num_local_experts");
      EXPECT_EQ(out["router_jitter_noise"], 0.0);
    } else {
      for (const char* key : {"moe_intermediate_size", "num_experts", "norm_topk_prob",
                              "decoder_sparse_step", "mlp_only_layers", "use_sliding_window", "head_dim"})
        fields.push_back(key);
    }
    for (const std::string& key : fields) EXPECT_EQ(out.value(key, Json()), in[key]) << key;
  }
}

TEST(MoeHfFolders, UnsupportedConfigsAreOneLineErrors) {
  auto read = [](const std::string& name, const std::function<void(Json&)>& edit) {
    Json c = config_of(name);
    edit(c);
    return [c, name] { llama_options_from_hf(c, name + "/config.json"); };
  };
  EXPECT_ERROR(read("mixtral", [](Json& c) { c["sliding_window"] = 4096; })(),
               "mixtral/config.json: sliding_window = 4096");
  EXPECT_ERROR(read("mixtral", [](Json& c) { c["router_jitter_noise"] = 0.01; })(),
               "router_jitter_noise = 0.01");
  EXPECT_ERROR(read("mixtral", [](Json& c) { c["num_experts_per_tok"] = 5; })(),
               "num_experts_per_tok = 5 must be between 1 and num_local_experts = 4");
  EXPECT_ERROR(read("mixtral", [](Json& c) { c.erase("num_local_experts"); })(),
               "no \"num_local_experts\"");
  EXPECT_ERROR(read("qwen3_moe", [](Json& c) { c["use_sliding_window"] = true; })(),
               "qwen3_moe/config.json: use_sliding_window = true");
  EXPECT_ERROR(read("qwen3_moe", [](Json& c) { c["mlp_only_layers"] = {1, 6}; })(),
               "mlp_only_layers holds 6: not a layer index 0..5");
  EXPECT_ERROR(read("qwen3_moe", [](Json& c) { c["decoder_sparse_step"] = 0; })(),
               "decoder_sparse_step = 0 must be positive");
  EXPECT_ERROR(read("qwen3_moe", [](Json& c) { c["moe_intermediate_size"] = 0; })(),
               "moe_intermediate_size = 0 must be positive");

  // What neither layout holds, by the [model] key.
  const LlamaConfig mixtral = config_of_folder("mixtral"), qwen = config_of_folder("qwen3_moe");
  auto kind = [](LlamaConfig k, const std::function<void(LlamaMoeConfig&)>& edit) {
    k.n_layer = 6;
    edit(k.moe);
    return [k] { llama_hf_kind(k); };
  };
  EXPECT_ERROR(kind(qwen, [](auto& k) { k.shared_experts = 1; })(), "model.moe.shared_experts = 1");
  EXPECT_ERROR(kind(mixtral, [](auto& k) { k.scoring = "sigmoid"; })(), "model.moe.scoring = 'sigmoid'");
  EXPECT_ERROR(kind(qwen, [](auto& k) { k.expert_bias = true; })(),
               "model.moe.expert_bias = true: neither Mixtral nor Qwen3-MoE folders hold an "
               "expert selection bias");
  EXPECT_ERROR(kind(mixtral, [](auto& k) { k.norm_topk_prob = false; })(),
               "model.moe.norm_topk_prob = false");
  EXPECT_ERROR(kind(mixtral, [](auto& k) { k.sparse_step = 2; })(),
               "model.moe.sparse_step: block 0 is dense");
  EXPECT_ERROR(kind(mixtral, [](auto& k) { k.first_k_dense = 1; })(), "model.moe.first_k_dense: block 0");
  EXPECT_ERROR(kind(mixtral, [](auto& k) { k.dense_layers = {4}; })(), "model.moe.dense_layers: block 4");
  // A dense model is a Llama, or with QK-norm a Qwen3 (DenseQwen3 below).
  LlamaConfig dense;
  EXPECT_EQ(llama_hf_kind(dense), LlamaHfKind::Llama);
  dense.qk_norm = true;
  EXPECT_EQ(llama_hf_kind(dense), LlamaHfKind::Qwen3);
  // Qwen3-MoE holds DeepSeek's first dense blocks as mlp_only_layers.
  LlamaConfig first = qwen;
  first.moe.first_k_dense = 2;
  EXPECT_EQ(moe_hf_config(Json::object(), LlamaHfKind::Qwen3Moe, first)["mlp_only_layers"],
            Json::array({3, 0, 1}));
}

// Dense Qwen3 (Qwen3ForCausalLM): Llama's shape keys with qk_norm and head_dim, no MoE key;
// Qwen3Config's defaults for what a config.json leaves out (head_dim 128, rms_norm_eps
// 1e-6, rope_theta 10000, untied; no layer_types before transformers 4.53).
TEST(DenseQwen3HfFolder, ConfigJsonGivesTheKeys) {
  const ModelOptions o = hf_folder_options(folder_of("qwen3"));
  EXPECT_EQ(o.arch, "llama");
  EXPECT_EQ(o.n_layer, 2);
  EXPECT_EQ(o.n_head, 2);
  EXPECT_EQ(o.n_embd, 8);
  EXPECT_EQ(o.vocab_size, 20);
  EXPECT_EQ(o.block_size, 64);
  const std::map<std::string, double, std::less<>> family = {
      {"n_kv_head", 1}, {"ffn_hidden_size", 12}, {"norm_eps", 1e-6}, {"rope_theta", 1e6},
      {"tie_embeddings", 0}, {"head_dim", 6}, {"qk_norm", 1}};
  EXPECT_EQ(o.family, family);
  EXPECT_TRUE(o.family_lists.empty());
  const LlamaConfig c = llama_config_of(o);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim(), 6);
  EXPECT_EQ(c.moe.num_experts, 0);
  EXPECT_EQ(llama_hf_kind(c), LlamaHfKind::Qwen3);

  Json d = config_of("qwen3");
  for (const char* key : {"head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                          "layer_types", "use_sliding_window", "sliding_window",
                          "max_window_layers", "attention_bias"})
    d.erase(key);
  const LlamaConfig k = llama_config_of(llama_options_from_hf(d, "qwen3/config.json"));
  EXPECT_EQ(k.explicit_head_dim, 128);
  EXPECT_EQ(k.norm_eps, 1e-6f);
  EXPECT_EQ(k.rope.theta, 10000.0);
  EXPECT_FALSE(k.tie_embeddings);
  EXPECT_TRUE(k.qk_norm);
  // A window that use_sliding_window false switches off (transformers then sets it null).
  d = config_of("qwen3");
  d["sliding_window"] = 4096, d["max_window_layers"] = 1;
  EXPECT_EQ(llama_options_from_hf(d, "qwen3/config.json").family, family);
}

// Export: a dense llama with qk_norm writes Qwen3Config's config.json, the folder's field for
// field (less what write_hf_folder adds: torch_dtype, the token ids; and the version); one
// without qk_norm a Llama's, as before.
TEST(DenseQwen3HfFolder, ExportConfigIsTheFolders) {
  Json want = config_of("qwen3");
  for (const char* key : {"transformers_version", "torch_dtype", "bos_token_id", "eos_token_id"})
    want.erase(key);
  ModelOptions o = hf_folder_options(folder_of("qwen3"));
  EXPECT_EQ(model_arch("llama").hf_config(o), want);
  o.family.erase("qk_norm");
  const Json llama = model_arch("llama").hf_config(o);
  EXPECT_EQ(llama["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(llama["model_type"], "llama");
  EXPECT_EQ(llama["mlp_bias"], false);
  for (const char* key : {"layer_types", "use_sliding_window", "max_window_layers"})
    EXPECT_FALSE(llama.contains(key)) << key;
}

TEST(DenseQwen3HfFolder, UnsupportedConfigsAreOneLineErrors) {
  auto read = [](const std::function<void(Json&)>& edit) {
    Json c = config_of("qwen3");
    edit(c);
    return [c] { llama_options_from_hf(c, "qwen3/config.json"); };
  };
  EXPECT_ERROR(read([](Json& c) { c["use_sliding_window"] = true; })(),
               "qwen3/config.json: use_sliding_window = true");
  EXPECT_ERROR(read([](Json& c) { c["attention_bias"] = true; })(),
               "qwen3/config.json: attention_bias = true");
  EXPECT_ERROR(read([](Json& c) { c["layer_types"][1] = "sliding_attention"; })(),
               "qwen3/config.json: layer_types[1] = \"sliding_attention\"");
  EXPECT_ERROR(read([](Json& c) { c["layer_types"] = {"full_attention"}; })(),
               "\"layer_types\" must be a list of num_hidden_layers = 2 entries");
  EXPECT_ERROR(read([](Json& c) { c["model_type"] = "qwen2"; })(),
               "qwen3/config.json: model_type = 'qwen2': kiln's llama reads llama, mixtral, qwen3, "
               "qwen3_moe");
  // Qwen3-MoE's attention is read by the same code.
  Json moe = config_of("qwen3_moe");
  moe["layer_types"] = Json::array();
  for (int l = 0; l < 6; ++l)
    moe["layer_types"].push_back(l < 5 ? "full_attention" : "sliding_attention");
  EXPECT_ERROR(llama_options_from_hf(moe, "qwen3_moe/config.json"),
               "qwen3_moe/config.json: layer_types[5] = \"sliding_attention\"");
}

struct TempDir {
  fs::path path = fs::temp_directory_path() /
                  fmt::format("kiln-moe-hf-test-{}-{}", ::getpid(), std::random_device{}());
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

// The config.json fields kiln reads from a folder of `type` (docs/formats.md).
std::vector<std::string> read_fields(const std::string& type) {
  std::vector<std::string> out = {"model_type", "hidden_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "vocab_size",
                                  "max_position_embeddings", "intermediate_size", "rms_norm_eps",
                                  "rope_theta", "tie_word_embeddings", "hidden_act",
                                  "num_experts_per_tok", "router_aux_loss_coef", "sliding_window"};
  const std::vector<std::string> more =
      type == "mixtral" ? std::vector<std::string>{"num_local_experts"}
      : type == "qwen3" ? std::vector<std::string>{"architectures", "head_dim",
                                                   "use_sliding_window", "layer_types",
                                                   "attention_bias", "rope_scaling"}
                        : std::vector<std::string>{"num_experts", "moe_intermediate_size",
                                                   "decoder_sparse_step", "mlp_only_layers",
                                                   "norm_topk_prob", "head_dim", "use_sliding_window",
                                                   "attention_bias", "rope_scaling"};
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

// HF -> kiln -> HF through the model: options from config.json, the model's parameters
// (names and shapes) against the layout, every tensor read, the folder exported again in
// its dtype: the same tensors bitwise, the same values of the fields kiln reads.
TEST(MoeHfFolders, ModelRoundTripsBitwise) {
  for (const std::string name : {"mixtral", "qwen3_moe", "qwen3"}) {
    SCOPED_TRACE(name);
    const ModelOptions o = hf_folder_options(folder_of(name));
    ASSERT_EQ(o.arch, "llama");
    const HfLayout layout = model_arch("llama").hf_layout(o);
    std::map<std::string, Shape> want;
    for (const HfParam& p : layout.params) want[p.name] = p.shape;
    auto backend = make_backend("cpu");
    std::map<std::string, Shape> got;
    const auto model = make_model(o, *backend);
    for (const ParamSpec& p : model->params()) got[p.name] = p.shape;
    EXPECT_EQ(got, want);
    const HfFolderReader r(folder_of(name), o);
    const st::Reader kiln(golden::golden_path("moe_hf/" + name + "_kiln.safetensors"));
    HostWeights w;
    for (const auto& [n, shape] : want) {
      auto& v = w[n];
      v.resize(static_cast<size_t>(shape.numel()));
      r.read(n, 0, shape.numel(), v.data());
      EXPECT_EQ(v, kiln.read_f32(n)) << n;
    }
    const Json in = config_of(name);
    const DType dtype = in["torch_dtype"] == "bfloat16" ? DType::BF16 : DType::F32;
    TempDir tmp;
    write_hf_folder(o, [&](const std::string& n) { return w.at(n); }, dtype, 8192, tmp.path / "out",
                    {}, {{"bos_token_id", in["bos_token_id"]}, {"eos_token_id", in["eos_token_id"]}});
    const st::FolderReader before(folder_of(name)), after(tmp.path / "out");
    const auto names = before.names(), written = after.names();
    EXPECT_EQ(std::set<std::string>(written.begin(), written.end()),
              std::set<std::string>(names.begin(), names.end()));
    for (const std::string& n : names)
      EXPECT_TRUE(after.file_of(n).read_bytes(n) == before.file_of(n).read_bytes(n)) << n;
    const Json out = Json::parse(checkpoint::detail::read_file(tmp.path / "out" / "config.json"));
    for (const std::string& key : read_fields(name))
      if (in.contains(key)) {
        EXPECT_EQ(out.value(key, Json()), in[key]) << key;
      }
    EXPECT_EQ(hf_folder_options(tmp.path / "out").family, o.family);
    EXPECT_EQ(hf_folder_options(tmp.path / "out").family_lists, o.family_lists);
  }
  // Qwen3-MoE's mlp_only_layers [3] is moe.dense_layers: of 6 blocks 1 and 5 are MoE.
  const ModelOptions q = hf_folder_options(folder_of("qwen3_moe"));
  EXPECT_EQ(q.family_lists.at("moe.dense_layers"), std::vector<int>{3});
  const LlamaConfig qc = llama_config_of(q);
  for (int l = 0; l < qc.n_layer; ++l) EXPECT_EQ(qc.is_moe_block(l), l == 1 || l == 5) << l;
}

// model.init_from = a MoE folder, [model] holding nothing else: the config takes the
// folder's shape (common keys, family keys and lists), and the model built from it has the
// folder's parameters.
TEST(MoeHfFolders, InitFromGivesTheFoldersShape) {
  for (const std::string name : {"mixtral", "qwen3_moe", "qwen3"}) {
    SCOPED_TRACE(name);
    const std::string dir = folder_of(name).string();
    const TrainConfig c = load_config_string(fmt::format("[model]\ninit_from = \"{}\"\n", dir));
    const ModelOptions want = hf_folder_options(dir), got = model_options_from(c);
    EXPECT_EQ(got.arch, "llama");
    EXPECT_EQ(got.n_layer, want.n_layer);
    EXPECT_EQ(got.n_head, want.n_head);
    EXPECT_EQ(got.n_embd, want.n_embd);
    EXPECT_EQ(got.vocab_size, want.vocab_size);
    EXPECT_EQ(got.block_size, want.block_size);
    for (const auto& [key, v] : want.family) EXPECT_EQ(got.family.at(key), v) << key;
    for (const auto& [key, v] : want.family_lists) EXPECT_EQ(got.family_lists.at(key), v) << key;
    EXPECT_EQ(llama_config_of(got).str(), llama_config_of(want).str());
    EXPECT_EQ(llama_config_of(got).moe, llama_config_of(want).moe);
    auto backend = make_backend("cpu");
    std::map<std::string, Shape> params, layout;
    const auto model = make_model(got, *backend);
    for (const ParamSpec& p : model->params()) params[p.name] = p.shape;
    for (const HfParam& p : model_arch("llama").hf_layout(want).params) layout[p.name] = p.shape;
    EXPECT_EQ(params, layout);
  }
  // An explicit list that differs from the folder's: one line naming both.
  const std::string dir = folder_of("qwen3_moe").string();
  EXPECT_ERROR(load_config_string(fmt::format("[model]\ninit_from = \"{}\"\n", dir),
                                  {"model.moe.dense_layers=2"}),
               "--set: key 'model.moe.dense_layers' is [2], but model.init_from's " + dir +
                   "/config.json gives [3]");
}

// The balancing keys are training hyper-parameters (ModelKey::training_only): a config's
// own values win over the folder's router_aux_loss_coef (and the folder's aux loss form),
// and its weights still load.
TEST(MoeHfFolders, InitFromKeepsTheConfigsBalancingKeys) {
  const std::string dir = folder_of("mixtral").string();  // router_aux_loss_coef 0.02, "hf"
  const TrainConfig c = load_config_string(
      fmt::format("[model]\ninit_from = \"{}\"\n", dir),
      {"model.moe.aux_loss_coef=0.01", "model.moe.aux_loss_type=per_layer",
       "model.moe.z_loss_coef=0.001"});
  const LlamaConfig got = llama_config_of(model_options_from(c));
  EXPECT_EQ(got.moe.aux_loss_coef, 0.01);
  EXPECT_EQ(got.moe.aux_loss_type, "per_layer");
  EXPECT_EQ(got.moe.z_loss_coef, 0.001);
  const HfFolderReader reader(dir, model_options_from(c));  // the folder holds this model
  std::vector<float> row(4);
  reader.read("model.embed_tokens.weight", 0, 4, row.data());
  // A shape key still has to agree.
  EXPECT_ERROR(load_config_string(fmt::format("[model]\ninit_from = \"{}\"\n", dir),
                                  {"model.moe.top_k=1"}),
               "key 'model.moe.top_k' is 1, but model.init_from's");
  // vocab_size = 0 ("from the data", as configs/demo-moe.toml has it) is no disagreement.
  const TrainConfig zero = load_config_string(
      fmt::format("[model]\ninit_from = \"{}\"\nvocab_size = 0\n", dir));
  EXPECT_EQ(zero.model.vocab_size, llama_config_of(model_options_from(c)).vocab_size);
  EXPECT_GT(zero.model.vocab_size, 0);
}

}  // namespace
}  // namespace kiln
