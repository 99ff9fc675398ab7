// The collective ledger's cost per recorded call (comm/ledger.h): what every MPI or NCCL
// call pays on the submitting thread (a formatted CommSite, the entry added to the ring)
// and on completion (the entry marked done). docs/reliability.md turns it into a share of
// the step time: cost per call x calls per update / update time.
#include "comm/ledger.h"

#include <benchmark/benchmark.h>

namespace {

void BM_LedgerRecordCall(benchmark::State& state) {
  kiln::Ledger ledger("dp", 0, {0, 1, 2, 3});
  int64_t part = 0;
  for (auto _ : state) {
    const kiln::CommSite site("dp.reduce_scatter grads part {}", part++ % 12);
    const kiln::LedgerEntry e = ledger.add(kiln::Collective::ReduceScatter, kiln::DType::F32, 1 << 20, -1);
    ledger.done(e.op, e.seq, e.peer);
    benchmark::DoNotOptimize(e);
  }
}
BENCHMARK(BM_LedgerRecordCall);

}  // namespace

BENCHMARK_MAIN();
