#include "models/llama_config.h"
#include "models/model_options.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace kiln {

const ModelKeys& llama_keys() {
  using enum ModelKeyType;
  static const ModelKeys keys{
      {.name = "n_kv_head", .type = Integer, .lo = 0,
       .description = "Key/value heads of grouped-query attention (llama); must divide n_head; "
                      "0 = n_head."},
      {.name = "head_dim", .type = Integer, .lo = 0,
       .description = "Attention head size (llama); need not be n_embd / n_head (Qwen3: 128 "
                      "with n_embd 2048, 32 heads); even (rotary); 0 = n_embd / n_head."},
      {.name = "qk_norm", .type = Bool,
       .description = "Per-head RMSNorm of q and k (gains [head_dim], eps norm_eps) after the "
                      "projection, before rotary (llama; Qwen3's q_norm / k_norm)."},
      {.name = "ffn_hidden_size", .type = Integer, .lo = 0,
       .description = "MLP hidden width (llama: SwiGLU gate/up width); 0 = the architecture's "
                      "default (2/3 of 4 n_embd rounded up to a multiple of 256)."},
      {.name = "norm_eps", .type = Float, .default_value = 1e-5, .lo = 0, .lo_open = true,
       .description = "RMSNorm epsilon (llama)."},
      {.name = "rope_theta", .type = Float, .default_value = 10000.0, .lo = 0, .lo_open = true,
       .description = "Rotary base theta (llama; Llama 3: 500000)."},
      {.name = "rope_scaling.factor", .type = Float, .lo = 0,
       .description = "Llama 3.1 \"llama3\" rope scaling: long wavelengths divided by this; 0 = "
                      "no scaling."},
      {.name = "rope_scaling.low_freq_factor", .type = Float, .default_value = 1.0, .lo = 0,
       .lo_open = true,
       .description = "llama3 rope scaling: wavelengths above original_max_position / "
                      "low_freq_factor are scaled."},
      {.name = "rope_scaling.high_freq_factor", .type = Float, .default_value = 4.0, .lo = 0,
       .lo_open = true,
       .description = "llama3 rope scaling: wavelengths below original_max_position / "
                      "high_freq_factor are kept."},
      {.name = "rope_scaling.original_max_position", .type = Float, .default_value = 8192.0,
       .lo = 0, .lo_open = true,
       .description = "llama3 rope scaling: the pre-training context length (HF "
                      "original_max_position_embeddings)."},
      {.name = "tie_embeddings", .type = Bool,
       .description = "The output head is the token embedding (llama; Llama 3.2 1B/3B tie). "
                      "GPT-2 always ties."},
      {.name = "moe.num_experts", .type = Integer, .lo = 0,
       .description = "Routed experts E of the mixture-of-experts blocks (llama); 0 = a dense "
                      "model."},
      {.name = "moe.top_k", .type = Integer, .default_value = 2, .lo = 1,
       .description = "Experts each token takes (1 <= top_k <= moe.num_experts)."},
      {.name = "moe.ffn_hidden_size", .type = Integer, .lo = 0,
       .description = "Each expert's SwiGLU width; 0 = ffn_hidden_size."},
      {.name = "moe.shared_experts", .type = Integer, .lo = 0,
       .description = "Always-on shared experts: one SwiGLU of width shared_experts x "
                      "moe.ffn_hidden_size added to the routed experts' output (DeepSeek)."},
      {.name = "moe.scoring", .type = Choice,
       .description = "Router scores: \"softmax\" over the experts or \"sigmoid\" of each "
                      "logit (DeepSeek-V3).",
       .choices = {"softmax", "sigmoid"}},
      {.name = "moe.routing", .type = Choice,
       .description = "\"top_k\": each token takes its top_k experts by score; \"round_robin\": "
                      "a test router (CPU) for memory and traffic checks, token n of each call "
                      "taking experts (n top_k + j) mod num_experts, j < top_k, whatever the "
                      "scores (the weights stay those experts' scores), so every expert and "
                      "expert-parallel rank gets the same load.",
       .choices = {"top_k", "round_robin"}},
      {.name = "moe.norm_topk_prob", .type = Bool, .default_value = 1,
       .description = "Renormalise the top_k chosen scores to sum 1 (Mixtral always; Qwen3's "
                      "norm_topk_prob)."},
      {.name = "moe.first_k_dense", .type = Integer, .lo = 0,
       .description = "Blocks 0..first_k_dense-1 stay dense (DeepSeek's first_k_dense_replace)."},
      {.name = "moe.sparse_step", .type = Integer, .default_value = 1, .lo = 1,
       .description = "Block l is a MoE block when (l + 1) % sparse_step == 0 (Qwen3's "
                      "decoder_sparse_step)."},
      {.name = "moe.dense_layers", .type = IntegerList, .lo = 0,
       .description = "Blocks that stay dense, each in [0, n_layer) (Qwen3's mlp_only_layers); "
                      "e.g. [0, 3]."},
      {.name = "moe.aux_loss_coef", .type = Float, .lo = 0,
       .description = "Load-balancing loss coefficient (HF router_aux_loss_coef); 0 = none.",
       .training_only = true},
      {.name = "moe.aux_loss_type", .type = Choice,
       .description = "\"per_layer\": the Switch/GShard loss per MoE layer, summed "
                      "(Megatron-core); \"hf\": transformers' load_balancing_loss_func over "
                      "all layers' routers (Mixtral, Qwen3-MoE; softmax scoring).",
       .choices = {"per_layer", "hf"},
       .training_only = true},
      {.name = "moe.aux_loss_scope", .type = Choice,
       .description = "Tokens the balancing loss counts: each rank's \"micro_batch\", or "
                      "\"global\": the micro-step's over the data-parallel ranks (Megatron-core's "
                      "global_aux_loss).",
       .choices = {"micro_batch", "global"},
       .training_only = true},
      {.name = "moe.z_loss_coef", .type = Float, .lo = 0,
       .description = "Router z-loss coefficient (ST-MoE); 0 = none.",
       .training_only = true},
      {.name = "moe.expert_bias", .type = Bool,
       .description = "DeepSeek-V3's auxiliary-loss-free balancing (Megatron-core's "
                      "moe_router_enable_expert_bias): a per-expert bias added to the scores "
                      "for the choice only, moved towards the mean load after each update."},
      {.name = "moe.bias_update_rate", .type = Float, .default_value = 1e-3, .lo = 0,
       .description = "The expert bias's step after each update (moe.expert_bias); 0 = "
                      "frozen (DeepSeek-V3's last tokens).",
       .training_only = true},
      {.name = "moe.capacity_factor", .type = Float, .lo = 0,
       .description = "Token dropping (Switch/GShard; Megatron-core's "
                      "moe_expert_capacity_factor): each expert keeps at most max(1, ceil(N "
                      "top_k / num_experts x capacity_factor)) of a micro-batch's N tokens, "
                      "the first in token order; in training and evaluation, not in kiln "
                      "sample; 0 = dropless.",
       .training_only = true},
  };
  return keys;
}

