#include "bootstrap_group.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "arbiter/common/deadline.h"

namespace arbiter::bootstrap {

namespace {

constexpr std::uint32_t kMagic = 0x41524242;  // "ARBB"
constexpr std::uint16_t kVersion = 1;
constexpr unsigned kAmId = 7;
constexpr std::size_t kMaxTokenBytes = 1024;
// Longest sleep between checks; events normally wake the worker sooner.
constexpr auto kPollSlice = std::chrono::milliseconds(20);
// How long leaving waits for the other side's goodbye.
constexpr auto kLeaveWait = std::chrono::seconds(2);
// How long a refused peer may stay connected to read why.
constexpr auto kRefusedLinger = std::chrono::seconds(1);
// How long a failing rank 0 spends telling the others why.
constexpr auto kNotifyWait = std::chrono::milliseconds(300);
// How long no connection may arrive before rank 0 stops listening.
constexpr auto kSettle = std::chrono::milliseconds(50);
// Longest pause between a client's tries to reach rank 0.
constexpr auto kRetryCap = std::chrono::milliseconds(100);
// Rank 0 listens at least this long once it started, even if the group is
// complete sooner: a client that tried before rank 0 listened comes back
// within kRetryCap, and a second RANK=1 among them must be told why it is
// refused, not left to wait out its timeout. The rest is slack for a busy
// host's scheduler.
constexpr auto kListenAtLeast = 5 * kRetryCap;
// Longer timeouts wait this long, as every wait of arbiter's does: one meant
// as "never" (1e10 s) would overflow the clock's 64-bit nanoseconds and end
// at once.
constexpr auto kLongestWait = std::chrono::milliseconds(arbiter::common::kLongestWaitMs);
// How often rank 0 looks whether a port in TIME_WAIT is free again.
constexpr auto kTimeWaitPoll = std::chrono::milliseconds(250);

enum Kind : std::uint8_t {
  kHello = 1,
  kWelcome = 2,
  kRefuse = 3,
  kReady = 4,
  kAbort = 5,
  kContribute = 6,
  kResult = 7,
  kError = 8,
  kBye = 9,
  kByeAck = 10,
};

// Host byte order on every rank (x86-64 and aarch64 are both little-endian).
struct WireHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint8_t kind;
  std::uint8_t op;
  std::uint32_t seq;
  std::int32_t rank;  // the sender's (in Hello: the rank it claims)
  std::int32_t world_size;
  std::int32_t root;
  std::int32_t status;  // arbiter_status in Refuse, Abort, Error
  std::uint32_t reserved;
  std::uint64_t bytes;  // per-rank bytes of the collective
};
static_assert(sizeof(WireHeader) == 40);

void log(const std::string& line) { std::fprintf(stderr, "arbiter bootstrap: %s\n", line.c_str()); }

std::string ucx_text(ucs_status_t status) { return ucs_status_string(status); }

std::string op_name(Op op) {
  switch (op) {
    case Op::kAllgather:
      return "allgather";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kBarrier:
      return "barrier";
    case Op::kNone:
      break;
  }
  return "call";
}

// "barrier (call #4)": the number counts every collective of the group.
std::string label(Op op, std::uint32_t seq) {
  return op_name(op) + " (call #" + std::to_string(seq) + ")";
}

// "rank 2" or "ranks 2, 5" (long lists are cut short).
std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kShown = 16;
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size() && i < kShown; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
  }
  if (ranks.size() > kShown) text += " and " + std::to_string(ranks.size() - kShown) + " more";
  return text;
}

std::string verb(const std::vector<int>& ranks, const char* singular, const char* plural) {
  return ranks.size() == 1 ? singular : plural;
}

// "60 s", "2.5 s", "300 ms".
std::string duration_text(std::chrono::milliseconds d) {
  const long long ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(ms) / 1000.0);
  return text;
}

std::string sockaddr_text(const sockaddr* addr, socklen_t length) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(addr, length, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  if (addr->sa_family == AF_INET6) return std::string("[") + host + "]:" + port;
  return std::string(host) + ":" + port;
}

// Rank 0 stops waiting a little before the callers' deadline, so that the
// others still listen when it tells them which ranks it lacks.
std::chrono::steady_clock::duration margin(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::steady_clock::duration>(timeout / 10, std::chrono::seconds(1));
}

Payload make_payload(const void* data, std::size_t bytes) {
  auto payload = std::make_shared<std::vector<std::byte>>(bytes);
  if (bytes > 0) std::memcpy(payload->data(), data, bytes);
  return payload;
}

Payload text_payload(const std::string& text) { return make_payload(text.data(), text.size()); }

// Whether a program listens on `address` (a TCP connect within 200 ms).
// Unsure (no answer in time, another error): yes.
bool someone_listens(const sockaddr_storage& address, socklen_t length) {
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  int error = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      socklen_t size = sizeof error;
      error = ::poll(&p, 1, 200) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0
                  ? error
                  : ETIMEDOUT;
    }
  }
  ::close(fd);
  return error != ECONNREFUSED;
}

// Whether the kernel lists a connection in TIME_WAIT whose local port is
// `port` (/proc/net/tcp and tcp6: state 06). Unreadable: no.
bool port_in_time_wait(std::uint16_t port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::FILE* f = std::fopen(table, "r");
    if (f == nullptr) continue;
    char line[512];
    bool found = false;
    if (std::fgets(line, sizeof line, f) != nullptr) {  // the header
      while (!found && std::fgets(line, sizeof line, f) != nullptr) {
        // "  12: 0100007F:6E2A 0100007F:A1B2 06 ...": local address:port, remote, state.
        char local[80], remote[80];
        unsigned state = 0;
        if (std::sscanf(line, " %*[^:]: %79s %79s %x", local, remote, &state) != 3) continue;
        const char* colon = std::strrchr(local, ':');
        found = colon != nullptr && state == 0x06 && std::strtoul(colon + 1, nullptr, 16) == port;
      }
    }
    std::fclose(f);
    if (found) return true;
  }
  return false;
}

