#include "model_io/model_io.h"

#include "core/error.h"
#include "model_io/lora_io.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

namespace kiln {

namespace fs = std::filesystem;

std::string checkpoint_arch(const nlohmann::json& state) { return state.value("arch", "gpt2"); }

ModelOptions checkpoint_model_options(const checkpoint::CheckpointReader& reader) {
  try {
    return model_options_from_json(checkpoint_arch(reader.state()), reader.state().at("model"));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: the manifest's state.model is malformed ({})",
              (reader.dir() / "manifest.json").string(), e.what());
  } catch (const Error& e) {
    KILN_FAIL("{}: {}", (reader.dir() / "manifest.json").string(), e.what());
  }
}

void add_param_range(checkpoint::CheckpointWriter& writer, const std::string& name,
                     const ParamSpec& spec, DType dtype, int64_t begin, int64_t end,
                     const void* data) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (const auto& run : spec.slice.global_runs(spec.shape, begin, end))
    writer.add_flat_range(name, spec.shape, dtype, run.global_begin, run.global_end,
                          bytes + static_cast<size_t>(run.local_begin - begin) * dtype_size(dtype));
}

void read_param_range(const checkpoint::CheckpointReader& reader, const std::string& name,
                      const ParamSpec& spec, int64_t begin, int64_t end, void* dst, DType dtype) {
  auto* bytes = static_cast<uint8_t*>(dst);
  for (const auto& run : spec.slice.global_runs(spec.shape, begin, end))
    reader.read_flat_range(name, run.global_begin, run.global_end,
                           bytes + static_cast<size_t>(run.local_begin - begin) * dtype_size(dtype),
                           dtype);
}

std::vector<float>& HostCopies::next(size_t floats) {
  if (used_ == buffers_.size()) buffers_.emplace_back();
  std::vector<float>& b = buffers_[used_++];
  b.resize(floats);  // the same size as at the last save: no allocation
  return b;
}

const float* HostCopies::copy(Backend& be, const Tensor& t) {
  std::vector<float>& b = next(static_cast<size_t>(t.numel()));
  download_f32(be, b.data(), t);
  return b.data();
}

void* HostCopies::raw(size_t bytes) { return next((bytes + 3) / 4).data(); }

void add_optimizer_segment(checkpoint::CheckpointWriter& writer, const AdamW& optimizer, size_t i,
                           HostCopies& copies) {
  Backend& be = optimizer.backend();
  const AdamWSegment& seg = optimizer.segments()[i];
  if (seg.size() == 0) return;
  add_param_range(writer, "optimizer.exp_avg." + seg.spec.name, seg.spec, DType::F32, seg.begin,
                  seg.end, copies.copy(be, optimizer.m(i)));
  add_param_range(writer, "optimizer.exp_avg_sq." + seg.spec.name, seg.spec, DType::F32,
                  seg.begin, seg.end, copies.copy(be, optimizer.v(i)));
  if (const Tensor ema = optimizer.ema(i))
    add_param_range(writer, "ema." + seg.spec.name, seg.spec, DType::F32, seg.begin, seg.end,
                    copies.copy(be, ema));
}

void add_model_buffers(checkpoint::CheckpointWriter& writer, const Model& model,
                       HostCopies& copies) {
  for (const ModelBuffer& b : model.buffers())
    writer.add_flat_range(b.name, b.value.shape(), DType::F32, 0, b.value.numel(),
                          copies.copy(model.backend(), b.value));
}

std::vector<std::string> load_model_buffers(const checkpoint::CheckpointReader& reader,
                                            Model& model) {
  std::vector<std::string> missing;
  std::vector<float> buf;
  for (const ModelBuffer& b : model.buffers()) {
    if (!reader.has(b.name)) {
      missing.push_back(b.name);
      continue;
    }
    KILN_CHECK(reader.global_shape(b.name) == b.value.shape(),
               "{}: tensor '{}' has shape {}, the model expects {}", reader.dir().string(),
               b.name, reader.global_shape(b.name).str(), b.value.shape().str());
    buf.resize(static_cast<size_t>(b.value.numel()));
    reader.read(b.name, buf.data(), DType::F32);
    upload_f32(model.backend(), b.value, buf.data());
  }
  return missing;
}