namespace {

// The moe.* keys of `o` (ffn_hidden_size unresolved: 0 stays 0).
LlamaMoeConfig moe_of(const ModelOptions& o) {
  const ModelKeys& k = llama_keys();
  LlamaMoeConfig m;
  m.num_experts = o.integer(k, "moe.num_experts");
  m.top_k = o.integer(k, "moe.top_k");
  m.ffn_hidden_size = o.integer(k, "moe.ffn_hidden_size");
  m.shared_experts = o.integer(k, "moe.shared_experts");
  m.scoring = o.choice(k, "moe.scoring");
  m.routing = o.choice(k, "moe.routing");
  m.norm_topk_prob = o.flag(k, "moe.norm_topk_prob");
  m.first_k_dense = o.integer(k, "moe.first_k_dense");
  m.sparse_step = o.integer(k, "moe.sparse_step");
  m.dense_layers = o.integer_list(k, "moe.dense_layers");
  m.aux_loss_coef = o.value(k, "moe.aux_loss_coef");
  m.aux_loss_type = o.choice(k, "moe.aux_loss_type");
  m.aux_loss_scope = o.choice(k, "moe.aux_loss_scope");
  m.z_loss_coef = o.value(k, "moe.z_loss_coef");
  m.expert_bias = o.flag(k, "moe.expert_bias");
  m.bias_update_rate = o.value(k, "moe.bias_update_rate");
  m.capacity_factor = o.value(k, "moe.capacity_factor");
  return m;
}

// The first moe.* key of `m` that differs from a dense model's default, or "".
std::string set_moe_key(const LlamaMoeConfig& m) {
  const LlamaMoeConfig d;
  const std::pair<bool, const char*> keys[] = {
      {m.top_k != d.top_k, "top_k"},
      {m.ffn_hidden_size != d.ffn_hidden_size, "ffn_hidden_size"},
      {m.shared_experts != d.shared_experts, "shared_experts"},
      {m.scoring != d.scoring, "scoring"},
      {m.routing != d.routing, "routing"},
      {m.norm_topk_prob != d.norm_topk_prob, "norm_topk_prob"},
      {m.first_k_dense != d.first_k_dense, "first_k_dense"},
      {m.sparse_step != d.sparse_step, "sparse_step"},
      {m.dense_layers != d.dense_layers, "dense_layers"},
      {m.aux_loss_coef != d.aux_loss_coef, "aux_loss_coef"},
      {m.aux_loss_type != d.aux_loss_type, "aux_loss_type"},
      {m.aux_loss_scope != d.aux_loss_scope, "aux_loss_scope"},
      {m.z_loss_coef != d.z_loss_coef, "z_loss_coef"},
      {m.expert_bias != d.expert_bias, "expert_bias"},
      {m.bias_update_rate != d.bias_update_rate, "bias_update_rate"},
      {m.capacity_factor != d.capacity_factor, "capacity_factor"}};
  for (const auto& [set, key] : keys)
    if (set) return key;
  return "";
}

// The moe.* keys' checks (LlamaConfig::validate), each error naming the key.
void validate_moe(const LlamaConfig& c) {
  const LlamaMoeConfig& m = c.moe;
  KILN_CHECK(m.num_experts >= 0, "model.moe.num_experts must be >= 0 (got {})", m.num_experts);
  if (!m.enabled()) {
    const std::string key = set_moe_key(m);
    KILN_CHECK(key.empty(), "model.moe.{} is set but model.moe.num_experts is 0 (a dense model): "
               "set moe.num_experts or drop moe.{}", key, key);
    return;
  }
  KILN_CHECK(m.top_k >= 1 && m.top_k <= m.num_experts,
             "model.moe.top_k ({}) must be in [1, model.moe.num_experts = {}]", m.top_k,
             m.num_experts);
  KILN_CHECK(m.ffn_hidden_size > 0 && m.shared_experts >= 0 &&
                 m.ffn_hidden_size <= INT32_MAX / 2 / std::max(1, m.shared_experts),
             "model.moe.ffn_hidden_size ({}) must be positive, and 2 x it x "
             "model.moe.shared_experts ({}) below 2^31", m.ffn_hidden_size, m.shared_experts);
  KILN_CHECK(m.scoring == "softmax" || m.scoring == "sigmoid",
             "model.moe.scoring must be \"softmax\" or \"sigmoid\" (got \"{}\")", m.scoring);
  KILN_CHECK(m.first_k_dense >= 0 && m.sparse_step >= 1,
             "model.moe.first_k_dense ({}) must be >= 0 and model.moe.sparse_step ({}) >= 1",
             m.first_k_dense, m.sparse_step);
  for (size_t i = 0; i < m.dense_layers.size(); ++i) {
    const int l = m.dense_layers[i];
    KILN_CHECK(l >= 0 && l < c.n_layer, "model.moe.dense_layers holds {}: not a block index in "
               "[0, model.n_layer = {})", l, c.n_layer);
    KILN_CHECK(std::find(m.dense_layers.begin(), m.dense_layers.begin() + i, l) ==
                   m.dense_layers.begin() + i,
               "model.moe.dense_layers holds {} twice", l);
  }
  bool any = false;
  for (int l = 0; l < c.n_layer; ++l) any = any || c.is_moe_block(l);
  KILN_CHECK(any, "model.moe.first_k_dense ({}), model.moe.sparse_step ({}) and "
             "model.moe.dense_layers ([{}]) leave no MoE block among the model.n_layer = {} "
             "blocks", m.first_k_dense, m.sparse_step, fmt::join(m.dense_layers, ", "),
             c.n_layer);
  KILN_CHECK(m.aux_loss_coef >= 0 && m.z_loss_coef >= 0,
             "model.moe.aux_loss_coef ({}) and model.moe.z_loss_coef ({}) must be >= 0",
             m.aux_loss_coef, m.z_loss_coef);
  KILN_CHECK(m.aux_loss_type == "per_layer" || m.aux_loss_type == "hf",
             "model.moe.aux_loss_type must be \"per_layer\" or \"hf\" (got \"{}\")",
             m.aux_loss_type);
  KILN_CHECK(m.aux_loss_type != "hf" || m.scoring == "softmax",
             "model.moe.aux_loss_type = \"hf\" needs model.moe.scoring = \"softmax\" "
             "(transformers' loss is over softmax probabilities)");
  KILN_CHECK(m.aux_loss_scope == "micro_batch" || m.aux_loss_scope == "global",
             "model.moe.aux_loss_scope must be \"micro_batch\" or \"global\" (got \"{}\")",
             m.aux_loss_scope);
  KILN_CHECK(m.bias_update_rate >= 0.0 && std::isfinite(m.bias_update_rate),
             "model.moe.bias_update_rate ({}) must be >= 0", m.bias_update_rate);
  KILN_CHECK(m.capacity_factor >= 0.0 && std::isfinite(m.capacity_factor),
             "model.moe.capacity_factor ({}) must be >= 0 (0: dropless)", m.capacity_factor);
}

}  // namespace

