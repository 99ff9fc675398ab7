#include "model_io/lora_io.h"

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/json_util.h"
#include "models/hf_formats.h"

#include <algorithm>
#include <set>

namespace kiln {

namespace fs = std::filesystem;
namespace st = safetensors;
namespace files = checkpoint::detail;  // the durable file primitives

namespace {

const nlohmann::json* lora_state(const checkpoint::CheckpointReader& reader) {
  return is_lora_checkpoint(reader) ? &reader.state().at("lora") : nullptr;
}

// A model of `options` with `plan`'s adapters, names and shapes only (no storage).
std::unique_ptr<Model> shapes_only(const ModelOptions& options, Backend& backend,
                                   const LoraPlan& plan) {
  ModelStorage storage;
  storage.allocate_params = storage.allocate_grads = false;
  storage.plans = {&plan};
  return make_model(options, backend, storage);
}

// The module of a Hugging Face weight tensor: its name without ".weight".
std::string module_of(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string(".weight").size());
}

std::string peft_tensor(const std::string& module, const char* which) {
  return "base_model.model." + module + "." + which + ".weight";
}

}  // namespace

bool is_lora_checkpoint(const checkpoint::CheckpointReader& reader) {
  const nlohmann::json& s = reader.state();
  return s.contains("lora") && !s.at("lora").is_null();
}

std::unique_ptr<LoraPlan> checkpoint_lora_plan(const checkpoint::CheckpointReader& reader) {
  const nlohmann::json* l = lora_state(reader);
  if (!l) return nullptr;
  const std::string where = (reader.dir() / "manifest.json").string() + ": state.lora";
  try {
    const nn::LoraSpec spec{json_integer_field(*l, "rank", where, 1, INT32_MAX),
                            l->at("alpha").get<float>(), l->at("rslora").get<bool>(), 0.f};
    return std::make_unique<LoraPlan>(
        LoraOptions{spec, l->at("targets").get<std::vector<std::string>>(), reader.dir().string()});
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: malformed ({})", where, e.what());
  }
}

void load_lora_base(const checkpoint::CheckpointReader& reader, Model& model,
                    const std::string& moved_to) {
  const std::string dir = reader.dir().string();
  const nlohmann::json base = lora_state(reader)->value("base", nlohmann::json::object());
  if (base.contains("seed")) {  // a random base: the model's own initial values
    KILN_CHECK(moved_to.empty(), "{}: its LoRA base is the random model of seed {} (no "
               "model.init_from): --lora-base does not apply", dir, base.at("seed").dump());
    model.init_weights(base.at("seed").get<uint64_t>());
    return;
  }
  const std::string path = moved_to.empty() ? base.value("path", "") : moved_to;
  KILN_CHECK(!path.empty() && fs::exists(path), "{}: its LoRA base '{}' does not exist: the "
             "adapters need the weights they were trained on{}", dir, path,
             moved_to.empty() ? " (moved? point --lora-base at them)" : "");
  const nlohmann::json now = weights_identity(path);
  KILN_CHECK(now.at("crc32") == base.value("crc32", ""), "{}: its adapters were trained on {} "
             "(crc32 {}), {} (crc32 {}: {})", dir, base.value("path", ""), base.value("crc32", ""),
             moved_to.empty() ? "whose weights have changed since"
                              : "and --lora-base " + moved_to + " holds other weights",
             now.at("crc32").get<std::string>(), weights_difference(base, now));
  std::vector<ParamSpec> specs;
  for (const ParamSpec& p : model.params())
    if (!p.adapter) specs.push_back(p);
  const auto source = open_model_weights(path, checkpoint_model_options(reader), specs);
  std::vector<float> buf;
  for (const ParamSpec& p : specs) {
    buf.resize(static_cast<size_t>(p.shape.numel()));
    source->read(p, 0, p.shape.numel(), buf.data());
    upload_f32(model.backend(), model.param(p), buf.data());
  }
}

CheckpointModel load_checkpoint_model(const checkpoint::CheckpointReader& reader,
                                      Backend& backend, bool use_ema,
                                      const std::string& lora_base) {
  CheckpointModel m;
  m.lora = checkpoint_lora_plan(reader);
  KILN_CHECK(m.lora || lora_base.empty(), "{}: holds no LoRA adapters: --lora-base applies to "
             "a LoRA checkpoint", reader.dir().string());
  ModelStorage storage;
  if (m.lora) storage.plans = {m.lora.get()};
  m.model = make_model(checkpoint_model_options(reader), backend, storage);
  load_model_weights(reader, *m.model, use_ema, lora_base);
  return m;
}

