// Tests for the training configuration: errors, presets, overrides, round trip,
// schedules, gradient accumulation and the shipped example configs.
#include "support/error_of.h"
#include "config/components.h"
#include "config/config.h"
#include "models/llama_config.h"
#include "models/registry.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace kiln {
namespace {

const char* kMinimal = R"(
[model]
n_layer = 2
n_head = 2
n_embd = 64
block_size = 32

[data]
dir = "data/x"

[train]
steps = 100
)";

std::string source_dir() {
  if (const char* env = std::getenv("KILN_SOURCE_DIR")) return env;
  return KILN_SOURCE_DIR_DEFAULT;
}

using kiln::testing::error_of;

std::string load_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { load_config_string(text, overrides, "config.toml"); });
}

// --- defaults and types ------------------------------------------------------------

TEST(TrainConfig, DefaultsFollowNanoGptPractice) {
  TrainConfig c = load_config_string(kMinimal);
  EXPECT_EQ(c.train.seed, 1337);
  EXPECT_EQ(c.train.dtype, "fp32");
  EXPECT_EQ(c.train.grad_dtype, "fp32");
  EXPECT_EQ(c.train.activation_checkpointing, "none");
  EXPECT_EQ(c.train.seq_len, 32);  // = block_size
  EXPECT_DOUBLE_EQ(c.optim.lr, 6e-4);
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);
  EXPECT_EQ(c.schedule.kind, "cosine");
  EXPECT_EQ(c.schedule.warmup_steps, 0);
  EXPECT_DOUBLE_EQ(c.schedule.decay_fraction, 0.2);
  EXPECT_EQ(c.eval.every, 0);
  EXPECT_EQ(c.eval.batches, 20);
  EXPECT_EQ(c.sample.tokens, 64);
  EXPECT_DOUBLE_EQ(c.sample.temperature, 1.0);
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_EQ(c.run.dir, "runs/default");
  EXPECT_EQ(c.log.every, 1);
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_DOUBLE_EQ(c.parallel.bucket_mb, 25.0);
  EXPECT_DOUBLE_EQ(c.parallel.timeout_s, 60.0);
  EXPECT_FALSE(c.profile.enabled());
  EXPECT_EQ(c.source, "<string>");
  EXPECT_NO_THROW(c.validate_for_training());
}

TEST(TrainConfig, WarmupLongerThanTheRunIsClamped) {
  // A short run of a longer config: --set train.steps=10 under warmup_steps = 11 loads (the
  // key keeps its value) and the schedule warms up over the 10 updates.
  TrainConfig c = load_config_string(std::string(kMinimal) + "[schedule]\nwarmup_steps = 11\n",
                                     {"train.steps=10"});
  EXPECT_EQ(c.schedule.warmup_steps, 11);
  EXPECT_EQ(lr_schedule_of(c).warmup_steps, 10);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), c.optim.lr);  // warmup's end: (9 + 1) / 10
  c = load_config_string(std::string(kMinimal) + "[schedule]\nwarmup_steps = 4\n", {"train.steps=10"});
  EXPECT_EQ(lr_schedule_of(c).warmup_steps, 4);
}

TEST(TrainConfig, IntegersAreAcceptedForFloats) {
  TrainConfig c = load_config_string(std::string(kMinimal) + "[optim]\nlr = 1\ngrad_clip = 0\n");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1.0);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 0.0);
}

// --- error classes -----------------------------------------------------------------

