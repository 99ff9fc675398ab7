// AdamW's two update paths give the same bits: one adamw_multi_step per update (the
// default) and, with AdamWConfig::multi_tensor off (optim.multi_tensor = false; a bad
// value of that key is tests/config/config_test.cpp's), adamw_step and a copy per
// segment. Over a few steps of a parameter set with and without weight decay, fp32 and
// bf16 (with fp32 masters), whole parameters and ZeRO-like partial segments, with an EMA
// and a device clipping scale; a stochastic-rounding bf16 optimizer keeps the
// per-segment path.
#include "backend/cpu/cpu_backend.h"
#include "optim/adamw.h"
#include "support/forwarding_backend.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <random>

namespace kiln {
namespace {

std::vector<ParamSpec> specs() {
  ParamSpec w, b, v;
  w.name = "w", w.shape = Shape{3, 5};
  w.weight_decay = true;
  b.name = "b", b.shape = Shape{7};
  b.offset = 15;
  v.name = "v", v.shape = Shape{4, 3};
  v.offset = 22;
  v.weight_decay = true;
  return {w, b, v};
}

struct Updates {
  std::vector<float> params, masters, ema;
  std::map<std::string, int64_t> calls;
};

Updates train(DType dtype, bool multi, bool partial, bool stochastic = false) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  testing::CountingBackend be(*cpu);
  const std::vector<ParamSpec> ps = specs();
  const int64_t n = 34;
  Tensor param = be.empty(Shape{n}, dtype, MemCategory::Parameters);
  Tensor grad = be.empty(Shape{n}, DType::F32, MemCategory::Gradients);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> host(n);
  for (float& x : host) x = nd(rng);
  upload_f32(be, param, host.data());
  std::vector<AdamWSegment> segs = whole_segments(ps, param, grad);
  if (partial) {  // as a ZeRO shard: the middle of w, all of b, an empty piece of v
    segs[0] = {ps[0], 4, 11, param.view_at(4, Shape{7}), grad.view_at(4, Shape{7})};
    segs[2] = {ps[2], 5, 5, param.view_at(27, Shape{0}), grad.view_at(27, Shape{0})};
  }
  AdamWConfig cfg;
  cfg.lr = 0.05f;
  cfg.ema_decay = 0.9f;
  cfg.stochastic_rounding = stochastic;
  cfg.seed = 11;
  cfg.multi_tensor = multi;
  AdamW opt(be, segs, cfg);
  Tensor scale = be.empty(Shape{1}, DType::F32, MemCategory::OptimizerState);
  const float half = 0.5f;
  be.copy_from_host(be.default_stream(), scale, &half);
  be.counts.clear();
  for (int step = 0; step < 4; ++step) {
    for (float& x : host) x = 0.1f * nd(rng);
    upload_f32(be, grad, host.data());
    opt.step(1e-2f * (step + 1), step == 2 ? 0.7f : 1.f, step % 2 ? scale : Tensor());
  }
  Updates r;
  r.calls = be.counts;
  r.params = download_f32(be, param);
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].size() == 0) continue;
    const Tensor m = opt.master(i);
    const std::vector<float> a = m ? download_f32(be, m) : std::vector<float>{};
    const std::vector<float> e = download_f32(be, opt.ema(i));
    r.masters.insert(r.masters.end(), a.begin(), a.end());
    r.ema.insert(r.ema.end(), e.begin(), e.end());
  }
  return r;
}

int64_t count(const Updates& r, const char* name) {
  const auto it = r.calls.find(name);
  return it == r.calls.end() ? 0 : it->second;
}

TEST(AdamWMultiTensor, BothPathsGiveTheSameBits) {
  for (const DType dt : {DType::F32, DType::BF16})
    for (const bool partial : {false, true}) {
      const Updates multi = train(dt, true, partial), per = train(dt, false, partial);
      const std::string at = std::string(dtype_name(dt)) + (partial ? " partial" : " whole");
      EXPECT_EQ(multi.params, per.params) << at;
      EXPECT_EQ(multi.masters, per.masters) << at;
      EXPECT_EQ(multi.ema, per.ema) << at;
      EXPECT_EQ(count(multi, "adamw_multi_step"), 4) << at;
      EXPECT_EQ(count(multi, "adamw_step"), 0) << at;
      EXPECT_EQ(count(per, "adamw_multi_step"), 0) << at;
      const int64_t live = partial ? 2 : 3;  // segments with elements
      EXPECT_EQ(count(per, "adamw_step"), 4 * live) << at;
      EXPECT_EQ(count(per, "copy"), dt == DType::BF16 ? 4 * live : 0) << at;
    }
}

TEST(AdamWMultiTensor, StochasticRoundingKeepsThePerSegmentPath) {
  const Updates r = train(DType::BF16, true, false, /*stochastic=*/true);
  EXPECT_EQ(count(r, "adamw_multi_step"), 0);
  EXPECT_EQ(count(r, "copy_stochastic_round"), 12);
}

}  // namespace
}  // namespace kiln
