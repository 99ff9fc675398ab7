#include "op_harness.h"

#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

namespace kiln::test {

std::vector<std::unique_ptr<Backend>>& backends() {
  static std::vector<std::unique_ptr<Backend>> b = available_backends();
  return b;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (auto& b : backends()) names.push_back(b->name());
  return names;
}

Backend& backend_by_name(const std::string& name) {
  for (auto& b : backends())
    if (b->name() == name) return *b;
  throw std::runtime_error("no backend " + name);
}

std::string sizes(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::ostringstream os;
  for (auto& [k, v] : kv) os << k << "=" << v << " ";
  return os.str();
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

namespace {
struct ErrRecord {
  double rel = 0, abs = 0;
  int count = 0;
};
std::mutex g_err_mu;
std::map<std::string, ErrRecord>& err_table() {
  static std::map<std::string, ErrRecord> t;
  return t;
}
std::string g_current_backend;

class HarnessEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    for (const std::string& s : skipped_backends()) std::printf("[  SKIPPED ] %s\n", s.c_str());
    for (auto& b : backends())
      std::printf("[ BACKEND  ] %s on %s\n", b->name().c_str(), b->device().str().c_str());
    std::fflush(stdout);
  }
  void TearDown() override {
    std::printf("\nWorst errors per op output (relative by norm / largest element-wise):\n");
    for (auto& [label, r] : err_table())
      std::printf("  %-48s rel %.3e  abs %.3e  (%d checks)\n", label.c_str(), r.rel, r.abs,
                  r.count);
    std::fflush(stdout);
  }
};
[[maybe_unused]] ::testing::Environment* const g_env =
    ::testing::AddGlobalTestEnvironment(new HarnessEnv);
}  // namespace

void record_error(const std::string& label, double rel, double abs) {
  std::lock_guard lock(g_err_mu);
  ErrRecord& r = err_table()[g_current_backend + ": " + label];
  r.rel = std::max(r.rel, rel);
  r.abs = std::max(r.abs, abs);
  ++r.count;
}

uint64_t test_seed() {
  if (const char* s = std::getenv("KILN_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

::testing::AssertionResult near_by_norm(const std::string& label, const std::vector<float>& got,
                                        const Vec& want, double tol, double min_norm) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << label << ": size " << got.size() << " != expected " << want.size();
  double diff2 = 0, want2 = 0, worst = -1;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      return ::testing::AssertionFailure()
             << label << ": element " << i << " of " << got.size() << " is " << got[i]
             << " (expected " << want[i] << "): unwritten or overflowed";
    }
    const double d = static_cast<double>(got[i]) - want[i];
    diff2 += d * d;
    want2 += want[i] * want[i];
    if (std::fabs(d) > worst) {
      worst = std::fabs(d);
      worst_i = i;
    }
  }
  const double denom2 = std::max(want2, min_norm * min_norm);
  const double rel = denom2 > 0 ? std::sqrt(diff2 / denom2) : std::sqrt(diff2);
  record_error(label, rel, std::max(worst, 0.0));
  if (rel <= tol) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << label << ": relative error by norm " << rel << " > " << tol << " (n=" << got.size()
     << ", ||want||=" << std::sqrt(want2) << "); worst element " << worst_i << ": got "
     << got[worst_i] << ", want " << want[worst_i] << ", |err| " << worst;
  return ::testing::AssertionFailure() << os.str();
}