TEST(TrainConfigErrors, UnknownKeySuggestsTheClosest) {
  EXPECT_EQ(load_error("[optim]\nlrr = 3e-4\n"),
            "config.toml: unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
  EXPECT_EQ(load_error("[train]\nmicro_bach = 4\n"),
            "config.toml: unknown key 'train.micro_bach' (did you mean 'train.micro_batch'?)");
  // A key put in the wrong section is found by its last component.
  EXPECT_EQ(load_error("[train]\nlr = 3e-4\n"),
            "config.toml: unknown key 'train.lr' (did you mean 'optim.lr'?)");
  EXPECT_EQ(load_error("lr = 3e-4\n"), "config.toml: unknown key 'lr' (did you mean 'optim.lr'?)");
  // Case is not a distance: "EP" is "ep" mistyped, not "dp".
  EXPECT_EQ(load_error("[parallel]\nEP = 2\n"),
            "config.toml: unknown key 'parallel.EP' (did you mean 'parallel.ep'?)");
  // Nothing close: no suggestion.
  EXPECT_EQ(load_error("[optim]\nfrobnicate_everything = 1\n"),
            "config.toml: unknown key 'optim.frobnicate_everything'");
}

TEST(TrainConfigErrors, UnknownSectionSuggestsTheClosest) {
  EXPECT_EQ(load_error("[optimm]\nlr = 1e-3\n"),
            "config.toml: unknown section 'optimm' (did you mean 'optim'?)");
  EXPECT_EQ(load_error("[optimizer]\nlr = 1e-3\n"),
            "config.toml: unknown section 'optimizer' (did you mean 'optim'?)");
  EXPECT_EQ(load_error("[zzzzzzzzzz]\n"), "config.toml: unknown section 'zzzzzzzzzz'");
  EXPECT_EQ(load_error("model = 3\n"),
            "config.toml: 'model' must be a section ([model]), got integer");
}

TEST(TrainConfigErrors, WrongTypeNamesKeyExpectedAndGiven) {
  EXPECT_EQ(load_error("[train]\nsteps = \"100\"\n"),
            "config.toml: wrong type for key 'train.steps': expected integer, got string");
  EXPECT_EQ(load_error("[train]\nsteps = 100.0\n"),
            "config.toml: wrong type for key 'train.steps': expected integer, got float");
  EXPECT_EQ(load_error("[optim]\nlr = \"fast\"\n"),
            "config.toml: wrong type for key 'optim.lr': expected float, got string");
  EXPECT_EQ(load_error("[model]\npreset = 2\n"),
            "config.toml: wrong type for key 'model.preset': expected string, got integer");
  EXPECT_EQ(load_error("[run]\ndir = true\n"),
            "config.toml: wrong type for key 'run.dir': expected string, got boolean");
  EXPECT_EQ(load_error("[profile]\nsteps = 3\n"),
            "config.toml: wrong type for key 'profile.steps': expected array of integers, got integer");
  EXPECT_EQ(load_error("[profile]\nsteps = [1, 2.5]\n"),
            "config.toml: wrong type for key 'profile.steps': expected array of integers, got "
            "array containing float");
  EXPECT_EQ(load_error("[model]\nn_layer = 3000000000\n"),
            "config.toml: key 'model.n_layer' is out of range, got 3000000000");
}

TEST(TrainConfigErrors, BadValueNamesTheKey) {
  EXPECT_EQ(load_error(std::string(kMinimal) + "[parallel]\nzero_stage = 5\n"),
            "config.toml: key 'parallel.zero_stage' must be between 0 and 3, got 5");
  EXPECT_EQ(load_error(std::string(kMinimal) + "[schedule]\nkind = \"linear\"\n"),
            "config.toml: key 'schedule.kind' must be one of \"cosine\", \"constant\", \"wsd\", "
            "got \"linear\"");
  EXPECT_EQ(load_error("[train]\ndtype = \"fp8\"\n"),
            "config.toml: key 'train.dtype' must be one of \"fp32\", \"bf16\", \"fp16\", got \"fp8\"");
  EXPECT_EQ(load_error("[train]\nsteps = -5\n"),
            "config.toml: key 'train.steps' must be >= 0, got -5");
  EXPECT_EQ(load_error("[optim]\nlr = 0\n"), "config.toml: key 'optim.lr' must be > 0, got 0.0");
  EXPECT_EQ(load_error("[optim]\nbeta2 = 1.0\n"),
            "config.toml: key 'optim.beta2' must be in [0, 1), got 1.0");
  EXPECT_EQ(load_error("[train]\nema_decay = 1.0\n"),
            "config.toml: key 'train.ema_decay' must be in [0, 1), got 1.0");
  EXPECT_EQ(load_error("[train]\nema_decay = -0.1\n"),
            "config.toml: key 'train.ema_decay' must be in [0, 1), got -0.1");
  EXPECT_EQ(load_error("[model]\npreset = \"gpt3\"\n"),
            "config.toml: key 'model.preset' must be one of \"\", \"gpt2\", \"gpt2-medium\", "
            "\"gpt2-large\", \"gpt2-xl\", \"llama3.2-1b\", \"llama3.2-3b\", "
            "\"llama3.1-8b\", \"llama3.1-70b\", got \"gpt3\"");
  // Keys that depend on each other.
  EXPECT_EQ(load_error("[model]\nn_head = 5\nn_embd = 64\n"),
            "config.toml: key 'model.n_embd' (64) must be divisible by model.n_head (5)");
  EXPECT_EQ(load_error("[model]\nblock_size = 32\n[train]\nseq_len = 64\n"),
            "config.toml: key 'train.seq_len' (64) must not exceed model.block_size (32)");
  EXPECT_EQ(load_error("[train]\nmicro_batch = 3\nglobal_batch = 16\n"),
            "config.toml: key 'train.global_batch' (16) must be a multiple of train.micro_batch (3)");
  EXPECT_EQ(load_error("[schedule]\nmin_lr = 1.0\n"),
            "config.toml: key 'schedule.min_lr' (1) must not exceed optim.lr (0.0006)");
  EXPECT_EQ(load_error("[profile]\ntiming = \"gpu\"\n"),
            "config.toml: key 'profile.timing' must be one of \"sync\", \"events\", got \"gpu\"");
  EXPECT_EQ(load_error("[profile]\nsteps = [5, 3]\n"),
            "config.toml: key 'profile.steps' must be [] or [a, b] with 0 <= a < b, got [5, 3]");
  EXPECT_EQ(load_error("[profile]\nsteps = [1, 2, 3]\n"),
            "config.toml: key 'profile.steps' must be [] or [a, b] with 0 <= a < b, got [1, 2, 3]");
}

TEST(TrainConfigErrors, TomlSyntaxErrorsAreOneLineWithPosition) {
  std::string e = load_error("[model]\nn_layer = = 3\n");
  EXPECT_EQ(e.rfind("config.toml:2:", 0), 0u) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  e = load_error(std::string(kMinimal) + "[train]\n");  // a section defined twice
  EXPECT_EQ(e.rfind("config.toml:13:1: ", 0), 0u) << e;
  EXPECT_NE(e.find("'train'"), std::string::npos) << e;
}

TEST(TrainConfigErrors, MissingFile) {
  std::string e = error_of([] { load_config_file("/nonexistent/kiln.toml"); });
  EXPECT_EQ(e, "/nonexistent/kiln.toml: cannot open the config file");
}

TEST(TrainConfigErrors, ValidateForTraining) {
  auto train_error = [](const std::string& text) {
    return error_of([&] { load_config_string(text, {}, "c.toml").validate_for_training(); });
  };
  EXPECT_EQ(train_error("[model]\npreset = \"gpt2\"\n[train]\nsteps = 1\n"),
            "c.toml: key 'data.dir' (or data.blend) is required for training");
  EXPECT_EQ(train_error("[data]\ndir = \"d\"\n[train]\nsteps = 1\n"),
            "c.toml: key 'model.n_layer' is required for training (set it or model.preset)");
  EXPECT_EQ(train_error("[data]\ndir = \"d\"\n[model]\npreset = \"gpt2\"\n"),
            "c.toml: key 'train.steps' must be > 0 for training");
  EXPECT_EQ(train_error("[data]\ndir = \"d\"\n[model]\npreset = \"gpt2\"\n[train]\nsteps = 1\n"), "");
}

// --- --set overrides ---------------------------------------------------------------

TEST(TrainConfigSet, OverridesAreParsedByDeclaredType) {
  TrainConfig c = load_config_string(kMinimal, {"optim.lr=3e-4", "model.preset=gpt2",
                                                "profile.steps=[3,5]", "train.steps=7",
                                                "sample.prompt=In the beginning",
                                                "run.dir = \"runs/x y\"", "optim.grad_clip=0"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.model.preset, "gpt2");
  EXPECT_EQ(c.profile.steps, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(c.profile.enabled());
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.sample.prompt, "In the beginning");
  EXPECT_EQ(c.run.dir, "runs/x y");
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 0.0);
}

TEST(TrainConfigSet, LaterOverridesWinAndArraysMayOmitBrackets) {
  TrainConfig c = load_config_string(kMinimal, {"train.steps=7", "train.steps=9",
                                                "profile.steps=2,4", "model.init_from="});
  EXPECT_EQ(c.train.steps, 9);
  EXPECT_EQ(c.profile.steps, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(c.model.init_from, "");
  c = load_config_string(std::string(kMinimal) + "[profile]\nsteps = [1, 2]\n",
                         {"profile.steps=[]"});
  EXPECT_FALSE(c.profile.enabled());
}

TEST(TrainConfigSet, Errors) {
  EXPECT_EQ(load_error(kMinimal, {"optim.lrr=3e-4"}),
            "--set: unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
  EXPECT_EQ(load_error(kMinimal, {"optim.lr"}), "--set 'optim.lr': expected section.key=value");
  EXPECT_EQ(load_error(kMinimal, {"=3"}), "--set '=3': expected section.key=value");
  EXPECT_EQ(load_error(kMinimal, {"optim.lr=fast"}),
            "--set: wrong type for key 'optim.lr': expected float, got 'fast'");
  EXPECT_EQ(load_error(kMinimal, {"train.steps=2.5"}),
            "--set: wrong type for key 'train.steps': expected integer, got float");
  EXPECT_EQ(load_error(kMinimal, {"train.steps=abc"}),
            "--set: wrong type for key 'train.steps': expected integer, got 'abc'");
  EXPECT_EQ(load_error(kMinimal, {"optim.lr=true"}),
            "--set: wrong type for key 'optim.lr': expected float, got boolean");
  EXPECT_EQ(load_error(kMinimal, {"profile.steps=[1,x]"}),
            "--set: wrong type for key 'profile.steps': expected array of integers, got '[1,x]'");
  // Value errors are attributed to --set when the bad value came from there.
  const std::string cp2 = std::string(kMinimal) + "[parallel]\ncp = 2\n";
  const char* cp_tail = " is not a multiple of 2 x parallel.cp = 4 (context parallelism "
                        "cuts each sequence into 2 x cp equal chunks)";
  EXPECT_EQ(load_error(cp2, {"train.seq_len=30"}),
            std::string("--set: train.seq_len = 30") + cp_tail);
  std::string in_file = cp2;
  in_file.replace(in_file.find("steps = 100"), 11, "steps = 100\nseq_len = 30");
  EXPECT_EQ(load_error(in_file), std::string("config.toml: train.seq_len = 30") + cp_tail);
  EXPECT_EQ(load_error(cp2, {"model.block_size=30"}),
            std::string("--set: train.seq_len = 30 (model.block_size's)") + cp_tail);
  EXPECT_EQ(load_error(kMinimal, {"parallel.zero_stage=5"}),
            "--set: key 'parallel.zero_stage' must be between 0 and 3, got 5");
  EXPECT_EQ(load_error(kMinimal, {"model.preset=gpt3"}),
            "--set: key 'model.preset' must be one of \"\", \"gpt2\", \"gpt2-medium\", "
            "\"gpt2-large\", \"gpt2-xl\", \"llama3.2-1b\", \"llama3.2-3b\", "
            "\"llama3.1-8b\", \"llama3.1-70b\", got \"gpt3\"");
}

// --- presets -----------------------------------------------------------------------

TEST(TrainConfigPreset, FillsShapeAndExplicitKeysOverride) {
  TrainConfig c = load_config_string("[model]\npreset = \"gpt2\"\n");
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_EQ(c.model.n_head, 12);
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(c.model.block_size, 1024);
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.train.seq_len, 1024);

  c = load_config_string("[model]\npreset = \"gpt2-medium\"\nn_layer = 4\nvocab_size = 0\n",
                         {"model.block_size=512"});
  EXPECT_EQ(c.model.n_layer, 4);       // explicit in the file
  EXPECT_EQ(c.model.n_head, 16);       // preset
  EXPECT_EQ(c.model.n_embd, 1024);     // preset
  EXPECT_EQ(c.model.block_size, 512);  // --set
  EXPECT_EQ(c.model.vocab_size, 0);    // explicit 0: from meta.json
  EXPECT_EQ(c.train.seq_len, 512);

  // A preset given by --set fills the shape too, and the file's explicit keys still win.
  c = load_config_string("[model]\nn_embd = 1280\n", {"model.preset=gpt2-large"});
  EXPECT_EQ(c.model.n_layer, 36);
  EXPECT_EQ(c.model.n_head, 20);
  EXPECT_EQ(c.model.n_embd, 1280);

  c = load_config_string("[model]\npreset = \"gpt2-xl\"\n");
  EXPECT_EQ(c.model.n_layer, 48);
  EXPECT_EQ(c.model.n_head, 25);
  EXPECT_EQ(c.model.n_embd, 1600);
}

TEST(TrainConfigPreset, AnotherArchitecturesPresetNamesBothKeys) {
  EXPECT_EQ(load_error("[model]\narch = \"vit\"\n", {"model.preset=gpt2"}),
            "--set: key 'model.preset' ('gpt2') is a gpt2 preset, but model.arch is 'vit' "
            "(config.toml); vit presets: none");
  EXPECT_EQ(load_error("[model]\narch = \"gpt2\"\npreset = \"llama3.2-1b\"\n"),
            "config.toml: key 'model.preset' ('llama3.2-1b') is a llama preset, but model.arch is "
            "'gpt2' (config.toml); gpt2 presets: gpt2, gpt2-medium, gpt2-large, gpt2-xl");
  // A preset of the arch set explicitly is fine.
  EXPECT_EQ(load_config_string("[model]\narch = \"llama\"\npreset = \"llama3.2-1b\"\n")
                .model.family.at("n_kv_head"), 8);
}

TEST(TrainConfigPreset, TableIsComplete) {
  auto presets = model_presets();
  ASSERT_EQ(presets.size(), 8u);
  for (const auto& p : presets) {
    EXPECT_EQ(p.n_embd % p.n_head, 0) << p.name;
    const bool llama = p.arch == "llama";
    EXPECT_EQ(p.name.starts_with("llama3."), llama) << p.name;
    EXPECT_EQ(p.block_size, llama ? 131072 : 1024) << p.name;
    EXPECT_EQ(p.vocab_size, llama ? 128256 : 50257) << p.name;
    if (llama) {
      EXPECT_EQ(p.n_head % static_cast<int>(p.keys.at("n_kv_head")), 0) << p.name;
    }
  }
}

// --- to_toml and hash --------------------------------------------------------------

TEST(TrainConfigToml, RoundTripGivesAnIdenticalConfig) {
  TrainConfig c = load_config_string(
      "[model]\npreset = \"gpt2\"\nn_layer = 3\ndropout = 0.1\n"
      "[data]\ndir = \"data/with \\\"quotes\\\" and \\\\ back\"\n"
      "[sample]\nprompt = \"line1\\nline2\\ttab\"\ntemperature = 0.8\n",
      {"optim.lr=3e-4", "profile.steps=[3,5]", "optim.eps=1e-10", "schedule.kind=wsd",
       "schedule.min_lr=0.00003"});
  std::string text = c.to_toml();
  TrainConfig back = load_config_string(text, {}, "resolved.toml");
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(back.to_toml(), text);
  EXPECT_EQ(back.hash(), c.hash());
  EXPECT_EQ(back.model.n_layer, 3);
  EXPECT_EQ(back.model.n_head, 12);
  EXPECT_EQ(back.data.dir, "data/with \"quotes\" and \\ back");
  EXPECT_EQ(back.sample.prompt, "line1\nline2\ttab");
}

TEST(TrainConfigToml, WritesEveryKey) {
  // Every key of model.arch: the common ones and its family's (ModelArch::keys), not the
  // keys only other families declare.
  for (const std::string arch : {"gpt2", "llama", "vit", "dit"}) {
    SCOPED_TRACE(arch);
    const std::string text = load_config_string(kMinimal, {"model.arch=" + arch}).to_toml();
    for (const auto& k : config_keys()) {
      auto dot = k.name.find('.');
      std::string section = fmt::format("[{}]\n", k.name.substr(0, dot));
      std::string line = fmt::format("\n{} = ", k.name.substr(dot + 1));
      auto at = text.find(section);
      ASSERT_NE(at, std::string::npos) << k.name;
      const std::string_view in_model = k.name.substr(dot + 1);
      const bool other_family = k.name.starts_with("model.") &&
                                !model_archs_with_key(in_model).empty() &&
                                !find_model_key(model_arch(arch).keys, in_model);
      EXPECT_EQ(text.find(line, at) != std::string::npos, !other_family) << k.name;
    }
  }
  TrainConfig c = load_config_string(kMinimal);
  std::string text = c.to_toml();
  EXPECT_NE(text.find("lr = 0.0006\n"), std::string::npos) << text;
  EXPECT_NE(text.find("grad_clip = 1.0\n"), std::string::npos) << text;  // stays a float
  EXPECT_NE(text.find("steps = []\n"), std::string::npos) << text;
  EXPECT_NE(text.find("seq_len = 32\n"), std::string::npos) << text;  // resolved
}

// Run directories of earlier versions hold a config.toml listing every [model] key of every
// family at its default (fixtures/*_run_config_v1.toml: written by kiln train before the
// keys moved to the families); `kiln train RUN/config.toml` must still load them.
TEST(TrainConfigToml, EarlierVersionsRunConfigsStillLoad) {
  const std::string dir = source_dir() + "/tests/config/fixtures/";
  const TrainConfig gpt2 = load_config_file(dir + "gpt2_run_config_v1.toml");
  EXPECT_EQ(gpt2.model.arch, "gpt2");
  EXPECT_TRUE(gpt2.model.family.empty());
  EXPECT_EQ(gpt2.to_toml().find("n_kv_head"), std::string::npos);
  const TrainConfig llama = load_config_file(dir + "llama_run_config_v1.toml");
  const std::map<std::string, double, std::less<>> want{
      {"n_kv_head", 2}, {"ffn_hidden_size", 24}, {"norm_eps", 1e-5}, {"rope_theta", 500000},
      {"rope_scaling.factor", 8}, {"rope_scaling.low_freq_factor", 1},
      {"rope_scaling.high_freq_factor", 4}, {"rope_scaling.original_max_position", 64},
      {"tie_embeddings", 1},
      {"head_dim", 0}, {"qk_norm", 0},
      // keys added since, at their defaults (a dense model)
      {"moe.num_experts", 0}, {"moe.top_k", 2}, {"moe.ffn_hidden_size", 0},
      {"moe.shared_experts", 0}, {"moe.scoring", 0}, {"moe.routing", 0}, {"moe.norm_topk_prob", 1},
      {"moe.first_k_dense", 0}, {"moe.sparse_step", 1}, {"moe.aux_loss_coef", 0},
      {"moe.aux_loss_type", 0}, {"moe.aux_loss_scope", 0}, {"moe.z_loss_coef", 0},
      {"moe.expert_bias", 0}, {"moe.bias_update_rate", 1e-3}, {"moe.capacity_factor", 0}};
  EXPECT_EQ(llama.model.family, want);
  EXPECT_EQ(llama.model.family_lists,
            (std::map<std::string, std::vector<int>, std::less<>>{{"moe.dense_layers", {}}}));
  const TrainConfig vit = load_config_file(dir + "vit_run_config_v1.toml");
  EXPECT_EQ(vit.model.family.at("image_size"), 8);
  EXPECT_EQ(vit.model.family.at("num_classes"), 3);
  EXPECT_EQ(vit.model.family.at("patch_size"), 4);
  EXPECT_FALSE(vit.model.family.contains("class_dropout"));  // dit's, at its default
  for (const TrainConfig* c : {&gpt2, &llama, &vit})
    EXPECT_EQ(load_config_string(c->to_toml()), *c) << c->model.arch;
}

// moe.dense_layers, an integer-list [model] key: a TOML array, --set as [..] or a,b (as
// the other list keys), written back by to_toml(), each index checked against n_layer.
TEST(TrainConfigModelKeys, DenseLayersIsAnIntegerList) {
  const std::string base = "[model]\narch = \"llama\"\nn_layer = 4\nn_head = 2\nn_embd = 16\n"
                           "vocab_size = 64\nblock_size = 8\n[model.moe]\nnum_experts = 4\n";
  const TrainConfig c = load_config_string(base + "dense_layers = [0, 3]\n");
  EXPECT_EQ(c.model.family_lists.at("moe.dense_layers"), (std::vector<int>{0, 3}));
  EXPECT_FALSE(c.model.family.contains("moe.dense_layers"));
  const std::string text = c.to_toml();
  EXPECT_NE(text.find("moe.dense_layers = [0, 3]\n"), std::string::npos) << text;
  EXPECT_EQ(load_config_string(text), c);
  for (const char* set : {"model.moe.dense_layers=[3,0]", "model.moe.dense_layers=3,0"})
    EXPECT_EQ(load_config_string(base, {set}).model.family_lists.at("moe.dense_layers"),
              (std::vector<int>{3, 0})) << set;
  EXPECT_TRUE(load_config_string(base, {"model.moe.dense_layers="})
                  .model.family_lists.at("moe.dense_layers").empty());
  EXPECT_TRUE(load_config_string(base).model.family_lists.at("moe.dense_layers").empty());
  const LlamaConfig lc = llama_config_of(model_options_from(c));
  EXPECT_FALSE(lc.is_moe_block(0));
  EXPECT_TRUE(lc.is_moe_block(1));
  EXPECT_TRUE(lc.is_moe_block(2));
  EXPECT_FALSE(lc.is_moe_block(3));
  // One line naming the key, for a wrong type, an index out of [0, n_layer) or twice.
  EXPECT_EQ(load_error(base + "dense_layers = 3\n"),
            "config.toml: wrong type for key 'model.moe.dense_layers': expected array of "
            "integers, got integer");
  EXPECT_EQ(load_error(base, {"model.moe.dense_layers=[1.5]"}),
            "--set: wrong type for key 'model.moe.dense_layers': expected array of integers, got "
            "array containing float");
  EXPECT_EQ(load_error(base + "dense_layers = [-1]\n"),
            "config.toml: key 'model.moe.dense_layers' holds -1: each element must be >= 0");
  EXPECT_EQ(load_error(base + "dense_layers = [4]\n"),
            "config.toml: model.moe.dense_layers holds 4: not a block index in [0, model.n_layer "
            "= 4)");
  EXPECT_EQ(load_error(base, {"model.moe.dense_layers=1,1"}),
            "--set: model.moe.dense_layers holds 1 twice");
  EXPECT_EQ(load_error(base + "dense_layers = [0, 1, 2, 3]\n"),
            "config.toml: model.moe.first_k_dense (0), model.moe.sparse_step (1) and "
            "model.moe.dense_layers ([0, 1, 2, 3]) leave no MoE block among the model.n_layer = "
            "4 blocks");
  // A dense model: set but unused.
  EXPECT_EQ(load_error(base + "dense_layers = [1]\n", {"model.moe.num_experts=0"}),
            "config.toml: model.moe.dense_layers is set but model.moe.num_experts is 0 (a dense "
            "model): set moe.num_experts or drop moe.dense_layers");
  // Another family's list key at its default ([]) is accepted (earlier to_toml()s).
  EXPECT_NO_THROW(load_config_string("[model]\nmoe.dense_layers = []\n"));
  EXPECT_EQ(load_error("[model]\nmoe.dense_layers = [1]\n"),
            "config.toml: key 'model.moe.dense_layers' is not a key of model.arch 'gpt2' (llama, "
            "llava have it)");
}

// A key of another family than model.arch's is one line naming the archs that have it,
// unless it holds their default (above); a key no family has is an unknown key.
TEST(TrainConfigModelKeys, AnotherFamilysKeyNamesTheArchsThatHaveIt) {
  EXPECT_EQ(load_error("[model]\nn_kv_head = 2\n"),
            "config.toml: key 'model.n_kv_head' is not a key of model.arch 'gpt2' (llama, llava "
            "have it)");
  EXPECT_EQ(load_error("", {"model.ffn_hidden_size=64"}),
            "--set: key 'model.ffn_hidden_size' is not a key of model.arch 'gpt2' (dit, llama, "
            "llava, mmdit, vit have it)");
  EXPECT_EQ(load_error("[model]\narch = \"vit\"\n[model.rope_scaling]\nfactor = 8.0\n"),
            "config.toml: key 'model.rope_scaling.factor' is not a key of model.arch 'vit' (llama, "
            "llava have it)");
  EXPECT_EQ(load_error("[model]\nclass_dropout = 0.2\n", {"model.arch=vit"}),
            "config.toml: key 'model.class_dropout' is not a key of model.arch 'vit' (dit has it)");
  // The arch is known from the preset too.
  EXPECT_EQ(load_config_string("[model]\npreset = \"llama3.2-1b\"\nn_kv_head = 4\n")
                .model.family.at("n_kv_head"), 4);
  EXPECT_EQ(load_error("[model]\nn_kv_hed = 2\n"),
            "config.toml: unknown key 'model.n_kv_hed' (did you mean 'model.n_kv_head'?)");
  // Type and range as any key.
  EXPECT_EQ(load_error("[model]\narch = \"llama\"\nn_kv_head = 2.5\n"),
            "config.toml: wrong type for key 'model.n_kv_head': expected integer, got float");
  EXPECT_EQ(load_error("", {"model.arch=dit", "model.class_dropout=1"}),
            "--set: key 'model.class_dropout' must be in [0, 1), got 1.0");
  EXPECT_EQ(load_error("", {"model.arch=llama", "model.tie_embeddings=yes"}),
            "--set: wrong type for key 'model.tie_embeddings': expected boolean, got 'yes'");
}

TEST(TrainConfigToml, HashIsStableAndSensitive) {
  TrainConfig a = load_config_string(kMinimal);
  TrainConfig b = load_config_string(kMinimal, {}, "other-name.toml");
  EXPECT_EQ(a.hash(), b.hash());  // the source name is not part of the config
  EXPECT_EQ(a.hash().size(), 16u);
  EXPECT_EQ(a.hash().find_first_not_of("0123456789abcdef"), std::string::npos);
  TrainConfig c = load_config_string(kMinimal, {"train.seed=1338"});
  EXPECT_NE(a.hash(), c.hash());
  EXPECT_FALSE(a == c);
}

// --- the keys that replaced environment variables ------------------------------------
// (train.classifier_chunk_mb, backend.*, optim.multi_tensor, parallel.communicator;
// docs/config.md, "Environment variables"). Each reaches its code through an explicit
// API: tests/train/device_test.cpp (backend options, communicator), tests/nn (the chunk),
// tests/optim (AdamW's two paths).

const std::vector<std::string> kSwitchesSet = {
    "train.classifier_chunk_mb=256", "backend.tf32=true",        "backend.gemm_tuning=true",
    "backend.attention=simt",        "optim.multi_tensor=false", "parallel.communicator=local"};

TEST(TrainConfigSwitches, DefaultsAreTheExactPaths) {
  const TrainConfig c = load_config_string(kMinimal);
  EXPECT_EQ(c.train.classifier_chunk_mb, 16.0);
  EXPECT_FALSE(c.backend.tf32);
  EXPECT_FALSE(c.backend.gemm_tuning);
  EXPECT_EQ(c.backend.attention, "auto");
  EXPECT_TRUE(c.optim.multi_tensor);
  EXPECT_EQ(c.parallel.communicator, "auto");
}

TEST(TrainConfigSwitches, BadValuesNameTheKey) {
  EXPECT_EQ(load_error("[train]\nclassifier_chunk_mb = 0\n"),
            "config.toml: key 'train.classifier_chunk_mb' must be > 0, got 0.0");
  EXPECT_EQ(load_error("[train]\nclassifier_chunk_mb = -3.0\n"),
            "config.toml: key 'train.classifier_chunk_mb' must be > 0, got -3.0");
  EXPECT_EQ(load_error("[train]\nclassifier_chunk_mb = \"16MB\"\n"),
            "config.toml: wrong type for key 'train.classifier_chunk_mb': expected float, got "
            "string");
  EXPECT_EQ(load_error("[backend]\ntf32 = 1\n"),
            "config.toml: wrong type for key 'backend.tf32': expected boolean, got integer");
  EXPECT_EQ(load_error("[backend]\ngemm_tuning = \"yes\"\n"),
            "config.toml: wrong type for key 'backend.gemm_tuning': expected boolean, got string");
  EXPECT_EQ(load_error("[backend]\nattention = \"flash\"\n"),
            "config.toml: key 'backend.attention' must be one of \"auto\", \"simt\", got \"flash\"");
  EXPECT_EQ(load_error("[optim]\nmulti_tensor = 0\n"),
            "config.toml: wrong type for key 'optim.multi_tensor': expected boolean, got integer");
  EXPECT_EQ(load_error("[parallel]\ncommunicator = \"gloo\"\n"),
            "config.toml: key 'parallel.communicator' must be one of \"auto\", \"local\", "
            "\"mpi\", \"nccl\", got \"gloo\"");
  EXPECT_EQ(load_error(kMinimal, {"optim.multi_tensor=off"}),
            "--set: wrong type for key 'optim.multi_tensor': expected boolean, got 'off'");
  EXPECT_EQ(load_error(kMinimal, {"train.classifier_chunk_mb=x"}),
            "--set: wrong type for key 'train.classifier_chunk_mb': expected float, got 'x'");
  EXPECT_EQ(load_error(kMinimal, {"backend.attention=simd"}),
            "--set: key 'backend.attention' must be one of \"auto\", \"simt\", got \"simd\"");
  EXPECT_EQ(load_error("[backend]\ntf33 = true\n"),
            "config.toml: unknown key 'backend.tf33' (did you mean 'backend.tf32'?)");
}

TEST(TrainConfigSwitches, RoundTripThroughToTomlAndChangeTheHash) {
  const TrainConfig base = load_config_string(kMinimal);
  const TrainConfig c = load_config_string(kMinimal, kSwitchesSet);
  EXPECT_EQ(c.train.classifier_chunk_mb, 256.0);
  EXPECT_TRUE(c.backend.tf32);
  EXPECT_TRUE(c.backend.gemm_tuning);
  EXPECT_EQ(c.backend.attention, "simt");
  EXPECT_FALSE(c.optim.multi_tensor);
  EXPECT_EQ(c.parallel.communicator, "local");
  const std::string text = c.to_toml();
  EXPECT_NE(text.find("\n[backend]\ntf32 = true\ngemm_tuning = true\nattention = \"simt\"\n"),
            std::string::npos) << text;
  const TrainConfig back = load_config_string(text, {}, "resolved.toml");
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(back.to_toml(), text);
  EXPECT_EQ(back.hash(), c.hash());
  for (const std::string& one : kSwitchesSet) {  // each key alone is in the hash
    const TrainConfig d = load_config_string(kMinimal, {one});
    EXPECT_NE(d.hash(), base.hash()) << one;
    EXPECT_FALSE(d == base) << one;
  }
}

// --- schedule ----------------------------------------------------------------------

TrainConfig schedule_config(const std::string& kind, int64_t steps, int64_t warmup,
                            double min_lr, double decay_fraction = 0.2) {
  return load_config_string(
      "", {"optim.lr=1.0", "schedule.kind=" + kind, "train.steps=" + std::to_string(steps),
           "schedule.warmup_steps=" + std::to_string(warmup),
           "schedule.min_lr=" + std::to_string(min_lr),
           "schedule.decay_fraction=" + std::to_string(decay_fraction)});
}

TEST(Schedule, LinearWarmup) {
  TrainConfig c = schedule_config("cosine", 100, 10, 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);  // cosine starts at lr
  EXPECT_THROW(learning_rate(c, -1), Error);
}

TEST(Schedule, CosineEndsAtMinLr) {
  TrainConfig c = schedule_config("cosine", 110, 10, 0.1);
  EXPECT_NEAR(learning_rate(c, 60), 0.55, 1e-12);  // half way: mean of lr and min_lr
  EXPECT_NEAR(learning_rate(c, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(learning_rate(c, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(c, 500), 0.1);
  for (int64_t s = 10; s < 110; ++s) EXPECT_GE(learning_rate(c, s), learning_rate(c, s + 1));
  // No warmup: starts at lr.
  EXPECT_DOUBLE_EQ(learning_rate(schedule_config("cosine", 100, 0, 0.0), 0), 1.0);
}

TEST(Schedule, Constant) {
  TrainConfig c = schedule_config("constant", 100, 4, 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 99), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 1000), 1.0);
}

TEST(Schedule, WarmupStableDecay) {
  // 100 steps, 10 warmup, the last 20 decay linearly from 1.0 to 0.0.
  TrainConfig c = schedule_config("wsd", 100, 10, 0.0, 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.1);   // warmup
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1.0);  // stable
  EXPECT_DOUBLE_EQ(learning_rate(c, 79), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 80), 1.0);  // decay starts
  EXPECT_DOUBLE_EQ(learning_rate(c, 90), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(c, 95), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 100), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 150), 0.0);
  // min_lr is the floor.
  TrainConfig m = schedule_config("wsd", 100, 0, 0.2, 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(m, 49), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(m, 75), 0.6);
  EXPECT_DOUBLE_EQ(learning_rate(m, 100), 0.2);
}

