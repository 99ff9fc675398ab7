#include "models/gpt2/config.h"
#include "models/model_options.h"

#include "core/error.h"
#include "core/json_util.h"

#include <fmt/format.h>

namespace kiln {

GPT2Config GPT2Config::preset(std::string_view name) {
  GPT2Config c;
  if (name == "gpt2") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768;
  } else if (name == "gpt2-medium") {
    c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
  } else if (name == "gpt2-large") {
    c.n_layer = 36, c.n_head = 20, c.n_embd = 1280;
  } else if (name == "gpt2-xl") {
    c.n_layer = 48, c.n_head = 25, c.n_embd = 1600;
  } else {
    KILN_FAIL("unknown model preset '{}' (expected gpt2, gpt2-medium, gpt2-large or gpt2-xl)",
              name);
  }
  return c;
}

int GPT2Config::pad_vocab(int vocab_size, int multiple) {
  KILN_CHECK(multiple > 0, "pad_vocab: multiple {} must be > 0", multiple);
  const int64_t padded = (int64_t{vocab_size} + multiple - 1) / multiple * multiple;
  KILN_CHECK(padded <= INT32_MAX, "vocab_size {} padded to a multiple of {} exceeds 2^31 - 1",
             vocab_size, multiple);
  return static_cast<int>(padded);
}

void GPT2Config::validate() const {
  KILN_CHECK(n_layer > 0 && n_head > 0 && n_embd > 0, "model: n_layer, n_head and n_embd must be "
             "positive (got {}, {}, {})", n_layer, n_head, n_embd);
  KILN_CHECK(n_embd % n_head == 0, "model: n_embd ({}) must be divisible by n_head ({})", n_embd,
             n_head);
  // Widths are ints: the MLP's 4 n_embd must fit one.
  KILN_CHECK(n_embd <= INT32_MAX / 4, "model.n_embd ({}) is too large: 4 * n_embd must be below 2^31",
             n_embd);
  KILN_CHECK(vocab_size > 0 && padded_vocab_size >= vocab_size,
             "model: padded_vocab_size ({}) must be >= vocab_size ({}) > 0", padded_vocab_size,
             vocab_size);
  KILN_CHECK(block_size > 0, "model: block_size must be positive (got {})", block_size);
  KILN_CHECK(dropout >= 0.f && dropout < 1.f, "model: dropout must be in [0, 1) (got {})", dropout);
}

int64_t GPT2Config::num_parameters() const {
  const int64_t C = n_embd, L = n_layer;
  return static_cast<int64_t>(vocab_size) * C + static_cast<int64_t>(block_size) * C +
         L * (12 * C * C + 13 * C) + 2 * C;
}

int64_t GPT2Config::num_flop_parameters() const {
  return num_parameters() - static_cast<int64_t>(block_size) * n_embd;
}

double GPT2Config::flops_per_token(int T) const {
  return 6.0 * static_cast<double>(num_flop_parameters()) +
         12.0 * n_layer * static_cast<double>(T) * n_embd;
}

std::string GPT2Config::str() const {
  return fmt::format("GPT-2 n_layer={} n_head={} n_embd={} vocab={} (padded {}) block={} "
                     "dropout={} params={:.2f}M",
                     n_layer, n_head, n_embd, vocab_size, padded_vocab_size, block_size, dropout,
                     num_parameters() / 1e6);
}

nlohmann::json gpt2_config_json(const GPT2Config& c) {
  return {{"n_layer", c.n_layer},       {"n_head", c.n_head},
          {"n_embd", c.n_embd},         {"vocab_size", c.vocab_size},
          {"padded_vocab_size", c.padded_vocab_size}, {"block_size", c.block_size},
          {"dropout", c.dropout}};
}

GPT2Config gpt2_config_from_json(const nlohmann::json& j) {
  GPT2Config c;
  auto integer = [&](const char* key) {
    return static_cast<int>(json_integer_field(j, key, "state.model", INT32_MIN, INT32_MAX));
  };
  c.n_layer = integer("n_layer");
  c.n_head = integer("n_head");
  c.n_embd = integer("n_embd");
  c.vocab_size = integer("vocab_size");
  c.padded_vocab_size = integer("padded_vocab_size");
  c.block_size = integer("block_size");
  c.dropout = j.value("dropout", 0.f);
  c.validate();
  return c;
}

ModelOptions gpt2_options_from_json(const nlohmann::json& j) {
  const GPT2Config c = gpt2_config_from_json(j);
  ModelOptions o;
  o.arch = "gpt2";
  o.n_layer = c.n_layer;
  o.n_head = c.n_head;
  o.n_embd = c.n_embd;
  o.block_size = c.block_size;
  o.vocab_size = c.vocab_size;
  o.dropout = c.dropout;
  return o;
}

GPT2Config gpt2_config_of(const ModelOptions& o) {
  check_family_keys(o, {});  // GPT-2 declares no keys of its own (ModelArch::keys)
  GPT2Config c;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.n_embd = o.n_embd;
  c.block_size = o.block_size;
  c.vocab_size = o.vocab_size;
  c.padded_vocab_size = GPT2Config::pad_vocab(o.vocab_size);
  c.dropout = o.dropout;
  return c;
}

}  // namespace kiln
