#include "config/config_keys.h"

#include "models/registry.h"

#include <algorithm>

namespace kiln::config_detail {
namespace {

// Key table builders ---------------------------------------------------------------

#define KILN_KEY(sec, k) #sec "." #k, [](TrainConfig& c) -> Ref { return &c.sec.k; }

Key any(std::string name, Ref (*ref)(TrainConfig&), std::string doc) {
  Key k;
  k.name = std::move(name);
  k.ref = ref;
  k.description = std::move(doc);
  return k;
}
Key range(std::string name, Ref (*ref)(TrainConfig&), double lo, double hi, std::string doc,
          bool lo_open = false, bool hi_open = false) {
  Key k = any(std::move(name), ref, std::move(doc));
  k.lo = lo;
  k.hi = hi;
  k.lo_open = lo_open;
  k.hi_open = hi_open;
  return k;
}
Key positive(std::string name, Ref (*ref)(TrainConfig&), std::string doc) {
  return range(std::move(name), ref, 0, kInf, std::move(doc), /*lo_open=*/true);
}
Key nonneg(std::string name, Ref (*ref)(TrainConfig&), std::string doc) {
  return range(std::move(name), ref, 0, kInf, std::move(doc));
}
Key oneof(std::string name, Ref (*ref)(TrainConfig&), std::vector<std::string> choices,
          std::string doc) {
  Key k = any(std::move(name), ref, std::move(doc));
  k.choices = std::move(choices);
  return k;
}

}  // namespace

const std::vector<Key>& keys() {
  static const std::vector<Key> table = [] {
    std::vector<std::string> presets{""};
    for (const auto& p : model_presets()) presets.emplace_back(p.name);
    return std::vector<Key>{
        any(KILN_KEY(model, arch),
            "Model architecture (models/registry.h): gpt2, llama (with its mixture-of-experts variants), vit (an image classifier), dit (a class-conditioned image generator), llava (a vision-language model) or mmdit (a text-conditioned image generator); tests and extensions register more."),
        oneof(KILN_KEY(model, preset), presets,
              "Model preset filling arch, n_layer, n_head, n_embd, block_size and vocab_size "
              "(llama presets also n_kv_head, ffn_hidden_size, norm_eps, rope_theta, "
              "rope_scaling.*, tie_embeddings): gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
              "llama3.2-1b, llama3.2-3b, llama3.1-8b, llama3.1-70b; \"\" = none. Keys given "
              "explicitly override the preset."),
        nonneg(KILN_KEY(model, n_layer), "Transformer blocks (required unless a preset gives it)."),
        nonneg(KILN_KEY(model, n_head), "Attention heads; must divide n_embd."),
        nonneg(KILN_KEY(model, n_embd), "Embedding (residual stream) width."),
        nonneg(KILN_KEY(model, block_size), "Maximum sequence length (position-table rows)."),
        nonneg(KILN_KEY(model, vocab_size), "Vocabulary size; 0 = take it from the data set's meta.json."),
        range(KILN_KEY(model, dropout), 0, 1, "Dropout probability (embeddings, attention, residual); gpt2 only (llama has none: 0).",
              false, /*hi_open=*/true),
        any(KILN_KEY(model, init_from),
            "Initial weights: \"\" = random init; a kiln checkpoint dir, a Hugging Face model "
            "folder (config.json + safetensors; its config.json fills the model keys not set "
            "explicitly), an llm.c .bin or a .safetensors file."),
        any(KILN_KEY(model, init_parts),
            "Parts of the model initialised from other models, after model.init_from (or the "
            "random init): \"PREFIX=PATH\" each, PATH a kiln checkpoint dir or a Hugging Face "
            "folder whose parameter N initialises this model's PREFIX.N (a llava's "
            "[\"vision_tower=runs/vit/ckpt/step_00005000\", \"language_model=hf/llama\"]); "
            "a source with more rows gives its first ones (a ViT's pos_embed without its "
            "class-token row); a whole model's part (a llava's language_model, an mmdit's "
            "Llama text_encoder) must also have the source's heads, norm epsilon and rotary "
            "settings. [] = none."),
        any(KILN_KEY(data, dir), "Directory of the tokenized data set (this or data.blend is required for training)."),
        any(KILN_KEY(data, blend),
            "A weighted blend of prepared token data sets instead of data.dir, as Megatron's --data-path: "
            "weight and directory pairs, [\"0.3\", \"data/web\", \"0.7\", \"data/code\"] (weights "
            "normalized; one tokenizer). Samples are drawn by weight, exactly and deterministically; "
            "each data set runs through its own shuffled epochs."),
        oneof(KILN_KEY(data, packing), {"none", "document"},
              "How documents share a sample: none = the token stream cut into samples, attention "
              "across document boundaries (GPT-2, llm.c); document = the same samples with each "
              "document attending only to itself and its positions restarting at 0 (needs the "
              "data set's document index, written by kiln prepare)."),
        nonneg(KILN_KEY(train, steps), "Optimizer updates to run (required, > 0, for training)."),
        positive(KILN_KEY(train, micro_batch), "Sequences per rank per micro-step."),
        nonneg(KILN_KEY(train, global_batch),
               "Sequences per optimizer update over all ranks; 0 = micro_batch * dp (no "
               "gradient accumulation). Must be a multiple of micro_batch * dp."),
        nonneg(KILN_KEY(train, seq_len), "Tokens per sequence; 0 = model.block_size."),
        nonneg(KILN_KEY(train, seed), "Random seed (init, data order, dropout, sampling)."),
        oneof(KILN_KEY(train, device), {"cpu", "cuda"},
              "Where training, evaluation, sampling and kiln bench run: cpu, or cuda (GPU "
              "local_rank % device_count; several ranks talk over NCCL). kiln memplan plans for it."),
        oneof(KILN_KEY(train, dtype), {"fp32", "bf16", "fp16"}, "Compute dtype: fp32, bf16 or fp16."),
        oneof(KILN_KEY(train, grad_dtype), {"fp32", "bf16", "fp16"},
              "Parameter-gradient dtype: fp32, or the low precision of train.dtype."),
        range(KILN_KEY(train, stochastic_rounding), 0, 1,
              "bf16: 1 = write parameters from the fp32 master weights with stochastic "
              "rounding (Philox, replayable), 0 = round to nearest even."),
        positive(KILN_KEY(train, loss_scale),
                 "fp16: initial dynamic loss scale (halved on overflow, doubled after "
                 "loss_scale_growth_interval clean steps)."),
        positive(KILN_KEY(train, loss_scale_growth_interval),
                 "fp16: clean steps after which the loss scale doubles."),
        oneof(KILN_KEY(train, activation_checkpointing), {"none", "full", "selective"},
              "Activation recomputation: none, full or selective."),
        range(KILN_KEY(train, ema_decay), 0, 1,
              "Exponential moving average of the weights, updated after every applied step: "
              "ema = ema_decay * ema + (1 - ema_decay) * weights; sharded like the master "
              "weights, saved in checkpoints (ema.<name>); 0 = none.",
              false, /*hi_open=*/true),
        positive(KILN_KEY(train, classifier_chunk_mb),
                 "MiB of fp32 logits per chunk of the fused output projection and loss (the "
                 "logits never exist whole): larger chunks mean fewer passes over the head's "
                 "weight and its gradient and more activation memory; the loss is the same up "
                 "to rounding."),
        any(KILN_KEY(train, freeze),
            "Glob patterns of parameters to freeze (no gradient, optimizer state or "
            "reduction; saved as before), over the checkpoint's parameter names: a pattern "
            "matches a whole name, or the part after a dot, or a module (\"wte\", "
            "\"h.0.*\", \"*.ln_1.*\"); each must match a parameter. [] = none."),
        oneof(KILN_KEY(train, fp8), {"none", "tensorwise", "delayed"},
              "fp8 GEMMs in the transformer blocks' Linears (docs/fp8.md): none; tensorwise "
              "(activations and weights in E4M3, output gradients in E5M2, each scaled by a "
              "power of two from its current amax); or delayed (the scale from an amax "
              "history of earlier steps, as Transformer Engine's DelayedScaling); needs "
              "train.dtype bf16 or fp32. The CPU emulates the fp8 GEMMs exactly."),
        range(KILN_KEY(train, fp8_amax_history_len), 1, 1 << 20,
              "train.fp8 = delayed: steps of amax history kept per tensor (in checkpoints)."),
        oneof(KILN_KEY(train, fp8_amax_compute_algo), {"max", "most_recent"},
              "train.fp8 = delayed: the amax a scale is taken from: the max over the history "
              "or the most recent step's."),
        any(KILN_KEY(train, fp8_layers),
            "train.fp8: glob patterns (train.freeze's rule) over the names of the blocks' "
            "Linears (\"transformer.h.3.attn.c_attn\", \"*.mlp.*\") that run in fp8; each "
            "must match one. [] = every block's Linears but the first and last block's. The "
            "embedding and the output head always stay in train.dtype."),
        nonneg(KILN_KEY(train, lora.rank),
               "LoRA (docs/lora.md): the rank r of low-rank adapters on the Linears "
               "train.lora.targets names, every other parameter frozen; 0 = no LoRA."),
        positive(KILN_KEY(train, lora.alpha),
                 "train.lora: the adapters' output is scaled by alpha / r (alpha / sqrt(r) "
                 "with train.lora.rslora)."),
        any(KILN_KEY(train, lora.rslora),
            "train.lora: rank-stabilised scaling alpha / sqrt(r) (Kalajdzievski 2023)."),
        range(KILN_KEY(train, lora.dropout), 0, 1,
              "train.lora: dropout on the adapters' input in training passes.", false,
              /*hi_open=*/true),
        any(KILN_KEY(train, lora.targets),
            "train.lora: the Linears that get adapters, by role (q, k, v, qkv, o, gate, up, "
            "fc, down) or glob pattern over their names (\"*.layers.0.*.o_proj\", a fused "
            "piece \"*.qkv_proj.q\"); each must match one."),
        any(KILN_KEY(train, lora.init_from),
            "train.lora: a Hugging Face PEFT adapter folder (adapter_config.json, "
            "adapter_model.safetensors) the adapters start from; its r, lora_alpha and "
            "use_rslora must be train.lora's. \"\" = fresh adapters (B = 0)."),
        oneof(KILN_KEY(train, lora.dtype), {"fp32", "bf16", "fp16"},
              "train.lora: the adapters' storage, fp32 (PEFT's: their own buffer, no master "
              "copy, the GEMMs reading them rounded to train.dtype) or train.dtype (Megatron's: "
              "fp32 masters in the optimizer)."),
        any(KILN_KEY(backend, tf32),
            "cuda: fp32 GEMMs may use TF32 tensor cores (faster, ~1e-3 relative error); false "
            "= full fp32."),
        any(KILN_KEY(backend, gemm_tuning),
            "cuda: each new GEMM shape's algorithm is the fastest of cuBLASLt's first 8 "
            "candidates, timed once, instead of the first; tuned runs may round differently "
            "unless the choices are kept (KILN_CUDA_GEMM_CACHE)."),
        oneof(KILN_KEY(backend, attention), {"auto", "simt"},
              "cuda: attention kernels: auto = tensor cores where they apply (bf16, no "
              "dropout, head size 32, 64 or 128), fp32 CUDA-core kernels otherwise; simt = "
              "the CUDA-core kernels always."),
        positive(KILN_KEY(optim, lr), "Peak learning rate."),
        range(KILN_KEY(optim, beta1), 0, 1, "AdamW beta1.", false, true),
        range(KILN_KEY(optim, beta2), 0, 1, "AdamW beta2.", false, true),
        positive(KILN_KEY(optim, eps), "AdamW epsilon."),
        nonneg(KILN_KEY(optim, weight_decay), "Decoupled (AdamW) weight decay."),
        nonneg(KILN_KEY(optim, grad_clip), "Clip the global gradient norm to this; 0 disables."),
        any(KILN_KEY(optim, multi_tensor),
            "One AdamW update over every tensor (Backend::adamw_multi_step, fewer launches); "
            "false = one update and one copy per tensor. Bitwise the same results."),
        oneof(KILN_KEY(schedule, kind), {"cosine", "constant", "wsd"},
              "Learning-rate schedule after warmup: cosine (to min_lr at train.steps), "
              "constant, or wsd (warmup-stable-decay)."),
        nonneg(KILN_KEY(schedule, warmup_steps),
               "Linear warmup: lr * (step + 1) / warmup_steps for the first warmup_steps updates."),
        nonneg(KILN_KEY(schedule, min_lr), "Final learning rate of cosine and wsd; at most optim.lr."),
        range(KILN_KEY(schedule, decay_fraction), 0, 1,
              "wsd: fraction of train.steps spent decaying linearly to min_lr at the end."),
        nonneg(KILN_KEY(eval, every), "Evaluate the validation loss every this many updates; 0 = never."),
        positive(KILN_KEY(eval, batches),
                 "Global batches of the val split per evaluation (from its start; the whole "
                 "split, each sample once, when it has fewer)."),
        nonneg(KILN_KEY(sample, every), "Generate a sample every this many updates; 0 = never."),
        positive(KILN_KEY(sample, tokens), "Tokens to generate per sample."),
        any(KILN_KEY(sample, prompt), "Sample prompt text; \"\" = start from the end-of-text token."),
        positive(KILN_KEY(sample, temperature), "Sampling temperature."),
        nonneg(KILN_KEY(sample, top_k), "Sample from the k most likely tokens; 0 = all."),
        nonneg(KILN_KEY(checkpoint, every), "Save a checkpoint every this many updates; 0 = no periodic checkpoints."),
        nonneg(KILN_KEY(checkpoint, keep), "Newest checkpoints kept on disk; 0 = keep all."),
        any(KILN_KEY(checkpoint, async),
            "Save in the background: at the save step each rank copies its state to host "
            "memory and trains on while a thread writes it; rank 0 commits once every rank's "
            "files are on disk (at most one save in flight; a stop or the end of training "
            "waits for it)."),
        oneof(KILN_KEY(checkpoint, on_error), {"stop", "warn"},
              "An asynchronous save that fails to write (a full disk): stop = end the run "
              "with the error; warn = a warning, training goes on, the previous checkpoint "
              "stays the newest."),
        any(KILN_KEY(run, dir), "Run directory: logs, resolved config, checkpoints."),
        positive(KILN_KEY(log, every), "Print a progress line every this many updates."),
        nonneg(KILN_KEY(log, peak_tflops), "Peak TFLOP/s used for MFU; 0 = measure at start-up."),
        any(KILN_KEY(log, expert_counts),
            "Mixture of experts: write every MoE layer's tokens per expert of each logged "
            "update to metrics.jsonl (\"moe_expert_counts\", [MoE layer][expert], summed over "
            "the global batch), e.g. to compare the routing of two layouts."),
        nonneg(KILN_KEY(log, straggler_factor),
               "Several ranks: warn, naming the rank, when one rank's compute time per update "
               "(its update time less its exposed data-parallel communication wait, averaged "
               "between logged updates) is at least this many times the median of the ranks' "
               "for log.straggler_windows logged updates in a row; 0 = never."),
        positive(KILN_KEY(log, straggler_windows),
                 "Logged updates in a row a rank must be slow for before the straggler warning "
                 "(log.straggler_factor)."),
        nonneg(KILN_KEY(parallel, dp), "Data-parallel ranks; 0 = derive (world size / (cp * tp * pp))."),
        positive(KILN_KEY(parallel, cp),
                 "Context-parallel ranks (between dp and tp on the mesh): each sequence is cut "
                 "into 2 x cp chunks, rank r holding chunks r and 2cp-1-r, and attention runs as "
                 "ring attention; train.seq_len must divide by 2 x cp. Gradients are reduced "
                 "(and ZeRO shards) over dp x cp."),
        positive(KILN_KEY(parallel, tp),
                 "Tensor-parallel ranks (innermost axis of the mesh). The query and key/value "
                 "heads, the padded vocabulary and the MLP width (a mixture of experts': each "
                 "expert's and the shared experts' width) must divide by it (the experts' width "
                 "is checked when the config loads, naming its key; a start-up error names the "
                 "tensor otherwise)."),
        any(KILN_KEY(parallel, sequence_parallel),
            "Sequence parallelism with tp > 1: the rows of the norm, dropout and residual "
            "activations split over the tp ranks."),
        positive(KILN_KEY(parallel, pp), "Pipeline-parallel stages."),
        positive(KILN_KEY(parallel, virtual_stages),
                 "Model chunks per pipeline rank (virtual stages); > 1 needs the interleaved schedule."),
        oneof(KILN_KEY(parallel, pp_schedule), {"gpipe", "1f1b", "interleaved"},
              "Pipeline schedule: gpipe, 1f1b or interleaved (1F1B over virtual stages)."),
        any(KILN_KEY(parallel, pp_split),
            "The first model part of each pipeline stage after the first (pp x virtual_stages - 1 "
            "increasing indices); [] = balanced by the parts' cost."),
        positive(KILN_KEY(parallel, ep),
                 "Expert-parallel ranks, carved out of the dp x cp ranks (no extra ranks): each "
                 "mixture-of-experts layer's experts are split over the ep ranks of a group, "
                 "which send each token to its experts' rank and back (all_to_all). ep must "
                 "divide dp x cp and model.moe.num_experts. Expert weights are reduced (and "
                 "ZeRO-sharded) over the dp x cp / ep ranks holding the same experts; with tp > "
                 "1 each expert's hidden units are split over tp as well, as the dense MLP's."),
        range(KILN_KEY(parallel, zero_stage), 0, 3,
              "ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded."),
        positive(KILN_KEY(parallel, bucket_mb), "Gradient all-reduce bucket size in MiB."),
        positive(KILN_KEY(parallel, timeout_s), "Collective-communication timeout in seconds."),
        oneof(KILN_KEY(parallel, communicator), {"auto", "local", "mpi", "nccl"},
              "The communicator the trainer's groups are split from (comm/registry.h): auto = "
              "nccl on cuda, else mpi when launched by mpirun/srun with several processes, "
              "else local; local = one process; mpi = MPI (cpu); nccl = NCCL (cuda)."),
        any(KILN_KEY(profile, steps),
            "Profile updates a <= step < b given as [a, b]; [] = off."),
        oneof(KILN_KEY(profile, timing), {"sync", "events"},
              "How ops are timed: sync = a synchronise after each op (its own time; the device "
              "idles between ops); events = device events around each op, read after the step "
              "(CUDA; the CPU times on the host either way)."),
    };
  }();
  return table;
}

#undef KILN_KEY

const Key* find_key(std::string_view name) {
  for (const auto& k : keys())
    if (k.name == name) return &k;
  return nullptr;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& k : keys()) {
    std::string s(k.section());
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

}  // namespace kiln::config_detail
