#include "backend/meta/meta_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/meta/meta_calls.h"
#include "core/error.h"

#include <cstring>

namespace kiln {

void* MetaAllocator::raw_allocate(size_t bytes) {
  std::lock_guard lock(mu_);
  const uintptr_t p = next_;
  next_ += (bytes + 63) / 64 * 64 + 64;  // a gap, so that no two buffers are adjacent
  return reinterpret_cast<void*>(p);
}

namespace {

class MetaBackend final : public Backend {
 public:
  explicit MetaBackend(MetaBackendOptions o) : opt_(std::move(o)), alloc_(opt_.device) {
    if (opt_.scratch && opt_.scratch->persistent_bytes() > 0)
      persistent_ = bytes(opt_.scratch->persistent_bytes());
  }

  std::string name() const override { return opt_.name; }
  Device device() const override { return opt_.device; }
  Allocator& allocator() override { return alloc_; }
  Stream default_stream() override { return {}; }
  void synchronize(Stream) override {}

  void copy_from_host(Stream, const Tensor&, const void*) override {}
  void copy_to_host(Stream, void* dst, const Tensor& src) override {
    if (src.nbytes()) std::memset(dst, 0, src.nbytes());
  }
  void copy(Stream, const Tensor& dst, const Tensor& src) override {
    KILN_CHECK(dst.numel() == src.numel(), "copy: {} and {} differ in size", dst.str(), src.str());
  }
  void copy_stochastic_round(Stream, const Tensor& dst, const Tensor& src, uint64_t, uint64_t,
                             const GlobalIndices&) override {
    KILN_CHECK(dst.numel() == src.numel(), "copy_stochastic_round: {} and {} differ in size",
               dst.str(), src.str());
  }
  void fill(Stream, const Tensor&, float) override {}

  // Every op of backend/op_list.h: checked and sized by meta_calls, its scratch held
  // while the (empty) op runs.
#define KILN_META_OP(Call, method, family, category, params, args) \
  void method(Stream, KILN_PARAMS params) override { Scope sc(*this, meta_calls::method args); }
  KILN_BACKEND_OPS(KILN_META_OP)
#undef KILN_META_OP

 protected:
  bool runs(Op op, DType dtype) const override {
    return opt_.device.type == DeviceType::CUDA ? cuda_supports(op, dtype)
                                                : cpu_supports(op, dtype);
  }

 private:
  Tensor bytes(int64_t n) {
    return Tensor::empty(alloc_, Shape{(n + 3) / 4}, DType::F32, MemCategory::Temporaries);
  }

  // Grows the persistent scratch buffer (free first, as the CPU backend does) and holds
  // the call's transient scratch until the op returns.
  struct Scope {
    Scope(MetaBackend& be, const MetaCallInfo& c) {
      MetaScratchModel* m = be.opt_.scratch.get();
      if (m == nullptr) return;
      const int64_t grow = m->growing_bytes(c);
      if (grow > 0 && static_cast<size_t>(grow) > be.growing_.nbytes()) {
        be.growing_ = Tensor();
        be.growing_ = be.bytes(grow);
      }
      const int64_t t = m->transient_bytes(c);
      if (t > 0) transient = be.bytes(t);
    }
    Tensor transient;
  };

  MetaBackendOptions opt_;
  MetaAllocator alloc_;
  Tensor persistent_;
  Tensor growing_;
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend(const MetaBackendOptions& options) {
  return std::make_unique<MetaBackend>(options);
}

}  // namespace kiln
