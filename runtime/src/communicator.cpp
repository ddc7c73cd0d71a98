#include "arbiter/communicator.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "arbiter/common/token_slice.h"

namespace arbiter {
namespace {

// The most a fallback workspace holds per call; larger calls run in slices.
constexpr std::uint64_t kFallbackSliceBytes = std::uint64_t{16} << 20;

struct Workspace {
  const arbiter_backend_v1_t* module = nullptr;
  arbiter_workspace* handle = nullptr;
};

std::string oob_error(const arbiter_oob& oob) {
  const char* e = oob.last_error ? oob.last_error(oob.ctx) : nullptr;
  return e && *e ? e : "no reason given";
}

template <class T>
std::vector<T> allgather(const arbiter_oob& oob, const T& mine, std::chrono::milliseconds timeout,
                         const char* what) {
  std::vector<T> all(static_cast<std::size_t>(oob.size));
  if (oob.allgather(oob.ctx, &mine, all.data(), sizeof(T), timeout.count()) != ARBITER_OK) {
    throw CommunicatorError(std::string("exchanging ") + what + " failed: " + oob_error(oob));
  }
  return all;
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The reason the registry recorded for the module named like `b`.
std::string why_unavailable(const Registry& registry, Backend b) {
  for (const ModuleInfo& m : registry.modules()) {
    if (m.name == backend_name(b)) return "unavailable: " + m.reason;
  }
  return "no module found (see `arbiter plugins`)";
}

}  // namespace

struct Communicator::Impl {
  const arbiter_oob& oob;
  Policy policy;
  CommunicatorOptions options;
  Workspace workspaces[kBackendCount];
  std::uint32_t usable = 0;
  // Backends the policy might pick that have no workspace; after creation the
  // policy no longer allows them.
  std::uint32_t unusable_candidates = 0;
  std::vector<std::string> dropped;
  // Why a backend has no workspace (for run_on); empty for usable ones.
  std::array<std::string, kBackendCount> no_workspace;

  Impl(const arbiter_oob& o, Policy p, const CommunicatorOptions& opt)
      : oob(o), policy(std::move(p)), options(opt) {}

  Request request_for(const arbiter_allreduce_args& args, std::uint32_t excluded) const;
  std::uint64_t capacity(Backend b, Algorithm algorithm) const;
  Decision decide(const arbiter_allreduce_args& args, std::uint32_t excluded) const;
  std::int32_t run_in_slices(Backend b, arbiter_allreduce_args call, void* stream,
                             std::string& error) const;

  Request request_for(Pattern pattern) const {
    Request r;
    r.capability = options.capability;
    r.world_size = static_cast<std::uint32_t>(oob.size);
    r.nodes = options.nodes;
    r.nvlink_domain = options.nvlink_domain;
    r.multicast = options.multicast;
    r.dtype = options.dtype;
    r.pattern = pattern;
    return r;
  }

  Backend fallback() const {
    return policy.tables().fallback[static_cast<int>(options.capability.device())];
  }

  void drop(Backend b, const std::string& why) {
    no_workspace[static_cast<int>(b)] = why;
    dropped.push_back(std::string(backend_name(b)) + ": " + why);
    if (oob.rank == 0) std::cerr << "arbiter: backend " << dropped.back() << "\n";
  }

