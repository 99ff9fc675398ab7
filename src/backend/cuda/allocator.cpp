#include "backend/cuda/allocator.h"

#include "backend/cuda/common.h"

#include <cstdint>

namespace kiln::cuda {

CudaAllocator::CudaAllocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {
  cudaMemPool_t pool = nullptr;
  KILN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;  // keep freed memory in the pool (reuse, no OS round trip)
  KILN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

void* CudaAllocator::raw_allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;  // the base class reports "out of memory on cuda:N ..."
  }
  KILN_CUDA_CHECK(e);
  return p;
}

void CudaAllocator::raw_deallocate(void* ptr) {
  // Destructors must not throw: a failing free (a dead context at exit) is ignored.
  if (cudaFreeAsync(ptr, stream_) != cudaSuccess) (void)cudaGetLastError();
}

void* PinnedHostAllocator::raw_allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  KILN_CUDA_CHECK(e);
  return p;
}

void PinnedHostAllocator::raw_deallocate(void* ptr) {
  if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace kiln::cuda