bool checkpoint_has_ema(const checkpoint::CheckpointReader& reader) {
  for (const std::string& name : reader.names())
    if (name.starts_with("ema.")) return true;
  return false;
}

void load_model_weights(const checkpoint::CheckpointReader& reader, Model& model, bool use_ema,
                        const std::string& lora_base) {
  KILN_CHECK(!use_ema || checkpoint_has_ema(reader),
             "{}: the checkpoint holds no moving average of the weights (no 'ema.' tensors: it "
             "was trained with train.ema_decay = 0)", reader.dir().string());
  Backend& be = model.backend();
  // A LoRA checkpoint holds the adapters: the base comes from its files (lora_io.h).
  const bool lora = is_lora_checkpoint(reader);
  if (lora) {
    KILN_CHECK(std::any_of(model.params().begin(), model.params().end(),
                           [](const ParamSpec& p) { return p.adapter; }),
               "{}: a LoRA checkpoint (adapters on a base) read into a model without adapters: "
               "build it with load_checkpoint_model, or export the merged model (kiln export "
               "--format hf --merge-lora)", reader.dir().string());
    load_lora_base(reader, model, lora_base);
  }
  std::vector<float> buf;
  for (const ParamSpec& p : model.params()) {
    if (lora && !p.adapter) continue;
    // A parameter frozen in training has no moving average: its weights are their own.
    const bool ema = use_ema && reader.has("ema." + p.name);
    const std::string name = ema ? "ema." + p.name : p.name;
    KILN_CHECK(reader.has(name), "{}: no tensor '{}'", reader.dir().string(), name);
    KILN_CHECK(reader.global_shape(name) == p.shape,
               "{}: tensor '{}' has shape {}, the model expects {}", reader.dir().string(), name,
               reader.global_shape(name).str(), p.shape.str());
    buf.resize(static_cast<size_t>(p.shape.numel()));
    reader.read(name, buf.data(), DType::F32);
    upload_f32(be, model.param(p), buf.data());
  }
  load_model_buffers(reader, model);
}

void load_model_from_checkpoint(const checkpoint::CheckpointReader& reader, Model& model,
                                AdamW* optimizer) {
  load_model_weights(reader, model, /*use_ema=*/false);
  if (optimizer) load_optimizer_from_checkpoint(reader, *optimizer);
}

bool load_optimizer_from_checkpoint(const checkpoint::CheckpointReader& reader, AdamW& optimizer) {
  Backend& be = optimizer.backend();
  const bool want_ema = optimizer.config().ema_decay > 0.f;
  const bool has_ema = want_ema && checkpoint_has_ema(reader);
  std::vector<float> buf;
  for (size_t i = 0; i < optimizer.segments().size(); ++i) {
    const AdamWSegment& seg = optimizer.segments()[i];
    if (seg.size() == 0) continue;
    buf.resize(static_cast<size_t>(seg.size()));
    const std::pair<const char*, Tensor> states[] = {
        {"optimizer.exp_avg.", optimizer.m(i)},
        {"optimizer.exp_avg_sq.", optimizer.v(i)},
        {"ema.", has_ema ? optimizer.ema(i) : Tensor()}};
    for (const auto& [prefix, dst] : states) {
      if (!dst) continue;
      const std::string name = prefix + seg.spec.name;
      KILN_CHECK(reader.has(name), "{}: no optimizer state '{}'", reader.dir().string(), name);
      read_param_range(reader, name, seg.spec, seg.begin, seg.end, buf.data(), DType::F32);
      be.copy_from_host(be.default_stream(), dst, buf.data());
    }
  }
  // No EMA saved (trained without one): it starts from the weights loaded.
  if (want_ema && !has_ema) optimizer.reset_ema();
  return !want_ema || has_ema;
}

