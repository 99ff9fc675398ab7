// The collective ledger (comm/ledger.h) and the diagnosis built from the ranks' ledger files
// (comm/diagnosis.h): numbering, call sites, the bounded ring, the file format, and the
// diagnosis of hand-made hangs (a rank that skipped a call, one waiting elsewhere, one that
// wrote no ledger, a receive whose sender never sent).
#include "comm/diagnosis.h"
#include "comm/ledger.h"
#include "core/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(CommSite, InnermostWinsAndTheOuterComesBack) {
  EXPECT_STREQ(CommSite::current(), "");
  {
    const CommSite outer("dp.all_reduce grads bucket {}", 3);
    EXPECT_STREQ(CommSite::current(), "dp.all_reduce grads bucket 3");
    {
      const CommSite inner("tp.all_reduce activations");
      EXPECT_STREQ(CommSite::current(), "tp.all_reduce activations");
    }
    EXPECT_STREQ(CommSite::current(), "dp.all_reduce grads bucket 3");
  }
  EXPECT_STREQ(CommSite::current(), "");
  const CommSite long_site(std::string(200, 'x'));
  EXPECT_EQ(std::string(CommSite::current()), std::string(CommSite::kCommSiteChars - 1, 'x'));
}

TEST(Ledger, NumbersCollectivesOnceAndPointToPointPerPeerAndDirection) {
  Ledger l("pp", 1, {4, 5, 6});
  EXPECT_EQ(l.add(Collective::AllReduce, DType::F32, 8, -1).seq, 1);
  EXPECT_EQ(l.add(Collective::Send, DType::F32, 8, 2).seq, 1);
  EXPECT_EQ(l.add(Collective::Send, DType::F32, 8, 2).seq, 2);
  EXPECT_EQ(l.add(Collective::Recv, DType::F32, 8, 2).seq, 1);
  EXPECT_EQ(l.add(Collective::Send, DType::F32, 8, 0).seq, 1);
  EXPECT_EQ(l.add(Collective::Broadcast, DType::I32, 3, 0).seq, 2);
  const std::vector<LedgerEntry> t = l.tail();
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t.back().op, Collective::Broadcast);
  for (const LedgerEntry& e : t) EXPECT_EQ(e.done_ns, 0);
  l.done(Collective::Send, 2, 2);
  EXPECT_EQ(l.tail()[1].done_ns, 0);
  EXPECT_GT(l.tail()[2].done_ns, 0);
}

TEST(Ledger, KeepsTheLastEntriesOnly) {
  Ledger l("dp", 0, {0, 1});
  const int64_t n = static_cast<int64_t>(kLedgerEntries) * 2 + 37;
  for (int64_t i = 0; i < n; ++i) {
    const CommSite site("call {}", i);
    l.add(Collective::AllReduce, DType::F32, i, -1);
  }
  const std::vector<LedgerEntry> t = l.tail();
  ASSERT_EQ(t.size(), kLedgerEntries);
  EXPECT_EQ(t.front().seq, n - static_cast<int64_t>(kLedgerEntries) + 1);
  EXPECT_EQ(t.back().seq, n);
  EXPECT_STREQ(t.back().site, fmt::format("call {}", n - 1).c_str());
  EXPECT_EQ(l.tail(5).front().seq, n - 4);
}

LedgerEntry entry(int64_t seq, Collective op, int64_t count, const char* site, bool done,
                  int peer = -1) {
  LedgerEntry e;
  e.seq = seq;
  e.op = op;
  e.count = count;
  e.peer = peer;
  std::snprintf(e.site, sizeof(e.site), "%s", site);
  e.submitted_ns = 1'000'000'000LL * seq;
  e.done_ns = done ? e.submitted_ns + 1000 : 0;
  return e;
}

