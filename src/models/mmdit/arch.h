// The mmdit family's registry entry (ModelArch, models/registry.h), stated in its folder
// and listed once by models/registry.cpp.
#pragma once

#include "models/registry.h"

namespace kiln {

ModelArch mmdit_arch();

}  // namespace kiln
