// Shape, Tensor views and the accounting allocator.
#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace kiln {
namespace {

TEST(Shape, Basics) {
  const Shape s{4, 32, 64};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s[0], 4);
  EXPECT_EQ(s[2], 64);
  EXPECT_EQ(s[-1], 64);
  EXPECT_EQ(s[-3], 4);
  EXPECT_EQ(s.numel(), 4 * 32 * 64);
  EXPECT_EQ(s.str(), "[4, 32, 64]");
  EXPECT_THROW(s[3], Error);
  EXPECT_THROW(s[-4], Error);
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar
  EXPECT_EQ(Shape{}.ndim(), 0);
  EXPECT_EQ(Shape{}.str(), "[]");
  EXPECT_EQ((Shape{3, 0, 2}).numel(), 0);
  EXPECT_TRUE((Shape{2, 3}) == (Shape{2, 3}));
  EXPECT_FALSE((Shape{2, 3}) == (Shape{3, 2}));
  EXPECT_FALSE((Shape{6}) == (Shape{6, 1}));
  std::vector<int> dims = {5, 6, 7};
  const Shape fromit(dims.begin(), dims.end());
  EXPECT_EQ(fromit, (Shape{5, 6, 7}));
}

TEST(Shape, BadShapesThrow) {
  EXPECT_THROW((Shape{2, -1}), Error);
  EXPECT_THROW((Shape{1, 1, 1, 1, 1, 1, 1}), Error);  // 7 dims
  EXPECT_NO_THROW((Shape{1, 1, 1, 1, 1, 1}));
  Shape s{1, 2, 3, 4, 5, 6};
  EXPECT_THROW(s.push_back(7), Error);
  Shape t;
  EXPECT_THROW(t.push_back(-3), Error);
}

class CountingTest : public ::testing::Test {
 protected:
  HostAllocator alloc;
};

TEST_F(CountingTest, TensorEmptyAndViews) {
  Tensor t = Tensor::empty(alloc, {4, 3, 5}, DType::F32, MemCategory::Activations);
  ASSERT_TRUE(bool(t));
  EXPECT_EQ(t.numel(), 60);
  EXPECT_EQ(t.nbytes(), 240u);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.str(), "fp32[4, 3, 5]@cpu");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u) << "host memory is 64-byte aligned";
  float* p = t.data<float>();
  for (int i = 0; i < 60; ++i) p[i] = static_cast<float>(i);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(t.data<uint16_t>(), Error);

  // reshape: same memory.
  Tensor r = t.reshape({12, 5});
  EXPECT_EQ(r.raw(), t.raw());
  EXPECT_EQ(r.shape(), (Shape{12, 5}));
  EXPECT_THROW(t.reshape({7, 9}), Error);
  EXPECT_THROW(t.reshape({61}), Error);

  // slice_rows: rows of the first dim.
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(s.data<float>()[0], 15.f);
  EXPECT_EQ(s.data<float>()[29], 44.f);
  Tensor e = t.slice_rows(4, 4);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_THROW(t.slice_rows(3, 5), Error);
  EXPECT_THROW(t.slice_rows(-1, 2), Error);
  EXPECT_THROW(t.slice_rows(3, 2), Error);
  Tensor flat = t.reshape({60});
  EXPECT_EQ(flat.slice_rows(7, 9).data<float>()[1], 8.f);

  // view_at: flat offset.
  Tensor v = t.view_at(10, {2, 5});
  EXPECT_EQ(v.data<float>()[0], 10.f);
  EXPECT_EQ(v.data<float>()[9], 19.f);
  EXPECT_NO_THROW(t.view_at(0, {60}));
  EXPECT_NO_THROW(t.view_at(59, {1}));
  EXPECT_THROW(t.view_at(51, {10}), Error);
  EXPECT_THROW(t.view_at(-1, {1}), Error);

  // A view keeps the storage alive after the original goes away.
  const int64_t before = alloc.stats().total_current;
  {
    Tensor keep = t.slice_rows(2, 4);
    t = Tensor();
    r = Tensor();
    s = Tensor();
    e = Tensor();
    flat = Tensor();
    v = Tensor();
    EXPECT_EQ(alloc.stats().total_current, before);
    EXPECT_EQ(keep.data<float>()[0], 30.f);
  }
  EXPECT_EQ(alloc.stats().total_current, 0);
}

