// MetaBackend: a backend that allocates nothing real and computes nothing, for dry runs.
//
// Its allocator is a kiln Allocator (so every byte is accounted by MemCategory exactly as
// on a real backend: current, per-category peaks and the peak of the total), but
// raw_allocate hands out fake, never-dereferenced addresses from a counter: a model of
// GPT-2 XL "allocates" tens of GiB in microseconds and touches no memory. Its ops check
// their arguments with the same op_checks as every backend (so a dry run fails where a
// real run would on a shape error) and then do nothing, except:
//   copy_to_host   fills the host buffer with zeros (callers reading losses and
//                  gradient norms get 0)
// supports() answers as the backend it stands for: that of `device` (the CUDA backend's
// answers for a CUDA device, the CPU backend's otherwise), so that a plan meets the
// capability checks the real run meets. Its ops themselves accept every dtype op_checks
// accepts.
//
// What a concrete backend allocates INSIDE its ops (library scratch space, counted as
// Temporaries there) is invisible to a backend that computes nothing; a MetaScratchModel
// supplies it (the memory planner has one for the CPU backend's oneDNN scratchpad and
// one for the CUDA backend's workspace and op scratch; see src/plan/). Three kinds:
//   persistent  allocated when the backend is built, kept (cuBLASLt's workspace)
//   growing     one buffer kept at the largest size any op asked for, grown by freeing
//               the old one first (the CPU backend's oneDNN user scratchpad)
//   transient   allocated at the start of one op and freed at its end (CUDA op scratch)
//
// Used by `kiln memplan` (src/plan/memplan.h): the planner builds exactly what the
// trainer builds on a MetaBackend and reads the allocator's peaks.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <memory>
#include <string>

namespace kiln {

/// One call's sizes (those that apply; the rest stay 0), as op_checks returns them. Every
/// call of the Backend interface that may need scratch memory is an op of
/// backend/op_list.h.
struct MetaCallInfo {
  Op call = Op::EmbeddingForward;
  DType dtype = DType::F32;  // of the activations / the tensor
  int64_t numel = 0;         // sum_squares, adamw: elements
  int64_t N = 0;             // rows: B*T (layernorm, linear, cross-entropy); tokens (the
                             // MoE router, with C its experts; the permutation, with C its
                             // channels); the permuted rows M (grouped linear)
  int64_t B = 0, T = 0, C = 0, NH = 0, Vp = 0;  // attention: C = NH * HD
  int64_t NKV = 0, HD = 0;  // attention: key/value heads, head size
  int64_t H = 0;            // swiglu: hidden width
  int64_t IC = 0, OC = 0;  // linear, grouped linear
  int64_t E = 0;           // grouped linear: experts (the weight's groups); the plan's
  bool has_bias = false;   // linear forward: a bias; linear backward: dbias requested
  bool has_dinp = false;   // linear and grouped linear backward
  bool has_dweight = false;
  DType grad_dtype = DType::F32;  // linear backward: of dweight (and dbias)
};

/// What a concrete backend would allocate as Temporaries beyond the tensors it is given.
class MetaScratchModel {
 public:
  virtual ~MetaScratchModel() = default;
  virtual std::string name() const = 0;
  /// Allocated when the MetaBackend is built and kept for its lifetime.
  virtual int64_t persistent_bytes() const { return 0; }
  /// The size the backend's one growing scratch buffer must have for this call (0: none).
  virtual int64_t growing_bytes(const MetaCallInfo&) { return 0; }
  /// Scratch allocated for the duration of this call only (0: none).
  virtual int64_t transient_bytes(const MetaCallInfo&) { return 0; }
};

struct MetaBackendOptions {
  std::string name = "meta";
  /// The device the planned run would use (tensors report it; nothing lives there); its
  /// backend's `supports` answers are this backend's.
  Device device = Device::cpu();
  /// Scratch model; nullptr = none (only the tensors callers allocate are counted).
  std::shared_ptr<MetaScratchModel> scratch;
};

/// An Allocator whose memory is fake: unique, 64-byte aligned, never-dereferenced
/// addresses from a counter (never reused). Accounting is the Allocator base's.
class MetaAllocator final : public Allocator {
 public:
  explicit MetaAllocator(Device device) : device_(device) {}
  Device device() const override { return device_; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void*) override {}

 private:
  Device device_;
  std::mutex mu_;
  uintptr_t next_ = uintptr_t{1} << 44;  // far from any real mapping of a small process
};

/// A new meta backend.
std::unique_ptr<Backend> make_meta_backend(const MetaBackendOptions& options = {});

}  // namespace kiln