std::map<std::string, std::string> tokenizer_files(const data::Tokenizer& tokenizer) {
  const fs::path tmp = fs::temp_directory_path() /
                       ("kiln-tok-" + std::to_string(std::random_device{}()));
  fs::create_directories(tmp);
  std::map<std::string, std::string> files;
  try {
    tokenizer.save(tmp);
    for (const auto& e : fs::directory_iterator(tmp)) {
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      files["tokenizer/" + e.path().filename().string()] = ss.str();
    }
  } catch (...) {
    fs::remove_all(tmp);
    throw;
  }
  fs::remove_all(tmp);
  return files;
}

std::unique_ptr<data::Tokenizer> load_checkpoint_tokenizer(const checkpoint::CheckpointReader& r) {
  const fs::path tmp = fs::temp_directory_path() /
                       ("kiln-tok-" + std::to_string(std::random_device{}()));
  fs::create_directories(tmp);
  bool any = false;
  for (const auto& name : r.extra_file_names()) {
    if (name.rfind("tokenizer/", 0) != 0) continue;
    std::ofstream(tmp / name.substr(10), std::ios::binary) << r.extra_file(name);
    any = true;
  }
  if (!any) {
    fs::remove_all(tmp);
    KILN_FAIL("{}: the checkpoint holds no tokenizer", r.dir().string());
  }
  auto tok = data::load_tokenizer(tmp);
  fs::remove_all(tmp);
  return tok;
}

namespace {

// A kiln checkpoint: ranges read from whatever slices were written.
class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const fs::path& path, const ModelOptions& expect,
                   const std::vector<ParamSpec>& params)
      : reader_(path) {
    KILN_CHECK(!is_lora_checkpoint(reader_), "model.init_from: {} is a LoRA checkpoint "
               "(adapters only): start from its merged model (kiln export --format hf "
               "--merge-lora) or its adapters (kiln export --format peft, train.lora.init_from)",
               path.string());
    const ModelOptions got = checkpoint_model_options(reader_);
    KILN_CHECK(got.arch == expect.arch && got.n_layer == expect.n_layer &&
                   got.n_head == expect.n_head && got.n_embd == expect.n_embd &&
                   got.block_size == expect.block_size && got.vocab_size == expect.vocab_size,
               "{}: holds a {} with n_layer={} n_head={} n_embd={} block_size={} vocab_size={}, "
               "the config asks for a {} with n_layer={} n_head={} n_embd={} block_size={} "
               "vocab_size={}", path.string(), got.arch, got.n_layer, got.n_head, got.n_embd,
               got.block_size, got.vocab_size, expect.arch, expect.n_layer, expect.n_head,
               expect.n_embd, expect.block_size, expect.vocab_size);
    for (const ParamSpec& p : params) {
      KILN_CHECK(reader_.has(p.name), "{}: no tensor '{}'", path.string(), p.name);
      KILN_CHECK(reader_.global_shape(p.name) == p.shape,
                 "{}: tensor '{}' has shape {}, the model's is {}", path.string(), p.name,
                 reader_.global_shape(p.name).str(), p.shape.str());
    }
  }
  void read(const ParamSpec& p, int64_t begin, int64_t end, float* dst) const override {
    reader_.read_flat_range(p.name, begin, end, dst, DType::F32);
  }

 private:
  checkpoint::CheckpointReader reader_;
};

// A Hugging Face folder: ranges read from its shards.
class HfFolderSource final : public WeightSource {
 public:
  HfFolderSource(const fs::path& path, const ModelOptions& expect) : reader_(path, expect) {}
  void read(const ParamSpec& p, int64_t begin, int64_t end, float* dst) const override {
    reader_.read(p.name, begin, end, dst);
  }

 private:
  HfFolderReader reader_;
};

// A file of the architecture's own formats, read whole.
class HostSource final : public WeightSource {
 public:
  HostSource(HostWeights w, const std::vector<ParamSpec>& params, const fs::path& path)
      : w_(std::move(w)) {
    for (const ParamSpec& p : params) {
      auto it = w_.find(p.name);
      KILN_CHECK(it != w_.end(), "{}: no tensor '{}'", path.string(), p.name);
      KILN_CHECK(static_cast<int64_t>(it->second.size()) == p.shape.numel(),
                 "{}: tensor '{}' has {} values, the model's {} needs {}", path.string(), p.name,
                 it->second.size(), p.shape.str(), p.shape.numel());
    }
  }
  void read(const ParamSpec& p, int64_t begin, int64_t end, float* dst) const override {
    const std::vector<float>& v = w_.at(p.name);
    std::copy(v.begin() + begin, v.begin() + end, dst);
  }

