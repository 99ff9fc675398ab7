#include "config/components.h"

#include "core/error.h"

namespace kiln {

ModelOptions model_options_from(const TrainConfig& config) {
  ModelOptions o;
  o.arch = config.model.arch;
  o.n_layer = config.model.n_layer;
  o.n_head = config.model.n_head;
  o.n_embd = config.model.n_embd;
  o.block_size = config.model.block_size;
  o.vocab_size = config.model.vocab_size;
  o.dropout = static_cast<float>(config.model.dropout);
  o.family = config.model.family;
  o.family_lists = config.model.family_lists;
  return o;
}

AdamWConfig adamw_config_from(const TrainConfig& config) {
  AdamWConfig oc;
  oc.lr = static_cast<float>(config.optim.lr);
  oc.beta1 = config.optim.beta1;
  oc.beta2 = config.optim.beta2;
  oc.eps = static_cast<float>(config.optim.eps);
  oc.weight_decay = static_cast<float>(config.optim.weight_decay);
  oc.stochastic_rounding = config.train.stochastic_rounding != 0;
  oc.seed = static_cast<uint64_t>(config.train.seed) ^ 0x5eed5eedull;
  oc.ema_decay = static_cast<float>(config.train.ema_decay);
  oc.multi_tensor = config.optim.multi_tensor;
  KILN_CHECK(oc.ema_decay < 1.f, "{}: key 'train.ema_decay' ({}) is 1 in fp32, where the "
             "average is kept (at most 0.99999994)", config.source, config.train.ema_decay);
  return oc;
}

}  // namespace kiln