  void create(const Registry& registry);
  void destroy();
};

void Communicator::Impl::create(const Registry& registry) {
  const auto timeout = options.timeout;
  // 1. Every rank decides identically only with identical tables.
  const std::uint64_t fp = policy.fingerprint();
  const auto fps = allgather(oob, fp, timeout, "policy fingerprints");
  for (int r = 0; r < oob.size; ++r) {
    if (fps[r] != fps[0]) {
      throw CommunicatorError("tuning tables differ across ranks: rank " + std::to_string(r) +
                              " has fingerprint " + hex(fps[r]) + ", rank 0 has " + hex(fps[0]) +
                              "; give every rank the same ARBITER_CONFIG and ARBITER_BACKENDS");
    }
  }
  const std::uint16_t cap = options.capability.code();
  const auto caps = allgather(oob, cap, timeout, "device capabilities");
  for (int r = 0; r < oob.size; ++r) {
    if (caps[r] != caps[0]) {
      throw CommunicatorError("ranks have different devices: rank " + std::to_string(r) +
                              " has capability " + std::to_string(caps[r]) + ", rank 0 has " +
                              std::to_string(caps[0]));
    }
  }
  // 2. The same backends on every rank: AND of what each could load.
  const std::uint32_t local = registry.available_mask();
  std::uint32_t common = local;
  for (std::uint32_t m : allgather(oob, local, timeout, "backend availability")) common &= m;
  const Tables& t = policy.tables();
  const int kind = static_cast<int>(options.capability.device());
  const Topology topo = topology_of(request_for(Pattern::kAllreduce));

  // 3. Workspaces, sized from the policy's caps, for the backends it may pick.
  std::uint64_t fused_cap = 0;
  for (int p = 0; p < kPatternCount; ++p) {
    if (!((options.pattern_mask >> p) & 1u)) continue;
    if (auto c = policy.max_fused_bytes(request_for(static_cast<Pattern>(p)))) {
      fused_cap = std::max(fused_cap, *c);
    }
  }
  const std::uint64_t largest_call =
      Request::message_bytes_of(options.max_tokens, options.hidden, options.dtype);
  // What fused workspaces hold: the cap, or more for a bench.
  const std::uint64_t fused_bytes = std::max(fused_cap, options.fused_workspace_bytes);
  std::vector<Backend> candidates;
  if (fused_bytes > 0) {
    for (Backend b : t.preference[static_cast<int>(topo)]) candidates.push_back(b);
  }
  const Backend fallback = t.fallback[kind];
  if (fallback != Backend::kNone &&
      std::find(candidates.begin(), candidates.end(), fallback) == candidates.end()) {
    candidates.push_back(fallback);
  }
  for (int i = 0; i < kBackendCount; ++i) {
    no_workspace[i] = "not a candidate here (neither in the tables' " +
                      std::string(topology_name(topo)) +
                      " preference list nor the fallback, or nothing is fused at this world "
                      "size)";
  }
  for (Backend b : candidates) {
    const int i = static_cast<int>(b);
    if (!((t.allowed_mask >> i) & 1u)) {  // the tables never pick it
      no_workspace[i] =
          "not allowed by the tables (allowed: " + backend_mask_names(t.allowed_mask) +
          "; see `enabled:` and ARBITER_BACKENDS)";
      continue;
    }
    if (!((common >> i) & 1u)) {
      unusable_candidates |= 1u << i;
      drop(b, (local >> i) & 1u ? "unavailable on another rank" : why_unavailable(registry, b));
      continue;
    }
    arbiter_workspace_spec spec{};
    spec.world_size = oob.size;
    spec.rank = oob.rank;
    spec.device = options.device;
    spec.nodes = options.nodes;
    spec.max_tokens = options.max_tokens;
    spec.hidden = options.hidden;
    spec.dtype = static_cast<arbiter_dtype>(options.dtype);
    spec.pattern_mask = options.pattern_mask;
    // Fused backends take at most the cap. The fallback takes any size, in
    // slices of its workspace (run_in_slices, unless the module streams by
    // itself as shm does), so it needs no more than the cap or
    // kFallbackSliceBytes: nccl's scratch need not hold the largest call.
    spec.max_message_bytes = fused_bytes;
    if (b == fallback) {
      const std::uint64_t token = Request::message_bytes_of(1, options.hidden, options.dtype);
      spec.max_message_bytes = std::max(
          {fused_bytes,
           std::min(largest_call == 0 ? kFallbackSliceBytes : largest_call, kFallbackSliceBytes),
           token});
    }
    spec.timeout_ms = timeout.count();
    const arbiter_backend_v1_t* module = registry.backend(b);
    arbiter_workspace* handle = nullptr;
    // Collective; the module fails on every rank when it fails on any.
    const std::int32_t status = module->workspace_create(&oob, &spec, &handle);
    if (status != ARBITER_OK || handle == nullptr) {
      unusable_candidates |= 1u << i;
      drop(b, std::string("workspace creation failed: ") + module->last_error());
      continue;
    }
    workspaces[i] = {module, handle};
    usable |= 1u << i;
    no_workspace[i].clear();
  }
  if (fallback == Backend::kNone || !((usable >> static_cast<int>(fallback)) & 1u)) {
    destroy();
    throw CommunicatorError(
        std::string("the fallback backend ") + std::string(backend_name(fallback)) +
        " is not usable on every rank, so calls the fused backends cannot "
        "take would have nowhere to go; backends dropped: " +
        (dropped.empty() ? "none" : dropped.back()) + " (see `arbiter plugins`)");
  }
  // Decide with the dropped backends no longer allowed, so every call takes
  // the policy's fast path instead of excluding them one call at a time.
  policy = policy.without_backends(unusable_candidates);
}

void Communicator::Impl::destroy() {
  // Collective, in backend order on every rank.
  for (Workspace& w : workspaces) {
    if (w.handle) w.module->workspace_destroy(w.handle);
    w = {};
  }
  usable = 0;
}

Communicator::Communicator(const arbiter_oob& oob, Policy policy, const Registry& registry,
                           const CommunicatorOptions& options)
    : impl_(std::make_unique<Impl>(oob, std::move(policy), options)) {
  if (oob.size < 1 || oob.rank < 0 || oob.rank >= oob.size || !oob.allgather || !oob.barrier ||
      !oob.broadcast) {
    throw CommunicatorError("invalid oob: rank " + std::to_string(oob.rank) + " of " +
                            std::to_string(oob.size) + ", or a NULL function");
  }
  // Lets GPU modules put ranks of different processes on one GPU, for the
  // multi-process GPU tests only: a job that inherits it must not run so.
  if (const char* shared = std::getenv("ARBITER_TEST_SHARED_GPU"); shared != nullptr && *shared) {
    throw CommunicatorError(
        "ARBITER_TEST_SHARED_GPU is set (to \"" + std::string(shared) +
        "\"): it puts every rank on GPU 0 for arbiter's multi-process GPU tests and is refused "
        "outside them; unset it");
  }
  impl_->create(registry);
}

Communicator::~Communicator() { impl_->destroy(); }

Request Communicator::Impl::request_for(const arbiter_allreduce_args& args,
                                        std::uint32_t excluded) const {
  Request r = request_for(static_cast<Pattern>(args.pattern));
  r.dtype = static_cast<Dtype>(args.dtype);
  r.tokens = args.tokens;
  r.hidden = args.hidden;
  r.message_bytes = Request::message_bytes_of(args.tokens, args.hidden, r.dtype);
  r.excluded_backends = excluded;
  return r;
}

std::uint64_t Communicator::Impl::capacity(Backend b, Algorithm algorithm) const {
  const Workspace& w = workspaces[static_cast<int>(b)];
  return w.module && w.module->max_message_bytes
             ? w.module->max_message_bytes(w.handle, static_cast<arbiter_algorithm>(algorithm))
             : ~std::uint64_t{0};
}

Decision Communicator::Impl::decide(const arbiter_allreduce_args& args,
                                    std::uint32_t excluded) const {
  Request r = request_for(args, excluded);
  const Backend fallback = this->fallback();
  for (int attempt = 0; attempt <= kBackendCount; ++attempt) {
    const Decision d = policy.decide(r);
    // Never send a message larger than a fused workspace's per-call capacity;
    // the fallback instead runs it in slices (see run_in_slices).
    if (d.backend == Backend::kNone || d.backend == fallback ||
        r.message_bytes <= capacity(d.backend, d.algorithm)) {
      return d;
    }
    r.excluded_backends |= 1u << static_cast<int>(d.backend);
  }
  return Decision{};
}

// Runs `args` on `b`, in slices of whole tokens when the message is larger
// than the workspace takes in one call. Every output is per token, so slices
// compute exactly what one call would (NVFP4 scale layouts excepted: those
// calls are never sliced).
std::int32_t Communicator::Impl::run_in_slices(Backend b, arbiter_allreduce_args call, void* stream,
                                               std::string& error) const {
  const Workspace& w = workspaces[static_cast<int>(b)];
  const std::uint64_t token_bytes =
      Request::message_bytes_of(1, call.hidden, static_cast<Dtype>(call.dtype));
  const std::uint64_t cap = capacity(b, static_cast<Algorithm>(call.algorithm));
  const std::uint64_t per_slice = token_bytes == 0 ? call.tokens : cap / token_bytes;
  if (std::uint64_t{call.tokens} * token_bytes <= cap || per_slice >= call.tokens) {
    const std::int32_t status = w.module->run(w.handle, &call, stream);
    if (status != ARBITER_OK) error = w.module->last_error();
    return status;
  }
  if (per_slice == 0 || call.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    error = "one token of " + std::to_string(token_bytes) + " bytes does not fit the " +
            std::string(backend_name(b)) + " workspace (" + std::to_string(cap) +
            " bytes per call); create the communicator with the real hidden size";
    return ARBITER_UNSUPPORTED;
  }
  std::int32_t status = ARBITER_OK;
  common::for_each_token_slice(call, per_slice, [&](const arbiter_allreduce_args& slice) {
    status = w.module->run(w.handle, &slice, stream);
    if (status != ARBITER_OK) error = w.module->last_error();
    return status == ARBITER_OK;
  });
  return status;
}

Decision Communicator::decide(const arbiter_allreduce_args& args) const noexcept {
  return impl_->decide(args, 0);
}

Communicator::Result Communicator::allreduce_fusion(const arbiter_allreduce_args& args,
                                                    void* stream) noexcept {
  Result result;
  try {
    std::uint32_t excluded = 0;
    for (int attempt = 0; attempt <= kBackendCount; ++attempt) {
      const Decision d = impl_->decide(args, excluded);
      result.decision = d;
      if (d.backend == Backend::kNone) {
        result.status = ARBITER_UNSUPPORTED;
        result.error = "no backend can run this call (tables allow " +
                       backend_mask_names(impl_->policy.tables().allowed_mask) +
                       "; usable here: " + backend_mask_names(impl_->usable & ~excluded) + ")";
        return result;
      }
      arbiter_allreduce_args call = args;
      call.algorithm = static_cast<arbiter_algorithm>(d.algorithm);
      const std::int32_t status = impl_->run_in_slices(d.backend, call, stream, result.error);
      if (status != ARBITER_UNSUPPORTED) {
        result.status = static_cast<arbiter_status>(status);
        return result;
      }
      // The backend declined this shape (the same way on every rank): the
      // policy's next choice.
      excluded |= 1u << static_cast<int>(d.backend);
    }
    result.status = ARBITER_INTERNAL;
    result.error = "no backend accepted the call";
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  return result;
}

Communicator::Result Communicator::run_on(Backend backend, Algorithm algorithm,
                                          const arbiter_allreduce_args& args,
                                          void* stream) noexcept {
  Result result;
  try {
    const int i = static_cast<int>(backend);
    if (i < 0 || i >= kBackendCount || static_cast<int>(algorithm) > 2) {
      result.status = ARBITER_INVALID_ARGUMENT;
      result.error = "run_on: unknown backend or algorithm";
      return result;
    }
    const bool unfused = backend == impl_->fallback() && algorithm == Algorithm::kNative;
    result.decision.backend = backend;
    result.decision.algorithm = algorithm;
    result.decision.fused = !unfused;
    const std::string name(backend_name(backend));
    // Every check below reads only the shape and what every rank shares.
    if (!((impl_->usable >> i) & 1u)) {
      result.status = ARBITER_UNSUPPORTED;
      result.error = name + " has no workspace: " + impl_->no_workspace[i];
      return result;
    }
    arbiter_allreduce_args call = args;
    call.algorithm = static_cast<arbiter_algorithm>(algorithm);
    const std::uint64_t bytes =
        Request::message_bytes_of(args.tokens, args.hidden, static_cast<Dtype>(args.dtype));
    const std::uint64_t capacity = impl_->capacity(backend, algorithm);
    if (!unfused && bytes > capacity) {
      result.status = ARBITER_UNSUPPORTED;
      result.error = "a message of " + std::to_string(bytes) + " bytes exceeds the " + name +
                     " workspace's " + std::string(algorithm_name(algorithm)) + " capacity of " +
                     std::to_string(capacity) +
                     " bytes per call (create the communicator with a larger "
                     "fused_workspace_bytes)";
      return result;
    }
    result.status =
        static_cast<arbiter_status>(impl_->run_in_slices(backend, call, stream, result.error));
  } catch (const std::exception& e) {
    result.status = ARBITER_INTERNAL;
    result.error = e.what();
  }
  return result;
}

const Policy& Communicator::policy() const { return impl_->policy; }
int Communicator::rank() const { return impl_->oob.rank; }
int Communicator::world_size() const { return impl_->oob.size; }
std::uint32_t Communicator::usable_mask() const { return impl_->usable; }
const std::vector<std::string>& Communicator::dropped() const { return impl_->dropped; }

}  // namespace arbiter
