// Agreeing on an outcome during a collective workspace creation: each rank
// all-gathers a record with its status and reason, and every rank derives
// the same verdict from the same records, so creation fails on every rank
// when it fails on any, each saying why. Host only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// Record: a trivially copyable struct with `int32_t status` and `char reason[N]`.
template <typename Record>
void put_reason(Record& record, const std::string& reason) {
  std::snprintf(record.reason, sizeof record.reason, "%s", reason.c_str());
}

template <typename Record>
std::string reason_of(const Record& record) {
  return std::string(record.reason, strnlen(record.reason, sizeof record.reason));
}

// OK when every rank is; otherwise this rank's own failure, or
// ARBITER_PEER_FAILED naming the first rank that failed and its reason.
template <typename Record>
Status verdict(const std::vector<Record>& all, std::int32_t self) {
  int failed = 0;
  int first = -1;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].status != ARBITER_OK) {
      ++failed;
      if (first < 0) first = static_cast<int>(r);
    }
  }
  if (failed == 0) return Status();
  if (all[self].status != ARBITER_OK) {
    std::string m = reason_of(all[self]);
    if (failed > 1) m += " (" + std::to_string(failed - 1) + " other rank(s) failed too)";
    return Status(static_cast<arbiter_status>(all[self].status), m);
  }
  std::string m = "rank " + std::to_string(first) + " failed: " + reason_of(all[first]);
  if (failed > 1) m += " (and " + std::to_string(failed - 1) + " more rank(s))";
  return Status(ARBITER_PEER_FAILED, m);
}

// The status of a failed oob call, with the oob's own message.
inline Status exchange_failed(const arbiter_oob& oob, const char* what, std::int32_t rc) {
  const char* m = oob.last_error != nullptr ? oob.last_error(oob.ctx) : nullptr;
  return Status(rc == ARBITER_OK ? ARBITER_INTERNAL : static_cast<arbiter_status>(rc),
                std::string("oob ") + what + " failed: " + (m != nullptr ? m : "(no message)"));
}

// An allocation that failed while this rank's own abort() was raised: the
// peers refused theirs at once because of that abort, so its exchange timed
// out on them. The abort is what failed, not a peer. `module`: "shm", ...
inline Status aborted_while_exchanging(const char* module, const Status& failed) {
  return Status(ARBITER_ABORTED,
                std::string(module) +
                    " alloc: aborted (abort() was called on this rank while this allocation "
                    "waited for its peers, which then refused theirs; an allocation in progress "
                    "is not cut short, so it returned at its deadline): " +
                    failed.message());
}

// The first round of a collective creation: every rank all-gathers its
// record (status and reason filled from `local` here) and all reach the same
// verdict. *all holds every rank's record afterwards.
template <typename Record>
Status gather_records(const arbiter_oob& oob, Record& mine, const Status& local,
                      std::int64_t timeout_ms, std::vector<Record>* all) {
  mine.status = local.code();
  put_reason(mine, local.message());
  all->resize(static_cast<std::size_t>(oob.size));
  if (const std::int32_t rc =
          oob.allgather(oob.ctx, &mine, all->data(), sizeof(Record), timeout_ms);
      rc != ARBITER_OK) {
    return exchange_failed(oob, "allgather", rc);
  }
  return verdict(*all, oob.rank);
}

// One agreement round: every rank all-gathers its local status, and all
// return the same verdict (verdict() above). Collective.
inline Status agree(const arbiter_oob& oob, const Status& local, std::int64_t timeout_ms) {
  struct Outcome {
    std::int32_t status;
    char reason[240];
  } mine{local.code(), {}};
  put_reason(mine, local.message());
  std::vector<Outcome> all(static_cast<std::size_t>(oob.size));
  if (const std::int32_t rc = oob.allgather(oob.ctx, &mine, all.data(), sizeof mine, timeout_ms);
      rc != ARBITER_OK) {
    return exchange_failed(oob, "allgather", rc);
  }
  return verdict(all, oob.rank);
}

}  // namespace arbiter::common