RopeSpec llama_rope_of(const ModelOptions& o) {
  const ModelKeys& k = llama_keys();
  RopeSpec rope;
  rope.theta = o.value(k, "rope_theta");
  rope.scale_factor = o.value(k, "rope_scaling.factor");
  rope.low_freq_factor = o.value(k, "rope_scaling.low_freq_factor");
  rope.high_freq_factor = o.value(k, "rope_scaling.high_freq_factor");
  rope.original_max_positions = o.value(k, "rope_scaling.original_max_position");
  return rope;
}

void llama_check_options(const ModelOptions& o, const KeySource& source) {
  if (o.n_layer > 0) {
    // The moe.* keys' checks, before the shape is complete (an expert width of 0 is
    // resolved from ffn_hidden_size later).
    LlamaConfig c;
    c.n_layer = o.n_layer;
    c.moe = moe_of(o);
    if (c.moe.enabled() && c.moe.ffn_hidden_size == 0) c.moe.ffn_hidden_size = 1;
    try {
      validate_moe(c);
    } catch (const Error& e) {
      // Each message starts with the key it is about: name where that key came from.
      const std::string msg = e.what();
      KILN_FAIL("{}: {}", source(msg.substr(0, msg.find_first_of(" ="))), msg);
    }
  }
  const int n_kv_head = o.integer(llama_keys(), "n_kv_head");
  if (n_kv_head > 0 && o.n_head > 0)
    KILN_CHECK(o.n_head % n_kv_head == 0, "{}: key 'model.n_kv_head' ({}) must divide "
               "model.n_head ({})", source("model.n_kv_head"), n_kv_head, o.n_head);
  const int head_dim = o.integer(llama_keys(), "head_dim");
  KILN_CHECK(head_dim % 2 == 0, "{}: key 'model.head_dim' ({}) must be even: rotary "
             "embeddings turn channel pairs", source("model.head_dim"), head_dim);
  const RopeSpec rope = llama_rope_of(o);
  if (rope.scale_factor > 0)
    KILN_CHECK(rope.high_freq_factor > rope.low_freq_factor,
               "{}: key 'model.rope_scaling.high_freq_factor' ({}) must exceed "
               "model.rope_scaling.low_freq_factor ({})",
               source("model.rope_scaling.high_freq_factor"), rope.high_freq_factor,
               rope.low_freq_factor);
}


