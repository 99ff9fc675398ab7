// The golden parameters through kiln's Hugging Face folder export (models/hf_formats.h):
// each golden file's parameters (kiln's names and layouts) written as a folder
// ($KILN_HF_GOLDEN_OUT/gpt2, /llama; the Llama one in shards), read back bitwise. The
// folders are then checked by check_hf_folder.py (golden_hf_reference), which loads them
// by Hugging Face's names into the generators' own PyTorch models and compares the
// logits with the golden ones: the independent check of the names and layouts.
#include "golden_compare.h"

#include "models/hf_formats.h"
#include "models/registry.h"

#include <filesystem>

using namespace kiln;
using namespace kiln::golden;
namespace st = kiln::safetensors;
namespace fs = std::filesystem;

namespace {

ModelOptions options_of(const std::string& arch, const st::Reader& r) {
  ModelOptions o;
  o.arch = arch;
  o.n_layer = meta_int(r, "n_layer");
  o.n_head = meta_int(r, "n_head");
  o.n_embd = meta_int(r, "n_embd");
  o.vocab_size = meta_int(r, "vocab_size");
  o.block_size = meta_int(r, "block_size");
  if (arch == "llama") {
    o.n_kv_head = meta_int(r, "n_kv_head");
    o.ffn_hidden_size = meta_int(r, "ffn_hidden_size");
    o.norm_eps = static_cast<float>(meta_double(r, "norm_eps"));
    o.rope.theta = meta_double(r, "rope_theta");
    o.rope.scale_factor = meta_double(r, "rope_scaling.factor");
    o.rope.low_freq_factor = meta_double(r, "rope_scaling.low_freq_factor");
    o.rope.high_freq_factor = meta_double(r, "rope_scaling.high_freq_factor");
    o.rope.original_max_positions = meta_double(r, "rope_scaling.original_max_position");
    o.tie_embeddings = r.metadata("tie_embeddings") == "True";
  }
  return o;
}

fs::path out_dir() {
  const char* env = std::getenv("KILN_HF_GOLDEN_OUT");
  return env ? fs::path(env) : fs::temp_directory_path() / "kiln_hf_golden";
}

}  // namespace

TEST(HfGolden, ExportsTheGoldenParametersAsFolders) {
  for (const std::string arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    const st::Reader r(golden_path(arch + "_golden.safetensors"));
    const ModelOptions o = options_of(arch, r);
    const fs::path dir = out_dir() / arch;
    const uint64_t shard = arch == "llama" ? 16384 : 5'000'000'000;
    write_hf_folder(o, [&](const std::string& name) { return r.read_f32(name); }, DType::F32,
                    shard, dir);
    EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), arch == "llama");
    const HfFolderReader back(dir, o);
    for (const HfParam& p : model_arch(arch).hf_layout(o).params) {
      const std::vector<float> want = r.read_f32(p.name);
      std::vector<float> got(want.size());
      back.read(p.name, 0, p.shape.numel(), got.data());
      EXPECT_EQ(got, want) << p.name;
    }
  }
}