// --- gradient accumulation ---------------------------------------------------------

TEST(GradAccum, DividesTheGlobalBatch) {
  TrainConfig c = load_config_string(kMinimal, {"train.micro_batch=4", "train.global_batch=32"},
                                     "g.toml");
  EXPECT_EQ(c.grad_accum_steps(1), 8);
  EXPECT_EQ(c.grad_accum_steps(2), 4);
  EXPECT_EQ(c.grad_accum_steps(8), 1);
  EXPECT_EQ(error_of([&] { c.grad_accum_steps(3); }),
            "g.toml: key 'train.global_batch' (32) must be a multiple of train.micro_batch (4) * "
            "data-parallel size (3) = 12");
  EXPECT_THROW(c.grad_accum_steps(16), Error);  // 64 per step > 32
  EXPECT_THROW(c.grad_accum_steps(0), Error);
  c.train.global_batch = 0;  // no accumulation
  EXPECT_EQ(c.grad_accum_steps(3), 1);
}

// --- shipped files -----------------------------------------------------------------

TEST(ExampleConfigs, Load) {
  TrainConfig demo = load_config_file(source_dir() + "/configs/demo.toml");
  EXPECT_NO_THROW(demo.validate_for_training());
  EXPECT_EQ(demo.model.n_layer, 4);
  EXPECT_EQ(demo.model.n_embd, 256);
  EXPECT_EQ(demo.data.dir, "data/kjv");
  EXPECT_EQ(demo.grad_accum_steps(1), 4);
  EXPECT_EQ(demo.grad_accum_steps(4), 1);  // mpirun -np 4 kiln train configs/demo.toml
  EXPECT_EQ(demo.run.dir, "runs/demo");

  TrainConfig gpt2 = load_config_file(source_dir() + "/configs/gpt2-124m.toml");
  EXPECT_NO_THROW(gpt2.validate_for_training());
  EXPECT_EQ(gpt2.model.n_layer, 12);
  EXPECT_EQ(gpt2.model.vocab_size, 50257);
  EXPECT_EQ(gpt2.train.micro_batch, 4);
  EXPECT_EQ(gpt2.train.seq_len, 64);
  EXPECT_EQ(gpt2.data.dir, "data/kjv");
}