bool LlamaConfig::is_moe_block(int l) const {
  return moe.enabled() && l >= moe.first_k_dense && (l + 1) % moe.sparse_step == 0 &&
         std::find(moe.dense_layers.begin(), moe.dense_layers.end(), l) == moe.dense_layers.end();
}

int LlamaConfig::default_ffn_hidden_size(int n_embd) {
  const int h = 2 * (4 * n_embd) / 3;
  return (h + 255) / 256 * 256;
}

void LlamaConfig::validate() const {
  KILN_CHECK(n_layer > 0, "model.n_layer must be positive for llama (got {})", n_layer);
  KILN_CHECK(explicit_head_dim >= 0, "model.head_dim must be >= 0 (got {}; 0 = n_embd / "
             "n_head)", explicit_head_dim);
  KILN_CHECK(n_head > 0 && n_embd > 0 && n_embd % n_head == 0,
             "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
  KILN_CHECK(explicit_head_dim % 2 == 0, "model.head_dim ({}) must be even for rotary "
             "embeddings", explicit_head_dim);
  KILN_CHECK(head_dim() % 2 == 0, "model.n_embd / model.n_head ({}) must be even for rotary "
             "embeddings (or set model.head_dim)", head_dim());
  KILN_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0,
             "model.n_kv_head ({}) must divide model.n_head ({})", n_kv_head, n_head);
  KILN_CHECK(ffn_hidden_size > 0, "model.ffn_hidden_size must be positive (got {})", ffn_hidden_size);
  // Widths are ints: the fused q/k/v ((NH + 2 NKV) HD) and gate/up (2 F) must fit one.
  const int64_t qkv_width = (int64_t{n_head} + 2 * n_kv_head) * head_dim();
  KILN_CHECK(qkv_width <= INT32_MAX && ffn_hidden_size <= INT32_MAX / 2,
             "model.head_dim ({}) or model.ffn_hidden_size ({}) is too large: (n_head + 2 "
             "n_kv_head) * head_dim and 2 * ffn_hidden_size must be below 2^31", head_dim(),
             ffn_hidden_size);
  KILN_CHECK(vocab_size > 0 && padded_vocab_size >= vocab_size,
             "model.vocab_size ({}) must be positive and at most the padded {}", vocab_size,
             padded_vocab_size);
  KILN_CHECK(block_size > 0, "model.block_size must be positive (got {})", block_size);
  KILN_CHECK(norm_eps > 0.f, "model.norm_eps must be positive (got {})", norm_eps);
  KILN_CHECK(rope.theta > 0.0, "model.rope_theta must be positive (got {})", rope.theta);
  KILN_CHECK(rope.scale_factor == 0.0 || rope.scale_factor >= 1.0,
             "model.rope_scaling.factor must be 0 (no scaling) or >= 1 (got {}): it stretches "
             "long wavelengths", rope.scale_factor);
  if (rope.scale_factor > 0.0) {
    KILN_CHECK(rope.low_freq_factor > 0.0 && rope.high_freq_factor > rope.low_freq_factor,
               "model.rope_scaling.high_freq_factor ({}) must exceed low_freq_factor ({}) > 0",
               rope.high_freq_factor, rope.low_freq_factor);
    KILN_CHECK(rope.original_max_positions > 0.0,
               "model.rope_scaling.original_max_position must be positive (got {})",
               rope.original_max_positions);
  }
  validate_moe(*this);
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t C = n_embd, V = vocab_size, F = ffn_hidden_size;
  const int64_t HD = head_dim(), NH = n_head, NKV = n_kv_head;
  const int64_t E = moe.num_experts, Fe = moe.ffn_hidden_size, Fs = moe.shared_experts * Fe;
  int64_t blocks = 0;
  for (int l = 0; l < n_layer; ++l)
    blocks += C * (NH + 2 * NKV) * HD + NH * HD * C + 2 * C +
              (qk_norm ? 2 * HD : 0) +
              (is_moe_block(l) ? E * C + 3 * E * Fe * C + 3 * Fs * C : 3 * C * F);
  return V * C * (tie_embeddings ? 1 : 2) + blocks + C;
}