// Whether `address` can be bound now (no SO_REUSEADDR, as UCX binds it).
int bind_error(const sockaddr_storage& address, socklen_t length) {
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int error =
      ::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0 ? 0 : errno;
  ::close(fd);
  return error;
}

}  // namespace

struct StarGroup::Conn {
  ucp_ep_h ep = nullptr;
  int rank = -1;         // rank 0: the peer's rank once its hello was accepted
  bool joined = false;   // hello accepted (rank 0) / welcome received (client)
  bool refused = false;  // rank 0 refused it; the peer is expected to hang up
  std::chrono::steady_clock::time_point refused_at{};
  bool left = false;    // the peer said goodbye (rank 0)
  bool failed = false;  // UCX reported an error on the endpoint
  ucs_status_t error = UCS_OK;
  std::string peer;  // the peer's socket address, for logs
};

struct StarGroup::Inbound {
  WireHeader header{};
  Conn* from = nullptr;
  std::vector<std::byte> data;
  std::string text() const {
    return std::string(reinterpret_cast<const char*>(data.data()), data.size());
  }
};

struct StarGroup::Outbound {
  WireHeader header{};
  Payload payload;
  Conn* to = nullptr;
  void* request = nullptr;
  ucs_status_t status = UCS_INPROGRESS;
};

// ---------------------------------------------------------------------------
// Setup and teardown

StarGroup::StarGroup(const BootstrapOptions& options) : options_(options) {
  options_.timeout = std::clamp(options_.timeout, std::chrono::milliseconds(0), kLongestWait);
}

std::unique_ptr<StarGroup> StarGroup::join(const BootstrapOptions& options) {
  std::unique_ptr<StarGroup> group(new StarGroup(options));
  const Clock::time_point deadline = Clock::now() + group->options_.timeout;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.master_port);
  const int rc = getaddrinfo(options.master_addr.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw BootstrapError(ARBITER_UNAVAILABLE, "bootstrap: rank " + std::to_string(options.rank) +
                                                  ": MASTER_ADDR='" + options.master_addr +
                                                  "' does not resolve (" + gai_strerror(rc) +
                                                  "; hint: give rank 0's host name or IP address)");
  }
  std::memcpy(&group->master_addr_, found->ai_addr, found->ai_addrlen);
  group->master_addr_len_ = found->ai_addrlen;
  freeaddrinfo(found);

  group->init_ucx();
  if (options.rank == 0) {
    group->listen(deadline);
    group->join_as_server(deadline);
  } else {
    group->join_as_client(deadline);
  }
  return group;
}

void StarGroup::init_ucx() {
  auto fail = [&](const std::string& what, ucs_status_t status) {
    throw BootstrapError(ARBITER_UNAVAILABLE, "bootstrap: " + where() + ": " + what + ": " +
                                                  ucx_text(status) +
                                                  " (hint: check the UCX_* variables; on a "
                                                  "loopback-only host use UCX_TLS=tcp,self "
                                                  "UCX_NET_DEVICES=lo)");
  };
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) fail("cannot read the UCX configuration", status);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &context_);
  if (status != UCS_OK) {
    // Without wakeup support the waits sleep in short slices instead.
    params.features = UCP_FEATURE_AM;
    status = ucp_init(&params, config, &context_);
  }
  ucp_config_release(config);
  if (status != UCS_OK) fail("cannot initialise UCX", status);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  // Rank 0's listening port may be reused while connections of an earlier
  // run sit in TIME_WAIT (a fixed ARBITER_BOOTSTRAP_PORT, a job restarted
  // within a minute), and its own connections leave TIME_WAIT entries that
  // the next run may reuse (both sides need SO_REUSEADDR). A port another
  // program listens on still fails. UCX 1.13 reads this only from the
  // environment (ucp_config_modify does not reach its connection managers),
  // when the worker opens them: set once per process, before the first
  // worker, and left set (unsetting it could race a getenv() in another
  // thread as much as setting it). The user's own setting wins.
  if (options_.rank == 0) {
    static std::once_flag once;
    std::call_once(once, [] {
      if (std::getenv("UCX_TCP_CM_REUSEADDR") == nullptr &&
          std::getenv("UCX_CM_REUSEADDR") == nullptr) {
        ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
      }
    });
  }
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) fail("cannot create a UCX worker", status);
  if (params.features & UCP_FEATURE_WAKEUP) {
    if (ucp_worker_get_efd(worker_, &event_fd_) != UCS_OK) event_fd_ = -1;
  }

  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kAmId;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  handler.cb = &StarGroup::on_am;
  handler.arg = this;
  status = ucp_worker_set_am_recv_handler(worker_, &handler);
  if (status != UCS_OK) fail("cannot register the active-message handler", status);
}

// A port that cannot be bound, that nobody listens on, and that the kernel
// lists in TIME_WAIT is held by connections of an earlier run (a fixed
// ARBITER_BOOTSTRAP_PORT, a job restarted within a minute) that did not use
// SO_REUSEADDR: the kernel frees it within 60 s. Rank 0 waits
// for that, up to `deadline`, instead of failing while its peers wait out
// their timeout. True when it is still held that way at the deadline; false
// when it is free, or a program listens there.
bool StarGroup::wait_out_time_wait(Clock::time_point deadline) {
  bool told = false;
  for (;;) {
    if (bind_error(master_addr_, master_addr_len_) != EADDRINUSE) return false;
    // Something else (a listener, a socket bound or connected from this
    // port) is not going away by waiting.
    if (!port_in_time_wait(options_.master_port)) return false;
    if (someone_listens(master_addr_, master_addr_len_)) return false;
    if (Clock::now() + kTimeWaitPoll >= deadline) return true;
    if (!told) {
      log("rank 0: port " + std::to_string(options_.master_port) +
          " is held by connections of an earlier run in TIME_WAIT (no program listens "
          "there); waiting for the kernel to free it: at most 60 s, and no longer than "
          "this rank's timeout of " +
          duration_text(options_.timeout));
      told = true;
    }
    std::this_thread::sleep_for(kTimeWaitPoll);
  }
}