std::map<std::string, std::vector<std::string>> peft_modules(const ModelOptions& options,
                                                             const std::vector<LoraUnit>& units) {
  const ModelArch& arch = model_arch(options.arch);
  KILN_CHECK(static_cast<bool>(arch.hf_layout), "{} has no Hugging Face folders: its adapters "
             "have no PEFT names", options.arch);
  const HfLayout layout = arch.hf_layout(options);
  std::map<std::string, std::vector<std::string>> out;
  for (const LoraUnit& u : units) {
    const auto p = std::find_if(layout.params.begin(), layout.params.end(),
                                [&](const HfParam& h) { return h.name == u.linear + ".weight"; });
    KILN_CHECK(p != layout.params.end(), "{}: no Hugging Face tensor holds {}.weight", u.name, u.linear);
    // Experts: the rows of expert e start at e * O in the weight [E, O, in] seen as rows.
    const int64_t per_expert = u.experts > 0 ? p->shape[1] : 0;
    const int64_t pieces_each = u.experts > 0 ? static_cast<int64_t>(p->pieces.size()) / u.experts
                                              : static_cast<int64_t>(p->pieces.size());
    for (int64_t e = 0; e < std::max<int64_t>(u.experts, 1); ++e) {
      // The Hugging Face tensor of exactly the unit's rows.
      int64_t row = 0;
      const HfPiece* piece = nullptr;
      for (const HfPiece& h : p->pieces) {
        if (row == e * per_expert + u.row0 && h.rows == u.rows) piece = &h;
        row += h.rows;
      }
      KILN_CHECK(piece || pieces_each > 1, "LoRA adapter {}: its rows are part of Hugging "
                 "Face's one module {}, which PEFT adapts whole (train.lora.targets qkv or fc)",
                 u.name, p->pieces.empty() ? u.linear : p->pieces[0].name);
      KILN_CHECK(piece, "LoRA adapter {}: its rows are {} Hugging Face modules, which PEFT "
                 "adapts apart (train.lora.targets q, k, v or gate, up)", u.name, pieces_each);
      KILN_CHECK(piece->name.ends_with(".weight"), "{}: {} is not a module's weight", u.name,
                 piece->name);
      out[u.name].push_back(module_of(piece->name));
    }
  }
  return out;
}