 private:
  HostWeights w_;
};

}  // namespace

std::unique_ptr<WeightSource> open_model_weights(const fs::path& path, const ModelOptions& expect,
                                                 const std::vector<ParamSpec>& params) {
  KILN_CHECK(fs::exists(path), "model.init_from: {} does not exist", path.string());
  if (is_hf_folder(path)) return std::make_unique<HfFolderSource>(path, expect);
  if (fs::is_directory(path)) return std::make_unique<CheckpointSource>(path, expect, params);
  return std::make_unique<HostSource>(import_model_weights(path, expect), params, path);
}

namespace {

// A part's parameters read as another model's (open_part_weights): ours by name, theirs
// through `source`.
class PartSource final : public WeightSource {
 public:
  PartSource(std::unique_ptr<WeightSource> source, std::map<std::string, ParamSpec> theirs)
      : source_(std::move(source)), theirs_(std::move(theirs)) {}
  void read(const ParamSpec& p, int64_t begin, int64_t end, float* dst) const override {
    const auto it = theirs_.find(p.name);
    KILN_CHECK(it != theirs_.end(), "model.init_parts: {} is not in this part", p.name);
    source_->read(it->second, begin, end, dst);  // the same elements: equal or more rows
  }

 private:
  std::unique_ptr<WeightSource> source_;
  std::map<std::string, ParamSpec> theirs_;
};

}  // namespace

namespace {

// open_part_weights's check of the source's options `theirs` against the part's `want`.
void check_part_options(const ModelOptions& want, const ModelOptions& theirs,
                        const std::string& where) {
  KILN_CHECK(theirs.arch == want.arch, "{}: a {} there, a {} here", where, theirs.arch, want.arch);
  for (const auto& [key, mine, its] : {std::tuple{"n_layer", want.n_layer, theirs.n_layer},
                                       std::tuple{"n_head", want.n_head, theirs.n_head},
                                       std::tuple{"n_embd", want.n_embd, theirs.n_embd}})
    KILN_CHECK(mine == its, "{}: its {} is {}, this model's part has {}", where, key, its, mine);
  const ModelKeys& keys = model_arch(want.arch).keys;
  for (const auto& [key, mine] : want.family) {
    const double its = theirs.value(keys, key);
    KILN_CHECK(std::fabs(its - mine) <= 1e-6 * std::max(std::fabs(its), std::fabs(mine)),
               "{}: its {} is {}, this model's part has {}", where, key, its, mine);
  }
}

}  // namespace

