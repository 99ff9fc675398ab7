// What a training config says each component is: the model's options (for make_model,
// models/registry.h) and the optimizer's settings (optim/adamw.h).
#pragma once

#include "config/config.h"
#include "models/model_options.h"
#include "optim/adamw.h"

namespace kiln {

/// The [model] section of a training config, for make_model (models/registry.h).
ModelOptions model_options_from(const TrainConfig& config);

/// The optimizer settings of a training config ([optim], train.stochastic_rounding and
/// train.ema_decay). Throws kiln::Error naming the config when train.ema_decay rounds to 1
/// in fp32.
AdamWConfig adamw_config_from(const TrainConfig& config);

}  // namespace kiln
