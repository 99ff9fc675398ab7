// CudaAllocator: device memory through CUDA's stream-ordered allocator
// (cudaMallocAsync / cudaFreeAsync on the backend's stream, from the device's default
// memory pool with its release threshold raised to "never"), so freed blocks are kept
// and reused by the driver instead of returning to the OS: a caching allocator without
// our own free lists. kiln's Allocator base accounts every byte by MemCategory.
//
// Stream ordering: frees are ordered on the backend's stream. Work queued on another
// stream that still reads a buffer must be made to finish (an event the backend's stream
// waits on) before the buffer's last Tensor goes away; the backend does this for its
// own scratch buffers.
//
// PinnedHostAllocator: page-locked host memory (cudaHostAlloc), the backend's staging
// allocator: cudaMemcpyAsync from it is truly asynchronous (pageable memory is copied
// through a driver bounce buffer first, with the host waiting).
#pragma once

#include "core/allocator.h"

#include <cuda_runtime.h>

namespace kiln::cuda {

class CudaAllocator final : public Allocator {
 public:
  CudaAllocator(int device, cudaStream_t stream);
  Device device() const override { return Device::cuda(device_); }
  cudaStream_t stream() const { return stream_; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;

 private:
  int device_;
  cudaStream_t stream_;
};

class PinnedHostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* ptr) override;
};

}  // namespace kiln::cuda