std::unique_ptr<WeightSource> open_part_weights(const fs::path& path, const std::string& prefix,
                                                const std::vector<ParamSpec>& params,
                                                const std::optional<ModelOptions>& expect) {
  const std::string where = fmt::format("model.init_parts {}={}", prefix, path.string());
  KILN_CHECK(fs::exists(path), "{}: {} does not exist", where, path.string());
  const bool hf = is_hf_folder(path);
  KILN_CHECK(hf || fs::exists(path / "manifest.json"), "{}: {} is neither a kiln checkpoint "
             "(manifest.json) nor a Hugging Face folder (config.json)", where, path.string());
  // Their options and the shape of each of their parameters.
  std::optional<checkpoint::CheckpointReader> reader;
  ModelOptions options;
  std::map<std::string, Shape> shapes;
  if (hf) {
    options = hf_folder_options(path);
    const ModelArch arch = model_arch(options.arch);
    KILN_CHECK(arch.hf_layout, "{}: model.arch '{}' has no Hugging Face folders", where, options.arch);
    for (const HfParam& p : arch.hf_layout(options).params) shapes[p.name] = p.shape;
  } else {
    reader.emplace(path);
    options = checkpoint_model_options(*reader);
  }
  if (expect) check_part_options(*expect, options, where);
  std::map<std::string, ParamSpec> theirs;
  std::vector<ParamSpec> wanted;
  for (const ParamSpec& p : params) {
    KILN_CHECK(p.name.starts_with(prefix + "."), "{}: parameter {} is not under {}.", where,
               p.name, prefix);
    ParamSpec t = p;
    t.name = p.name.substr(prefix.size() + 1);
    const bool has = hf ? shapes.count(t.name) > 0 : reader->has(t.name);
    KILN_CHECK(has, "{}: the {} there has no tensor '{}' (for {})", where, options.arch, t.name,
               p.name);
    t.shape = hf ? shapes.at(t.name) : reader->global_shape(t.name);
    bool fits = t.shape == p.shape;
    if (!fits && p.name.ends_with("pos_embed") && t.shape.ndim() == p.shape.ndim() &&
        t.shape[0] >= p.shape[0]) {
      fits = true;
      for (int d = 1; d < p.shape.ndim(); ++d) fits = fits && t.shape[d] == p.shape[d];
    }
    KILN_CHECK(fits, "{}: tensor '{}' there has shape {}, {} here is {}", where, t.name,
               t.shape.str(), p.name, p.shape.str());
    wanted.push_back(t);
    theirs.emplace(p.name, t);
  }
  reader.reset();
  return std::make_unique<PartSource>(open_model_weights(path, options, wanted), std::move(theirs));
}

void check_part_tokenizer(const fs::path& path, const fs::path& data_dir, const std::string& where) {
  const fs::path data_tokenizer = data_dir / "tokenizer.json";
  if (!fs::exists(path / "manifest.json") || !fs::exists(data_tokenizer)) return;
  const checkpoint::CheckpointReader reader(path);
  if (!reader.has_extra_file("tokenizer/tokenizer.json")) return;
  const std::string theirs = load_checkpoint_tokenizer(reader)->hash();
  const std::string ours = data::load_tokenizer(data_dir)->hash();
  KILN_CHECK(theirs == ours, "{}: its tokenizer (hash {}) is not the data's ({}: hash {}); the "
             "part reads the data's token ids", where, theirs, data_tokenizer.string(), ours);
}

