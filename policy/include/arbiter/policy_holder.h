// A Policy that can be replaced while other threads decide with it: the
// tables of a long-running process, reloaded when an operator edits a site
// file.
//
// Readers: current() is one atomic load (acquire). decide(), explain() and
// max_fused_bytes() through it are lock-free, allocation-free and never
// throw, like Policy's own. A reader sees the tables of one version, never a
// mix: every version is an immutable Policy, published whole with a single
// atomic store (release) after it was completely loaded and compiled. To
// take several decisions from one version (and know which), read current()
// once and use that reference:
//
//   const Policy& p = holder.current();
//   Decision d = p.decide(request);  // from the tables whose
//   std::uint64_t f = p.fingerprint();  // fingerprint is f
//
// Writers: reload() loads a new Policy (all or nothing: a table with any
// error publishes nothing and returns the diagnostics) and publishes it;
// publish() installs one loaded elsewhere. Writers are serialised by a mutex
// that readers never touch, and ordered by when they were called: a reload
// never replaces the tables of a reload or publish called after it.
//
// Memory: a reference returned by current() stays valid until the holder is
// destroyed, so every published version is kept until then; readers pay no
// reference counting and need no hazard pointers. Reloads are rare (an
// operator edits a table), so the cost is bounded by retained_versions()
// times the size of one compiled table: about 32 KiB for the default tables
// with a small site file (a thousand reloads keep about 32 MiB). A process
// that reloads without bound should recreate its holder once no reader
// uses it.
//
// Thread-safety: every member may be called concurrently with every other
// one, except the destructor, which must run after all readers are done.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "arbiter/decision.h"
#include "arbiter/diagnostic.h"
#include "arbiter/policy.h"
#include "arbiter/request.h"

namespace arbiter {

struct ReloadResult {
  // True when the new tables were published; false when the load found an
  // error (the previous tables stay in use) or was superseded (below).
  bool published = false;
  // True when the tables loaded but were not published: a reload (or
  // publish) that began later had published already, and its tables, read
  // later, stay in use.
  bool superseded = false;
  // The generation in use after the call (0 is the initial version).
  std::uint64_t generation = 0;
  // Errors and warnings of the load, in file order.
  std::vector<Diagnostic> diagnostics;
};

class PolicyHolder {
 public:
  // `initial` is generation 0.
  explicit PolicyHolder(Policy initial);
  PolicyHolder(const PolicyHolder&) = delete;
  PolicyHolder& operator=(const PolicyHolder&) = delete;
  ~PolicyHolder();

  // The tables in use. The reference stays valid (and its tables unchanged)
  // until the holder is destroyed, across any number of reloads.
  const Policy& current() const noexcept { return *current_.load(std::memory_order_acquire); }

  // Shorthands for current().decide(...) and friends: each reads the current
  // version once.
  Decision decide(const Request& request) const noexcept { return current().decide(request); }
  Decision explain(const Request& request) const noexcept { return current().explain(request); }
  std::optional<std::uint64_t> max_fused_bytes(const Request& request) const noexcept {
    return current().max_fused_bytes(request);
  }
  std::uint64_t fingerprint() const noexcept { return current().fingerprint(); }

  // Loads `options` (see Policy::load) and, when that finds no error,
  // publishes the result, unless a reload or publish that began later has
  // published first (ReloadResult::superseded): concurrent reloads leave the
  // tables of the one called last, whichever finishes loading first. Never
  // throws for bad input.
  [[nodiscard]] ReloadResult reload(const LoadOptions& options);
  // Publishes `policy`; returns its generation.
  std::uint64_t publish(Policy policy);

  // Number of versions published so far, the initial one not counted.
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }
  // Versions kept alive (the current one included): generation() + 1.
  std::size_t retained_versions() const;

 private:
  // Installs `policy` unless a writer with a later ticket already has;
  // returns its generation, or nullopt when superseded. No ticket: one
  // taken under the lock, so the newest (publish()).
  std::optional<std::uint64_t> install(Policy policy, std::optional<std::uint64_t> ticket);

  std::atomic<const Policy*> current_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> tickets_{0};  // one per reload() or publish(), in call order
  mutable std::mutex writer_;              // guards versions_, installed_ticket_, publishing
  std::uint64_t installed_ticket_ = 0;     // the ticket of the tables in use
  std::vector<std::unique_ptr<const Policy>> versions_;  // oldest first
};

}  // namespace arbiter
