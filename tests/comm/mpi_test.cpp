// Every collective of the world communicator against a local computation, on whatever
// world this runs in: ctest runs it under mpirun with 2, 3 and 4 ranks, and alone (a world
// of one, LocalCommunicator). Sizes are awkward on purpose (1, odd, not divisible by the
// world size); values are small integers where the result must be exact in every dtype.
#include "comm/communicator.h"
#include "core/rng.h"
#include "mpi_test_main.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <thread>

namespace kiln {
namespace {

using testing::world;

const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::F64};
const int64_t kSizes[] = {1, 7, 1000, 4099};

/// A host buffer of n elements of `dtype` holding `values` (exactly representable).
struct Buffer {
  DType dtype;
  std::vector<uint32_t> words;  // enough room for n elements of up to 8 bytes
  int64_t n;
  Buffer(DType d, int64_t count) : dtype(d), words(2 * static_cast<size_t>(std::max<int64_t>(count, 1))), n(count) {}
  Tensor tensor() { return Tensor::view(words.data(), {n}, dtype); }
  Tensor slice(int64_t offset, int64_t count) { return tensor().view_at(offset, {count}); }
  void set(int64_t i, double v) {
    switch (dtype) {
      case DType::F32: reinterpret_cast<float*>(words.data())[i] = static_cast<float>(v); break;
      case DType::I32: reinterpret_cast<int32_t*>(words.data())[i] = static_cast<int32_t>(v); break;
      case DType::BF16: reinterpret_cast<uint16_t*>(words.data())[i] = f32_to_bf16(static_cast<float>(v)); break;
      case DType::F16: reinterpret_cast<uint16_t*>(words.data())[i] = f32_to_f16(static_cast<float>(v)); break;
      case DType::F64: reinterpret_cast<double*>(words.data())[i] = v; break;
      case DType::E4M3: reinterpret_cast<uint8_t*>(words.data())[i] = f32_to_e4m3(static_cast<float>(v)); break;
      case DType::E5M2: reinterpret_cast<uint8_t*>(words.data())[i] = f32_to_e5m2(static_cast<float>(v)); break;
    }
  }
  double get(int64_t i) const {
    switch (dtype) {
      case DType::F32: return reinterpret_cast<const float*>(words.data())[i];
      case DType::I32: return reinterpret_cast<const int32_t*>(words.data())[i];
      case DType::BF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(words.data())[i]);
      case DType::F16: return f16_to_f32(reinterpret_cast<const uint16_t*>(words.data())[i]);
      case DType::F64: return reinterpret_cast<const double*>(words.data())[i];
      case DType::E4M3: return e4m3_to_f32(reinterpret_cast<const uint8_t*>(words.data())[i]);
      case DType::E5M2: return e5m2_to_f32(reinterpret_cast<const uint8_t*>(words.data())[i]);
    }
    return 0;
  }
};

double small_value(int rank, int64_t i) { return (rank + 1) * static_cast<double>((i % 13) - 6); }

TEST(Comm, AllReduceSumEveryDtypeAndSize) {
  Communicator& c = world();
  const int n = c.size();
  const double ranks_sum = n * (n + 1) / 2.0;  // sum over r of (r + 1)
  for (DType d : kAllDtypes) {
    for (int64_t size : kSizes) {
      Buffer b(d, size);
      for (int64_t i = 0; i < size; ++i) b.set(i, small_value(c.rank(), i));
      c.all_reduce(b.tensor(), ReduceOp::Sum);
      for (int64_t i = 0; i < size; ++i) {
        ASSERT_EQ(b.get(i), ranks_sum * ((i % 13) - 6)) << dtype_name(d) << " size " << size << " i " << i;
      }
    }
  }
}

// Token counts past 2^24 and 2^32 and loss sums that fp32 would round: exact in 64 bits.
TEST(Comm, AllReduceSumInt64AndFp64Exact) {
  Communicator& c = world();
  const int n = c.size(), r = c.rank();
  std::vector<int64_t> counts = {(int64_t{1} << 24) + 1 + r, (int64_t{1} << 40) + 3 * r, -r};
  c.all_reduce_sum(counts);
  const int64_t ranks_sum = int64_t{n} * (n - 1) / 2;
  EXPECT_EQ(counts[0], n * ((int64_t{1} << 24) + 1) + ranks_sum);
  EXPECT_EQ(counts[1], n * (int64_t{1} << 40) + 3 * ranks_sum);
  EXPECT_EQ(counts[2], -ranks_sum);
  std::vector<double> sums = {16777217.0 + r, 0.1 * (r + 1)};
  c.all_reduce_sum(sums);
  EXPECT_EQ(sums[0], 16777217.0 * n + static_cast<double>(ranks_sum));
  double want = 0.0;  // the fp64 sum in rank order, bitwise
  for (int k = 0; k < n; ++k) want += 0.1 * (k + 1);
  EXPECT_EQ(sums[1], want);
}

