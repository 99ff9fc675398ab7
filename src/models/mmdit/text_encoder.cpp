#include "models/mmdit/text_encoder.h"

#include "models/mmdit/joint_text_encoder.h"
#include "models/mmdit/llama_text_encoder.h"

namespace kiln {

std::unique_ptr<TextEncoder> make_text_encoder(const MMDiTConfig& c) {
  if (c.text_encoder == TextEncoderKind::Llama) return std::make_unique<LlamaTextEncoder>(c);
  return std::make_unique<JointTextEncoder>(c);
}

}  // namespace kiln
