#include "models/hf_formats.h"

#include "checkpoint/file_util.h"
#include "checkpoint/safetensors_folder.h"
#include "core/error.h"
#include "models/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <utility>

namespace kiln {

namespace fs = std::filesystem;
namespace st = safetensors;

int64_t hf_cols(const HfParam& p) {
  return p.shape.ndim() == 1 ? 1 : p.shape[p.shape.ndim() - 1];
}

std::vector<int64_t> hf_piece_shape(const HfParam& p, const HfPiece& piece) {
  KILN_CHECK(!piece.transposed || p.shape.ndim() == 2,
             "tensor '{}': only a 2-D parameter is stored transposed, not '{}' {}", piece.name,
             p.name, p.shape.str());
  if (p.shape.ndim() == 1) return {piece.rows};
  if (piece.transposed) return {hf_cols(p), piece.rows};
  return {piece.rows, hf_cols(p)};
}

void hf_piece_bytes(const HfParam& p, const HfPiece& piece, int64_t row0,
                    const std::vector<float>& values, DType dtype, void* dst) {
  const int64_t cols = hf_cols(p), n = piece.rows * cols;
  KILN_CHECK(static_cast<int64_t>(values.size()) == p.shape.numel() &&
                 (row0 + piece.rows) * cols <= p.shape.numel(),
             "export: tensor '{}' has {} values, {} needs {} (rows {}..{})", p.name, values.size(),
             p.shape.str(), p.shape.numel(), row0, row0 + piece.rows);
  const float* src = values.data() + row0 * cols;
  std::vector<float> tmp;
  if (piece.transposed) {
    tmp.resize(static_cast<size_t>(n));
    transpose_f32(src, tmp.data(), piece.rows, cols);
    src = tmp.data();
  }
  convert(src, DType::F32, dst, dtype, static_cast<size_t>(n));
}

void transpose_f32(const float* src, float* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB)
      for (int64_t r = r0; r < std::min(rows, r0 + kB); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kB); ++c) dst[c * rows + r] = src[r * cols + c];
}

nlohmann::json read_hf_config(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  KILN_CHECK(fs::exists(file), "{}: no config.json (not a Hugging Face model folder)", dir.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(checkpoint::detail::read_file(file));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: not valid JSON ({})", file.string(), e.what());
  }
  KILN_CHECK(j.is_object(), "{}: not a JSON object", file.string());
  return j;
}

namespace {
const nlohmann::json* field(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  return it == cfg.end() || it->is_null() ? nullptr : &*it;
}
}  // namespace

int hf_int(const nlohmann::json& cfg, const char* key, const std::string& file,
           std::optional<int> fallback) {
  const nlohmann::json* v = field(cfg, key);
  if (!v) {
    KILN_CHECK(fallback, "{}: no \"{}\"", file, key);
    return *fallback;
  }
  KILN_CHECK(v->is_number_integer(), "{}: \"{}\" must be an integer, got {}", file, key, v->dump());
  const auto x = v->get<int64_t>();
  KILN_CHECK(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max(),
             "{}: \"{}\" = {} is out of range", file, key, x);
  return static_cast<int>(x);
}

double hf_double(const nlohmann::json& cfg, const char* key, const std::string& file,
                 std::optional<double> fallback) {
  const nlohmann::json* v = field(cfg, key);
  if (!v) {
    KILN_CHECK(fallback, "{}: no \"{}\"", file, key);
    return *fallback;
  }
  KILN_CHECK(v->is_number(), "{}: \"{}\" must be a number, got {}", file, key, v->dump());
  return v->get<double>();
}

bool hf_bool(const nlohmann::json& cfg, const char* key, const std::string& file, bool fallback) {
  const nlohmann::json* v = field(cfg, key);
  if (!v) return fallback;
  KILN_CHECK(v->is_boolean(), "{}: \"{}\" must be true or false, got {}", file, key, v->dump());
  return v->get<bool>();
}

std::string hf_string(const nlohmann::json& cfg, const char* key, const std::string& file,
                      const std::string& fallback) {
  const nlohmann::json* v = field(cfg, key);
  if (!v) return fallback;
  KILN_CHECK(v->is_string(), "{}: \"{}\" must be a string, got {}", file, key, v->dump());
  return v->get<std::string>();
}

double hf_float_value(float x) { return std::stod(fmt::format("{}", x)); }

bool is_hf_folder(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path / "config.json", ec);
}

