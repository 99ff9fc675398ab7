// The training configuration: one TOML file plus `--set section.key=value` overrides.
//
// `kiln train CONFIG.toml [--set section.key=value]...` reads the file with toml++,
// applies the overrides in order, fills in the model preset and the derived defaults
// and validates every value. Any problem becomes a one-line kiln::Error naming the
// file (or "--set") and the key at fault, e.g.
//   config.toml: unknown key 'optim.lrr' (did you mean 'optim.lr'?)
//
// Every key, its type, default and meaning is listed in docs/config.md and, for
// programs, by config_keys(). The learning-rate schedule lives here too, as the pure
// function learning_rate().
#pragma once

#include "optim/schedule.h"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

/// [model]: the network's shape and where its initial weights come from.
struct ModelSection {
  std::string arch = "gpt2";  // the architecture (models/registry.h)
  std::string preset;     // "" = none; "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"
  int n_layer = 0;        // 0 = unset (required unless a preset gives it)
  int n_head = 0;
  int n_embd = 0;
  int block_size = 0;     // maximum sequence length
  int vocab_size = 0;     // 0 = take it from the data set's meta.json
  double dropout = 0.0;
  std::string init_from;  // "" = random init; a kiln checkpoint dir, a Hugging Face folder, an llm.c .bin or a .safetensors
  /// "PREFIX=PATH" each: the parameters named PREFIX.* start from another model's (a kiln
  /// checkpoint or a Hugging Face folder) of the names after the prefix (open_part_weights).
  std::vector<std::string> init_parts;
  /// The keys of model.arch's family (ModelArch::keys, e.g. n_kv_head, rope_scaling.factor,
  /// image_size) by name within [model], every one the arch declares (its default where
  /// nothing set it); bools 0 / 1.
  std::map<std::string, double, std::less<>> family;
  /// The family's integer-list keys (ModelKeyType::IntegerList, e.g. moe.dense_layers), every
  /// one the arch declares ([] where nothing set it).
  std::map<std::string, std::vector<int>, std::less<>> family_lists;
  bool operator==(const ModelSection&) const = default;
};

/// [data]: the tokenized data set.
struct DataSection {
  std::string dir;  // one data set; this or blend is required for training
  /// Weighted data sets, Megatron's --data-path style: ["0.3", "dir/a", "0.7", "dir/b"]
  /// (data/blend.h). Exclusive with dir.
  std::vector<std::string> blend;
  /// "none" or "document": documents packed with masks (data/packing.h).
  std::string packing = "none";
  bool operator==(const DataSection&) const = default;
};

/// [train.lora]: low-rank adapters on a frozen base (docs/lora.md; models/lora_plan.h).
struct LoraSection {
  int64_t rank = 0;          // r; 0 = no LoRA (every parameter trains)
  double alpha = 16.0;       // scale alpha / r (alpha / sqrt(r) with rslora)
  bool rslora = false;
  double dropout = 0.0;      // on the adapters' input
  std::vector<std::string> targets = {"q", "v"};  // roles or glob patterns
  std::string init_from;     // a PEFT adapter folder the adapters start from; "" = fresh
  std::string dtype = "fp32";  // the adapters' storage: fp32 or train.dtype
  bool operator==(const LoraSection&) const = default;
};

