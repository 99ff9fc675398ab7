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

fs::path out_dir() {
  const char* env = std::getenv("KILN_HF_GOLDEN_OUT");
  return env ? fs::path(env) : fs::temp_directory_path() / "kiln_hf_golden";
}

}  // namespace

TEST(HfGolden, ExportsTheGoldenParametersAsFolders) {
  for (const std::string arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    const st::Reader r(golden_path(arch + "_golden.safetensors"));
    const ModelOptions o = golden_options(arch, r);
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
