// Out-of-band exchange for standalone processes: a small group over UCX that
// provides the arbiter_oob a backend's workspace_create() needs.
//
// Rank 0 listens (a ucp_listener on MASTER_ADDR:MASTER_PORT); the other ranks
// connect to it by socket address and present the job token and their rank.
// Collectives run as a star through rank 0 (gather, then send back), which is
// plenty for the few kilobytes of handles a workspace exchanges.
//
// Every wait has a deadline. Errors name the ranks that did not arrive or that
// disconnected; a peer that goes away fails the pending call at once. After a
// failed collective the group is unusable (ranks may disagree on how far they
// got): every later call returns the first error again.
//
// Thread-safety: one thread at a time may call a Bootstrap (collectives are
// issued in the same order on every rank anyway). last_error() of oob() is
// per thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "arbiter_backend.h"

namespace arbiter {

// What a rank needs to join its group. from_environment() fills it from the
// launcher's variables; frameworks with their own rendezvous may fill it.
struct BootstrapOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // the GPU ordinal of this rank (never `rank`); -1: none given (CPU ranks)
  std::string master_addr = "127.0.0.1";  // host name or address of rank 0
  std::uint16_t master_port = 0;          // where rank 0 listens
  // Shared by every rank of the job; rank 0 refuses connections that do not
  // present it. Must not be empty.
  std::string job_token;
  // Deadline for the whole join (connect, retry while rank 0 is not up yet,
  // wait for every rank).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Thrown by from_environment() and connect() only; collectives return a
// BootstrapStatus instead.
class BootstrapError : public std::runtime_error {
 public:
  BootstrapError(arbiter_status code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  // ARBITER_INVALID_ARGUMENT (bad environment or options), ARBITER_TIMEOUT,
  // ARBITER_PEER_FAILED (a peer disconnected, refused us, or failed), or
  // ARBITER_UNAVAILABLE (UCX missing, port in use, address not resolvable).
  arbiter_status code() const { return code_; }

 private:
  arbiter_status code_;
};

struct [[nodiscard]] BootstrapStatus {
  arbiter_status code = ARBITER_OK;
  std::string message;  // empty when ok
  bool ok() const { return code == ARBITER_OK; }
};

// Reads the launcher's environment (torchrun's names):
//   RANK, WORLD_SIZE                  required integers
//   LOCAL_RANK                        the GPU of a GPU rank; optional for CPU
//                                     ranks (local_rank -1 when unset)
//   MASTER_ADDR, MASTER_PORT          required when WORLD_SIZE > 1
//   ARBITER_BOOTSTRAP_PORT            optional: listen/connect here instead of
//                                     MASTER_PORT (under torchrun its store
//                                     already holds MASTER_PORT; `arbiter
//                                     launch` sets a port of its own). Rank 0
//                                     listens there until every rank joined.
//   ARBITER_JOB_TOKEN                 optional; `arbiter launch` sets a fresh
//                                     random one. When absent the token is
//                                     derived as "derived-" + hex FNV-1a-64 of
//                                     "MASTER_ADDR:PORT/WORLD_SIZE": it keeps
//                                     apart jobs that differ in any of those,
//                                     but it is not a secret.
//   ARBITER_BOOTSTRAP_TIMEOUT         optional seconds (e.g. 60 or 2.5); wins
//                                     over `timeout`
// Throws BootstrapError(ARBITER_INVALID_ARGUMENT) naming the variable at
// fault and how to fix it.
BootstrapOptions bootstrap_options_from_environment(
    std::chrono::milliseconds timeout = std::chrono::seconds(60));

// The token used when ARBITER_JOB_TOKEN is absent (see above).
std::string derive_job_token(const std::string& master_addr, std::uint16_t port, int world_size);

// A TCP port of 127.0.0.1 that nothing uses now, for a launcher on this host
// to hand its ranks as MASTER_PORT (`arbiter launch` does). It lies below
// the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), so
// that between this pick and rank 0's listen no outgoing connection and no
// bind to port 0 can take it, as they can a port the kernel picked itself;
// the search starts at a random port, so concurrent launchers rarely try the
// same one. Falls back to the kernel's pick when 64 ports in a row there are
// taken, or when the range starts at 10001 or lower (nothing to search).
// Throws BootstrapError(ARBITER_UNAVAILABLE) when no socket can be bound.
std::uint16_t free_bootstrap_port();

class Bootstrap {
 public:
  // bootstrap_options_from_environment(timeout), then connect().
  static Bootstrap from_environment(std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Joins the group: returns when every rank has joined. Rank 0 refuses (and
  // logs to stderr) connections with a wrong token, a different world size,
  // or a rank out of range or already taken, and keeps waiting for the real
  // ranks. Throws BootstrapError, e.g. "ranks 2, 5 did not connect within
  // 60 s". A world of one rank needs no network at all.
  static Bootstrap connect(const BootstrapOptions& options);

  Bootstrap(Bootstrap&&) noexcept;
  Bootstrap& operator=(Bootstrap&&) noexcept;
  // Flushes what is in flight, closes the endpoints, the listener, the worker
  // and the context. Not collective, but a rank says goodbye first: rank 0
  // waits up to 2 s for the others' goodbyes, the others up to 2 s for rank
  // 0's answer, so that nobody takes an orderly exit for a crash.
  ~Bootstrap();

  int rank() const;
  int world_size() const;
  int local_rank() const;  // the GPU ordinal to use
  const BootstrapOptions& options() const;

  // Collectives: every rank calls them in the same order, with the same
  // `bytes` (and `root`). Each returns within `timeout` (roughly: rank 0 gives
  // up slightly earlier so that it can tell the others which ranks it lacks).
  //
  // recv holds world_size() * bytes: rank r's `bytes` at offset r * bytes.
  // send and recv may not overlap.
  BootstrapStatus allgather(const void* send, void* recv, std::size_t bytes,
                            std::chrono::milliseconds timeout);
  // buf (bytes long) of rank `root` is copied to every rank's buf.
  BootstrapStatus broadcast(void* buf, std::size_t bytes, int root,
                            std::chrono::milliseconds timeout);
  BootstrapStatus barrier(std::chrono::milliseconds timeout);

  // The C view for backends. ctx points into this object; it stays valid
  // while the Bootstrap lives (also across moves). The functions return
  // arbiter_status values; last_error() is per thread.
  const arbiter_oob* oob() const;

  class Impl;  // private (bootstrap_api.cpp)

 private:
  explicit Bootstrap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbiter
