// Allocators that account every byte by category and remember the peak of each.
//
// Every buffer kiln allocates goes through an Allocator with a MemCategory, so that
// `metrics.jsonl`, `kiln bench` and the memory planner can report parameters, gradients,
// optimizer state (fp32 master weights included), activations, communication buffers
// and temporaries (library scratch space included) separately, in bytes.
#pragma once

#include "core/device.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>

namespace kiln {

enum class MemCategory : uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  CommBuffers,
  Temporaries,
};
inline constexpr int kNumMemCategories = 6;

/// "parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "temporaries".
std::string_view mem_category_name(MemCategory c);

/// Bytes in use and peak bytes, per category and in total (bytes), and how many
/// allocations were made (a training step should make none after its first update).
struct MemoryStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;  // peak of the sum, not the sum of per-category peaks
  int64_t allocations = 0;  // allocate() calls of non-zero size, ever

  int64_t current_of(MemCategory c) const { return current[static_cast<int>(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[static_cast<int>(c)]; }
};

/// Base of every allocator: raw allocation is the subclass's, accounting is here.
/// Thread-safe. allocate() throws kiln::Error when memory cannot be had.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;

  void* allocate(size_t bytes, MemCategory category);
  void deallocate(void* ptr, size_t bytes, MemCategory category);

  MemoryStats stats() const;
  /// Restarts peak tracking from the current usage.
  void reset_peak();

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_deallocate(void* ptr) = 0;

 private:
  mutable std::mutex mu_;
  MemoryStats stats_;
};

/// Host memory, 64-byte aligned (one cache line; AVX-512 friendly).
class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;
};

/// The process-wide host allocator (used for host-side tensors such as token batches).
HostAllocator& host_allocator();

}  // namespace kiln