namespace {

// The config.json model_types of the architectures that read Hugging Face folders, each
// with its architecture (ModelArch::hf_model_types, else the architecture's own name).
std::map<std::string, std::string> hf_model_types() {
  std::map<std::string, std::string> out;
  for (const auto& a : model_archs()) {
    const ModelArch entry = model_arch(a);
    if (!entry.options_from_hf) continue;
    if (entry.hf_model_types.empty()) out[a] = a;
    for (const std::string& type : entry.hf_model_types) out[type] = a;
  }
  return out;
}

// The architecture that reads config.json's model_type `type`; throws naming `what`:
// "model_type = 'mistral': expected gpt2, llama, mixtral, qwen3 or qwen3_moe".
std::string hf_arch_of(const std::string& type, const std::string& what) {
  const auto types = hf_model_types();
  auto it = types.find(type);
  if (it != types.end()) return it->second;
  std::string known;
  for (auto t = types.begin(); t != types.end(); ++t)
    known += (t == types.begin() ? "" : std::next(t) == types.end() ? " or " : ", ") + t->first;
  KILN_FAIL("{}: model_type = '{}': expected {}", what, type, known);
}

// The entry of `arch` with folder support; throws naming `what`.
ModelArch hf_arch(const std::string& arch, const std::string& what) {
  const ModelArch a = model_arch(arch);
  KILN_CHECK(a.options_from_hf, "{}: model.arch '{}' has no Hugging Face folder format", what, arch);
  return a;
}

// "num_hidden_layers = 3 (the folder) vs 2" for every config.json field in which the two
// models differ, both written out by the architecture (its defaults filled in). The
// dropout and the training-only keys (ModelKey::training_only, e.g. router_aux_loss_coef)
// are not compared: kiln's apply, not Hugging Face's.
std::vector<std::string> differences(const ModelArch& arch, ModelOptions got, const ModelOptions& want) {
  got.dropout = want.dropout;
  for (const ModelKey& k : arch.keys) {
    if (!k.training_only) continue;
    got.family.erase(k.name);
    if (const auto it = want.family.find(k.name); it != want.family.end())
      got.family[k.name] = it->second;
  }
  const nlohmann::json a = arch.hf_config(got), b = arch.hf_config(want);
  std::vector<std::string> out;
  for (const auto& [key, value] : a.items())
    if (!b.contains(key) || b[key] != value)
      out.push_back(fmt::format("{} = {} (the folder) vs {}", key, value.dump(),
                                b.contains(key) ? b[key].dump() : "none"));
  return out;
}

}  // namespace

ModelOptions hf_folder_options(const fs::path& dir) {
  const nlohmann::json cfg = read_hf_config(dir);
  const std::string file = (dir / "config.json").string();
  KILN_CHECK(cfg.contains("model_type") && cfg["model_type"].is_string(),
             "{}: no \"model_type\" string", file);
  const std::string arch = hf_arch_of(cfg["model_type"].get<std::string>(), file);
  ModelOptions o;
  try {
    o = hf_arch(arch, file).options_from_hf(cfg, file);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("{}: {}", file, e.what());
  }
  o.arch = arch;
  return o;
}

struct HfFolderReader::Impl {
  st::FolderReader folder;
  std::map<std::string, HfParam> params;   // by kiln name
  std::map<std::string, std::string> actual;  // layout tensor name -> name in the folder
};

HfFolderReader::HfFolderReader(const fs::path& dir, const ModelOptions& expect) {
  const std::string file = (dir / "config.json").string();
  const ModelOptions got = hf_folder_options(dir);
  KILN_CHECK(got.arch == expect.arch, "{}: holds a model of arch '{}' (model_type = {}), the "
             "config asks for model.arch '{}'", file, got.arch,
             read_hf_config(dir)["model_type"].dump(), expect.arch);
  const ModelArch arch = hf_arch(expect.arch, file);
  const auto diff = differences(arch, got, expect);
  KILN_CHECK(diff.empty(), "{}: holds another model than the config asks for: {}", file,
             fmt::join(diff, ", "));
  open(dir, arch.hf_layout(expect), file);
}

HfFolderReader::HfFolderReader(const fs::path& path, const HfLayout& layout) {
  open(path, layout, "this model");
}

void HfFolderReader::open(const fs::path& path, const HfLayout& layout, const std::string& what) {
  impl_ = std::make_unique<Impl>(Impl{st::FolderReader(path), {}, {}});
  const st::FolderReader& f = impl_->folder;
  std::set<std::string> wanted;
  for (const HfParam& p : layout.params) {
    impl_->params[p.name] = p;
    for (const HfPiece& piece : p.pieces) wanted.insert(piece.name);
  }
  const std::string& prefix = layout.optional_prefix;
  for (const std::string& name : f.names()) {
    std::string canonical = name;
    if (!wanted.count(name) && !prefix.empty() && wanted.count(prefix + name)) canonical = prefix + name;
    if (wanted.count(canonical)) {
      KILN_CHECK(impl_->actual.emplace(canonical, name).second,
                 "{}: tensor '{}' present with and without the '{}' prefix", f.path(), canonical,
                 prefix);
      continue;
    }
    const bool ignored = layout.ignored && (layout.ignored(name) || layout.ignored(prefix + name));
    KILN_CHECK(ignored, "{}: unexpected tensor '{}' for {}", f.file_of(name).path(), name, what);
  }
  for (const HfParam& p : layout.params)
    for (const HfPiece& piece : p.pieces) {
      auto it = impl_->actual.find(piece.name);
      KILN_CHECK(it != impl_->actual.end(), "{}: no tensor '{}'{}", f.path(), piece.name,
                 prefix.empty() || !piece.name.starts_with(prefix)
                     ? std::string()
                     : fmt::format(" (nor '{}')", piece.name.substr(prefix.size())));
      const st::TensorInfo& t = f.info(it->second);
      const auto want = hf_piece_shape(p, piece);
      KILN_CHECK(t.shape == want, "{}: tensor '{}' has shape {}, expected [{}]{}",
                 f.file_of(it->second).path(), it->second, t.shape_str(), fmt::join(want, ", "),
                 piece.transposed ? " (stored [in, out])" : "");
    }
}