TEST(Comm, AllReduceMax) {
  Communicator& c = world();
  for (DType d : kAllDtypes) {
    Buffer b(d, 5);
    for (int64_t i = 0; i < 5; ++i) b.set(i, i == 2 ? (c.rank() == c.size() - 1 ? 1 : 0) : -(c.rank() + i));
    c.all_reduce(b.tensor(), ReduceOp::Max);
    EXPECT_EQ(b.get(2), 1) << dtype_name(d);  // a flag raised on one rank reaches all
    for (int64_t i : {0, 1, 3, 4}) EXPECT_EQ(b.get(i), -i) << dtype_name(d);
  }
}

// Random fp32 values: the sum matches a double-precision reference, every rank gets the
// same bits, and bf16 is the fp32 sum rounded once.
TEST(Comm, AllReduceRandomMatchesReferenceAndIsIdenticalOnAllRanks) {
  Communicator& c = world();
  const int64_t size = 1531;
  auto value = [](int r, int64_t i) { return uniform_at(1234, static_cast<uint64_t>(r), static_cast<uint64_t>(i)) * 2.f - 1.f; };
  std::vector<float> x(size), ref(size, 0.f);
  std::vector<uint16_t> xb(size);
  for (int64_t i = 0; i < size; ++i) {
    x[i] = value(c.rank(), i);
    xb[i] = f32_to_bf16(x[i]);
    double s = 0, sb = 0;
    for (int r = 0; r < c.size(); ++r) {
      s += value(r, i);
      sb += bf16_to_f32(f32_to_bf16(value(r, i)));
    }
    ref[i] = static_cast<float>(s);
    (void)sb;
  }
  c.all_reduce(Tensor::view(x.data(), {size}, DType::F32));
  c.all_reduce(Tensor::view(xb.data(), {size}, DType::BF16));
  for (int64_t i = 0; i < size; ++i) {
    ASSERT_NEAR(x[i], ref[i], 1e-5f * c.size()) << i;
    // bf16: one rounding of an fp32 sum of the bf16 inputs -> within one bf16 ulp of it.
    float got = bf16_to_f32(xb[i]);
    ASSERT_NEAR(got, ref[i], std::fabs(ref[i]) * (1.f / 128.f) + 1e-2f * c.size()) << i;
  }
  // Bitwise agreement across ranks (DDP replicas must not drift).
  std::vector<float> all(size * c.size());
  c.all_gather(Tensor::view(all.data(), {size * c.size()}, DType::F32), Tensor::view(x.data(), {size}, DType::F32));
  for (int r = 0; r < c.size(); ++r) {
    ASSERT_EQ(0, std::memcmp(all.data() + r * size, x.data(), size * sizeof(float))) << "rank " << r << " differs";
  }
}

TEST(Comm, ReduceScatter) {
  Communicator& c = world();
  const int n = c.size();
  const double ranks_sum = n * (n + 1) / 2.0;
  for (DType d : kAllDtypes) {
    for (int64_t per : {int64_t{1}, int64_t{5}, int64_t{333}}) {
      Buffer in(d, per * n), out(d, per);
      for (int64_t j = 0; j < per * n; ++j) in.set(j, (c.rank() + 1) * static_cast<double>(j % 17));
      c.reduce_scatter(out.tensor(), in.tensor());
      for (int64_t i = 0; i < per; ++i) {
        ASSERT_EQ(out.get(i), ranks_sum * ((c.rank() * per + i) % 17)) << dtype_name(d) << " per " << per << " i " << i;
      }
      // In place: the output is this rank's slice of the input (as ZeRO's flat buffers do).
      for (int64_t j = 0; j < per * n; ++j) in.set(j, (c.rank() + 1) * static_cast<double>(j % 17));
      c.reduce_scatter(in.slice(c.rank() * per, per), in.tensor());
      for (int64_t i = 0; i < per; ++i) {
        ASSERT_EQ(in.get(c.rank() * per + i), ranks_sum * ((c.rank() * per + i) % 17)) << "in place " << dtype_name(d);
      }
    }
  }
}