void StarGroup::listen(Clock::time_point deadline) {
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&master_addr_);
  params.sockaddr.addrlen = master_addr_len_;
  params.conn_handler.cb = &StarGroup::on_conn_request;
  params.conn_handler.arg = this;
  ucs_status_t status = ucp_listener_create(worker_, &params, &listener_);
  bool time_wait = false;
  if (status == UCS_ERR_BUSY) {
    // Without UCX_TCP_CM_REUSEADDR: maybe only TIME_WAIT holds it.
    time_wait = wait_out_time_wait(deadline - margin(options_.timeout));
    if (!time_wait) status = ucp_listener_create(worker_, &params, &listener_);
  }
  if (status == UCS_OK) {
    listening_since_ = Clock::now();
    return;
  }
  listener_ = nullptr;
  if (status == UCS_ERR_BUSY && time_wait) {
    throw BootstrapError(ARBITER_UNAVAILABLE,
                         "bootstrap: rank 0 cannot listen on " + master() + ": port " +
                             std::to_string(options_.master_port) +
                             " is still held by connections of an earlier run in TIME_WAIT "
                             "(no program listens there; the kernel frees it within 60 s of "
                             "that run) and the join's timeout of " +
                             duration_text(options_.timeout) +
                             " passed first (hint: leave UCX_TCP_CM_REUSEADDR unset, or set it "
                             "to y, on rank 0 for every run, so that such a port is reused at "
                             "once; or wait a minute)");
  }
  if (status == UCS_ERR_BUSY) {
    throw BootstrapError(
        ARBITER_UNAVAILABLE,
        "bootstrap: rank 0 cannot listen on " + master() + ": port " +
            std::to_string(options_.master_port) +
            " is already in use (hint: another job or program listens there; give arbiter a "
            "free port: ARBITER_BOOTSTRAP_PORT names it, else MASTER_PORT, which torchrun's "
            "store holds; or let `arbiter launch` pick one)");
  }
  throw BootstrapError(ARBITER_UNAVAILABLE,
                       "bootstrap: rank 0 cannot listen on " + master() + ": " + ucx_text(status) +
                           " (hint: MASTER_ADDR must be an address of rank 0's host)");
}