double LlamaConfig::block_matmul_weights(int l) const {
  const double C = n_embd, F = ffn_hidden_size, HD = head_dim(), NH = n_head, NKV = n_kv_head;
  const double E = moe.num_experts, k = moe.top_k, Fe = moe.ffn_hidden_size;
  const double Fs = moe.shared_experts * Fe;
  const double attention = C * (NH + 2 * NKV) * HD + NH * HD * C;
  return attention + (is_moe_block(l) ? E * C + 3.0 * k * Fe * C + 3.0 * Fs * C : 3.0 * C * F);
}

double LlamaConfig::flops_per_token(int T) const {
  const double L = n_layer, V = vocab_size, C = n_embd, HD = head_dim(), NH = n_head;
  double matmul = V * C;
  for (int l = 0; l < n_layer; ++l) matmul += block_matmul_weights(l);
  return 6.0 * matmul + 12.0 * L * static_cast<double>(T) * NH * HD;
}

std::string LlamaConfig::str() const {
  return fmt::format("Llama n_layer={} n_head={} n_kv_head={} n_embd={} head_dim={}{} ffn={} "
                     "vocab={} (padded {}) block={} rope_theta={} rope_scaling={} {} "
                     "params={:.2f}M",
                     n_layer, n_head, n_kv_head, n_embd, head_dim(), qk_norm ? " qk_norm" : "",
                     ffn_hidden_size, vocab_size,
                     padded_vocab_size, block_size, rope.theta, rope.scale_factor,
                     tie_embeddings ? "tied" : "untied", num_parameters() / 1e6) +
         (moe.enabled() ? fmt::format(" moe: experts={} top_k={} expert_ffn={} shared={} {}",
                                      moe.num_experts, moe.top_k, moe.ffn_hidden_size,
                                      moe.shared_experts, moe.scoring)
                        : std::string()) +
         (moe.capacity_factor > 0 ? fmt::format(" capacity_factor={}", moe.capacity_factor)
                                  : std::string());
}