TEST_F(CountingTest, OtherDtypesAndChecks) {
  Tensor b = Tensor::empty(alloc, {7}, DType::BF16, MemCategory::Parameters);
  EXPECT_EQ(b.nbytes(), 14u);
  EXPECT_NO_THROW(b.data<uint16_t>());
  EXPECT_THROW(b.data<float>(), Error);
  Tensor i = Tensor::empty(alloc, {3, 3}, DType::I32, MemCategory::Activations);
  EXPECT_NO_THROW(i.data<int32_t>());
  EXPECT_THROW(i.data<float>(), Error);
  Tensor bv = b.view_at(3, {2});
  EXPECT_EQ(static_cast<char*>(bv.raw()) - static_cast<char*>(b.raw()), 6);

  EXPECT_NO_THROW(check_shape(i, {3, 3}, "i"));
  EXPECT_THROW(check_shape(i, {9}, "i"), Error);
  EXPECT_NO_THROW(check_dtype(i, DType::I32, "i"));
  EXPECT_THROW(check_dtype(i, DType::F32, "i"), Error);
  try {
    check_shape(i, {3, 4}, "my_tensor");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my_tensor"), std::string::npos) << e.what();
  }

  float host[6] = {1, 2, 3, 4, 5, 6};
  Tensor hv = Tensor::view(host, {2, 3}, DType::F32);
  EXPECT_EQ(hv.data<float>(), host);
  EXPECT_EQ(hv.slice_rows(1, 2).data<float>()[0], 4.f);
  EXPECT_EQ(Tensor().raw(), nullptr);
  EXPECT_FALSE(bool(Tensor()));
}

TEST_F(CountingTest, AllocatorAccounting) {
  auto cur = [&](MemCategory c) { return alloc.stats().current_of(c); };
  auto peak = [&](MemCategory c) { return alloc.stats().peak_of(c); };
  MemoryStats s0 = alloc.stats();
  for (int c = 0; c < kNumMemCategories; ++c) {
    EXPECT_EQ(s0.current[c], 0);
    EXPECT_EQ(s0.peak[c], 0);
  }
  EXPECT_EQ(alloc.device(), Device::cpu());

  void* a = alloc.allocate(1000, MemCategory::Parameters);
  void* b = alloc.allocate(3000, MemCategory::Activations);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(cur(MemCategory::Parameters), 1000);
  EXPECT_EQ(cur(MemCategory::Activations), 3000);
  EXPECT_EQ(alloc.stats().total_current, 4000);
  EXPECT_EQ(alloc.stats().total_peak, 4000);

  alloc.deallocate(b, 3000, MemCategory::Activations);
  EXPECT_EQ(cur(MemCategory::Activations), 0);
  EXPECT_EQ(peak(MemCategory::Activations), 3000);
  EXPECT_EQ(alloc.stats().total_current, 1000);
  EXPECT_EQ(alloc.stats().total_peak, 4000);

  // Total peak is the peak of the sum, not the sum of per-category peaks.
  void* g = alloc.allocate(2000, MemCategory::Gradients);
  EXPECT_EQ(alloc.stats().total_current, 3000);
  EXPECT_EQ(alloc.stats().total_peak, 4000);
  EXPECT_EQ(peak(MemCategory::Gradients), 2000);
  void* g2 = alloc.allocate(2500, MemCategory::Gradients);
  EXPECT_EQ(alloc.stats().total_current, 5500);
  EXPECT_EQ(alloc.stats().total_peak, 5500);
  EXPECT_EQ(peak(MemCategory::Gradients), 4500);
  alloc.deallocate(g, 2000, MemCategory::Gradients);
  EXPECT_EQ(cur(MemCategory::Gradients), 2500);
  EXPECT_EQ(peak(MemCategory::Gradients), 4500);
  // Sum of per-category peaks (1000 + 3000 + 4500) exceeds the total peak.
  EXPECT_EQ(alloc.stats().total_peak, 5500);

  // reset_peak restarts from current usage.
  alloc.reset_peak();
  MemoryStats s = alloc.stats();
  EXPECT_EQ(s.peak_of(MemCategory::Activations), 0);
  EXPECT_EQ(s.peak_of(MemCategory::Gradients), 2500);
  EXPECT_EQ(s.peak_of(MemCategory::Parameters), 1000);
  EXPECT_EQ(s.total_peak, 3500);
  void* t = alloc.allocate(100, MemCategory::Temporaries);
  EXPECT_EQ(peak(MemCategory::Temporaries), 100);
  EXPECT_EQ(alloc.stats().total_peak, 3600);
  alloc.deallocate(t, 100, MemCategory::Temporaries);
  EXPECT_EQ(alloc.stats().total_peak, 3600);

  // Zero bytes: nothing allocated, nothing counted.
  EXPECT_EQ(alloc.allocate(0, MemCategory::CommBuffers), nullptr);
  EXPECT_EQ(cur(MemCategory::CommBuffers), 0);
  alloc.deallocate(nullptr, 0, MemCategory::CommBuffers);

  alloc.deallocate(g2, 2500, MemCategory::Gradients);
  alloc.deallocate(a, 1000, MemCategory::Parameters);
  EXPECT_EQ(alloc.stats().total_current, 0);
  for (int c = 0; c < kNumMemCategories; ++c) EXPECT_EQ(alloc.stats().current[c], 0);
}