StarGroup::~StarGroup() {
  if (worker_ != nullptr) {
    leave();
    for (auto& conn : conns_) close(conn.get(), true);
    drain_closes(Clock::now() + std::chrono::seconds(1));
    stop_listening(Clock::now());  // a join that failed: strangers may still come
    // Sends to force-closed endpoints complete with an error; whatever is
    // still pending (a send, or a close that a stopped peer never let
    // finish) is released to UCX, which frees it with the worker: a request
    // the worker finds unreleased is an assertion that aborts the process.
    progress();
    for (auto& out : in_flight_) {
      if (out->request != nullptr) ucp_request_free(out->request);
    }
    in_flight_.clear();
    for (void* request : closing_) ucp_request_free(request);
    closing_.clear();
    ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
}

void StarGroup::leave() {
  const Clock::time_point deadline = Clock::now() + kLeaveWait;
  if (options_.rank != 0) {
    Conn* master = by_rank_.empty() ? nullptr : by_rank_[0];
    if (master != nullptr && master->joined && !master->failed && master->ep != nullptr) {
      send(master, kBye, Op::kNone, seq_, nullptr);
      bool acknowledged = false;
      wait_until(
          [&] {
            acknowledged =
                acknowledged || take([&](const Inbound& m) { return m.header.kind == kByeAck; });
            return master->failed || acknowledged;
          },
          deadline);
      // A master that never answered (stopped, hung) would hold a graceful
      // close until the deadline and beyond: force it.
      close(master, !acknowledged);
    }
    return;
  }
  // Rank 0 stays until every client said goodbye (or went away), so that no
  // client mistakes the hang-up for a crash while it still reads results.
  wait_until(
      [&] {
        answer_byes();
        for (Conn* conn : by_rank_) {
          if (conn != nullptr && !conn->left && !conn->failed) return false;
        }
        return in_flight_.empty();
      },
      deadline);
  // A client that never said goodbye (stopped, hung) would hold a graceful
  // close, which flushes to it, until the deadline and beyond: force it.
  for (Conn* conn : by_rank_) {
    if (conn != nullptr) close(conn, !conn->left);
  }
}

// ---------------------------------------------------------------------------
// Joining

void StarGroup::join_as_server(Clock::time_point deadline) {
  const int world = options_.world_size;
  by_rank_.assign(world, nullptr);
  std::optional<BootstrapError> failure;
  // progress() takes the hellos (tend_strangers()).
  auto all_in = [&] {
    answer_byes();
    std::vector<int> gone, left;
    for (int r = 1; r < world; ++r) {
      if (by_rank_[r] == nullptr) continue;
      if (by_rank_[r]->failed) {
        gone.push_back(r);
      } else if (by_rank_[r]->left) {
        left.push_back(r);
      }
    }
    if (!gone.empty()) {
      failure.emplace(ARBITER_PEER_FAILED, "bootstrap: " + rank_list(gone) +
                                               " disconnected while waiting for the "
                                               "others (UCX: " +
                                               ucx_text(by_rank_[gone.front()]->error) + ")");
      return true;
    }
    if (!left.empty()) {
      failure.emplace(ARBITER_PEER_FAILED, "bootstrap: " + rank_list(left) +
                                               " gave up waiting "
                                               "for the others");
      return true;
    }
    return std::count(by_rank_.begin() + 1, by_rank_.end(), nullptr) == 0;
  };
  const bool in_time = wait_until(all_in, deadline - margin(options_.timeout));
  if (!in_time) {
    std::vector<int> missing;
    for (int r = 1; r < world; ++r) {
      if (by_rank_[r] == nullptr) missing.push_back(r);
    }
    failure.emplace(ARBITER_TIMEOUT,
                    "bootstrap: " + rank_list(missing) + " did not connect within " +
                        duration_text(options_.timeout) + " (rank 0 listened on " + master() +
                        "; check that " + verb(missing, "it", "they") +
                        " started, with the same MASTER_ADDR, MASTER_PORT and job token)");
  }
  if (failure) {
    const std::string reason = failure->what();
    for (Conn* conn : by_rank_) {
      if (conn != nullptr && !conn->failed && !conn->left) {
        send(conn, kAbort, Op::kNone, 0, text_payload(reason), 0, failure->code());
      }
    }
    wait_until([&] { return in_flight_.empty(); }, Clock::now() + kNotifyWait);
    throw *failure;
  }

  for (int r = 1; r < world; ++r) send(by_rank_[r], kReady, Op::kNone, 0, nullptr);
  complete_ = true;
  wait_until([&] { return in_flight_.empty(); }, std::max(deadline, Clock::now() + kNotifyWait));
  // Stop listening: UCX 1.13's TCP connection manager aborts the process on
  // malformed bytes sent to the port, so the port is open no longer than
  // the join needs. A second RANK=1 started beside the first is still in
  // its handshake now, or comes back within kRetryCap if it tried before
  // rank 0 listened: it is answered (refused) before the listener goes.
  stop_listening(listening_since_ + kListenAtLeast);
}

// Progresses until no connection has arrived for kSettle, and not before
// `not_before` (at most kLeaveWait past either), refusing and closing
// strangers, then destroys the listener.
// Destroying it rejects what UCX holds undelivered, and a rejected request
// crashes UCX's TCP connection manager when the client answers
// (openucx/ucx#11235; Debian 12's UCX 1.13 has it); the settling makes that
// a connection started in the microseconds before the destroy.
void StarGroup::stop_listening(Clock::time_point not_before) {
  if (listener_ == nullptr) return;
  const Clock::time_point until = std::max(Clock::now(), not_before) + kLeaveWait;
  Clock::time_point quiet_since = Clock::now();
  std::size_t seen = conns_.size();
  bool answered = false;
  while (Clock::now() < until) {
    wait_until([] { return false; }, Clock::now() + kSettle / 4);
    if (conns_.size() != seen) {
      seen = conns_.size();
      quiet_since = Clock::now();
      answered = false;
    }
    // Every stranger that said hello was told why (tend_strangers()), and
    // the refusals went out, before they are cut off.
    if (!answered) {
      answered = std::all_of(conns_.begin(), conns_.end(), [](const auto& c) {
        return c->joined || c->ep == nullptr || c->refused || c->failed;
      });
      if (answered) wait_until([&] { return in_flight_.empty(); }, Clock::now() + kNotifyWait);
    }
    const Clock::time_point now = Clock::now();
    if (answered && now - quiet_since >= kSettle && now >= not_before) break;
  }
  ucp_listener_destroy(listener_);
  listener_ = nullptr;
  for (auto& conn : conns_) {
    if (!conn->joined) close(conn.get(), true);
  }
  std::erase_if(inbox_, [](const std::unique_ptr<Inbound>& m) { return !m->from->joined; });
}

void StarGroup::handle_hello(std::unique_ptr<Inbound> hello) {
  Conn* conn = hello->from;
  if (conn->refused || conn->ep == nullptr) return;
  const WireHeader& h = hello->header;
  const int world = options_.world_size;
  if (h.kind != kHello) return refuse(conn, "it did not start with a hello (protocol error)");
  // The world size first: a token derived from the environment differs
  // with it too, and "wrong job token" would hide the cause.
  if (h.world_size != world) {
    return refuse(conn, "its WORLD_SIZE is " + std::to_string(h.world_size) + ", rank 0's is " +
                            std::to_string(world));
  }
  if (hello->data.size() > kMaxTokenBytes || hello->text() != options_.job_token) {
    return refuse(conn, "wrong job token");
  }
  if (h.rank < 1 || h.rank >= world) {
    return refuse(conn,
                  "rank " + std::to_string(h.rank) + " is not in 1.." + std::to_string(world - 1));
  }
  if (Conn* holder = by_rank_[h.rank]; holder != nullptr) {
    return refuse(conn, "rank " + std::to_string(h.rank) + " is already connected (from " +
                            holder->peer + ")" +
                            (complete_ ? "; the group of " + std::to_string(world) +
                                             " ranks is complete: were two processes started "
                                             "with RANK=" +
                                             std::to_string(h.rank) + "?"
                                       : ""));
  }
  conn->rank = h.rank;
  conn->joined = true;
  by_rank_[h.rank] = conn;
  send(conn, kWelcome, Op::kNone, 0, nullptr);
}

void StarGroup::refuse(Conn* conn, const std::string& reason) {
  log("rank 0 refused a connection from " + conn->peer + ": " + reason);
  conn->refused = true;
  conn->refused_at = Clock::now();
  // The peer hangs up when it reads this; closing first could lose it.
  send(conn, kRefuse, Op::kNone, 0, text_payload(reason), 0, ARBITER_INVALID_ARGUMENT);
}

void StarGroup::join_as_client(Clock::time_point deadline) {
  std::string last_error = "no answer";
  auto backoff = std::chrono::milliseconds(10);
  while (!try_connect(deadline, &last_error)) {
    if (Clock::now() + backoff >= deadline) {
      throw BootstrapError(ARBITER_TIMEOUT,
                           "bootstrap: " + where() + " could not join rank 0 at " + master() +
                               " within " + duration_text(options_.timeout) +
                               " (last error: " + last_error +
                               "; hint: is rank 0 running, and do all ranks use the same "
                               "MASTER_ADDR and port? Rank 0 stops listening once its group "
                               "is complete: was another process started with RANK=" +
                               std::to_string(options_.rank) + "?)");
    }
    // Rank 0 may simply not listen yet: try again a little later.
    wait_until([] { return false; }, Clock::now() + backoff);
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, kRetryCap);
  }
  Conn* master = by_rank_[0];
  std::unique_ptr<Inbound> answer;
  const bool in_time = wait_until(
      [&] {
        answer = take(
            [](const Inbound& m) { return m.header.kind == kReady || m.header.kind == kAbort; });
        return answer != nullptr || master->failed;
      },
      deadline);
  if (answer && answer->header.kind == kReady) return;
  if (answer) {
    throw BootstrapError(static_cast<arbiter_status>(answer->header.status),
                         answer->text() + " (reported by rank 0)");
  }
  if (master->failed) {
    throw BootstrapError(ARBITER_PEER_FAILED, "bootstrap: " + where() +
                                                  ": rank 0 disconnected while waiting for the "
                                                  "others (UCX: " +
                                                  ucx_text(master->error) + ")");
  }
  (void)in_time;
  throw BootstrapError(ARBITER_TIMEOUT, "bootstrap: " + where() +
                                            " joined rank 0 but the group was not complete "
                                            "within " +
                                            duration_text(options_.timeout) +
                                            " (rank 0 names the missing ranks in its own error)");
}

