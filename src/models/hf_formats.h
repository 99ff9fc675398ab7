// Hugging Face model folders, for every architecture that describes its parameters as
// Hugging Face tensors (ModelArch::hf_layout; built in: gpt2, llama).
//
// A folder holds config.json (transformers' PretrainedConfig: "model_type" names the
// architecture, the other fields its shape), the weights (model.safetensors, or shards and
// model.safetensors.index.json: checkpoint/safetensors_folder.h) and generation_config.json.
// An HfLayout says where each kiln parameter lives in such a folder: its rows stacked from
// one or more Hugging Face tensors (Llama's fused qkv_proj is q_proj, k_proj, v_proj),
// each possibly stored transposed (GPT-2's Conv1D weights, [in, out]); rows past the
// stored ones are kiln's vocabulary padding, zero and not stored. Reading and writing are
// per tensor: a rank reads only the element ranges it holds (HfFolderReader::read), and an
// export produces one tensor at a time while it streams the shards out.
#pragma once

#include "core/tensor.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

struct ModelOptions;

/// Rows of a kiln parameter stored as one Hugging Face tensor.
struct HfPiece {
  std::string name;          // the tensor's name in the folder
  int64_t rows = 0;          // kiln rows (dimension 0) it holds
  bool transposed = false;   // stored [cols, rows] (a 2-D parameter only)
};

/// Where a kiln parameter lives: rows [0, sum of the pieces' rows) from the pieces in
/// order, the rows past them zero (not stored). A parameter of more than two dimensions is
/// a matrix of rows of its last dimension (an MoE layer's experts [E, 2F, C]: E 2F rows of
/// C), so that each piece is a 2-D tensor of the folder (expert e's [F, C] gate_proj is
/// rows [2F e, 2F e + F)).
struct HfParam {
  std::string name;  // kiln's global parameter name (ParamSpec::name)
  Shape shape;       // kiln's global shape
  std::vector<HfPiece> pieces;
};

/// An architecture's tensors in a folder.
struct HfLayout {
  std::vector<HfParam> params;
  /// A prefix the folder's names may lack (GPT2Model / LlamaModel saved without the head:
  /// "transformer." / "model."); "" for none.
  std::string optional_prefix;
  /// Tensors a folder may hold that kiln does not read (GPT-2's attn.bias buffers, a tied
  /// lm_head.weight); any other unknown tensor is an error.
  std::function<bool(const std::string& name)> ignored;
};

/// Columns of a row of `p`: its last dimension (1 for a 1-D parameter).
int64_t hf_cols(const HfParam& p);
/// The shape in the folder of `piece` of `p`: [rows] (1-D), [rows, cols], or [cols, rows]
/// when transposed. Throws kiln::Error naming the tensor for a transposed piece of a
/// parameter that is not 2-D.
std::vector<int64_t> hf_piece_shape(const HfParam& p, const HfPiece& piece);
/// The bytes of `piece` of `p` (its kiln rows [row0, row0 + piece.rows)) in `dtype` (F32,
/// BF16, F16; rounded to nearest even) into dst, from the parameter's fp32 `values` (its
/// whole global shape), transposed when the piece is. Throws kiln::Error naming the tensor
/// when `values` has another size.
void hf_piece_bytes(const HfParam& p, const HfPiece& piece, int64_t row0,
                    const std::vector<float>& values, DType dtype, void* dst);

/// dst[c * rows + r] = src[r * cols + c]: [rows, cols] -> [cols, rows] (fp32).
void transpose_f32(const float* src, float* dst, int64_t rows, int64_t cols);

/// Fields of a config.json (`file` names it in errors): `key` of `cfg`, `fallback` when
/// absent or null (no fallback: required). Throws kiln::Error naming the file and key when
/// missing or of another type ("DIR/config.json: \"hidden_size\" must be an integer").
int hf_int(const nlohmann::json& cfg, const char* key, const std::string& file,
           std::optional<int> fallback = std::nullopt);
double hf_double(const nlohmann::json& cfg, const char* key, const std::string& file,
                 std::optional<double> fallback = std::nullopt);
bool hf_bool(const nlohmann::json& cfg, const char* key, const std::string& file, bool fallback);
std::string hf_string(const nlohmann::json& cfg, const char* key, const std::string& file,
                      const std::string& fallback);
/// A float as JSON with its shortest decimal form (1e-05, not 9.999999747378752e-06).
double hf_float_value(float x);

/// dir/config.json parsed. Throws kiln::Error naming the file when missing or not a JSON
/// object.
nlohmann::json read_hf_config(const std::filesystem::path& dir);
/// True when `path` is a directory holding config.json (a Hugging Face model folder, not a
/// kiln checkpoint).
bool is_hf_folder(const std::filesystem::path& path);
/// The model options of a folder's config.json, by its "model_type" (the architecture that
/// lists it, ModelArch::hf_model_types: llama reads llama, mixtral, qwen3 and qwen3_moe;
/// ModelArch::options_from_hf). Throws kiln::Error naming the file and key:
/// "DIR/config.json: model_type = 'mistral': expected gpt2, llama, mixtral, qwen3 or
/// qwen3_moe", or the architecture's error for an unsupported option.
ModelOptions hf_folder_options(const std::filesystem::path& dir);

/// Element ranges of kiln parameters from a Hugging Face folder (in kiln's names, layouts
/// and padding, fp32 from F32, BF16 or F16 files).
class HfFolderReader {
 public:
  /// Opens `dir` for a model of `expect`: config.json must give the same shape (else a
  /// kiln::Error naming both values and the key), every tensor of the layout must be
  /// present with its shape and no unknown tensor may be (errors name the shard file and
  /// tensor).
  HfFolderReader(const std::filesystem::path& dir, const ModelOptions& expect);
  /// The tensors of `layout` in a folder's safetensors files, or in one safetensors file
  /// `path`, with no config.json (the caller knows the shape); the same checks.
  HfFolderReader(const std::filesystem::path& path, const HfLayout& layout);
  ~HfFolderReader();
  /// Elements [begin, end) of kiln parameter `name` (row-major in kiln's global shape)
  /// into dst (end - begin floats). Transposed pieces are read whole, the others only in
  /// the range asked for.
  void read(const std::string& name, int64_t begin, int64_t end, float* dst) const;

 private:
  struct Impl;
  void open(const std::filesystem::path& path, const HfLayout& layout, const std::string& what);
  std::unique_ptr<Impl> impl_;
};

/// Writes the model of `options` (arch included) as a Hugging Face folder `out`,
/// atomically: config.json (ModelArch::hf_config, "torch_dtype" = `dtype`),
/// with `config_fields` merged in (e.g. bos_token_id, eos_token_id), generation_config.json
/// (the token ids of config.json), `extra_files` (name -> contents, e.g. tokenizer files) and the
/// tensors of its layout from `read` (a kiln parameter's fp32 values by name, full global
/// shape) in `dtype` (F32, BF16 or F16; rounded to nearest even), in shards of at most
/// `shard_bytes`. Throws kiln::Error for an architecture without folders.
void write_hf_folder(const ModelOptions& options,
                     const std::function<std::vector<float>(const std::string&)>& read,
                     DType dtype, uint64_t shard_bytes, const std::filesystem::path& out,
                     const std::map<std::string, std::string>& extra_files = {},
                     const nlohmann::json& config_fields = nlohmann::json::object());

}  // namespace kiln
