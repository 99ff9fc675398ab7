// ForwardingBackend: a Backend that forwards every call to an inner backend and reports
// each one to on_call(name) first (name = the Backend method). Tests derive from it to
// count calls (CountingBackend) or to watch particular ones (override the method and
// call ForwardingBackend's). The ops come from backend/op_list.h, so a new op needs no
// change here.
#pragma once

#include "backend/backend.h"
#include "backend/op_list.h"

#include <map>
#include <string>

namespace kiln::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}
  Backend& inner() const { return in_; }
  /// Called before each forwarded call (not for name/device/allocator/supports queries).
  virtual void on_call(const char* /*name*/) {}

  std::string name() const override { return in_.name(); }
  Device device() const override { return in_.device(); }
  Allocator& allocator() override { return in_.allocator(); }
  Allocator& staging_allocator() override { return in_.staging_allocator(); }
  Stream default_stream() override { return in_.default_stream(); }
  std::string gemm_path(DType dt) const override { return in_.gemm_path(dt); }
  int64_t record_marker(Stream s) override { return in_.record_marker(s); }
  double marker_elapsed_ms(int64_t from, int64_t to) override {
    return in_.marker_elapsed_ms(from, to);
  }
  void release_markers() override { in_.release_markers(); }
  void synchronize(Stream s) override {
    on_call("synchronize");
    in_.synchronize(s);
  }
  void copy_from_host(Stream s, const Tensor& d, const void* p) override {
    on_call("copy_from_host");
    in_.copy_from_host(s, d, p);
  }
  void copy_to_host(Stream s, void* d, const Tensor& t) override {
    on_call("copy_to_host");
    in_.copy_to_host(s, d, t);
  }
  void copy(Stream s, const Tensor& d, const Tensor& t) override {
    on_call("copy");
    in_.copy(s, d, t);
  }
  void copy_stochastic_round(Stream s, const Tensor& d, const Tensor& t, uint64_t seed,
                             uint64_t stream, const GlobalIndices& at) override {
    on_call("copy_stochastic_round");
    in_.copy_stochastic_round(s, d, t, seed, stream, at);
  }
  void fill(Stream s, const Tensor& t, float v) override {
    on_call("fill");
    in_.fill(s, t, v);
  }
#define KILN_FORWARD_OP(Call, method, family, category, params, args) \
  void method(Stream s, KILN_PARAMS params) override {         \
    on_call(#method);                                          \
    in_.method(s, KILN_PARAMS args);                           \
  }
  KILN_BACKEND_OPS(KILN_FORWARD_OP)
#undef KILN_FORWARD_OP

 protected:
  bool runs(Op op, DType dt) const override { return in_.supports(op, dt); }

 private:
  Backend& in_;
};

/// Counts every forwarded call by method name.
class CountingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::map<std::string, int64_t> counts;
  void on_call(const char* name) override { ++counts[name]; }
  /// The calls after which the host waits for the device: copy_to_host and synchronize.
  int64_t host_waits() const {
    auto at = [&](const char* k) { auto it = counts.find(k); return it == counts.end() ? 0 : it->second; };
    return at("copy_to_host") + at("synchronize");
  }
};

}  // namespace kiln::testing