// One attempt: connect, present the token, wait for the answer. True when
// rank 0 welcomed this rank; false (with the reason) when it is worth trying
// again; throws when rank 0 refused this rank.
bool StarGroup::try_connect(Clock::time_point deadline, std::string* last_error) {
  auto conn_owner = std::make_unique<Conn>();
  Conn* conn = conn_owner.get();
  conn->peer = master();
  conns_.push_back(std::move(conn_owner));

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&master_addr_);
  params.sockaddr.addrlen = master_addr_len_;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &StarGroup::on_ep_error;
  params.err_handler.arg = conn;
  const ucs_status_t status = ucp_ep_create(worker_, &params, &conn->ep);
  if (status != UCS_OK) {
    conn->ep = nullptr;
    *last_error = ucx_text(status);
    return false;
  }
  by_ep_[conn->ep] = conn;
  if (by_rank_.empty()) by_rank_.assign(1, nullptr);
  by_rank_[0] = conn;

  send(conn, kHello, Op::kNone, 0, text_payload(options_.job_token));
  std::unique_ptr<Inbound> answer;
  wait_until(
      [&] {
        answer = take([&](const Inbound& m) {
          return m.from == conn &&
                 (m.header.kind == kWelcome || m.header.kind == kRefuse || m.header.kind == kAbort);
        });
        return answer != nullptr || conn->failed;
      },
      deadline);
  if (answer && answer->header.kind == kWelcome) {
    conn->joined = true;
    conn->rank = 0;
    return true;
  }
  if (answer && answer->header.kind == kRefuse) {
    close(conn, false);
    throw BootstrapError(ARBITER_INVALID_ARGUMENT,
                         "bootstrap: rank 0 at " + master() + " refused " + where() + ": " +
                             answer->text() +
                             " (hint: every rank of a job must see the same WORLD_SIZE and "
                             "ARBITER_JOB_TOKEN; without ARBITER_JOB_TOKEN the token comes from "
                             "MASTER_ADDR, MASTER_PORT and WORLD_SIZE as written, so every rank "
                             "must spell MASTER_ADDR alike (not localhost on one rank and "
                             "127.0.0.1 on another); is another job using this MASTER_PORT?)");
  }
  if (answer) {
    throw BootstrapError(static_cast<arbiter_status>(answer->header.status),
                         answer->text() + " (reported by rank 0)");
  }
  *last_error = conn->failed ? ucx_text(conn->error)
                             : "connected, but rank 0 did not answer (is another program "
                               "listening on that port?)";
  close(conn, true);
  return false;
}

// ---------------------------------------------------------------------------
// Collectives

BootstrapStatus StarGroup::allgather(const void* send, void* recv, std::size_t bytes,
                                     std::chrono::milliseconds timeout) {
  return run(Op::kAllgather, send, recv, bytes, 0, timeout);
}

BootstrapStatus StarGroup::broadcast(void* buf, std::size_t bytes, int root,
                                     std::chrono::milliseconds timeout) {
  return run(Op::kBroadcast, buf, buf, bytes, root, timeout);
}

BootstrapStatus StarGroup::barrier(std::chrono::milliseconds timeout) {
  return run(Op::kBarrier, nullptr, nullptr, 0, 0, timeout);
}

BootstrapStatus StarGroup::run(Op op, const void* send, void* recv, std::size_t bytes, int root,
                               std::chrono::milliseconds timeout) {
  const std::uint32_t seq = ++seq_;
  if (broken_) {
    return {broken_->code, label(op, seq) + ": the group failed earlier: " + broken_->message};
  }
  timeout = std::clamp(timeout, std::chrono::milliseconds(0), kLongestWait);
  const Clock::time_point deadline = Clock::now() + timeout;
  if (options_.rank == 0) return server_run(op, seq, send, recv, bytes, root, deadline, timeout);
  return client_run(op, seq, send, recv, bytes, root, deadline, timeout);
}

