// What a training config says each component is: the model's options (for make_model,
// models/registry.h) and the optimizer's settings (optim/adamw.h).
#pragma once

#include "config/config.h"
#include "models/model_options.h"
#include "optim/adamw.h"

#include <functional>
#include <string>
#include <string_view>

namespace kiln {

/// The [model] section of a training config, for make_model (models/registry.h).
ModelOptions model_options_from(const TrainConfig& config);

/// The layout's axes the model's registry entry supports (ModelArch::stages for
/// parallel.pp > 1, tensor_parallel for parallel.tp > 1, context_parallel for parallel.cp >
/// 1, none beyond 1 where ModelArch::single_layout_reason gives a reason for that axis),
/// checked from the config alone, before any rank connects or data and weights are read. Throws kiln::Error
/// naming where the key was set (`where("parallel.tp")`: the file, or "--set"; without
/// `where`, config.source), the key and the architectures that support it. Loading a
/// config checks it; a trainer checks again for configs built in code.
void check_layout_supported(const TrainConfig& config,
                            const std::function<std::string(std::string_view key)>& where = {});

/// The optimizer settings of a training config ([optim], train.stochastic_rounding and
/// train.ema_decay). Throws kiln::Error naming the config when train.ema_decay rounds to 1
/// in fp32.
AdamWConfig adamw_config_from(const TrainConfig& config);

}  // namespace kiln