LlamaConfig llama_config_of(const ModelOptions& o) {
  KILN_CHECK(o.dropout == 0.f, "model.dropout ({}): llama has no dropout (set 0)", o.dropout);
  check_family_keys(o, llama_keys());
  const ModelKeys& k = llama_keys();
  LlamaConfig c;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  const int n_kv_head = o.integer(k, "n_kv_head"), ffn = o.integer(k, "ffn_hidden_size");
  c.n_kv_head = n_kv_head > 0 ? n_kv_head : o.n_head;
  c.n_embd = o.n_embd;
  c.explicit_head_dim = o.integer(k, "head_dim");
  c.qk_norm = o.flag(k, "qk_norm");
  c.ffn_hidden_size = ffn > 0 ? ffn : LlamaConfig::default_ffn_hidden_size(o.n_embd);
  c.vocab_size = o.vocab_size;
  c.padded_vocab_size = (o.vocab_size + 127) / 128 * 128;
  c.block_size = o.block_size;
  c.norm_eps = static_cast<float>(o.value(k, "norm_eps"));
  c.rope = llama_rope_of(o);
  c.tie_embeddings = o.flag(k, "tie_embeddings");
  c.moe = moe_of(o);
  if (c.moe.enabled() && c.moe.ffn_hidden_size == 0) c.moe.ffn_hidden_size = c.ffn_hidden_size;
  c.validate();
  return c;
}

namespace {
// The moe.* keys as a checkpoint's state "model" "moe" object (choices as strings).
nlohmann::json moe_json(const LlamaMoeConfig& m) {
  return {{"num_experts", m.num_experts},
          {"top_k", m.top_k},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"shared_experts", m.shared_experts},
          {"scoring", m.scoring},
          {"routing", m.routing},
          {"norm_topk_prob", m.norm_topk_prob},
          {"first_k_dense", m.first_k_dense},
          {"sparse_step", m.sparse_step},
          {"dense_layers", m.dense_layers},
          {"aux_loss_coef", m.aux_loss_coef},
          {"aux_loss_type", m.aux_loss_type},
          {"aux_loss_scope", m.aux_loss_scope},
          {"z_loss_coef", m.z_loss_coef},
          {"expert_bias", m.expert_bias},
          {"bias_update_rate", m.bias_update_rate},
          {"capacity_factor", m.capacity_factor}};
}
}  // namespace