namespace {

// PEFT's target_modules: the modules' last names ("q_proj") when every module of the model
// with such a name is adapted, else the full module names (PEFT matches a target by
// equality or as a dotted suffix).
nlohmann::json target_modules(const std::map<std::string, std::vector<std::string>>& modules,
                              const HfLayout& layout) {
  std::set<std::string> full, short_names;
  for (const auto& [unit, names] : modules)
    for (const std::string& module : names) {
      full.insert(module);
      short_names.insert(module.substr(module.rfind('.') + 1));
    }
  auto last = [](const std::string& m) { return m.substr(m.rfind('.') + 1); };
  bool every = true;
  for (const HfParam& p : layout.params)
    for (const HfPiece& h : p.pieces) {
      if (!h.name.ends_with(".weight")) continue;
      const std::string m = module_of(h.name);
      if (short_names.count(last(m)) && !full.count(m)) every = false;
    }
  const std::set<std::string>& names = every ? short_names : full;
  return nlohmann::json(std::vector<std::string>(names.begin(), names.end()));
}

// PEFT's fan_in_fan_out: whether the adapted modules store their weight [in, out] (GPT-2's
// Conv1D), for which PEFT sets it true (the adapters' own tensors are [r, in] and [out, r]
// either way; it decides how PEFT merges them).
bool fan_in_fan_out(const std::map<std::string, std::vector<std::string>>& modules,
                    const HfLayout& layout) {
  std::set<std::string> adapted;
  for (const auto& [unit, names] : modules)
    for (const std::string& m : names) adapted.insert(m + ".weight");
  for (const HfParam& p : layout.params)
    for (const HfPiece& h : p.pieces)
      if (h.transposed && adapted.count(h.name)) return true;
  return false;
}

// `dir`'s adapter_model.safetensors, after checking that `dir` is a folder.
fs::path checked(const fs::path& dir) {
  KILN_CHECK(fs::is_directory(dir), "train.lora.init_from: {} is not a folder (a PEFT adapter "
             "folder holds adapter_config.json and adapter_model.safetensors)", dir.string());
  return dir / "adapter_model.safetensors";
}

// The LoraConfig features kiln does not compute, refused rather than loaded as plain LoRA:
// DoRA, per-module ranks or alphas, trained biases, fully trained modules, a subset of
// layers, a regex target.
void refuse_unsupported(const nlohmann::json& c, const fs::path& file) {
  auto empty = [&](const char* key) {
    const nlohmann::json v = c.value(key, nlohmann::json());
    return v.is_null() || ((v.is_object() || v.is_array()) && v.empty());
  };
  for (const char* key : {"alpha_pattern", "rank_pattern", "modules_to_save",
                          "layers_to_transform", "layers_pattern", "layer_replication"})
    KILN_CHECK(empty(key), "{}: \"{}\" = {} is not supported (kiln's adapters share one rank and "
               "alpha and adapt the blocks' Linears only)", file.string(), key, c.at(key).dump());
  KILN_CHECK(!c.value("use_dora", false), "{}: \"use_dora\" = true: DoRA is not supported",
             file.string());
  KILN_CHECK(c.value("bias", "none") == "none", "{}: \"bias\" = \"{}\": trained biases are not "
             "supported (\"none\" only)", file.string(), c.value("bias", ""));
  if (c.contains("target_modules") && c.at("target_modules").is_string()) {
    const std::string t = c.at("target_modules").get<std::string>();
    KILN_CHECK(t != "all-linear", "{}: \"target_modules\" = \"all-linear\" (PEFT's keyword) is "
               "not supported: list the modules", file.string());
    KILN_FAIL("{}: a regex \"target_modules\" (\"{}\") is not supported (a list of module names)",
              file.string(), t);
  }
}

// A PEFT folder's adapters in kiln's names.
class PeftSource final : public WeightSource {
 public:
  PeftSource(const fs::path& dir, const ModelOptions& expect, const LoraPlan& plan,
             const nn::LoraSpec& spec)
      : reader_(checked(dir).string()) {
    const fs::path file = dir / "adapter_config.json";
    KILN_CHECK(fs::exists(file), "train.lora.init_from: {} does not exist (a PEFT adapter folder "
               "holds adapter_config.json and adapter_model.safetensors)", file.string());
    nlohmann::json c;
    try {
      c = nlohmann::json::parse(files::read_file(file));
      KILN_CHECK(c.value("peft_type", "") == "LORA", "{}: \"peft_type\" is {}, not \"LORA\"",
                 file.string(), c.value("peft_type", nlohmann::json()).dump());
      const double alpha = c.value("lora_alpha", 8.0);  // PEFT's default
      KILN_CHECK(c.at("r").get<int64_t>() == spec.rank && alpha == spec.alpha &&
                     c.value("use_rslora", false) == spec.rslora,
                 "{}: r = {}, lora_alpha = {}, use_rslora = {}; the config asks for "
                 "train.lora.rank = {}, alpha = {}, rslora = {}", file.string(), c.at("r").dump(),
                 alpha, c.value("use_rslora", false), spec.rank, spec.alpha, spec.rslora);
      refuse_unsupported(c, file);
    } catch (const nlohmann::json::exception& e) {
      KILN_FAIL("{}: malformed ({})", file.string(), e.what());
    }
    for (const auto& [unit, modules] : peft_modules(expect, plan.units()))
      for (const std::string& module : modules)
        for (const char* which : {"lora_A", "lora_B"}) {
          const std::string name = peft_tensor(module, which);
          KILN_CHECK(reader_.contains(name), "{}: no tensor '{}' (the adapter {} of the "
                     "config's train.lora.targets)", reader_.path(), name, unit);
          names_[unit + "." + which + ".weight"].push_back(name);
        }
    // Adapters the folder holds that train.lora.targets does not choose would be dropped.
    std::set<std::string> used;
    for (const auto& [kiln_name, peft_names] : names_) used.insert(peft_names.begin(), peft_names.end());
    const HfLayout layout = model_arch(expect.arch).hf_layout(expect);
    for (const st::TensorInfo& t : reader_.tensors())
      if (!used.count(t.name)) refuse_extra(t.name, layout);
  }
  // An expert adapter [E, ...] reads expert e's elements from the e-th tensor.
  void read(const ParamSpec& p, int64_t begin, int64_t end, float* dst) const override {
    const std::vector<std::string>& names = names_.at(p.name);
    const auto E = static_cast<int64_t>(names.size());
    Shape each = p.shape;
    if (p.shape.ndim() == 3) {  // an expert adapter [E, rows, cols]: [rows, cols] each
      each = Shape();
      for (int d = 1; d < p.shape.ndim(); ++d) each.push_back(p.shape[d]);
    }
    const int64_t n = each.numel();
    for (int64_t e = begin / n; e < E && e * n < end; ++e) {
      const std::string& name = names[static_cast<size_t>(e)];
      const std::vector<int64_t>& shape = reader_.info(name).shape;
      KILN_CHECK(Shape(shape.begin(), shape.end()) == each, "{}: tensor '{}' has shape {}, the "
                 "adapter {} is {}", reader_.path(), name, Shape(shape.begin(), shape.end()).str(),
                 p.name, each.str());
      const int64_t from = std::max(begin, e * n), to = std::min(end, (e + 1) * n);
      reader_.read_f32_range(name, from - e * n, to - e * n, dst + (from - begin));
    }
  }

