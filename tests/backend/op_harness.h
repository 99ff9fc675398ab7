// The cross-backend op harness: every test runs once per backend of
// `available_backends()` (a CUDA backend, once registered, goes through the same cases
// unchanged), with fresh random inputs whose seed is printed on failure and can be
// replayed with KILN_TEST_SEED=<seed>.
//
// Helpers: upload/download through copy_from_host/copy_to_host, NaN-poisoned outputs,
// norm-relative comparison against the double references (reference.h) with the worst
// element-wise error printed, and central-difference checks of backward ops.
#pragma once

#include "backend/backend.h"
#include "backend/registry.h"
#include "reference.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace kiln::test {

using ref::Vec;

/// The backends under test (created once), and their names for test instantiation.
std::vector<std::unique_ptr<Backend>>& backends();
std::vector<std::string> backend_names();
Backend& backend_by_name(const std::string& name);
/// A gtest-safe test name for a backend parameter ("cuda:0" -> "cuda_0").
std::string param_name(const ::testing::TestParamInfo<std::string>& info);

/// "k1=v1 k2=v2 ": the sizes of a case, for failure messages.
std::string sizes(std::initializer_list<std::pair<const char*, int64_t>> kv);

/// Keeps the worst errors seen per label, printed at the end of the run.
void record_error(const std::string& label, double rel, double abs);

/// Seed of this test: KILN_TEST_SEED when set, else std::random_device.
uint64_t test_seed();

/// ||got - want|| / max(||want||, min_norm) <= tol (absolute when both are 0), every
/// element finite. min_norm gives the natural size of the result where the exact answer
/// is (near) zero, e.g. layernorm's dinp at C = 1. The message names the label, sizes,
/// worst element and the errors.
::testing::AssertionResult near_by_norm(const std::string& label, const std::vector<float>& got,
                                        const Vec& want, double tol, double min_norm = 0);
/// Element-wise bitwise equality.
::testing::AssertionResult bitwise_equal(const std::string& label, const std::vector<float>& got,
                                         const std::vector<float>& want);

std::vector<double> to_double(const std::vector<float>& v);
std::vector<float> to_float(const Vec& v);
/// got - base, in double (gradient added to a pre-filled buffer).
Vec minus(const std::vector<float>& got, const std::vector<float>& base);
/// near_by_norm's min_norm for such an increment checked at `tol`: 2^-23 ||base|| / tol,
/// so the fp32 buffer's own rounding (up to an ulp of base per element) stays within tol
/// where the increment is far smaller than the buffer (random inputs at C = 1). Also the
/// floor of an fp32 dot product that cancels, with `base` the sums of its terms' |a b|.
double accumulated_min_norm(const std::vector<float>& base, double tol);

/// A forward function of several inputs, for finite differences: inputs -> outputs.
using Inputs = std::vector<Vec>;
using Forward = std::function<Vec(const Inputs&)>;

/// L = sum_i w_i * f(x)_i.
double weighted_loss(const Forward& f, const Inputs& x, const Vec& w);

/// Central differences of L with respect to input `which` at `ncoords` random
/// coordinates (plus the first and the last), compared with
///   - `ref_grad` (the double reference backward): tight, |ref - fd| <= 1e-6 (|fd| + s);
///   - `got_grad` (the backend's, pre-fill removed): |got - fd| <= tol (|fd| + s) + 1e-6;
/// s is the RMS of ref_grad (at least min_scale). Returns the failures (empty when all agree).
::testing::AssertionResult check_fd(const std::string& label, const Forward& f, const Inputs& x,
                                    const Vec& w, int which, const Vec& ref_grad,
                                    const Vec& got_grad, std::mt19937_64& rng, int ncoords = 8,
                                    double tol = 1e-4, double min_scale = 0);

class OpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;

  Backend& be() { return *be_; }
  Stream st() { return stream_; }

  // ---- random inputs --------------------------------------------------------------------
  std::vector<float> randn(int64_t n, float std = 1.f, float mean = 0.f);
  std::vector<float> randu(int64_t n, float lo, float hi);
  int randint(int lo, int hi);  // [lo, hi]
  std::mt19937_64& rng() { return rng_; }

  // ---- device transfers -----------------------------------------------------------------
  Tensor upload(const std::vector<float>& host, const Shape& shape,
                MemCategory cat = MemCategory::Activations);
  Tensor upload_i32(const std::vector<int32_t>& host, const Shape& shape);
  /// A new fp32 tensor with every element NaN, so that an unwritten element fails.
  Tensor poisoned(const Shape& shape, MemCategory cat = MemCategory::Activations);
  void set(const Tensor& t, const std::vector<float>& host);
  void poison(const Tensor& t);
  std::vector<float> download(const Tensor& t);
  /// A tensor of dtype `dt` holding `host` (converted by the backend's copy), and any float
  /// tensor back as fp32 (through the backend's copy).
  Tensor up(const std::vector<float>& host, const Shape& shape, DType dt,
            MemCategory cat = MemCategory::Activations);
  std::vector<float> down(const Tensor& t);
  std::vector<int32_t> download_i32(const Tensor& t);

  uint64_t seed_ = 0;

 private:
  Backend* be_ = nullptr;
  Stream stream_;
  std::mt19937_64 rng_;
  std::optional<::testing::ScopedTrace> trace_;
};

}  // namespace kiln::test