/// [train]: batch geometry, length of the run, precision.
struct TrainSection {
  int64_t steps = 0;        // optimizer updates; required (> 0) for training
  int micro_batch = 4;      // sequences per rank per micro-step
  int global_batch = 0;     // sequences per update over all ranks; 0 = micro_batch * dp
  int seq_len = 0;          // 0 = model.block_size (filled in on load)
  int64_t seed = 1337;
  std::string device = "cpu";                     // "cpu" | "cuda" (train/device.h)
  std::string dtype = "fp32";                     // "fp32" | "bf16" | "fp16"
  std::string grad_dtype = "fp32";                // "fp32" | the low precision of dtype
  int stochastic_rounding = 0;                    // bf16: 1 = stochastic rounding of params
  double loss_scale = 65536.0;                    // fp16: initial dynamic loss scale
  int64_t loss_scale_growth_interval = 2000;      // fp16: clean steps before it doubles
  std::string activation_checkpointing = "none";  // "none" | "full" | "selective"
  double ema_decay = 0.0;                         // weights' moving average; 0 = none
  double classifier_chunk_mb = 16.0;  // MiB of fp32 logits per chunk of the fused loss
  std::vector<std::string> freeze;    // glob patterns of the parameters to freeze
  std::string fp8 = "none";           // "none" | "tensorwise" | "delayed": fp8 GEMMs (docs/fp8.md)
  std::vector<std::string> fp8_layers;  // Linears in fp8 by glob; [] = the blocks but first/last
  int fp8_amax_history_len = 16;        // delayed: steps of amax history per tensor
  std::string fp8_amax_compute_algo = "max";  // delayed: "max" | "most_recent" of the history
  LoraSection lora;
  bool operator==(const TrainSection&) const = default;
};

/// [backend]: how the backend of train.device computes where several ways are valid and
/// may round differently (BackendOptions, backend/options.h); the defaults are the exact,
/// reproducible paths.
struct BackendSection {
  bool tf32 = false;               // fp32 GEMMs may use TF32 tensor cores (cuda)
  bool gemm_tuning = false;        // GEMM algorithms chosen by timing (cuda)
  std::string attention = "auto";  // "auto" | "simt": the attention kernels (cuda)
  bool operator==(const BackendSection&) const = default;
};

/// [optim]: AdamW.
struct OptimSection {
  double lr = 6e-4;  // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
  bool multi_tensor = true;  // one update over every tensor (false: one per tensor, same bits)
  bool operator==(const OptimSection&) const = default;
};

/// [schedule]: the learning-rate schedule (see learning_rate()).
struct ScheduleSection {
  std::string kind = "cosine";  // "cosine" | "constant" | "wsd"
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  double decay_fraction = 0.2;  // wsd: fraction of `steps` spent decaying at the end
  bool operator==(const ScheduleSection&) const = default;
};

/// [eval]: held-out loss.
struct EvalSection {
  int64_t every = 0;  // 0 = never
  int batches = 20;
  bool operator==(const EvalSection&) const = default;
};

/// [sample]: text generation during training.
struct SampleSection {
  int64_t every = 0;  // 0 = never
  int tokens = 64;
  std::string prompt;  // "" = start from the end-of-text token
  double temperature = 1.0;
  int top_k = 0;  // 0 = no top-k filtering
  bool operator==(const SampleSection&) const = default;
};

/// [checkpoint]: periodic checkpoints under run.dir.
struct CheckpointSection {
  int64_t every = 0;  // 0 = no periodic checkpoints
  int keep = 2;       // newest checkpoints kept; 0 = keep all
  bool async = false;  // write the files on a thread while training goes on
  std::string on_error = "stop";  // an asynchronous save's write error: stop | warn
  bool operator==(const CheckpointSection&) const = default;
};

/// [run]: where the run writes its logs and checkpoints.
struct RunSection {
  std::string dir = "runs/default";
  bool operator==(const RunSection&) const = default;
};

/// [log]: progress lines.
struct LogSection {
  int64_t every = 1;
  double peak_tflops = 0.0;  // for MFU; 0 = measure at start-up
  bool expert_counts = false;  // MoE: every expert's tokens per logged update in metrics
  double straggler_factor = 1.5;  // warn when a rank's compute time is this x the median; 0 = never
  int straggler_windows = 3;      // ... for this many logged updates in a row
  bool operator==(const LogSection&) const = default;
};