 private:
  // Throws the reason an adapter tensor the targets do not choose cannot be read: a module
  // the model lacks (another shape: an expert past model.moe.num_experts), one kiln puts no
  // adapter on (the router, the embedding, the head), or one train.lora.targets leaves out.
  void refuse_extra(const std::string& tensor, const HfLayout& layout) const {
    std::string module = tensor.substr(0, tensor.rfind(".lora_"));
    const std::string prefix = "base_model.model.";
    if (module.starts_with(prefix)) module = module.substr(prefix.size());
    const HfParam* param = nullptr;
    for (const HfParam& p : layout.params)
      for (const HfPiece& h : p.pieces)
        if (h.name == module + ".weight") param = &p;
    KILN_CHECK(param, "{}: tensor '{}' adapts {}, which this model does not have (a folder "
               "for another model shape?)", reader_.path(), tensor, module);
    const bool block_linear = param->name.ends_with("_proj.weight") ||
                              param->name.ends_with(".c_attn.weight") ||
                              param->name.ends_with(".c_fc.weight") ||
                              param->name.ends_with(".c_proj.weight");
    KILN_CHECK(block_linear, "{}: tensor '{}' adapts {} (kiln's {}), which takes no LoRA "
               "adapter in kiln (the transformer blocks' attention, MLP and expert "
               "projections do)", reader_.path(), tensor, module, param->name);
    KILN_FAIL("{}: tensor '{}' is an adapter train.lora.targets does not choose (name its "
              "module's role or pattern in train.lora.targets)", reader_.path(), tensor);
  }

  st::Reader reader_;
  std::map<std::string, std::vector<std::string>> names_;  // kiln adapter name -> PEFT tensors
                                                           // (one per expert)
};

}  // namespace

std::unique_ptr<WeightSource> open_peft_folder(const fs::path& dir, const ModelOptions& expect,
                                               const LoraPlan& plan, const nn::LoraSpec& spec) {
  return std::make_unique<PeftSource>(dir, expect, plan, spec);
}