TEST(LedgerFile, RoundTripsAndRejectsOtherFiles) {
  RankLedger r;
  r.rank = 3;
  r.reason = "timed out";
  r.written_ns = 123456789;
  r.groups.push_back({.name = "dp", .rank = 1, .world_ranks = {1, 3},
                      .entries = {entry(1, Collective::AllGather, 16, "a \"quoted\" site", true),
                                  entry(2, Collective::Recv, 4, "", false, 0)}});
  const RankLedger back = parse_ledger_file(ledger_file_text(r), "rank-3.jsonl");
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.reason, "timed out");
  EXPECT_EQ(back.written_ns, 123456789);
  ASSERT_EQ(back.groups.size(), 1u);
  EXPECT_EQ(back.groups[0].world_ranks, (std::vector<int>{1, 3}));
  ASSERT_EQ(back.groups[0].entries.size(), 2u);
  EXPECT_STREQ(back.groups[0].entries[0].site, "a \"quoted\" site");
  EXPECT_EQ(back.groups[0].entries[1].op, Collective::Recv);
  EXPECT_EQ(back.groups[0].entries[1].peer, 0);
  EXPECT_EQ(back.groups[0].entries[1].done_ns, 0);
  EXPECT_THROW(parse_ledger_file("{\"step\": 1}\n", "metrics.jsonl"), Error);
  EXPECT_THROW(parse_ledger_file("", "empty.jsonl"), Error);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// Three ranks of one group 'world': rank 2 skipped collective #2, so from #2 on its calls
// are one ahead; ranks 0 and 1 wait in #3, which rank 2 reached with another call.
TEST(Diagnosis, NamesTheFirstDisagreementAndWhoIsMissing) {
  std::vector<RankLedger> ls(3);
  for (int r = 0; r < 3; ++r) {
    ls[r].rank = r;
    ls[r].written_ns = 10'000'000'000LL;
    ls[r].groups.push_back({.name = "world", .rank = r, .world_ranks = {0, 1, 2}, .entries = {}});
  }
  for (int r = 0; r < 2; ++r)
    ls[r].groups[0].entries = {entry(1, Collective::AllReduce, 4, "a", true),
                               entry(2, Collective::AllReduce, 4, "b", true),
                               entry(3, Collective::AllReduce, 4, "c", false)};
  ls[2].groups[0].entries = {entry(1, Collective::AllReduce, 4, "a", true),
                             entry(2, Collective::AllReduce, 4, "c", false)};
  const std::string d = joined(diagnose(ls, 3));
  EXPECT_THAT(d, HasSubstr("rank 2 differs: collective #2 of 'world' differs between ranks: "
                           "ranks 0, 1 called all_reduce fp32[4] at 'b'; rank 2 called "
                           "all_reduce fp32[4] at 'c'"));
  EXPECT_THAT(d, HasSubstr("ranks 0, 1 wait in all_reduce fp32[4] #3 of 'world' at 'c'; missing: rank 2"));
  EXPECT_THAT(d, HasSubstr("rank 2: it waits in all_reduce fp32[4] #2 of 'world' at 'c'"));
}