nlohmann::json llama_config_json(const LlamaConfig& c) {
  nlohmann::json j = {{"n_layer", c.n_layer},
                       {"n_head", c.n_head},
                       {"n_kv_head", c.n_kv_head},
                       {"n_embd", c.n_embd},
                       {"head_dim", c.explicit_head_dim},
                       {"qk_norm", c.qk_norm},
                       {"ffn_hidden_size", c.ffn_hidden_size},
                       {"vocab_size", c.vocab_size},
                       {"padded_vocab_size", c.padded_vocab_size},
                       {"block_size", c.block_size},
                       {"norm_eps", c.norm_eps},
                       {"rope_theta", c.rope.theta},
                       {"rope_scaling",
                        {{"factor", c.rope.scale_factor},
                         {"low_freq_factor", c.rope.low_freq_factor},
                         {"high_freq_factor", c.rope.high_freq_factor},
                         {"original_max_position", c.rope.original_max_positions}}},
                       {"tie_embeddings", c.tie_embeddings}};
  if (!c.moe.enabled()) return j;  // a dense model's state as before MoE existed
  j["moe"] = moe_json(c.moe);
  return j;
}

namespace {
// The moe.* keys of a checkpoint's state "model" "moe" object into o.family (choices as
// their index, bools 0 / 1) and o.family_lists (dense_layers); a key absent (a state
// written before it existed) keeps its default.
void moe_options_from_json(ModelOptions& o, const nlohmann::json& m) {
  const ModelKeys& keys = llama_keys();
  for (const ModelKey& k : keys) {
    if (!k.name.starts_with("moe.")) continue;
    if (!m.contains(k.name.substr(4))) continue;
    if (k.type == ModelKeyType::IntegerList) {
      o.family_lists[k.name] = m.at(k.name.substr(4)).get<std::vector<int>>();
      continue;
    }
    const nlohmann::json& v = m.at(k.name.substr(4));
    double x = 0.0;
    if (k.type == ModelKeyType::Choice) {
      const auto it = std::find(k.choices.begin(), k.choices.end(), v.get<std::string>());
      KILN_CHECK(it != k.choices.end(), "state.model.{}: \"{}\" is not one of its choices",
                 k.name, v.get<std::string>());
      x = static_cast<double>(it - k.choices.begin());
    } else if (k.type == ModelKeyType::Bool) {
      x = v.get<bool>() ? 1.0 : 0.0;
    } else {
      x = v.get<double>();
    }
    o.family[k.name] = x;
  }
}
}  // namespace

void llama_set_moe_options(ModelOptions& o, const LlamaMoeConfig& moe) {
  if (moe.enabled()) moe_options_from_json(o, moe_json(moe));
}

ModelOptions llama_part_options(const LlamaConfig& c, bool has_head) {
  ModelOptions o = llama_options_from_json(llama_config_json(c));
  o.family.erase("head_dim");
  if (!has_head) o.family.erase("tie_embeddings");
  return o;
}

ModelOptions llama_options_from_json(const nlohmann::json& j) {
  ModelOptions o;
  o.arch = "llama";
  auto integer = [&](const char* key) {
    return static_cast<int>(json_integer_field(j, key, "state.model", INT32_MIN, INT32_MAX));
  };
  o.n_layer = integer("n_layer");
  o.n_head = integer("n_head");
  o.n_embd = integer("n_embd");
  o.vocab_size = integer("vocab_size");
  o.block_size = integer("block_size");
  o.family["n_kv_head"] = integer("n_kv_head");
  o.family["ffn_hidden_size"] = integer("ffn_hidden_size");
  // Checkpoints from before the keys: the Llama 3 attention (0 = n_embd / n_head, no norm).
  if (j.contains("head_dim")) o.family["head_dim"] = integer("head_dim");
  if (j.contains("qk_norm")) o.family["qk_norm"] = j.at("qk_norm").get<bool>() ? 1.0 : 0.0;
  o.family["norm_eps"] = j.at("norm_eps").get<float>();
  o.family["rope_theta"] = j.at("rope_theta").get<double>();
  const auto& rs = j.at("rope_scaling");
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position"})
    o.family[std::string("rope_scaling.") + key] = rs.at(key).get<double>();
  o.family["tie_embeddings"] = j.at("tie_embeddings").get<bool>() ? 1.0 : 0.0;
  if (j.contains("moe")) moe_options_from_json(o, j.at("moe"));
  llama_config_of(o);  // validates
  return o;
}

}  // namespace kiln