BootstrapStatus StarGroup::server_run(Op op, std::uint32_t seq, const void* send, void* recv,
                                      std::size_t bytes, int root, Clock::time_point deadline,
                                      std::chrono::milliseconds timeout) {
  const int world = options_.world_size;
  const std::string what = label(op, seq);
  // Whose part rank 0 waits for.
  std::vector<bool> expected(world, false);
  if (op != Op::kBroadcast) {
    std::fill(expected.begin() + 1, expected.end(), true);
  } else if (root != 0) {
    expected[root] = true;
  }
  std::vector<std::unique_ptr<Inbound>> parts(world);
  std::optional<BootstrapStatus> failure;

  auto collected = [&] {
    answer_byes();
    while (std::unique_ptr<Inbound> m = take([&](const Inbound& in) {
             return in.header.kind == kContribute && in.header.seq <= seq;
           })) {
      // Stale (a call that failed here), or not from a rank of the group.
      if (m->header.seq < seq || m->from->rank < 1) continue;
      const int r = m->from->rank;
      const WireHeader& h = m->header;
      std::string mismatch;
      if (h.op != static_cast<std::uint8_t>(op)) {
        mismatch = "rank " + std::to_string(r) + " called " + op_name(static_cast<Op>(h.op)) +
                   " where rank 0 called " + what;
      } else if (op == Op::kBroadcast && h.root != root) {
        mismatch = "rank " + std::to_string(r) + " passed root " + std::to_string(h.root) + " to " +
                   what + ", rank 0 passed " + std::to_string(root);
      } else if (h.bytes != bytes || m->data.size() != bytes) {
        mismatch = "rank " + std::to_string(r) + " passed " + std::to_string(h.bytes) +
                   " bytes to " + what + ", rank 0 passed " + std::to_string(bytes);
      } else if (!expected[r] || parts[r] != nullptr) {
        mismatch = "rank " + std::to_string(r) + " sent an unexpected part for " + what;
      }
      if (!mismatch.empty()) {
        failure = BootstrapStatus{ARBITER_INVALID_ARGUMENT,
                                  mismatch +
                                      " (every rank must make the same calls in the "
                                      "same order with the same sizes)"};
        return true;
      }
      parts[r] = std::move(m);
    }
    std::vector<int> gone, left, missing;
    for (int r = 1; r < world; ++r) {
      // A broadcast root that delivered its part is done with this call.
      const bool needed = !(op == Op::kBroadcast && r == root && parts[r] != nullptr);
      if (expected[r] && parts[r] == nullptr) missing.push_back(r);
      if (!needed) continue;
      if (by_rank_[r]->failed) {
        gone.push_back(r);
      } else if (by_rank_[r]->left) {
        left.push_back(r);
      }
    }
    if (!gone.empty()) {
      failure = BootstrapStatus{ARBITER_PEER_FAILED,
                                rank_list(gone) + " disconnected during " + what +
                                    " (UCX: " + ucx_text(by_rank_[gone.front()]->error) + ")"};
    } else if (!left.empty()) {
      failure = BootstrapStatus{ARBITER_PEER_FAILED,
                                rank_list(left) + " left the group (destroyed " +
                                    verb(left, "its", "their") + " Bootstrap) before " + what};
    }
    return failure.has_value() || missing.empty();
  };
  if (!wait_until(collected, deadline - margin(timeout))) {
    std::vector<int> missing;
    for (int r = 1; r < world; ++r) {
      if (expected[r] && parts[r] == nullptr) missing.push_back(r);
    }
    // Said as it is: a rank 1.9 s late under a 2 s timeout is told so.
    const auto early = std::chrono::duration_cast<std::chrono::milliseconds>(margin(timeout));
    failure = BootstrapStatus{ARBITER_TIMEOUT,
                              rank_list(missing) + " did not reach " + what + " within " +
                                  duration_text(timeout) + " (rank 0 stopped waiting " +
                                  duration_text(early) + " before it, to tell the others in time)"};
  }
  if (failure) return fail_everywhere(seq, *failure);

  // Build the answer, and rank 0's own output.
  Payload result;
  if (op == Op::kAllgather) {
    auto all = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(world) * bytes);
    if (bytes > 0) {
      std::memcpy(all->data(), send, bytes);
      for (int r = 1; r < world; ++r) {
        std::memcpy(all->data() + static_cast<std::size_t>(r) * bytes, parts[r]->data.data(),
                    bytes);
      }
      std::memcpy(recv, all->data(), all->size());
    }
    result = all;
  } else if (op == Op::kBroadcast) {
    if (root == 0) {
      result = make_payload(send, bytes);
    } else {
      result = make_payload(parts[root]->data.data(), bytes);
      if (bytes > 0) std::memcpy(recv, result->data(), bytes);
    }
  } else {
    result = make_payload(nullptr, 0);
  }
  std::vector<std::pair<int, std::shared_ptr<Outbound>>> sends;
  for (int r = 1; r < world; ++r) {
    if (op == Op::kBroadcast && r == root) continue;
    sends.emplace_back(r, this->send(by_rank_[r], kResult, op, seq, result, root, 0, bytes));
  }
  std::vector<int> undelivered;
  auto delivered = [&] {
    undelivered.clear();
    bool pending = false;
    for (auto& [r, out] : sends) {
      if (out->status == UCS_INPROGRESS) pending = true;
      if (out->status != UCS_INPROGRESS && out->status != UCS_OK) undelivered.push_back(r);
    }
    return !undelivered.empty() || !pending;
  };
  if (!wait_until(delivered, deadline)) {
    std::vector<int> slow;
    for (auto& [r, out] : sends) {
      if (out->status == UCS_INPROGRESS) slow.push_back(r);
    }
    return fail_everywhere(
        seq, {ARBITER_TIMEOUT, "rank 0 could not deliver the result of " + what + " to " +
                                   rank_list(slow) + " within " + duration_text(timeout)});
  }
  if (!undelivered.empty()) {
    Conn* first = by_rank_[undelivered.front()];
    const ucs_status_t error = first->failed ? first->error : ucs_status_t(UCS_ERR_IO_ERROR);
    return fail_everywhere(
        seq, {ARBITER_PEER_FAILED, rank_list(undelivered) + " disconnected during " + what +
                                       " (UCX: " + ucx_text(error) + ")"});
  }
  return {};
}