void export_peft_folder(const checkpoint::CheckpointReader& reader, Backend& backend,
                        const fs::path& out) {
  const std::string dir = reader.dir().string();
  const std::unique_ptr<LoraPlan> plan = checkpoint_lora_plan(reader);
  KILN_CHECK(plan, "{}: holds no LoRA adapters (trained without train.lora): --format peft "
             "writes adapters", dir);
  const ModelOptions options = checkpoint_model_options(reader);
  const auto model = shapes_only(options, backend, *plan);
  const std::map<std::string, std::vector<std::string>> modules =
      peft_modules(options, plan->units());
  const nlohmann::json& l = *lora_state(reader);
  const nlohmann::json base = l.value("base", nlohmann::json::object());
  const HfLayout layout = model_arch(options.arch).hf_layout(options);
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base.value("path", "")},
      {"r", l.at("rank")},
      {"lora_alpha", l.at("alpha")},
      {"use_rslora", l.at("rslora")},
      {"lora_dropout", l.value("dropout", 0.0)},
      {"target_modules", target_modules(modules, layout)},
      {"bias", "none"},
      {"fan_in_fan_out", fan_in_fan_out(modules, layout)},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"use_dora", false}};
  KILN_CHECK(!fs::exists(out) || fs::exists(out / "adapter_config.json") || fs::is_empty(out),
             "{}: exists and is not a PEFT adapter folder (no adapter_config.json): not "
             "replacing it", out.string());
  const fs::path tmp = files::temp_name_for(out);
  files::make_dirs(tmp);
  try {
    st::Writer writer((tmp / "adapter_model.safetensors").string());
    writer.set_metadata("format", "pt");
    for (const LoraUnit& u : plan->units())
      for (const char* which : {"lora_A", "lora_B"}) {
        const std::string name = u.name + "." + which + ".weight";
        const Shape shape = reader.global_shape(name);
        const std::vector<float> values = reader.read_f32(name);
        const std::vector<std::string>& names = modules.at(u.name);
        // One [rows, cols] tensor per module: the adapter's, or each expert's.
        const int64_t rows = shape[-2], cols = shape[-1];
        for (size_t e = 0; e < names.size(); ++e) {
          const auto first = values.begin() + static_cast<int64_t>(e) * rows * cols;
          writer.add_f32(peft_tensor(names[e], which), {rows, cols},
                         std::vector<float>(first, first + rows * cols));
        }
      }
    writer.write();
    files::atomic_write_file(tmp / "adapter_config.json", config.dump(2) + "\n");
    files::fsync_dir(tmp);
    if (fs::exists(out)) files::remove_tree(out);
    files::rename_path(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

void export_merged_hf_folder(const checkpoint::CheckpointReader& reader, Backend& backend,
                             const ExportOptions& options, const fs::path& out) {
  const CheckpointModel m = load_checkpoint_model(reader, backend, false, options.lora_base);
  KILN_CHECK(m.lora, "{}: holds no LoRA adapters: --merge-lora merges a LoRA checkpoint's "
             "adapters (export this one without it)", reader.dir().string());
  const std::map<std::string, std::vector<float>> merged = merged_lora_weights(*m.model, *m.lora);
  auto read = [&](const std::string& name) {
    if (const auto it = merged.find(name); it != merged.end()) return it->second;
    for (const ParamSpec& p : m.model->params())
      if (p.name == name) return download_f32(backend, m.model->param(p));
    KILN_FAIL("{}: the model has no parameter {}", reader.dir().string(), name);
  };
  // The run's dtype (its adapters may be fp32 on a bf16 base: train.lora.dtype); a
  // checkpoint saved before the state recorded it, the dtype of its parameters.
  const std::string run_dtype = reader.state().at("lora").value("train_dtype", "");
  const DType dtype = !options.dtype.empty() ? parse_dtype(options.dtype)
                      : !run_dtype.empty()   ? parse_dtype(run_dtype)
                                             : checkpoint_dtype(reader);
  nlohmann::json fields = nlohmann::json::object();
  const auto tokenizer = hf_tokenizer_files(reader, fields);
  write_hf_folder(checkpoint_model_options(reader), read, dtype, options.shard_bytes, out,
                  tokenizer, fields);
}

std::map<std::string, std::vector<float>> merged_lora_weights(const Model& model,
                                                              const LoraPlan& plan) {
  std::map<std::string, std::vector<float>> out;
  auto values = [&](const std::string& name) {
    for (const ParamSpec& p : model.params())
      if (p.name == name) return download_f32(model.backend(), model.param(p));
    KILN_FAIL("merge: the model has no parameter {}", name);
  };
  for (const LoraUnit& u : plan.units()) {
    const std::string w = u.linear + ".weight";
    if (!out.count(w)) out[w] = values(w);
    std::vector<float>& W = out[w];
    const std::vector<float> A = values(u.name + ".lora_A.weight"),
                             B = values(u.name + ".lora_B.weight");
    // Each expert e (one for a Linear): W_e [out, in], A_e [r, in], B_e [rows, r].
    const int64_t E = std::max<int64_t>(u.experts, 1), r = u.rank, in = u.in;
    const int64_t out_rows = static_cast<int64_t>(W.size()) / (E * in);
    for (int64_t e = 0; e < E; ++e) {
      const float* Ae = A.data() + e * r * in;
      const float* Be = B.data() + e * u.rows * r;
      float* We = W.data() + e * out_rows * in;
      for (int64_t i = 0; i < u.rows; ++i)
        for (int64_t c = 0; c < in; ++c) {
          double d = 0;
          for (int64_t k = 0; k < r; ++k) d += double{Be[i * r + k]} * Ae[k * in + c];
          float& x = We[(u.row0 + i) * in + c];
          x = static_cast<float>(x + u.scale * d);
        }
    }
  }
  return out;
}

}  // namespace kiln