/// [parallel]: data, context, tensor, pipeline and expert parallelism, ZeRO.
struct ParallelSection {
  int dp = 0;  // 0 = derive: world_size / (cp * tp * pp)
  int cp = 1;  // context parallel: each sequence split over cp ranks (ring attention)
  int tp = 1;
  bool sequence_parallel = false;  // split the norm/dropout regions' rows over tp
  int pp = 1;
  int virtual_stages = 1;            // model chunks per pipeline rank (interleaved: > 1)
  std::string pp_schedule = "1f1b";  // gpipe | 1f1b | interleaved
  std::vector<int64_t> pp_split;     // first part of each stage after the first; [] = balance
  int ep = 1;  // expert parallel: each MoE layer's experts split over ep of the dp x cp ranks
  int zero_stage = 0;  // 0..3
  double bucket_mb = 25.0;  // gradient all-reduce bucket size
  double timeout_s = 60.0;  // collective timeout
  std::string communicator = "auto";  // "auto" | "local" | "mpi" | "nccl" (comm/registry.h)
  bool operator==(const ParallelSection&) const = default;
};

/// [profile]: a profiled window of optimizer updates.
struct ProfileSection {
  std::vector<int64_t> steps;  // [] = off; [a, b] = profile updates a <= step < b
  std::string timing = "sync";  // "sync": each op synchronised; "events": device events
  /// True when a profiling window is configured.
  bool enabled() const { return steps.size() == 2; }
  bool operator==(const ProfileSection&) const = default;
};

/// The fully resolved training configuration (defaults, preset and overrides applied).
struct TrainConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  BackendSection backend;
  OptimSection optim;
  ScheduleSection schedule;
  EvalSection eval;
  SampleSection sample;
  CheckpointSection checkpoint;
  RunSection run;
  LogSection log;
  ParallelSection parallel;
  ProfileSection profile;

  /// Where the config came from (file name or "<string>"), used in error messages.
  /// Not part of the configuration: to_toml(), hash() and == ignore it.
  std::string source = "config";

  /// Micro-steps per optimizer update: global_batch / (micro_batch * dp_size), or 1
  /// when global_batch is 0. Throws kiln::Error naming train.global_batch when it does
  /// not divide (or dp_size < 1).
  int grad_accum_steps(int dp_size) const;

  /// The fully resolved config as TOML: every key of every section, defaults and
  /// preset values filled in. Reading it back gives a config equal to this one.
  std::string to_toml() const;

  /// Stable hex digest (16 hex digits, FNV-1a 64) of to_toml(); equal configs give
  /// equal hashes on every platform, so ranks can check they run the same config.
  std::string hash() const;

  /// Checks the keys a training run needs beyond what loading already validated:
  /// data.dir set, model shape complete (n_layer, n_head, n_embd, block_size > 0),
  /// train.steps > 0. Throws kiln::Error naming `source` and the missing key.
  void validate_for_training() const;

  /// Compares every key (not `source`).
  bool operator==(const TrainConfig& other) const;
};

/// Reads the TOML file at `path`, applies `overrides` ("section.key=value", in order)
/// and resolves and validates the result. Throws kiln::Error naming the file (or
/// "--set") and the key at fault.
TrainConfig load_config_file(const std::string& path,
                             const std::vector<std::string>& overrides = {});

/// As load_config_file(), from TOML text; `name_for_errors` stands for the file name in
/// error messages.
TrainConfig load_config_string(std::string_view text,
                               const std::vector<std::string>& overrides = {},
                               const std::string& name_for_errors = "<string>");

/// The [schedule] and [optim] keys as a learning-rate schedule (optim/schedule.h, where
/// the formulas are), and the learning rate of update `step` (counted from 0) under it.
LrSchedule lr_schedule_of(const TrainConfig& config);
double learning_rate(const TrainConfig& config, int64_t step);

/// Description of one configuration key, for help text and documentation.
struct ConfigKeyInfo {
  std::string_view name;           // "section.key"
  std::string_view type;           // "int", "float", "bool", "string" or "int array"
  std::string_view default_value;  // as written in TOML
  std::string_view description;
};

/// Every valid key, in the order to_toml() writes them; the [model] keys of the registered
/// families (ModelArch::keys) once each, after the common [model] keys, each description
/// saying which architectures read it.
std::span<const ConfigKeyInfo> config_keys();

}  // namespace kiln