TEST(Comm, AllGather) {
  Communicator& c = world();
  const int n = c.size();
  for (DType d : kAllDtypes) {
    for (int64_t per : {int64_t{1}, int64_t{3}, int64_t{257}}) {
      Buffer in(d, per), out(d, per * n);  // values < 256: exact in bf16
      for (int64_t i = 0; i < per; ++i) in.set(i, c.rank() * 50 + (i % 50));
      c.all_gather(out.tensor(), in.tensor());
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < per; ++i) ASSERT_EQ(out.get(r * per + i), r * 50 + (i % 50)) << dtype_name(d);
      }
      // In place: the input is this rank's slice of the output.
      Buffer out2(d, per * n);
      for (int64_t i = 0; i < per; ++i) out2.set(c.rank() * per + i, c.rank() * 50 + (i % 50));
      c.all_gather(out2.tensor(), out2.slice(c.rank() * per, per));
      for (int r = 0; r < n; ++r) {
        for (int64_t i = 0; i < per; ++i) ASSERT_EQ(out2.get(r * per + i), r * 50 + (i % 50)) << "in place";
      }
    }
  }
}

/// all_to_all's test pattern: the elements rank `from` sends rank `to` (0 to 3; pattern
/// 0 sends nothing at all), and the value of element i of that piece (below 256: exact in
/// every dtype).
int64_t piece_count(int from, int to, int pattern) {
  return pattern == 0 ? 0 : (from * 3 + to * 5 + pattern) % 4;
}
double piece_value(int from, int to, int64_t i) { return from * 50 + to * 11 + static_cast<double>(i); }

TEST(Comm, AllToAllUnevenAndEmptySplits) {
  Communicator& c = world();
  const int n = c.size(), me = c.rank();
  for (DType d : kAllDtypes) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
      int64_t sent = 0, received = 0;
      for (int q = 0; q < n; ++q) {
        sent += send[static_cast<size_t>(q)] = piece_count(me, q, pattern);
        received += recv[static_cast<size_t>(q)] = piece_count(q, me, pattern);
      }
      // One spare element past the pieces on each side: never sent, never written.
      Buffer in(d, sent + 1), out(d, received + 1);
      int64_t at = 0;
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < send[static_cast<size_t>(q)]; ++i) in.set(at++, piece_value(me, q, i));
      in.set(sent, 255);
      out.set(received, 254);
      c.all_to_all(out.tensor(), in.tensor(), send, recv);
      at = 0;
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < recv[static_cast<size_t>(q)]; ++i)
          ASSERT_EQ(out.get(at++), piece_value(q, me, i)) << dtype_name(d) << " pattern " << pattern << " from " << q;
      EXPECT_EQ(out.get(received), 254) << "written past the pieces";
    }
  }
}

TEST(Comm, AllToAllOfCountsThenPayloadAsync) {
  // The dispatch's two steps: each rank learns what it will receive (one int32 per rank),
  // then two payloads are in flight at once.
  Communicator& c = world();
  const int n = c.size(), me = c.rank();
  const std::vector<int64_t> ones(static_cast<size_t>(n), 1);
  std::vector<int32_t> mine(static_cast<size_t>(n)), theirs(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) mine[static_cast<size_t>(q)] = static_cast<int32_t>((me + 2 * q) % 5);
  c.all_to_all(Tensor::view(theirs.data(), {n}, DType::I32), Tensor::view(mine.data(), {n}, DType::I32), ones, ones);
  std::vector<int64_t> send(mine.begin(), mine.end()), recv(theirs.begin(), theirs.end());
  for (int q = 0; q < n; ++q) ASSERT_EQ(recv[static_cast<size_t>(q)], (q + 2 * me) % 5);
  const int64_t sent = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t received = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  std::vector<float> a(static_cast<size_t>(sent) + 1), b(a.size());
  std::vector<float> ra(static_cast<size_t>(received) + 1), rb(ra.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(me * 1000 + static_cast<int>(i));
    b[i] = -a[i];
  }
  auto view = [](std::vector<float>& v) { return Tensor::view(v.data(), {static_cast<int64_t>(v.size())}, DType::F32); };
  auto wa = c.all_to_all_async(view(ra), view(a), send, recv);
  auto wb = c.all_to_all_async(view(rb), view(b), send, recv);
  wb->wait();
  wa->wait();
  int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    int64_t offset = 0;  // where rank q's piece for me starts in its input
    for (int p = 0; p < me; ++p) offset += (q + 2 * p) % 5;
    for (int64_t i = 0; i < recv[static_cast<size_t>(q)]; ++i, ++at) {
      ASSERT_EQ(ra[static_cast<size_t>(at)], static_cast<float>(q * 1000 + offset + i));
      ASSERT_EQ(rb[static_cast<size_t>(at)], -ra[static_cast<size_t>(at)]);
    }
  }
}

