// arbiter::Bootstrap and its C view (arbiter_oob).
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "arbiter/bootstrap.h"
#include "bootstrap_ucx_loader.h"
#include "fork_stamp.h"

namespace arbiter {

namespace {

// arbiter_oob::last_error is per thread (whichever Bootstrap failed last).
thread_local std::string t_last_error;

int32_t record(const BootstrapStatus& status) {
  if (!status.ok()) t_last_error = status.message;
  return status.code;
}

// A joined group of several ranks in libarbiter_bootstrap_ucx.so.
class UcxGroup {
 public:
  // Loads the library (BootstrapError when UCX is missing) and joins.
  explicit UcxGroup(const BootstrapOptions& o) : ucx_(bootstrap::ucx_library()) {
    const arbiter_bootstrap_ucx_options c{o.rank,
                                          o.world_size,
                                          o.local_rank,
                                          o.master_addr.c_str(),
                                          o.master_port,
                                          o.job_token.c_str(),
                                          static_cast<int64_t>(o.timeout.count())};
    const int32_t code = ucx_.join(&c, &group_);
    if (code != ARBITER_OK) {
      throw BootstrapError(static_cast<arbiter_status>(code), ucx_.last_error());
    }
  }
  UcxGroup(const UcxGroup&) = delete;
  UcxGroup& operator=(const UcxGroup&) = delete;
  // A forked child's copy leaves nothing: its goodbyes would reach the
  // parent's peers on the parent's connections.
  ~UcxGroup() {
    if (!joined_.forked()) ucx_.leave(group_);
  }

  BootstrapStatus allgather(const void* send, void* recv, std::size_t bytes,
                            std::chrono::milliseconds timeout) {
    return in_turn(timeout,
                   [&] { return ucx_.allgather(group_, send, recv, bytes, timeout.count()); });
  }
  BootstrapStatus broadcast(void* buf, std::size_t bytes, int root,
                            std::chrono::milliseconds timeout) {
    return in_turn(timeout,
                   [&] { return ucx_.broadcast(group_, buf, bytes, root, timeout.count()); });
  }
  BootstrapStatus barrier(std::chrono::milliseconds timeout) {
    return in_turn(timeout, [&] { return ucx_.barrier(group_, timeout.count()); });
  }

 private:
  // UCX's worker is not thread-safe: two threads of one process in the
  // group's collectives at once (two communicators created from the shared
  // from_environment() group, say) aborted inside UCX. One at a time, each
  // waiting at most its timeout for its turn; the collectives still pair
  // across ranks in the order each rank makes them.
  template <class Collective>
  BootstrapStatus in_turn(std::chrono::milliseconds timeout, Collective collective) {
    if (joined_.forked()) {
      return {ARBITER_INVALID_ARGUMENT,
              "bootstrap: this group was joined by process " + std::to_string(joined_.pid) +
                  ", which has since forked; a forked child cannot use it (its messages would "
                  "mix with the parent's on the same connections): join from a process started "
                  "with a RANK of its own, or give the child's communicator an oob of its own"};
    }
    std::unique_lock lock(mutex_, std::defer_lock);
    if (!lock.try_lock_for(timeout)) {
      return {ARBITER_TIMEOUT, "bootstrap: another thread of this process used the group for " +
                                   std::to_string(timeout.count()) +
                                   " ms (its collectives are one at a time: create, allocate "
                                   "and destroy communicators from one thread)"};
    }
    return status(collective());
  }

  BootstrapStatus status(int32_t code) const {
    if (code == ARBITER_OK) return {};
    return {static_cast<arbiter_status>(code), ucx_.last_error()};
  }

  const arbiter_bootstrap_ucx_v1_t& ucx_;
  void* group_ = nullptr;
  std::timed_mutex mutex_;
  const ForkStamp joined_;
};

}  // namespace

class Bootstrap::Impl {
 public:
  explicit Impl(const BootstrapOptions& options) : options_(options) {
    oob_.ctx = this;
    oob_.rank = options.rank;
    oob_.size = options.world_size;
    oob_.allgather = &Impl::c_allgather;
    oob_.broadcast = &Impl::c_broadcast;
    oob_.barrier = &Impl::c_barrier;
    oob_.last_error = &Impl::c_last_error;
  }

  BootstrapOptions options_;
  std::unique_ptr<UcxGroup> group_;  // null for a world of one
  arbiter_oob oob_{};

  BootstrapStatus allgather(const void* send, void* recv, std::size_t bytes,
                            std::chrono::milliseconds timeout) {
    if (BootstrapStatus bad = check(timeout, bytes > 0 && (send == nullptr || recv == nullptr));
        !bad.ok()) {
      return bad;
    }
    if (!group_) {
      if (bytes > 0) std::memmove(recv, send, bytes);
      return {};
    }
    return group_->allgather(send, recv, bytes, timeout);
  }