HfFolderReader::~HfFolderReader() = default;

void HfFolderReader::read(const std::string& name, int64_t begin, int64_t end, float* dst) const {
  auto pit = impl_->params.find(name);
  KILN_CHECK(pit != impl_->params.end(), "{}: no parameter '{}' in this model", impl_->folder.path(), name);
  const HfParam& p = pit->second;
  KILN_CHECK(0 <= begin && begin <= end && end <= p.shape.numel(),
             "{}: range [{}, {}) outside '{}' {}", impl_->folder.path(), begin, end, name, p.shape.str());
  const int64_t cols = hf_cols(p);
  std::fill(dst, dst + (end - begin), 0.f);  // rows past the pieces: padding
  int64_t row0 = 0;
  for (const HfPiece& piece : p.pieces) {
    const int64_t lo = std::max(begin, row0 * cols), hi = std::min(end, (row0 + piece.rows) * cols);
    const int64_t base = row0 * cols;
    row0 += piece.rows;
    if (lo >= hi) continue;
    const std::string& in_file = impl_->actual.at(piece.name);
    const st::Reader& r = impl_->folder.file_of(in_file);
    if (!piece.transposed) {
      r.read_f32_range(in_file, lo - base, hi - base, dst + (lo - begin));
      continue;
    }
    std::vector<float> stored(static_cast<size_t>(piece.rows * cols)), rows(stored.size());
    r.read_f32_range(in_file, 0, piece.rows * cols, stored.data());
    transpose_f32(stored.data(), rows.data(), cols, piece.rows);  // [cols, rows] -> [rows, cols]
    std::copy(rows.begin() + (lo - base), rows.begin() + (hi - base), dst + (lo - begin));
  }
}

void write_hf_folder(const ModelOptions& options,
                     const std::function<std::vector<float>(const std::string&)>& read,
                     DType dtype, uint64_t shard_bytes, const fs::path& out,
                     const std::map<std::string, std::string>& extra_files,
                     const nlohmann::json& config_fields) {
  KILN_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "{}: Hugging Face folders are written in fp32, bf16 or fp16, not {}", out.string(),
             dtype_name(dtype));
  const ModelArch a = model_arch(options.arch);
  KILN_CHECK(a.hf_layout && a.hf_config, "export: model.arch '{}' has no Hugging Face folder format",
             options.arch);
  const HfLayout layout = a.hf_layout(options);
  const st::StDType sdt = st::to_st_dtype(dtype);
  // The tensors are produced one at a time in order, a parameter's pieces together: each
  // parameter is read once for all its pieces (an MoE layer's 2E expert tensors).
  auto last = std::make_shared<std::pair<std::string, std::vector<float>>>();
  std::vector<st::FolderTensor> tensors;
  for (const HfParam& p : layout.params) {
    int64_t row0 = 0;
    for (const HfPiece& piece : p.pieces) {
      st::FolderTensor t;
      t.name = piece.name;
      t.dtype = sdt;
      t.shape = hf_piece_shape(p, piece);
      t.produce = [&read, last, p, piece, row0, dtype](void* dst) {
        if (last->first != p.name || last->second.empty()) *last = {p.name, read(p.name)};
        hf_piece_bytes(p, piece, row0, last->second, dtype, dst);
      };
      tensors.push_back(std::move(t));
      row0 += piece.rows;
    }
  }
  nlohmann::json config = a.hf_config(options);
  for (const auto& [k, v] : config_fields.items()) config[k] = v;
  config["torch_dtype"] = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";
  nlohmann::json generation = {{"_from_model_config", true}};
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (config.contains(key)) generation[key] = config[key];
  std::map<std::string, std::string> files = extra_files;
  files["config.json"] = config.dump(2) + "\n";
  files["generation_config.json"] = generation.dump(2) + "\n";
  st::write_folder(out, tensors, shard_bytes, {{"format", "pt"}}, files);
}

}  // namespace kiln