namespace {
// The files of a model.init_from that hold its weights and shape: the file itself, or a
// folder's *.safetensors, *.bin, config.json and manifest.json (not its README, tokenizer
// or generation config, nor its subfolders).
std::vector<fs::path> weight_files(const fs::path& path) {
  if (!fs::is_directory(path)) return {path};
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && (name.ends_with(".safetensors") || name.ends_with(".bin") ||
                                name == "config.json" || name == "manifest.json"))
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

nlohmann::json weights_identity(const fs::path& path) {
  KILN_CHECK(fs::exists(path), "model.init_from: {} does not exist", path.string());
  uint32_t crc = 0;
  uint64_t bytes = 0;
  nlohmann::json each = nlohmann::json::object();
  for (const fs::path& f : weight_files(path)) {
    const std::string name = f.filename().string();
    const uint64_t size = fs::file_size(f);
    const uint32_t file_crc = checkpoint::file_crc32(f);
    crc = checkpoint::buffer_crc32(name.data(), name.size(), crc);
    crc = checkpoint::buffer_crc32(&size, sizeof size, crc);
    crc = checkpoint::buffer_crc32(&file_crc, sizeof file_crc, crc);
    bytes += size;
    each[name] = fmt::format("{:08x}", file_crc);
  }
  return {{"path", path.string()}, {"bytes", bytes}, {"crc32", fmt::format("{:08x}", crc)},
          {"files", each}};
}

std::string weights_difference(const nlohmann::json& then, const nlohmann::json& now) {
  const nlohmann::json a = then.value("files", nlohmann::json::object()),
                       b = now.value("files", nlohmann::json::object());
  std::vector<std::string> out;
  for (const auto& [name, crc] : a.items())
    if (!b.contains(name)) out.push_back(name + " missing");
    else if (b.at(name) != crc) out.push_back(name + " changed");
  for (const auto& [name, crc] : b.items())
    if (!a.contains(name)) out.push_back(name + " added");
  return out.empty() ? std::string("no file named") : fmt::format("{}", fmt::join(out, ", "));
}

void load_weights_into(Model& model, const ModelOptions& expect, const fs::path& path) {
  const auto source = open_model_weights(path, expect, model.params());
  Backend& be = model.backend();
  std::vector<float> buf;
  for (const ParamSpec& p : model.params()) {
    buf.resize(static_cast<size_t>(p.shape.numel()));
    source->read(p, 0, p.shape.numel(), buf.data());
    upload_f32(be, model.param(p), buf.data());
  }
}

std::map<std::string, std::string> hf_tokenizer_files(const checkpoint::CheckpointReader& reader,
                                                      nlohmann::json& config_fields) {
  bool any = false;
  for (const auto& name : reader.extra_file_names()) any = any || name.starts_with("tokenizer/");
  if (!any) return {};
  const auto tok = load_checkpoint_tokenizer(reader);
  std::map<std::string, std::string> files = tok->hf_files();  // {} for the byte kind
  // bos/eos ids: tokenizer_config.json's tokens where one encodes to a single id (the hf
  // kind's special tokens, e.g. Llama 3's <|begin_of_text|> and <|end_of_text|>), else the
  // document separator (GPT-2's <|endoftext|> is both).
  auto id_of = [&](const char* key) {
    if (!files.count("tokenizer_config.json")) return tok->eot_id();
    const auto cfg = nlohmann::json::parse(files.at("tokenizer_config.json"));
    if (!cfg.contains(key) || !cfg[key].is_string() || cfg[key].get<std::string>().empty())
      return tok->eot_id();
    const auto ids = tok->encode(cfg[key].get<std::string>());
    return ids.size() == 1 ? ids[0] : tok->eot_id();
  };
  config_fields["bos_token_id"] = id_of("bos_token");
  config_fields["eos_token_id"] = id_of("eos_token");
  return files;
}

DType checkpoint_dtype(const checkpoint::CheckpointReader& reader) {
  for (const std::string& name : reader.names())
    if (name.starts_with("lowp.")) return reader.dtype(name);
  return DType::F32;
}

void export_checkpoint(const fs::path& checkpoint_dir, const ExportOptions& options,
                       const fs::path& out) {
  checkpoint::CheckpointReader reader(checkpoint_dir);
  checkpoint_model_options(reader);  // a malformed state.model is one line naming the file
  KILN_CHECK(!is_lora_checkpoint(reader), "{}: a LoRA checkpoint holds adapters, not a model: "
             "export them (--format peft) or the model with them merged (--format hf "
             "--merge-lora)", checkpoint_dir.string());
  const std::string arch = checkpoint_arch(reader.state());
  const nlohmann::json& config = reader.state().at("model");
  if (options.format != "hf") {
    // The folders this export creates go again when it fails (an unknown format, a full
    // disk): the output file itself is written atomically.
    fs::path created;
    for (fs::path p = out.parent_path(); !p.empty() && !fs::exists(p); p = p.parent_path()) created = p;
    if (out.has_parent_path()) fs::create_directories(out.parent_path());
    try {
      export_model_weights(arch, config, [&](const std::string& name) { return reader.read_f32(name); },
                           options.format, out);
    } catch (...) {
      std::error_code ec;
      if (!created.empty()) fs::remove_all(created, ec);
      throw;
    }
    return;
  }
  const DType dtype = options.dtype.empty() ? checkpoint_dtype(reader) : parse_dtype(options.dtype);
  // In the checkpoint's low precision its "lowp." copies are the model (bitwise); else the
  // fp32 values (rounded to `dtype` when lower).
  auto read = [&](const std::string& name) {
    const std::string lowp = "lowp." + name;
    return dtype != DType::F32 && reader.has(lowp) && reader.dtype(lowp) == dtype
               ? reader.read_f32(lowp) : reader.read_f32(name);
  };
  nlohmann::json fields = nlohmann::json::object();
  const auto tokenizer = hf_tokenizer_files(reader, fields);
  write_hf_folder(model_options_from_json(arch, config), read, dtype, options.shard_bytes, out,
                  tokenizer, fields);
}

}  // namespace kiln
