// The Meta backend's view of each op of backend/op_list.h: its arguments checked with
// the op_checks every backend uses, and the sizes a MetaScratchModel needs.
#pragma once

#include "backend/meta/meta_backend.h"

namespace kiln::meta_calls {

#define KILN_META_DECLARE(Call, method, family, category, params, args) \
  MetaCallInfo method(KILN_PARAMS params);
KILN_BACKEND_OPS(KILN_META_DECLARE)
#undef KILN_META_DECLARE

}  // namespace kiln::meta_calls