BootstrapStatus StarGroup::client_run(Op op, std::uint32_t seq, const void* send, void* recv,
                                      std::size_t bytes, int root, Clock::time_point deadline,
                                      std::chrono::milliseconds timeout) {
  const std::string what = label(op, seq);
  Conn* master = by_rank_[0];
  const bool is_root = op == Op::kBroadcast && root == options_.rank;
  const bool contributes = op != Op::kBroadcast || is_root;
  std::shared_ptr<Outbound> out;
  if (contributes) {
    out = this->send(master, kContribute, op, seq, make_payload(send, bytes), root, 0, bytes);
  }
  std::unique_ptr<Inbound> result;
  std::optional<BootstrapStatus> failure;
  auto done = [&] {
    // Only an error about this collective or an earlier one: rank 0 may
    // already report a later collective's failure (a rank that died right
    // after this one completed) while this one's result is still queued.
    if (std::unique_ptr<Inbound> error = take(
            [&](const Inbound& m) { return m.header.kind == kError && m.header.seq <= seq; })) {
      failure = BootstrapStatus{static_cast<arbiter_status>(error->header.status),
                                error->text() + " (reported by rank 0)"};
      return true;
    }
    if (!is_root && result == nullptr) {
      while ((result = take([&](const Inbound& m) {
                return m.header.kind == kResult && m.header.seq <= seq;
              })) != nullptr &&
             result->header.seq < seq) {
      }
    }
    const bool sent = out == nullptr || out->status == UCS_OK;
    if ((is_root || result != nullptr) && sent) return true;
    if (out != nullptr && out->status != UCS_OK && out->status != UCS_INPROGRESS) {
      failure = BootstrapStatus{ARBITER_PEER_FAILED,
                                "could not send this rank's part of " + what +
                                    " to rank 0 (UCX: " + ucx_text(out->status) + ")"};
      return true;
    }
    if (master->failed) {
      failure = BootstrapStatus{ARBITER_PEER_FAILED, "rank 0 disconnected during " + what +
                                                         " (UCX: " + ucx_text(master->error) + ")"};
      return true;
    }
    return false;
  };
  if (!wait_until(done, deadline)) {
    return remember({ARBITER_TIMEOUT, is_root ? "could not deliver this rank's part of " + what +
                                                    " to rank 0 within " + duration_text(timeout)
                                              : "rank 0 did not answer " + what + " within " +
                                                    duration_text(timeout) +
                                                    " (rank 0 gathers every rank's part; it "
                                                    "names the ranks it lacks in its own error)"});
  }
  if (failure) return remember(*failure);
  if (result != nullptr) {
    const std::size_t want = op == Op::kAllgather
                                 ? static_cast<std::size_t>(options_.world_size) * bytes
                                 : (op == Op::kBroadcast ? bytes : 0);
    if (result->header.op != static_cast<std::uint8_t>(op) || result->data.size() != want) {
      return remember({ARBITER_INVALID_ARGUMENT,
                       "rank 0 answered " + what + " with " + std::to_string(result->data.size()) +
                           " bytes of a " + op_name(static_cast<Op>(result->header.op)) +
                           " where this rank expected " + std::to_string(want) +
                           " (every rank must make the same calls in the same order with the "
                           "same sizes)"});
    }
    if (want > 0) std::memcpy(recv, result->data.data(), want);
  }
  return {};
}

BootstrapStatus StarGroup::fail_everywhere(std::uint32_t seq, BootstrapStatus status) {
  for (Conn* conn : by_rank_) {
    if (conn != nullptr && !conn->failed && !conn->left) {
      send(conn, kError, Op::kNone, seq, text_payload(status.message), 0, status.code);
    }
  }
  wait_until([&] { return in_flight_.empty(); }, Clock::now() + kNotifyWait);
  return remember(std::move(status));
}

BootstrapStatus StarGroup::remember(BootstrapStatus status) {
  if (!broken_) broken_ = status;
  return status;
}

// ---------------------------------------------------------------------------
// Transport

std::shared_ptr<StarGroup::Outbound> StarGroup::send(Conn* to, std::uint8_t kind, Op op,
                                                     std::uint32_t seq, Payload payload,
                                                     std::int32_t root, std::int32_t status,
                                                     std::uint64_t bytes) {
  auto out = std::make_shared<Outbound>();
  out->to = to;
  out->payload = payload ? std::move(payload) : make_payload(nullptr, 0);
  out->header = WireHeader{kMagic,
                           kVersion,
                           kind,
                           static_cast<std::uint8_t>(op),
                           seq,
                           options_.rank,
                           options_.world_size,
                           root,
                           status,
                           0,
                           bytes};
  if (to->ep == nullptr || to->failed) {
    out->status = to->failed ? to->error : UCS_ERR_NOT_CONNECTED;
    return out;
  }
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // REPLY: the receiver learns which endpoint sent it. EAGER: the whole
  // message arrives in the handler, never as a rendezvous descriptor.
  params.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  ucs_status_ptr_t request = ucp_am_send_nbx(to->ep, kAmId, &out->header, sizeof(out->header),
                                             out->payload->data(), out->payload->size(), &params);
  if (request == nullptr) {
    out->status = UCS_OK;
  } else if (UCS_PTR_IS_ERR(request)) {
    out->status = UCS_PTR_STATUS(request);
  } else {
    out->request = request;
    in_flight_.push_back(out);
  }
  return out;
}

