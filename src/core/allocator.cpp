#include "core/allocator.h"

#include "core/error.h"

#include <cstdlib>

namespace kiln {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters: return "parameters";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::OptimizerState: return "optimizer_state";
    case MemCategory::Activations: return "activations";
    case MemCategory::CommBuffers: return "comm_buffers";
    case MemCategory::Temporaries: return "temporaries";
  }
  return "?";
}

void* Allocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  void* p = raw_allocate(bytes);
  KILN_CHECK(p != nullptr, "out of memory on {}: could not allocate {} bytes of {}", device().str(),
             bytes, mem_category_name(category));
  std::lock_guard lock(mu_);
  const int c = static_cast<int>(category);
  stats_.current[c] += static_cast<int64_t>(bytes);
  if (stats_.current[c] > stats_.peak[c]) stats_.peak[c] = stats_.current[c];
  stats_.total_current += static_cast<int64_t>(bytes);
  if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
  ++stats_.allocations;
  return p;
}

void Allocator::deallocate(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  raw_deallocate(ptr);
  std::lock_guard lock(mu_);
  stats_.current[static_cast<int>(category)] -= static_cast<int64_t>(bytes);
  stats_.total_current -= static_cast<int64_t>(bytes);
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
}

void* HostAllocator::raw_allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded);
}

void HostAllocator::raw_deallocate(void* ptr) { std::free(ptr); }

HostAllocator& host_allocator() {
  static HostAllocator a;
  return a;
}

}  // namespace kiln
