// The diagnosis of a hang from the ranks' collective ledgers (ledger.h): the first call at
// which the ranks disagree, which ranks a waiting call misses, and where each of those is
// instead. docs/reliability.md, "Reading a diagnosis", shows examples.
#pragma once

#include "comm/ledger.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kiln {

/// A rank's ledger file (<dir>/rank-<R>.jsonl), parsed.
struct RankLedger {
  struct Group {
    std::string name;
    int rank = 0;                 // this rank's rank in the group
    std::vector<int> world_ranks;  // [group size]
    std::vector<LedgerEntry> entries;  // oldest first
  };
  int rank = 0;  // world rank
  std::string reason;
  int64_t written_ns = 0;  // system clock
  std::vector<Group> groups;
};

/// The file's lines: a header {"rank", "reason", "written_ns"}, then one line per group
/// {"group", "rank", "world_ranks", "entries": [[seq, op, dtype, count, peer, site,
/// submitted_ns, done_ns], ...]}.
std::string ledger_file_text(const RankLedger& ledger);
/// Parses ledger_file_text's output; throws kiln::Error naming `path` when it is not one.
RankLedger parse_ledger_file(const std::string& text, const std::string& path);

/// The diagnosis as a few lines (no "kiln:" prefix), from the ledgers of the ranks that
/// wrote one; `world_size` says which ranks wrote none. `own_view`: `ledgers` is this
/// rank's alone (its file could not be written, so the others' were not read).
std::vector<std::string> diagnose(const std::vector<RankLedger>& ledgers, int world_size,
                                  bool own_view = false);

}  // namespace kiln
