// Every backend compiled into this build and usable on this machine.
#pragma once

#include "backend/backend.h"
#include "backend/options.h"

#include <memory>
#include <string>
#include <vector>

namespace kiln {

/// The CPU backend first, then each GPU backend whose device is present. Backends that
/// are compiled in but cannot run here (no GPU) are absent; `skipped_backends` names
/// them with the reason, for a visible skip message in tests.
std::vector<std::unique_ptr<Backend>> available_backends();
std::vector<std::string> skipped_backends();

/// GPUs of `kind` ("cuda") visible to this process; 0 when none or not compiled in.
int gpu_device_count(const std::string& kind);
/// Why no GPU of `kind` can be used here ("not compiled into this build", "compiled, but
/// no GPU visible (...)"); empty when one can.
std::string gpu_unavailable_reason(const std::string& kind);

/// A backend by name ("cpu", "cuda", "cuda:N"), made with `options` (the CPU backend
/// has none to take); throws kiln::Error when unknown or unavailable.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});

}  // namespace kiln
