// The NCCL communicator on one process and one GPU (world of 1, bootstrapped by a
// LocalCommunicator): every collective runs through NCCL on device buffers, host
// buffers fall back to the bootstrap, stats are recorded. Skipped without a GPU.
// Multi-rank runs need mpirun and several GPUs (see docs/cuda.md).
#include "backend/registry.h"
#include "comm/local_communicator.h"
#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace kiln {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclCommunicator, SingleRankCollectives) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU visible";
  auto be = make_backend("cuda");
  Stream s = be->default_stream();
  auto comm = make_nccl_communicator(std::make_unique<LocalCommunicator>("world"), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend_name(), "nccl");
  std::printf("NCCL %s\n", nccl_version().c_str());

  std::vector<float> h(1000);
  std::iota(h.begin(), h.end(), 1.f);
  Tensor t = be->empty({1000}, DType::F32, MemCategory::CommBuffers);
  be->copy_from_host(s, t, h.data());
  comm->all_reduce(t, ReduceOp::Sum, s);
  std::vector<float> back(1000);
  be->copy_to_host(s, back.data(), t);
  EXPECT_EQ(back, h);

  Tensor out = be->empty({1000}, DType::F32, MemCategory::CommBuffers);
  comm->all_gather(out, t, s);
  be->copy_to_host(s, back.data(), out);
  EXPECT_EQ(back, h);
  be->fill(s, out, 0.f);
  comm->reduce_scatter(out, t, s);
  be->copy_to_host(s, back.data(), out);
  EXPECT_EQ(back, h);
  comm->broadcast(t, 0, s);
  comm->barrier();

  // An async all-reduce overlapping a kernel queued after it on the compute stream.
  auto w = comm->all_reduce_async(t, ReduceOp::Max, s);
  be->fill(s, out, 2.f);
  w->wait();
  EXPECT_TRUE(w->is_completed());

  // bf16 buffers.
  Tensor b = be->empty({64}, DType::BF16, MemCategory::CommBuffers);
  be->fill(s, b, 1.5f);
  comm->all_reduce(b, ReduceOp::Sum, s);
  std::vector<uint16_t> hb(64);
  be->copy_to_host(s, hb.data(), b);
  EXPECT_EQ(hb[0], f32_to_bf16(1.5f));

  // all_to_all: the piece for itself, 999 of the 1000 elements (the last never written).
  be->fill(s, out, -1.f);
  const std::vector<int64_t> counts{999};
  comm->all_to_all(out, t, counts, counts, s);
  be->copy_to_host(s, back.data(), out);
  EXPECT_TRUE(std::equal(back.begin(), back.end() - 1, h.begin()));
  EXPECT_EQ(back.back(), -1.f);
  const std::vector<int64_t> none{0};
  comm->all_to_all(out, t, none, none, s);  // nothing to send: still a valid call

  // Host buffers go through the bootstrap communicator.
  int32_t x = 7;
  comm->all_reduce(Tensor::view(&x, {1}, DType::I32));
  EXPECT_EQ(x, 7);

  const CommStats st = comm->stats();
  EXPECT_GE(st.of(Collective::AllReduce).count, 3);
  EXPECT_EQ(st.of(Collective::Barrier).count, 1);
  EXPECT_EQ(st.of(Collective::AllToAll).count, 2);
  EXPECT_EQ(st.of(Collective::AllToAll).bytes, 999 * 4);
}

}  // namespace
}  // namespace kiln