TEST(Comm, BroadcastFromEveryRoot) {
  Communicator& c = world();
  for (DType d : kAllDtypes) {
    for (int root = 0; root < c.size(); ++root) {
      Buffer b(d, 1001);
      for (int64_t i = 0; i < 1001; ++i) b.set(i, c.rank() == root ? (i % 31) + root : -1);
      c.broadcast(b.tensor(), root);
      for (int64_t i = 0; i < 1001; ++i) ASSERT_EQ(b.get(i), (i % 31) + root) << dtype_name(d) << " root " << root;
    }
  }
}

TEST(Comm, SendRecvRingAndTags) {
  Communicator& c = world();
  const int n = c.size();
  const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
  for (int64_t size : {int64_t{1}, int64_t{99}, int64_t{100003}}) {
    std::vector<float> out(size), a(size), b(size);
    for (int64_t i = 0; i < size; ++i) out[i] = static_cast<float>(c.rank() * 7 + i % 11);
    // Two messages with different tags, received in the opposite order.
    auto s1 = c.send_async(Tensor::view(out.data(), {size}, DType::F32), next, 1);
    auto s2 = c.send_async(Tensor::view(out.data(), {size}, DType::F32), next, 2);
    auto r2 = c.recv_async(Tensor::view(b.data(), {size}, DType::F32), prev, 2);
    auto r1 = c.recv_async(Tensor::view(a.data(), {size}, DType::F32), prev, 1);
    r2->wait();
    r1->wait();
    s1->wait();
    s2->wait();
    for (int64_t i = 0; i < size; ++i) {
      ASSERT_EQ(a[i], prev * 7 + i % 11);
      ASSERT_EQ(b[i], prev * 7 + i % 11);
    }
  }
  // Blocking forms, bf16, when the ring has two ranks or more.
  if (n > 1) {
    std::vector<uint16_t> x(13, f32_to_bf16(static_cast<float>(c.rank())));
    if (c.rank() == 0) {
      c.send(Tensor::view(x.data(), {13}, DType::BF16), 1, 7);
    } else if (c.rank() == 1) {
      c.recv(Tensor::view(x.data(), {13}, DType::BF16), 0, 7);
      for (uint16_t v : x) EXPECT_EQ(bf16_to_f32(v), 0.f);
    }
  }
}

TEST(Comm, AsyncOverlap) {
  Communicator& c = world();
  const int n = c.size();
  const int64_t size = 50001;
  std::vector<std::vector<float>> bufs(4, std::vector<float>(size));
  for (int k = 0; k < 4; ++k) {
    for (int64_t i = 0; i < size; ++i) bufs[k][i] = static_cast<float>((c.rank() + 1) * (k + 1));
  }
  std::vector<int32_t> gathered(3 * n), mine = {c.rank(), c.rank() * 2, c.rank() * 3};
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 4; ++k) works.push_back(c.all_reduce_async(Tensor::view(bufs[k].data(), {size}, DType::F32)));
  works.push_back(c.all_gather_async(Tensor::view(gathered.data(), {3 * n}, DType::I32), Tensor::view(mine.data(), {3}, DType::I32)));
  // Compute while the collectives run.
  double acc = 0;
  for (int i = 1; i < 2000000; ++i) acc += 1.0 / i;
  EXPECT_GT(acc, 10.0);
  for (auto& w : works) w->wait();
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  const float ranks_sum = n * (n + 1) / 2.f;
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(bufs[k][0], ranks_sum * (k + 1));
    EXPECT_EQ(bufs[k][size - 1], ranks_sum * (k + 1));
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[3 * r + 2], r * 3);
}