  BootstrapStatus broadcast(void* buf, std::size_t bytes, int root,
                            std::chrono::milliseconds timeout) {
    if (BootstrapStatus bad = check(timeout, bytes > 0 && buf == nullptr); !bad.ok()) return bad;
    if (root < 0 || root >= options_.world_size) {
      return {ARBITER_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) +
                                            " is not a rank of this group (0.." +
                                            std::to_string(options_.world_size - 1) + ")"};
    }
    if (!group_) return {};
    return group_->broadcast(buf, bytes, root, timeout);
  }

  BootstrapStatus barrier(std::chrono::milliseconds timeout) {
    if (BootstrapStatus bad = check(timeout, false); !bad.ok()) return bad;
    if (!group_) return {};
    return group_->barrier(timeout);
  }

 private:
  static BootstrapStatus check(std::chrono::milliseconds timeout, bool null_buffer) {
    if (timeout.count() < 0) {
      return {ARBITER_INVALID_ARGUMENT, "the timeout is negative"};
    }
    if (null_buffer) return {ARBITER_INVALID_ARGUMENT, "a buffer is NULL but bytes > 0"};
    return {};
  }

  // The C entry points never let an exception escape.
  template <class F>
  static int32_t guarded(F&& call) {
    try {
      return record(call());
    } catch (const std::exception& e) {
      return record({ARBITER_INTERNAL, std::string("bootstrap: ") + e.what()});
    } catch (...) {
      return record({ARBITER_INTERNAL, "bootstrap: unknown exception"});
    }
  }

  static int32_t c_allgather(void* ctx, const void* send, void* recv, size_t bytes,
                             int64_t timeout_ms) {
    return guarded([&] {
      return static_cast<Impl*>(ctx)->allgather(send, recv, bytes,
                                                std::chrono::milliseconds(timeout_ms));
    });
  }
  static int32_t c_broadcast(void* ctx, void* buf, size_t bytes, int32_t root, int64_t timeout_ms) {
    return guarded([&] {
      return static_cast<Impl*>(ctx)->broadcast(buf, bytes, root,
                                                std::chrono::milliseconds(timeout_ms));
    });
  }
  static int32_t c_barrier(void* ctx, int64_t timeout_ms) {
    return guarded(
        [&] { return static_cast<Impl*>(ctx)->barrier(std::chrono::milliseconds(timeout_ms)); });
  }
  static const char* c_last_error(void*) { return t_last_error.c_str(); }
};

Bootstrap::Bootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bootstrap::Bootstrap(Bootstrap&&) noexcept = default;
Bootstrap& Bootstrap::operator=(Bootstrap&&) noexcept = default;
Bootstrap::~Bootstrap() = default;

Bootstrap Bootstrap::from_environment(std::chrono::milliseconds timeout) {
  return connect(bootstrap_options_from_environment(timeout));
}

Bootstrap Bootstrap::connect(const BootstrapOptions& options) {
  auto invalid = [](const std::string& message) {
    throw BootstrapError(ARBITER_INVALID_ARGUMENT, "bootstrap: " + message);
  };
  if (options.world_size < 1) invalid("world_size must be at least 1");
  if (options.rank < 0 || options.rank >= options.world_size) {
    invalid("rank " + std::to_string(options.rank) + " is not in 0.." +
            std::to_string(options.world_size - 1));
  }
  if (options.local_rank < -1) invalid("local_rank must be >= 0, or -1 for none (CPU ranks)");
  if (options.timeout.count() <= 0) invalid("the timeout must be above 0");
  if (options.job_token.empty()) invalid("the job token must not be empty");
  auto impl = std::make_unique<Impl>(options);
  if (options.world_size > 1) {
    if (options.master_port == 0) invalid("MASTER_PORT must be set (1..65535)");
    if (options.master_addr.empty()) invalid("MASTER_ADDR must be set");
    impl->group_ = std::make_unique<UcxGroup>(options);
  }
  return Bootstrap(std::move(impl));
}

int Bootstrap::rank() const { return impl_->options_.rank; }
int Bootstrap::world_size() const { return impl_->options_.world_size; }
int Bootstrap::local_rank() const { return impl_->options_.local_rank; }
const BootstrapOptions& Bootstrap::options() const { return impl_->options_; }

BootstrapStatus Bootstrap::allgather(const void* send, void* recv, std::size_t bytes,
                                     std::chrono::milliseconds timeout) {
  return impl_->allgather(send, recv, bytes, timeout);
}

BootstrapStatus Bootstrap::broadcast(void* buf, std::size_t bytes, int root,
                                     std::chrono::milliseconds timeout) {
  return impl_->broadcast(buf, bytes, root, timeout);
}

BootstrapStatus Bootstrap::barrier(std::chrono::milliseconds timeout) {
  return impl_->barrier(timeout);
}

const arbiter_oob* Bootstrap::oob() const { return &impl_->oob_; }

}  // namespace arbiter