::testing::AssertionResult bitwise_equal(const std::string& label, const std::vector<float>& got,
                                         const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << label << ": size " << got.size() << " != " << want.size();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (f32_bits(got[i]) != f32_bits(want[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << label << ": " << bad << " of " << got.size()
                                       << " elements differ; first " << first << ": got "
                                       << got[first] << ", want " << want[first];
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<float> to_float(const Vec& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

Vec minus(const std::vector<float>& got, const std::vector<float>& base) {
  Vec d(got.size());
  for (size_t i = 0; i < got.size(); ++i)
    d[i] = static_cast<double>(got[i]) - static_cast<double>(base[i]);
  return d;
}

double accumulated_min_norm(const std::vector<float>& base, double tol) {
  double norm2 = 0;
  for (float b : base) norm2 += static_cast<double>(b) * b;
  return std::ldexp(std::sqrt(norm2), -23) / tol;
}

double weighted_loss(const Forward& f, const Inputs& x, const Vec& w) {
  const Vec y = f(x);
  double L = 0;
  for (size_t i = 0; i < y.size(); ++i) L += w[i] * y[i];
  return L;
}

::testing::AssertionResult check_fd(const std::string& label, const Forward& f, const Inputs& x,
                                    const Vec& w, int which, const Vec& ref_grad,
                                    const Vec& got_grad, std::mt19937_64& rng, int ncoords,
                                    double tol, double min_scale) {
  const Vec& xi = x[which];
  const size_t n = xi.size();
  if (ref_grad.size() != n || got_grad.size() != n)
    return ::testing::AssertionFailure() << label << ": gradient sizes differ from the input's";
  double s = 0;
  for (double g : ref_grad) s += g * g;
  s = std::max(std::sqrt(s / std::max<size_t>(n, 1)), min_scale);
  std::vector<size_t> coords = {0, n - 1};
  for (int i = 0; i < ncoords; ++i) coords.push_back(std::uniform_int_distribution<size_t>(0, n - 1)(rng));
  std::ostringstream fails;
  fails.precision(9);
  Inputs xp = x;
  double worst_got = 0;
  for (size_t c : coords) {
    const double h = 1e-5 * std::max(1.0, std::fabs(xi[c]));
    xp[which][c] = xi[c] + h;
    const double lp = weighted_loss(f, xp, w);
    xp[which][c] = xi[c] - h;
    const double lm = weighted_loss(f, xp, w);
    xp[which][c] = xi[c];
    const double fd = (lp - lm) / (2 * h);
    const double bound_ref = 1e-6 * (std::fabs(fd) + s);
    // Plus a floor of a few fp32 ulps of a unit-size value: accumulated gradients are
    // read back as (pre-fill + grad) - pre-fill, and exact zeros come back as rounding.
    const double bound_got = tol * (std::fabs(fd) + s) + 1e-6;
    if (!(std::fabs(ref_grad[c] - fd) <= bound_ref))
      fails << "\n  reference backward at " << c << ": " << ref_grad[c] << " vs central difference "
            << fd << " (the REFERENCE is wrong)";
    if (!(std::fabs(got_grad[c] - fd) <= bound_got))
      fails << "\n  backend gradient at " << c << ": " << got_grad[c] << " vs central difference "
            << fd << " (|err| " << std::fabs(got_grad[c] - fd) << " > " << bound_got << ")";
    if (s > 0) worst_got = std::max(worst_got, std::fabs(got_grad[c] - fd) / (std::fabs(fd) + s));
  }
  record_error(label + " (vs finite diff.)", worst_got, 0);
  if (fails.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << label << ": finite-difference check failed:" << fails.str();
}

// ---- fixture --------------------------------------------------------------------------------

void OpTest::SetUp() {
  be_ = &backend_by_name(GetParam());
  g_current_backend = GetParam();
  stream_ = be_->default_stream();
  seed_ = test_seed();
  rng_.seed(seed_);
  trace_.emplace(__FILE__, __LINE__,
                 "backend " + GetParam() + ", seed " + std::to_string(seed_) +
                     " (replay with KILN_TEST_SEED=" + std::to_string(seed_) + ")");
}

std::vector<float> OpTest::randn(int64_t n, float std, float mean) {
  std::normal_distribution<float> d(mean, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng_);
  return v;
}

std::vector<float> OpTest::randu(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng_);
  return v;
}

int OpTest::randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

Tensor OpTest::upload(const std::vector<float>& host, const Shape& shape, MemCategory cat) {
  EXPECT_EQ(static_cast<int64_t>(host.size()), shape.numel()) << "test bug: upload size";
  Tensor t = be_->empty(shape, DType::F32, cat);
  be_->copy_from_host(stream_, t, host.data());
  return t;
}

Tensor OpTest::upload_i32(const std::vector<int32_t>& host, const Shape& shape) {
  EXPECT_EQ(static_cast<int64_t>(host.size()), shape.numel()) << "test bug: upload size";
  Tensor t = be_->empty(shape, DType::I32, MemCategory::Activations);
  be_->copy_from_host(stream_, t, host.data());
  return t;
}

Tensor OpTest::poisoned(const Shape& shape, MemCategory cat) {
  Tensor t = be_->empty(shape, DType::F32, cat);
  poison(t);
  return t;
}

void OpTest::set(const Tensor& t, const std::vector<float>& host) {
  EXPECT_EQ(static_cast<int64_t>(host.size()), t.numel()) << "test bug: set size";
  be_->copy_from_host(stream_, t, host.data());
}

void OpTest::poison(const Tensor& t) {
  const std::vector<float> nan(t.numel(), std::numeric_limits<float>::quiet_NaN());
  be_->copy_from_host(stream_, t, nan.data());
}

std::vector<float> OpTest::download(const Tensor& t) {
  std::vector<float> h(t.numel());
  be_->copy_to_host(stream_, h.data(), t);
  return h;
}

Tensor OpTest::up(const std::vector<float>& host, const Shape& shape, DType dt, MemCategory cat) {
  Tensor f = upload(host, shape, cat);
  if (dt == DType::F32) return f;
  Tensor t = be_->empty(shape, dt, cat);
  be_->copy(stream_, t, f);
  return t;
}

std::vector<float> OpTest::down(const Tensor& t) {
  if (t.dtype() == DType::F32) return download(t);
  Tensor f = be_->empty(t.shape(), DType::F32, MemCategory::Temporaries);
  be_->copy(stream_, f, t);
  return download(f);
}

std::vector<int32_t> OpTest::download_i32(const Tensor& t) {
  std::vector<int32_t> h(t.numel());
  be_->copy_to_host(stream_, h.data(), t);
  return h;
}

INSTANTIATE_TEST_SUITE_P(Backends, OpTest, ::testing::ValuesIn(backend_names()),
                         param_name);

}  // namespace kiln::test
