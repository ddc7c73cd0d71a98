// The C API: thin wrappers that catch everything and map it to codes.
#include "arbiter/arbiter.h"

#include <cstddef>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "arbiter/bootstrap.h"
#include "arbiter/common/call_checks.h"
#include "arbiter/common/numeric.h"
#include "arbiter/communicator.h"
#include "arbiter/policy.h"
#include "arbiter/registry.h"
#include "fork_stamp.h"

struct arbiter_policy {
  arbiter::Policy policy;
};

struct arbiter_comm {
  // Declared first so that they are destroyed last: destroying the
  // communicator is collective over the group's oob. The caller's oob is
  // copied: C code builds it on the stack of a setup function, and the
  // communicator calls it for as long as it lives (its ctx must live as
  // long; the struct need not).
  std::shared_ptr<arbiter::Bootstrap> bootstrap;
  arbiter_oob oob{};
  std::optional<arbiter::Registry> registry;  // set before comm, which refers to it
  std::unique_ptr<arbiter::Communicator> comm;
  int device = -1;
};

namespace {

thread_local std::string g_last_error;

int32_t fail(int32_t status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

template <class Fn>
int32_t guarded(Fn&& fn) noexcept {
  try {
    g_last_error.clear();
    return fn();
  } catch (const arbiter::LoadError& e) {
    return fail(ARBITER_INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    return fail(ARBITER_INTERNAL, e.what());
  } catch (...) {
    return fail(ARBITER_INTERNAL, "unknown exception");
  }
}

using arbiter::common::raw_enum;  // enum fields written by C callers, read safely

// `capability` as the C API encodes it (0: CPU ranks), or false with the
// reason (prefixed by `what`) in g_last_error.
bool valid_capability(std::uint32_t capability, const char* what) {
  if (capability == 0 ||
      (capability >= arbiter::Capability::kMinSm && capability <= arbiter::Capability::kMaxSm)) {
    return true;
  }
  g_last_error = std::string(what) + "capability " + std::to_string(capability) +
                 " is not major*10+minor in 50..199 (0 for CPU ranks)";
  return false;
}

// residual_replicated took the padding before message_bytes: callers built
// against the header without it pass the same struct.
static_assert(sizeof(arbiter_request) == 48 && offsetof(arbiter_request, message_bytes) == 32);

bool to_request(const arbiter_request* in, arbiter::Request& r) {
  using namespace arbiter;
  const std::int64_t dtype = raw_enum(in->dtype);
  const std::int64_t pattern = raw_enum(in->pattern);
  if (!common::is_valid_dtype(dtype) || pattern < ARBITER_PATTERN_ALLREDUCE ||
      pattern > ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    g_last_error = "unknown dtype or pattern value";
    return false;
  }
  if (!valid_capability(in->capability, "")) return false;
  r.capability = in->capability == 0 ? Capability::cpu()
                                     : Capability::sm(static_cast<std::uint16_t>(in->capability));
  r.world_size = in->world_size;
  r.nodes = in->nodes == 0 ? 1 : in->nodes;
  r.nvlink_domain = in->nvlink_domain != 0;
  r.multicast = in->multicast != 0;
  r.dtype = static_cast<Dtype>(in->dtype);
  r.pattern = static_cast<Pattern>(in->pattern);
  r.residual_replicated = in->residual_replicated != 0;
  r.tokens = in->tokens;
  r.hidden = in->hidden;
  r.message_bytes = in->message_bytes != 0
                        ? in->message_bytes
                        : Request::message_bytes_of(in->tokens, in->hidden, r.dtype);
  return true;
}

bool to_request(const arbiter_request_ex* in, arbiter::Request& r) {
  // The first version's size (through buffers_registered) up to this one's.
  constexpr std::size_t kSmallest =
      offsetof(arbiter_request_ex, buffers_registered) + sizeof(in->buffers_registered);
  if (in->size < kSmallest || in->size > sizeof(arbiter_request_ex)) {
    g_last_error = "arbiter_request_ex.size is " + std::to_string(in->size) +
                   "; this library knows sizes " + std::to_string(kSmallest) + " to " +
                   std::to_string(sizeof(arbiter_request_ex)) +
                   " (set it to sizeof(arbiter_request_ex); a larger one comes from a newer "
                   "arbiter.h than this library)";
    return false;
  }
  if (!to_request(&in->request, r)) return false;
  r.buffers_registered = in->buffers_registered != 0;
  return true;
}

void to_decision(const arbiter::Decision& d, arbiter_decision* out) {
  out->backend = static_cast<uint32_t>(d.backend);
  out->algorithm = static_cast<arbiter_algorithm>(d.algorithm);
  out->fused = d.fused;
  out->reason = static_cast<uint32_t>(d.reason);
  out->cap = d.cap;
}

// The decide, max_fused_bytes and explain entry points, for either request
// struct (to_request reads each).
template <class CRequest>
int32_t decide(const arbiter_policy* policy, const CRequest* request, arbiter_decision* out) {
  if (!policy || !request || !out) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  arbiter::Request r;
  if (!to_request(request, r)) return ARBITER_INVALID_ARGUMENT;
  to_decision(policy->policy.decide(r), out);
  return ARBITER_OK;
}

template <class CRequest>
int32_t max_fused_bytes(const arbiter_policy* policy, const CRequest* request, uint64_t* cap,
                        int32_t* has_cap) {
  if (!policy || !request || !cap || !has_cap) {
    return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  }
  arbiter::Request r;
  if (!to_request(request, r)) return ARBITER_INVALID_ARGUMENT;
  const auto c = policy->policy.max_fused_bytes(r);
  *has_cap = c.has_value();
  *cap = c.value_or(0);
  return ARBITER_OK;
}

template <class CRequest>
int32_t explain(const arbiter_policy* policy, const CRequest* request, int32_t json, char* buf,
                size_t size, size_t* needed) {
  return guarded([&] {
    if (!policy || !request || !needed) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
    arbiter::Request r;
    if (!to_request(request, r)) return int32_t{ARBITER_INVALID_ARGUMENT};
    const arbiter::Decision d = policy->policy.explain(r);
    const std::string text =
        json ? policy->policy.decision_json(r, d) : policy->policy.explain_text(r, d);
    *needed = text.size() + 1;
    if (!buf || size < *needed) {
      return fail(ARBITER_INVALID_ARGUMENT,
                  "buffer too small: " + std::to_string(*needed) + " bytes needed");
    }
    std::memcpy(buf, text.c_str(), *needed);
    return int32_t{ARBITER_OK};
  });
}

}  // namespace

extern "C" {

const char* arbiter_last_error(void) { return g_last_error.c_str(); }

const char* arbiter_version(void) { return ARBITER_VERSION; }

const char* arbiter_backend_name(uint32_t backend) {
  return backend < arbiter::kBackendCount
             ? arbiter::backend_name(static_cast<arbiter::Backend>(backend)).data()
             : "none";
}

int32_t arbiter_policy_from_environment(arbiter_policy** out) {
  return guarded([&] {
    if (!out) return fail(ARBITER_INVALID_ARGUMENT, "out is NULL");
    *out = new arbiter_policy{arbiter::Policy::from_environment()};
    return int32_t{ARBITER_OK};
  });
}

int32_t arbiter_policy_load(const char* const* site_files, size_t count, const char* backends_env,
                            arbiter_policy** out) {
  return guarded([&] {
    if (!out || (count > 0 && !site_files)) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
    arbiter::LoadOptions o;
    for (size_t i = 0; i < count; ++i) {
      if (!site_files[i]) return fail(ARBITER_INVALID_ARGUMENT, "site_files holds a NULL");
      o.site_files.emplace_back(site_files[i]);
    }
    if (backends_env) o.backends_env = backends_env;
    *out = new arbiter_policy{arbiter::Policy::load_or_throw(o)};
    return int32_t{ARBITER_OK};
  });
}

void arbiter_policy_free(arbiter_policy* policy) { delete policy; }

int32_t arbiter_decide(const arbiter_policy* policy, const arbiter_request* request,
                       arbiter_decision* out) {
  return decide(policy, request, out);
}

int32_t arbiter_decide_ex(const arbiter_policy* policy, const arbiter_request_ex* request,
                          arbiter_decision* out) {
  return decide(policy, request, out);
}

int32_t arbiter_max_fused_bytes(const arbiter_policy* policy, const arbiter_request* request,
                                uint64_t* cap, int32_t* has_cap) {
  return max_fused_bytes(policy, request, cap, has_cap);
}

int32_t arbiter_max_fused_bytes_ex(const arbiter_policy* policy, const arbiter_request_ex* request,
                                   uint64_t* cap, int32_t* has_cap) {
  return max_fused_bytes(policy, request, cap, has_cap);
}

uint64_t arbiter_policy_fingerprint(const arbiter_policy* policy) {
  return policy ? policy->policy.fingerprint() : 0;
}

int32_t arbiter_explain(const arbiter_policy* policy, const arbiter_request* request, int32_t json,
                        char* buf, size_t size, size_t* needed) {
  return explain(policy, request, json, buf, size, needed);
}

int32_t arbiter_explain_ex(const arbiter_policy* policy, const arbiter_request_ex* request,
                           int32_t json, char* buf, size_t size, size_t* needed) {
  return explain(policy, request, json, buf, size, needed);
}

}  // extern "C"

namespace {

arbiter::CommunicatorOptions to_options(const arbiter_comm_options& in) {
  arbiter::CommunicatorOptions o;
  o.capability = in.capability == 0
                     ? arbiter::Capability::cpu()
                     : arbiter::Capability::sm(static_cast<std::uint16_t>(in.capability));
  o.nodes = in.nodes == 0 ? 1 : in.nodes;
  o.nvlink_domain = in.nvlink_domain == ARBITER_NVLINK_YES ||
                    (in.nvlink_domain == ARBITER_NVLINK_AUTO && o.nodes <= 1);
  o.multicast = in.multicast != 0;
  o.device = in.device;
  o.max_tokens = in.max_tokens;
  o.hidden = in.hidden;
  o.dtype = static_cast<arbiter::Dtype>(in.dtype);
  o.pattern_mask = in.pattern_mask;  // 0: every pattern
  if (in.timeout_ms > 0) o.timeout = std::chrono::milliseconds(in.timeout_ms);
  return o;
}

bool valid_options(const arbiter_comm_options& in) {
  const std::int64_t dtype = raw_enum(in.dtype);
  if (!arbiter::common::is_valid_dtype(dtype)) {
    g_last_error = "options: unknown dtype " + std::to_string(dtype);
    return false;
  }
  if (in.timeout_ms < 0) {
    g_last_error = "options: timeout_ms " + std::to_string(in.timeout_ms) +
                   " is negative; 0 means the default (60 s), and any value above 30 days waits "
                   "30 days (for \"never\", give INT64_MAX)";
    return false;
  }
  if (in.nvlink_domain > ARBITER_NVLINK_NO) {
    g_last_error = "options: nvlink_domain " + std::to_string(in.nvlink_domain) +
                   " is none of ARBITER_NVLINK_AUTO (0), _YES (1), _NO (2)";
    return false;
  }
  if ((in.pattern_mask & ~arbiter::CommunicatorOptions::kAllPatterns) != 0) {
    g_last_error = "options: pattern_mask " + std::to_string(in.pattern_mask) +
                   " has bits that name no pattern (bits 0-3: allreduce, residual_rmsnorm, "
                   "residual_rmsnorm_fp8, residual_rmsnorm_fp4; 0 for all)";
    return false;
  }
  if (in.hidden == 0) {
    g_last_error =
        "options: hidden is 0: pass the model's hidden size (the elements per token of the widest "
        "call); the workspaces are sized from it";
    return false;
  }
  return valid_capability(in.capability, "options: ");
}

// The group of arbiter_comm_create_from_environment: joined by the first
// call (with the options it parsed from the environment), then shared by
// every later one for the life of the process: a second group beside a
// live one would need a second port.
// Never destroyed: at exit nothing is in flight on it, and a goodbye
// handshake from a static destructor would delay every exit.
// A forked child holds its parent's copy of the group: it cannot use it
// (the parent's rank, on the parent's connections), nor join another (UCX,
// whose threads the child lacks, does not work after a fork).
std::shared_ptr<arbiter::Bootstrap> process_group(const arbiter::BootstrapOptions& wanted) {
  static std::mutex mutex;
  static auto* group = new std::shared_ptr<arbiter::Bootstrap>();
  static std::optional<arbiter::ForkStamp> joined;
  const std::lock_guard<std::mutex> lock(mutex);
  // A world of one has no connections to share: its copy serves the child.
  if (*group && (*group)->world_size() > 1 && joined->forked()) {
    const arbiter::BootstrapOptions& have = (*group)->options();
    throw arbiter::BootstrapError(
        ARBITER_INVALID_ARGUMENT,
        "bootstrap: process " + std::to_string(joined->pid) + " joined rank " +
            std::to_string(have.rank) +
            " of its group and has since forked; this child can neither use that group nor "
            "join another (UCX does not work across fork()): start it as a process of its own "
            "(multiprocessing's 'spawn', or exec), or give its communicator an oob of its own");
  }
  if (*group) {
    const arbiter::BootstrapOptions& have = (*group)->options();
    if (have.rank != wanted.rank || have.world_size != wanted.world_size ||
        have.master_addr != wanted.master_addr || have.master_port != wanted.master_port) {
      throw arbiter::BootstrapError(
          ARBITER_INVALID_ARGUMENT,
          "bootstrap: this process already joined rank " + std::to_string(have.rank) + " of " +
              std::to_string(have.world_size) + " at " + have.master_addr + ":" +
              std::to_string(have.master_port) + "; the environment now says rank " +
              std::to_string(wanted.rank) + " of " + std::to_string(wanted.world_size) + " at " +
              wanted.master_addr + ":" + std::to_string(wanted.master_port) +
              " (one process joins one group; use arbiter_comm_create with your own oob for "
              "another)");
    }
    return *group;
  }
  *group = std::make_shared<arbiter::Bootstrap>(arbiter::Bootstrap::connect(wanted));
  joined.emplace();
  return *group;
}

// Creates the communicator over `oob` into `comm` (which may already own the
// bootstrap that provides the oob).
int32_t create_into(std::unique_ptr<arbiter_comm>& comm, const arbiter_oob& oob,
                    const arbiter_policy& policy, const arbiter::CommunicatorOptions& o,
                    arbiter_comm** out) {
  arbiter::DiscoverOptions d = arbiter::DiscoverOptions::from_environment();
  d.probe = {o.capability.is_cpu() ? ARBITER_DEVICE_CPU : ARBITER_DEVICE_GPU, o.device};
  comm->registry.emplace(arbiter::Registry::discover(d));
  comm->device = o.capability.is_cpu() ? -1 : o.device;  // the header: -1 for CPU ranks
  // The caller's mistake, not an unavailable group.
  if (oob.size < 1 || oob.rank < 0 || oob.rank >= oob.size || !oob.allgather || !oob.broadcast ||
      !oob.barrier) {
    return fail(ARBITER_INVALID_ARGUMENT,
                "oob: rank " + std::to_string(oob.rank) + " of " + std::to_string(oob.size) +
                    ", or a NULL function (allgather, broadcast and barrier are all required)");
  }
  try {
    comm->comm = std::make_unique<arbiter::Communicator>(oob, policy.policy, *comm->registry, o);
  } catch (const arbiter::CommunicatorError& e) {
    return fail(ARBITER_UNAVAILABLE, e.what());
  }
  *out = comm.release();
  return int32_t{ARBITER_OK};
}

}  // namespace

extern "C" {

int32_t arbiter_comm_create(const arbiter_oob* oob, const arbiter_policy* policy,
                            const arbiter_comm_options* options, arbiter_comm** out) {
  return guarded([&] {
    if (!oob || !policy || !options || !out) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
    if (!valid_options(*options)) return int32_t{ARBITER_INVALID_ARGUMENT};
    auto comm = std::make_unique<arbiter_comm>();
    comm->oob = *oob;
    return create_into(comm, comm->oob, *policy, to_options(*options), out);
  });
}

int32_t arbiter_comm_create_from_environment(const arbiter_policy* policy,
                                             const arbiter_comm_options* options,
                                             arbiter_comm** out) {
  return guarded([&] {
    if (!policy || !options || !out) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
    if (!valid_options(*options)) return int32_t{ARBITER_INVALID_ARGUMENT};
    arbiter::CommunicatorOptions o = to_options(*options);
    auto comm = std::make_unique<arbiter_comm>();
    const std::chrono::milliseconds timeout =
        options->timeout_ms > 0 ? std::chrono::milliseconds(options->timeout_ms)
                                : std::chrono::milliseconds(std::chrono::seconds(60));
    try {
      // Before joining: a rank that cannot create would hold its peers in
      // the creation's first exchange until their timeout.
      const arbiter::BootstrapOptions wanted = arbiter::bootstrap_options_from_environment(timeout);
      if (!o.capability.is_cpu() && o.device < 0) {
        o.device = wanted.local_rank;
        if (o.device < 0) {
          return fail(ARBITER_INVALID_ARGUMENT,
                      "a GPU rank (capability " + std::to_string(options->capability) +
                          ") needs its CUDA device: LOCAL_RANK is not set (torchrun and "
                          "`arbiter launch` set it; or pass the device: options.device in C, "
                          "device= in Python)");
        }
      }
      comm->bootstrap = process_group(wanted);
    } catch (const arbiter::BootstrapError& e) {
      return fail(e.code(), e.what());
    }
    return create_into(comm, *comm->bootstrap->oob(), *policy, o, out);
  });
}

int32_t arbiter_comm_get_info(const arbiter_comm* comm, arbiter_comm_info* out) {
  if (!comm || !out) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  out->rank = comm->comm->rank();
  out->world_size = comm->comm->world_size();
  out->device = comm->device;
  out->backend_mask = comm->comm->usable_mask();
  out->fingerprint = comm->comm->policy().fingerprint();
  g_last_error.clear();
  return ARBITER_OK;
}

int32_t arbiter_comm_get_footprint(const arbiter_comm* comm, int32_t backend,
                                   arbiter_comm_footprint* out) {
  if (!comm || !out) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  const std::uint32_t usable = comm->comm->usable_mask();
  if (backend < 0 || backend >= arbiter::kBackendCount || !((usable >> backend) & 1u)) {
    return fail(ARBITER_UNSUPPORTED, "backend " + std::to_string(backend) +
                                         " has no workspace in this communicator (backend_mask " +
                                         std::to_string(usable) + ")");
  }
  const arbiter::WorkspaceFootprint& figure =
      comm->comm->footprint_of(static_cast<arbiter::Backend>(backend));
  out->backend = backend;
  out->known = figure.known ? 1 : 0;
  out->device_bytes = figure.device_bytes;
  out->host_bytes = figure.host_bytes;
  out->shared_bytes = figure.shared_bytes;
  for (int a = 0; a < 3; ++a) out->max_message_bytes[a] = figure.max_message_bytes[a];
  out->note = figure.note.c_str();
  g_last_error.clear();
  return ARBITER_OK;
}

int32_t arbiter_comm_allreduce_fusion(arbiter_comm* comm, const arbiter_allreduce_args* args,
                                      void* stream, arbiter_decision* used) {
  if (!comm) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  if (!args) {
    static_cast<void>(comm->comm->join_refused_call());  // a call all the same
    return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  }
  const arbiter::Communicator::Result r = comm->comm->allreduce_fusion(*args, stream);
  if (used) to_decision(r.decision, used);
  if (r.status != ARBITER_OK) return fail(r.status, r.error);
  return ARBITER_OK;
}

int32_t arbiter_comm_join_refused(arbiter_comm* comm) {
  if (!comm) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  const arbiter::Communicator::Result r = comm->comm->join_refused_call();
  if (r.status != ARBITER_OK) return fail(r.status, r.error);
  g_last_error.clear();
  return ARBITER_OK;
}

int32_t arbiter_comm_alloc(arbiter_comm* comm, uint64_t bytes, void** data) {
  if (!comm || !data) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  *data = nullptr;
  const arbiter::Communicator::Result r = comm->comm->alloc_registered(bytes, data);
  if (r.status != ARBITER_OK) return fail(r.status, r.error);
  g_last_error.clear();
  return ARBITER_OK;
}

int32_t arbiter_comm_free(arbiter_comm* comm, void* data) {
  if (!comm) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  // free_registered() refuses NULL too, but saying so here names the cause.
  if (!data)
    return fail(ARBITER_INVALID_ARGUMENT, "data is NULL (not an arbiter_comm_alloc result)");
  const arbiter::Communicator::Result r = comm->comm->free_registered(data);
  if (r.status != ARBITER_OK) return fail(r.status, r.error);
  g_last_error.clear();
  return ARBITER_OK;
}

int32_t arbiter_comm_abort(arbiter_comm* comm) {
  if (!comm) return fail(ARBITER_INVALID_ARGUMENT, "NULL argument");
  comm->comm->abort();  // noexcept; g_last_error is this thread's own
  g_last_error.clear();
  return ARBITER_OK;
}

void arbiter_comm_destroy(arbiter_comm* comm) { delete comm; }

}  // extern "C"