// With a communication thread, work completes without anyone calling wait().
TEST(Comm, WorkCompletesWithoutWait) {
  Communicator& c = world();
  const char* mode = std::getenv("KILN_MPI_THREADS");
  if (mode != nullptr && std::string(mode) == "inline") GTEST_SKIP() << "inline mode progresses only in wait()";
  float x = 1.f;
  auto w = c.all_reduce_async(Tensor::view(&x, {1}, DType::F32));
  auto t0 = std::chrono::steady_clock::now();
  while (!w->is_completed() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(w->is_completed());
  w->wait();
  EXPECT_EQ(x, static_cast<float>(c.size()));
}

TEST(Comm, Barrier) {
  Communicator& c = world();
  c.barrier();
  auto w = c.barrier_async();
  w->wait();
  EXPECT_TRUE(w->is_completed());
}

TEST(Comm, SubGroupsByRanksAndBySplit) {
  Communicator& c = world();
  const int n = c.size();
  // Even and odd ranks, each group listed in reverse order (group rank i = ranks[i]).
  std::vector<int> members;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == c.rank() % 2) members.push_back(r);
  }
  auto g = c.new_group(members, c.rank() % 2 == 0 ? "even" : "odd");
  ASSERT_EQ(g->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[static_cast<size_t>(g->rank())], c.rank());
  int32_t v = c.rank();
  g->all_reduce(Tensor::view(&v, {1}, DType::I32));
  int32_t expect = 0;
  for (int r : members) expect += r;
  EXPECT_EQ(v, expect);
  std::vector<int32_t> got(members.size());
  int32_t me = c.rank();
  g->all_gather(Tensor::view(got.data(), {static_cast<int64_t>(got.size())}, DType::I32), Tensor::view(&me, {1}, DType::I32));
  for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(got[i], members[i]);

  // Split: pairs {0,1}, {2,3}, ... ordered by key = -rank (reversed).
  auto s = c.split(c.rank() / 2, -c.rank(), "pairs");
  const int pair_size = std::min(2, n - (c.rank() / 2) * 2);
  ASSERT_EQ(s->size(), pair_size);
  EXPECT_EQ(s->rank(), pair_size == 2 ? 1 - c.rank() % 2 : 0);
  int32_t w = c.rank();
  s->all_reduce(Tensor::view(&w, {1}, DType::I32), ReduceOp::Max);
  EXPECT_EQ(w, std::min(n - 1, (c.rank() / 2) * 2 + 1));
  // The world still works while the groups exist, and groups inherit the timeout.
  EXPECT_EQ(g->timeout(), c.timeout());
  c.barrier();
}

TEST(Comm, ConfigHashCheck) {
  Communicator& c = world();
  EXPECT_NO_THROW(check_same_on_all_ranks(c, "config", "3f2a9c"));
  if (c.size() == 1) return;
  // The last rank's hash differs (and is longer): every rank throws the same message.
  std::string hash = c.rank() == c.size() - 1 ? "deadbeef-longer" : "3f2a9c";
  std::string expected = fmt::format("config differs between ranks: rank {} has 'deadbeef-longer', rank 0 has '3f2a9c'", c.size() - 1);
  try {
    check_same_on_all_ranks(c, "config", hash);
    ADD_FAILURE() << "no error on rank " << c.rank();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
}

TEST(Comm, StatisticsAndBandwidth) {
  Communicator& c = world();
  c.reset_stats();
  std::vector<float> x(4096, 1.f), g(4096 * c.size());
  c.all_reduce(Tensor::view(x.data(), {4096}, DType::F32));
  c.all_reduce(Tensor::view(x.data(), {4096}, DType::F32));
  c.all_gather(Tensor::view(g.data(), {4096 * c.size()}, DType::F32), Tensor::view(x.data(), {4096}, DType::F32));
  CommStats s = c.stats();
  EXPECT_EQ(s.of(Collective::AllReduce).count, 2);
  EXPECT_EQ(s.of(Collective::AllReduce).bytes, 2 * 4096 * 4);
  EXPECT_EQ(s.of(Collective::AllGather).count, 1);
  EXPECT_EQ(s.of(Collective::AllGather).bytes, 4096 * 4 * c.size());
  EXPECT_EQ(s.of(Collective::Broadcast).count, 0);
  // all_to_all counts the bytes this rank sends: 3 elements to each rank.
  const std::vector<int64_t> three(static_cast<size_t>(c.size()), 3);
  c.all_to_all(Tensor::view(g.data(), {3 * c.size()}, DType::F32),
               Tensor::view(x.data(), {3 * c.size()}, DType::F32), three, three);
  EXPECT_EQ(c.stats().of(Collective::AllToAll).count, 1);
  EXPECT_EQ(c.stats().of(Collective::AllToAll).bytes, 3 * 4 * c.size());
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(Collective::AllToAll, 4), 0.75);
  if (c.backend_name() == "mpi") {
    EXPECT_GT(s.of(Collective::AllReduce).seconds, 0.0);
    const auto& ar = s.of(Collective::AllReduce);
    double busbw = bus_bandwidth(Collective::AllReduce, c.size(), ar.bytes, ar.seconds);
    EXPECT_GT(busbw, 0.0);
  }
  c.reset_stats();
  EXPECT_EQ(c.stats().of(Collective::AllReduce).count, 0);
}