bool StarGroup::wait_until(const std::function<bool()>& done, Clock::time_point deadline) {
  for (;;) {
    progress();
    if (done()) return true;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    sleep_for_events(std::min<Clock::duration>(deadline - now, kPollSlice));
  }
}

void StarGroup::progress() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  accept_pending();
  tend_strangers();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    Outbound& out = **it;
    const ucs_status_t status = ucp_request_check_status(out.request);
    if (status == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(out.request);
    out.request = nullptr;
    out.status = status;
    it = in_flight_.erase(it);
  }
  std::erase_if(closing_, [](void* request) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
    ucp_request_free(request);
    return true;
  });
}

void StarGroup::sleep_for_events(Clock::duration max_wait) {
  if (event_fd_ >= 0) {
    const ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) return;  // events are pending: progress again now
    if (status == UCS_OK) {
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(max_wait).count();
      pollfd fd{event_fd_, POLLIN, 0};
      ::poll(&fd, 1, static_cast<int>(std::max<long long>(ms, 1)));
      return;
    }
  }
  std::this_thread::sleep_for(std::min<Clock::duration>(max_wait, std::chrono::milliseconds(1)));
}

void StarGroup::close(Conn* conn, bool force) {
  if (conn->ep == nullptr) return;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // A failed endpoint can only be closed by force.
  params.flags = (force || conn->failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(conn->ep, &params);
  by_ep_.erase(conn->ep);
  conn->ep = nullptr;
  if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
}

void StarGroup::drain_closes(Clock::time_point deadline) {
  wait_until([&] { return closing_.empty(); }, deadline);
}

std::unique_ptr<StarGroup::Inbound> StarGroup::take(
    const std::function<bool(const Inbound&)>& match) {
  for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
    if (match(**it)) {
      std::unique_ptr<Inbound> found = std::move(*it);
      inbox_.erase(it);
      return found;
    }
  }
  return nullptr;
}

void StarGroup::accept_pending() {
  std::vector<ucp_conn_request_h> requests;
  requests.swap(conn_requests_);
  for (ucp_conn_request_h request : requests) {
    auto conn_owner = std::make_unique<Conn>();
    Conn* conn = conn_owner.get();
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    conn->peer = ucp_conn_request_query(request, &attr) == UCS_OK
                     ? sockaddr_text(reinterpret_cast<const sockaddr*>(&attr.client_address),
                                     sizeof(attr.client_address))
                     : "an unknown address";
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &StarGroup::on_ep_error;
    params.err_handler.arg = conn;
    const ucs_status_t status = ucp_ep_create(worker_, &params, &conn->ep);
    if (status != UCS_OK) {
      log("rank 0 could not accept a connection from " + conn->peer + ": " + ucx_text(status));
      continue;
    }
    by_ep_[conn->ep] = conn;
    conns_.push_back(std::move(conn_owner));
  }
}

void StarGroup::tend_strangers() {
  // Rank 0 only, once its table of ranks exists (join_as_server()).
  if (listener_ == nullptr || by_rank_.size() != static_cast<std::size_t>(options_.world_size)) {
    return;
  }
  while (std::unique_ptr<Inbound> m = take([](const Inbound& in) { return !in.from->joined; })) {
    handle_hello(std::move(m));
  }
  // Strangers that hung up are closed; refused ones are expected to hang up
  // themselves, and are cut off when they do not.
  const Clock::time_point now = Clock::now();
  for (auto& conn : conns_) {
    if (conn->joined || conn->ep == nullptr) continue;
    if (conn->failed || (conn->refused && now - conn->refused_at > kRefusedLinger)) {
      close(conn.get(), true);
    }
  }
}

void StarGroup::answer_byes() {
  while (std::unique_ptr<Inbound> bye =
             take([](const Inbound& m) { return m.header.kind == kBye; })) {
    bye->from->left = true;
    send(bye->from, kByeAck, Op::kNone, bye->header.seq, nullptr);
  }
}

ucs_status_t StarGroup::on_am(void* arg, const void* header, std::size_t header_length, void* data,
                              std::size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<StarGroup*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    return UCS_ERR_UNSUPPORTED;  // every send is eager; fail the sender's request
  }
  if (header_length != sizeof(WireHeader) ||
      !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    return UCS_OK;  // not ours: drop
  }
  auto it = self->by_ep_.find(param->reply_ep);
  if (it == self->by_ep_.end()) return UCS_OK;  // from a connection being closed
  auto message = std::make_unique<Inbound>();
  std::memcpy(&message->header, header, sizeof(WireHeader));
  if (message->header.magic != kMagic || message->header.version != kVersion) {
    message->header.kind = 0;  // rank 0 refuses it as a protocol error
  }
  message->from = it->second;
  const auto* bytes = static_cast<const std::byte*>(data);
  message->data.assign(bytes, bytes + length);
  self->inbox_.push_back(std::move(message));
  return UCS_OK;
}

void StarGroup::on_conn_request(ucp_conn_request_h request, void* arg) {
  static_cast<StarGroup*>(arg)->conn_requests_.push_back(request);
}

void StarGroup::on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* conn = static_cast<Conn*>(arg);
  conn->failed = true;
  conn->error = status;
}

std::string StarGroup::where() const { return "rank " + std::to_string(options_.rank); }

std::string StarGroup::master() const {
  return sockaddr_text(reinterpret_cast<const sockaddr*>(&master_addr_), master_addr_len_);
}

}  // namespace arbiter::bootstrap