TEST_F(CountingTest, TensorsAccountTheirCategory) {
  {
    Tensor p = Tensor::empty(alloc, {10, 10}, DType::F32, MemCategory::Parameters);
    Tensor o = Tensor::empty(alloc, {10, 10}, DType::F32, MemCategory::OptimizerState);
    Tensor h = Tensor::empty(alloc, {10}, DType::BF16, MemCategory::CommBuffers);
    EXPECT_EQ(alloc.stats().current_of(MemCategory::Parameters), 400);
    EXPECT_EQ(alloc.stats().current_of(MemCategory::OptimizerState), 400);
    EXPECT_EQ(alloc.stats().current_of(MemCategory::CommBuffers), 20);
    EXPECT_EQ(alloc.stats().total_current, 820);
    Tensor copy = p;  // shares storage
    EXPECT_EQ(alloc.stats().total_current, 820);
  }
  EXPECT_EQ(alloc.stats().total_current, 0);
  EXPECT_EQ(alloc.stats().total_peak, 820);
}

TEST_F(CountingTest, OutOfMemoryThrows) {
  EXPECT_THROW(alloc.allocate(size_t{1} << 60, MemCategory::Activations), Error);
  EXPECT_EQ(alloc.stats().total_current, 0);
  EXPECT_THROW(Tensor::empty(alloc, {int64_t{1} << 40, int64_t{1} << 18}, DType::F32,
                             MemCategory::Activations),
               Error);
  EXPECT_EQ(alloc.stats().total_current, 0);
}

TEST_F(CountingTest, ThreadSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const MemCategory c = static_cast<MemCategory>((t + i) % kNumMemCategories);
        void* p = alloc.allocate(64 + i % 7, c);
        alloc.deallocate(p, 64 + i % 7, c);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(alloc.stats().total_current, 0);
  for (int c = 0; c < kNumMemCategories; ++c) EXPECT_EQ(alloc.stats().current[c], 0);
}

TEST(MemCategory, Names) {
  EXPECT_EQ(mem_category_name(MemCategory::Parameters), "parameters");
  EXPECT_EQ(mem_category_name(MemCategory::Gradients), "gradients");
  EXPECT_EQ(mem_category_name(MemCategory::OptimizerState), "optimizer_state");
  EXPECT_EQ(mem_category_name(MemCategory::Activations), "activations");
  EXPECT_EQ(mem_category_name(MemCategory::CommBuffers), "comm_buffers");
  EXPECT_EQ(mem_category_name(MemCategory::Temporaries), "temporaries");
  EXPECT_EQ(&host_allocator(), &host_allocator());
  EXPECT_EQ(host_allocator().device(), Device::cpu());
}

}  // namespace
}  // namespace kiln