TEST(Comm, BadArgumentsThrowOnEveryRankBeforeCommunicating) {
  Communicator& c = world();
  std::vector<float> in(10), out(3);
  // 10 is not size * 3 for any size (checked on every rank, so no rank is left waiting).
  EXPECT_THROW(c.reduce_scatter(Tensor::view(out.data(), {3}, DType::F32), Tensor::view(in.data(), {10}, DType::F32)), Error);
  EXPECT_THROW(c.all_gather(Tensor::view(in.data(), {10}, DType::F32), Tensor::view(out.data(), {3}, DType::F32)), Error);
  EXPECT_THROW(c.broadcast(Tensor::view(in.data(), {10}, DType::F32), c.size()), Error);
  EXPECT_THROW(c.send(Tensor::view(in.data(), {10}, DType::F32), -1, 0), Error);
  EXPECT_THROW(c.send(Tensor::view(in.data(), {10}, DType::F32), 0, 40000), Error);
  EXPECT_THROW(c.set_timeout(0), Error);
  EXPECT_THROW(c.new_group({c.size()}), Error);
  // all_to_all: a count per rank, none negative, as much sent to itself as received from
  // itself, the pieces within the buffers, the buffers apart.
  const auto n = static_cast<size_t>(c.size());
  const std::vector<int64_t> one(n, 1), short_counts(n + 1, 1);
  std::vector<int64_t> negative(n, 1), uneven_self(n, 1), too_many(n, 1);
  negative[0] = -1;
  uneven_self[static_cast<size_t>(c.rank())] = 2;
  too_many[0] = 11;
  std::vector<float> big(2 * n);
  const Tensor in_t = Tensor::view(in.data(), {10}, DType::F32);
  const Tensor big_t = Tensor::view(big.data(), {static_cast<int64_t>(big.size())}, DType::F32);
  if (n <= 10) {
    EXPECT_THROW(c.all_to_all(big_t, in_t, short_counts, one), Error);
    EXPECT_THROW(c.all_to_all(big_t, in_t, negative, one), Error);
    EXPECT_THROW(c.all_to_all(big_t, in_t, uneven_self, one), Error);
    EXPECT_THROW(c.all_to_all(big_t, in_t, too_many, one), Error);
    EXPECT_THROW(c.all_to_all(big_t.view_at(0, {static_cast<int64_t>(n) + 1}), big_t.view_at(1, {static_cast<int64_t>(n)}), one, one), Error);
    EXPECT_THROW(c.all_to_all(big_t, Tensor::view(in.data(), {10}, DType::I32), one, one), Error);
  }
  c.barrier();  // still in step
}

TEST(Comm, WorldMatchesLauncher) {
  Communicator& c = world();
  int launched = launcher_world_size();
  if (launched == 0) {
    EXPECT_EQ(c.backend_name(), "local");
    EXPECT_EQ(c.size(), 1);
  } else if (launched > 0) {
    EXPECT_EQ(c.size(), launched);
    if (launched > 1) {
      EXPECT_EQ(c.backend_name(), "mpi");
    }
  }
}

}  // namespace
}  // namespace kiln