// Rank 0 waits in a dp collective; rank 1 waits in a pipeline receive from rank 2, which
// wrote no ledger; rank 3 is in no call.
TEST(Diagnosis, SaysWhereEachMissingRankIsInstead) {
  std::vector<RankLedger> ls(3);
  ls[0].rank = 0;
  ls[0].groups.push_back({.name = "dp", .rank = 0, .world_ranks = {0, 1, 3},
                          .entries = {entry(7, Collective::AllReduce, 4, "dp.x", false)}});
  ls[1].rank = 1;
  ls[1].written_ns = 9'000'000'000LL;
  ls[1].groups.push_back({.name = "dp", .rank = 1, .world_ranks = {0, 1, 3},
                          .entries = {entry(6, Collective::AllReduce, 4, "dp.w", true)}});
  ls[1].groups.push_back({.name = "pp", .rank = 1, .world_ranks = {2, 1},
                          .entries = {entry(1, Collective::Recv, 8, "pp.recv a", true, 0),
                                      entry(2, Collective::Recv, 8, "pp.recv b", false, 0)}});
  ls[2].rank = 3;
  ls[2].written_ns = 9'000'000'000LL;
  ls[2].groups.push_back({.name = "dp", .rank = 2, .world_ranks = {0, 1, 3},
                          .entries = {entry(7, Collective::AllReduce, 4, "dp.x", true)}});
  const std::string d = joined(diagnose(ls, 4));
  EXPECT_THAT(d, HasSubstr("ledgers written by ranks 0, 1, 3; none by rank 2"));
  EXPECT_THAT(d, HasSubstr("rank 0 waits in all_reduce fp32[4] #7 of 'dp' (ranks 0, 1, 3) at 'dp.x'; missing: rank 1"));
  EXPECT_THAT(d, HasSubstr("rank 1: it waits in recv fp32[8] from rank 2 #2 of 'pp' (ranks 2, 1) at 'pp.recv b'"));
  EXPECT_THAT(d, HasSubstr("rank 1 waits in recv fp32[8] from rank 2 #2 of 'pp' (ranks 2, 1) at 'pp.recv b'; missing: rank 2"));
  EXPECT_THAT(d, HasSubstr("rank 2: it wrote no ledger"));
  EXPECT_THAT(d, Not(HasSubstr("missing: rank 3")));
}

TEST(Diagnosis, EveryMemberArrived) {
  std::vector<RankLedger> ls(2);
  for (int r = 0; r < 2; ++r) {
    ls[r].rank = r;
    ls[r].groups.push_back({.name = "world", .rank = r, .world_ranks = {0, 1},
                            .entries = {entry(5, Collective::Barrier, 0, "ckpt.barrier save", false)}});
  }
  const std::string d = joined(diagnose(ls, 2));
  EXPECT_THAT(d, HasSubstr("ranks 0, 1 wait in barrier #5 of 'world' at 'ckpt.barrier save': every member reached it"));
}

// Two pipeline stages' 'dp' groups, {0, 1} and {2, 3}: their collectives share numbers and
// a name but not their shapes, and neither misses the other's members.
TEST(Diagnosis, KeepsCommunicatorsOfOneNameApart) {
  std::vector<RankLedger> ls(4);
  for (int r = 0; r < 4; ++r) {
    ls[r].rank = r;
    const std::vector<int> members = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    ls[r].groups.push_back({.name = "dp", .rank = r % 2, .world_ranks = members,
                            .entries = {entry(2, Collective::AllReduce, r < 2 ? 9552 : 6176, "g", r != 1)}});
  }
  const std::string d = joined(diagnose(ls, 4));
  EXPECT_THAT(d, Not(HasSubstr("differs")));
  EXPECT_THAT(d, HasSubstr("rank 1 waits in all_reduce fp32[9552] #2 of 'dp' (ranks 0, 1) at 'g': every member reached it"));
  EXPECT_THAT(d, Not(HasSubstr("missing")));
}

// A rank whose file could not be written diagnoses from its own ledger: it says what it
// waits in, and that it does not know where the missing rank is.
TEST(Diagnosis, OwnViewClaimsNothingOfTheOthers) {
  RankLedger mine;
  mine.groups.push_back({.name = "dp", .rank = 0, .world_ranks = {0, 1},
                         .entries = {entry(3, Collective::AllReduce, 4, "train.loss", false)}});
  const std::string d = joined(diagnose({mine}, 2, /*own_view=*/true));
  EXPECT_THAT(d, Not(HasSubstr("ledgers written")));
  EXPECT_THAT(d, Not(HasSubstr("wrote no ledger")));
  EXPECT_THAT(d, HasSubstr("rank 0 waits in all_reduce fp32[4] #3 of 'dp' at 'train.loss'; missing: rank 1"));
  EXPECT_THAT(d, HasSubstr("rank 1: not known (only this rank's ledger was read)"));
}

}  // namespace
}  // namespace kiln