// Every shipped config loads (some are for planning, without data); the mixture-of-experts
// ones validate for training and hold their shape.
TEST(ExampleConfigs, EveryFileLoads) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_config_file(entry.path().string()));
    ++n;
  }
  EXPECT_GE(n, 8);
  TrainConfig mixtral = load_config_file(source_dir() + "/configs/demo-moe.toml");
  EXPECT_NO_THROW(mixtral.validate_for_training());
  EXPECT_EQ(mixtral.model.family.at("moe.num_experts"), 8);
  EXPECT_EQ(mixtral.model.family.at("moe.top_k"), 2);
  TrainConfig qwen = load_config_file(source_dir() + "/configs/qwen3-moe-tiny.toml");
  EXPECT_NO_THROW(qwen.validate_for_training());
  EXPECT_EQ(qwen.model.family.at("moe.num_experts"), 16);
  EXPECT_EQ(qwen.model.family.at("qk_norm"), 1);
  EXPECT_EQ(qwen.model.family.at("head_dim"), 32);
}

TEST(ExampleConfigs, DocsListEveryKey) {
  std::ifstream in(source_dir() + "/docs/config.md");
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  for (const auto& k : config_keys())
    EXPECT_NE(doc.find(fmt::format("`{}`", k.name)), std::string::npos)
        << k.name << " is missing from docs/config.md";
}

}  // namespace
}  // namespace kiln
