// The UCX star behind arbiter::Bootstrap (private).
//
// Rank 0 owns a ucp_listener until every rank joined (and strangers that
// came meanwhile were answered); every other rank holds one endpoint to
// rank 0. Connection requests are never passed to ucp_listener_reject.
// All traffic is active messages (one id) whose header is a WireHeader; the
// receiver finds the sending connection through the reply endpoint.
//
// Join: client -> Hello(token, rank, world size); rank 0 -> Welcome or
// Refuse(reason); when all ranks are in, rank 0 -> Ready (or Abort(reason)).
// Collective number s: clients -> Contribute(s); rank 0 -> Result(s) (or
// Error(s, reason) naming the ranks at fault).
// Leave: client -> Bye; rank 0 -> ByeAck. Neither side disconnects before the
// other has read everything, so an orderly exit is never taken for a crash.
#pragma once

#include <ucp/api/ucp.h>

#include <sys/socket.h>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "arbiter/bootstrap.h"

namespace arbiter::bootstrap {

enum class Op : std::uint8_t { kNone = 0, kAllgather = 1, kBroadcast = 2, kBarrier = 3 };

// Bytes on the wire, shared by the sends of one result.
using Payload = std::shared_ptr<const std::vector<std::byte>>;

class StarGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // Initialises UCX and joins the group. Throws BootstrapError.
  static std::unique_ptr<StarGroup> join(const BootstrapOptions& options);
  ~StarGroup();
  StarGroup(const StarGroup&) = delete;
  StarGroup& operator=(const StarGroup&) = delete;

  // REQUIRES: the same op, bytes and root on every rank, in the same order.
  BootstrapStatus allgather(const void* send, void* recv, std::size_t bytes,
                            std::chrono::milliseconds timeout);
  BootstrapStatus broadcast(void* buf, std::size_t bytes, int root,
                            std::chrono::milliseconds timeout);
  BootstrapStatus barrier(std::chrono::milliseconds timeout);

 private:
  struct Conn;
  struct Inbound;
  struct Outbound;
  explicit StarGroup(const BootstrapOptions& options);
  void init_ucx();
  void listen(Clock::time_point deadline);
  void stop_listening(Clock::time_point not_before);
  bool wait_out_time_wait(Clock::time_point deadline);
  void join_as_server(Clock::time_point deadline);
  void join_as_client(Clock::time_point deadline);
  bool try_connect(Clock::time_point deadline, std::string* last_error);
  void leave();

  // Collective steps. `label` is e.g. "allgather #3".
  BootstrapStatus run(Op op, const void* send, void* recv, std::size_t bytes, int root,
                      std::chrono::milliseconds timeout);
  BootstrapStatus server_run(Op op, std::uint32_t seq, const void* send, void* recv,
                             std::size_t bytes, int root, Clock::time_point deadline,
                             std::chrono::milliseconds timeout);
  BootstrapStatus client_run(Op op, std::uint32_t seq, const void* send, void* recv,
                             std::size_t bytes, int root, Clock::time_point deadline,
                             std::chrono::milliseconds timeout);
  // Rank 0 tells every live client why the call failed, then remembers it.
  BootstrapStatus fail_everywhere(std::uint32_t seq, BootstrapStatus status);
  BootstrapStatus remember(BootstrapStatus status);

  // Transport.
  std::shared_ptr<Outbound> send(Conn* to, std::uint8_t kind, Op op, std::uint32_t seq,
                                 Payload payload, std::int32_t root = 0, std::int32_t status = 0,
                                 std::uint64_t bytes = 0);
  // Progresses until done() is true or the deadline passes; false on timeout.
  bool wait_until(const std::function<bool()>& done, Clock::time_point deadline);
  void progress();
  void sleep_for_events(Clock::duration max_wait);
  void close(Conn* conn, bool force);
  void drain_closes(Clock::time_point deadline);
  std::unique_ptr<Inbound> take(const std::function<bool(const Inbound&)>& match);
  // Server: turns queued connection requests into endpoints; answers Bye.
  void accept_pending();
  void answer_byes();
  // Rank 0, while it listens: answers the hellos of connections not yet
  // joined and closes strangers that are done.
  void tend_strangers();
  void handle_hello(std::unique_ptr<Inbound> hello);
  void refuse(Conn* conn, const std::string& reason);

  static ucs_status_t on_am(void* arg, const void* header, std::size_t header_length, void* data,
                            std::size_t length, const ucp_am_recv_param_t* param);
  static void on_conn_request(ucp_conn_request_h request, void* arg);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  std::string where() const;   // "rank 3"
  std::string master() const;  // "127.0.0.1:29500"

  BootstrapOptions options_;
  sockaddr_storage master_addr_{};
  socklen_t master_addr_len_ = 0;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  Clock::time_point listening_since_;  // rank 0: when listen() succeeded
  int event_fd_ = -1;

  std::vector<std::unique_ptr<Conn>> conns_;  // every connection ever made; never shrinks
  std::unordered_map<ucp_ep_h, Conn*> by_ep_;
  std::vector<Conn*> by_rank_;  // rank 0: joined clients; clients: [0] = rank 0
  std::vector<ucp_conn_request_h> conn_requests_;
  std::deque<std::unique_ptr<Inbound>> inbox_;
  std::list<std::shared_ptr<Outbound>> in_flight_;
  std::vector<void*> closing_;

  bool complete_ = false;                  // rank 0: every rank joined
  std::uint32_t seq_ = 0;                  // collectives issued so far
  std::optional<BootstrapStatus> broken_;  // first failure; sticky
};

}  // namespace arbiter::bootstrap
