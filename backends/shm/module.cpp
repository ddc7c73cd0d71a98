// The shm module's C entry points: argument checks, dispatch to an
// algorithm, and the exported arbiter_backend_v1. Every entry point catches
// everything; no exception crosses the plugin boundary.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "algorithms.h"
#include "arbiter/common/call_checks.h"
#include "arbiter/common/call_signature.h"
#include "arbiter/common/collective.h"
#include "arbiter/common/names.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/rmsnorm.h"
#include "arbiter/common/token_slice.h"
#include "arbiter_backend.h"
#include "footprint.h"
#include "status.h"
#include "workspace.h"

namespace arbiter::shm {

namespace {

constexpr std::int32_t kMinWorldSize = 1;  // one rank: the epilogue alone, no exchange
constexpr std::int32_t kMaxWorldSize = 63;

template <class Body>
std::int32_t guarded(const char* entry, Body body) noexcept {
  try {
    return report(body());
  } catch (const std::bad_alloc&) {
    return report({ARBITER_INTERNAL, std::string("shm ") + entry + ": out of host memory"});
  } catch (const std::exception& error) {
    return report({ARBITER_INTERNAL, std::string("shm ") + entry + ": " + error.what()});
  } catch (...) {
    return report({ARBITER_INTERNAL, std::string("shm ") + entry + ": unknown exception"});
  }
}

Workspace* from_handle(arbiter_workspace* handle) { return reinterpret_cast<Workspace*>(handle); }

bool aligned(const void* pointer, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

// Everything run() can reject before touching any memory. Returns OK with
// `empty` set when there is nothing to do (tokens == 0).
Status check_run(const Workspace& workspace, const arbiter_allreduce_args* args, bool& empty) {
  empty = false;
  if (args == nullptr) return {ARBITER_INVALID_ARGUMENT, "shm run: args is NULL"};
  const arbiter_allreduce_args& a = *args;
  if (a.pattern < ARBITER_PATTERN_ALLREDUCE || a.pattern > ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    return {ARBITER_INVALID_ARGUMENT, "shm run: unknown pattern " + std::to_string(a.pattern)};
  }
  if (a.algorithm < ARBITER_ALGORITHM_ONESHOT || a.algorithm > ARBITER_ALGORITHM_NATIVE) {
    return {ARBITER_INVALID_ARGUMENT, "shm run: unknown algorithm " + std::to_string(a.algorithm)};
  }
  if (!common::is_valid_dtype(a.dtype)) {
    return {ARBITER_INVALID_ARGUMENT, "shm run: unknown dtype " + std::to_string(a.dtype)};
  }
  if (a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    return {ARBITER_UNSUPPORTED,
            "shm run: residual_rmsnorm_fp4 (NVFP4) is not supported on CPU ranks; use "
            "residual_rmsnorm_fp8 or residual_rmsnorm"};
  }
  if (a.dtype != workspace.dtype()) {
    return {ARBITER_UNSUPPORTED, std::string("shm run: the workspace was created for ") +
                                     common::dtype_text(workspace.dtype()) + ", this call is " +
                                     common::dtype_text(a.dtype)};
  }
  if (a.hidden == 0) return {ARBITER_INVALID_ARGUMENT, "shm run: hidden is 0"};
  const std::size_t element = common::dtype_size(a.dtype);
  // Any number of tokens streams through the slots; one token must fit.
  const std::uint64_t row_bytes = std::uint64_t{a.hidden} * element;
  if (row_bytes > workspace.slot_bytes()) {
    return {ARBITER_UNSUPPORTED, "shm run: one token of hidden " + std::to_string(a.hidden) +
                                     " is " + std::to_string(row_bytes) +
                                     " bytes, more than the workspace's slot of " +
                                     std::to_string(workspace.slot_bytes()) +
                                     " bytes (create the workspace with this hidden size)"};
  }
  if (a.tokens == 0) {
    empty = true;
    return {};
  }
  auto missing = [](const char* what) {
    return Status{ARBITER_INVALID_ARGUMENT, std::string("shm run: ") + what + " is NULL"};
  };
  if (a.input == nullptr) return missing("input");
  if (a.pattern == ARBITER_PATTERN_ALLREDUCE && a.allreduce_out == nullptr) {
    return missing("allreduce_out (required for pattern allreduce)");
  }
  if (a.pattern != ARBITER_PATTERN_ALLREDUCE) {
    if (a.gamma == nullptr) return missing("gamma");
  }
  // As the GPU modules require (arbiter_backend.h): without it the call ran
  // a whole collective, wrote no norm, and returned success.
  if (a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM && a.norm_out == nullptr) {
    return missing("norm_out (residual_rmsnorm writes its norm there)");
  }
  if (a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
    if (a.quant_out == nullptr) return missing("quant_out");
    if (a.scale == nullptr) return missing("scale");
    // Host memory, so its value can be checked: 0, a negative, NaN or an
    // infinity quantises every element to a saturated or NaN code.
    float scale = 0.0f;
    std::memcpy(&scale, a.scale, sizeof scale);
    if (!(std::isfinite(scale) && scale > 0.0f)) {
      return {ARBITER_INVALID_ARGUMENT,
              "shm run: scale is " + std::to_string(scale) + "; it must be finite and > 0"};
    }
  }
  const void* const buffers[] = {a.allreduce_out, a.residual_in, a.residual_out, a.gamma,
                                 a.norm_out};
  for (const void* buffer : buffers) {
    if (buffer != nullptr && !aligned(buffer, element)) {
      return {ARBITER_INVALID_ARGUMENT,
              "shm run: an output, residual or gamma buffer is not "
              "aligned to its element size"};
    }
  }
  for (const Status& status : {common::check_aliasing(a), common::check_call_values(a)}) {
    if (!status.ok()) return {status.code(), "shm run: " + status.message()};
  }
  return {};
}

std::int32_t probe(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
  return guarded("probe", [&]() -> Status {
    if (args == nullptr || caps == nullptr) {
      return {ARBITER_INVALID_ARGUMENT, "shm probe: args and caps must not be NULL"};
    }
    if (args->device_kind != ARBITER_DEVICE_CPU) {
      return {ARBITER_UNAVAILABLE, "shm serves CPU ranks only; this rank uses a GPU"};
    }
    arbiter_backend_caps result{};
    result.device_kind = ARBITER_DEVICE_CPU;
    result.capability = 0;
    for (std::int32_t size = kMinWorldSize; size <= kMaxWorldSize; ++size) {
      result.world_size_mask |= std::uint64_t{1} << size;
    }
    result.dtype_mask =
        (1u << ARBITER_DTYPE_FP16) | (1u << ARBITER_DTYPE_BF16) | (1u << ARBITER_DTYPE_FP32);
    result.pattern_mask = (1u << ARBITER_PATTERN_ALLREDUCE) |
                          (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM) |
                          (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8);
    result.algorithm_mask = (1u << ARBITER_ALGORITHM_ONESHOT) | (1u << ARBITER_ALGORITHM_TWOSHOT) |
                            (1u << ARBITER_ALGORITHM_NATIVE);
    result.flags = ARBITER_CAPS_SINGLE_NODE_ONLY | ARBITER_CAPS_RESIDUAL_OPTIONAL |
                   ARBITER_CAPS_JOINS_REFUSALS;
    *caps = result;
    return {};
  });
}

std::int32_t workspace_create(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                              arbiter_workspace** out) {
  return guarded("workspace_create", [&]() -> Status {
    if (out != nullptr) *out = nullptr;
    if (oob == nullptr || spec == nullptr || out == nullptr) {
      return {ARBITER_INVALID_ARGUMENT, "shm workspace_create: oob, spec and out must not be NULL"};
    }
    if (oob->allgather == nullptr || oob->broadcast == nullptr) {
      return {ARBITER_INVALID_ARGUMENT,
              "shm workspace_create: the oob lacks allgather or broadcast"};
    }
    Workspace* workspace = nullptr;
    Status status = create_workspace(*oob, *spec, &workspace);
    *out = reinterpret_cast<arbiter_workspace*>(workspace);
    return status;
  });
}

std::uint64_t max_message_bytes(const arbiter_workspace* handle, arbiter_algorithm) {
  // Any size: run() streams a call through the slots a slice at a time.
  return handle == nullptr ? 0 : std::numeric_limits<std::uint64_t>::max();
}

// A call of no tokens still meets the others, so that a peer which was
// given tokens refuses its call instead of waiting for this rank's data.
Status run_empty(Workspace& workspace) {
  Backoff backoff = workspace.publish_call();
  return workspace.meet_call(backoff, "call of no tokens");
}

Status run_algorithm(Workspace& workspace, const arbiter_allreduce_args& args) {
  switch (args.algorithm) {
    case ARBITER_ALGORITHM_ONESHOT:
      return run_oneshot(workspace, args);
    case ARBITER_ALGORITHM_TWOSHOT:
      return run_twoshot(workspace, args);
    default:
      return run_native(workspace, args);
  }
}

// A call larger than a slot, as consecutive calls on slices of whole tokens
// (NVFP4 is refused above). Every rank slices the same shape alike, so the
// slices pair up across ranks.
Status run_streamed(Workspace& workspace, const arbiter_allreduce_args& args) {
  const std::size_t row_bytes = std::size_t{args.hidden} * common::dtype_size(args.dtype);
  // At least 1: a slot holds at least a row.
  const std::uint64_t slice_tokens = workspace.slot_bytes() / row_bytes;
  if (args.tokens <= slice_tokens) return run_algorithm(workspace, args);
  Status status;
  common::for_each_token_slice(args, slice_tokens, [&](const arbiter_allreduce_args& slice) {
    status = run_algorithm(workspace, slice);
    return status.ok();
  });
  return status;
}

// A call this rank refused (its arguments, here, or above the module:
// ARBITER_RUN_REFUSED) still meets its peers, with a signature that says
// so: their call is refused too (ARBITER_MISMATCH naming this rank) rather
// than paired with this rank's next call, which would mix two calls' data.
// OK or MISMATCH: the peers were told; anything else: the wait failed.
Status join_refused(Workspace& workspace) {
  if (workspace.world_size() == 1) return {};
  workspace.signature = common::refused_call();
  workspace.registered_key = 0;
  workspace.registered_outputs_key = 0;
  Backoff backoff = workspace.publish_call();
  return workspace.meet_call(backoff, "part in a call this rank refused");
}

// This rank's `refusal`, joined: the refusal, or, when the peers never came
// (the workspace is then unusable), that failure after it.
Status refuse(Workspace& workspace, Status refusal) {
  const Status joined = join_refused(workspace);
  if (joined.ok() || joined.code() == ARBITER_MISMATCH) return refusal;
  return {joined.code(), refusal.message() +
                             "; then waiting for the peers to join the call, to tell them, "
                             "failed: " +
                             joined.message()};
}

// What every call, copied or registered, starts with: count it, refuse it
// after a fault or for bad arguments (joining it all the same), and set
// its signature. `*empty`: no tokens (the ranks still meet); `*joined`: a
// call refused above the module, joined and done.
Status start_call(arbiter_workspace* handle, const arbiter_allreduce_args* args, Workspace** out,
                  bool* empty, bool* joined) {
  if (handle == nullptr) return {ARBITER_INVALID_ARGUMENT, "shm run: workspace is NULL"};
  Workspace& workspace = *from_handle(handle);
  *out = &workspace;
  workspace.call = workspace.runs++;
  workspace.fault_point("shm.call.start");
  // A workspace that saw a fault fails every call at once.
  if (Status status = workspace.usable(); !status.ok()) return status;
  if (args != nullptr && (args->flags & ARBITER_RUN_REFUSED) != 0) {
    *joined = true;
    Status status = join_refused(workspace);
    return status.code() == ARBITER_MISMATCH ? Status() : status;
  }
  if (Status status = check_run(workspace, args, *empty); !status.ok()) {
    return refuse(workspace, std::move(status));
  }
  workspace.signature = common::signature_of(*args, /*read_scale=*/true, /*with_algorithm=*/true);
  workspace.registered_key = 0;
  workspace.registered_outputs_key = 0;
  return {};
}

std::int32_t run(arbiter_workspace* handle, const arbiter_allreduce_args* args, void*) {
  return guarded("run", [&]() -> Status {
    Workspace* workspace = nullptr;
    bool empty = false;
    bool joined = false;
    if (Status status = start_call(handle, args, &workspace, &empty, &joined);
        !status.ok() || joined) {
      return status;
    }
    if (empty) return workspace->world_size() > 1 ? run_empty(*workspace) : Status();
    return run_streamed(*workspace, *args);
  });
}

// Whether an output the call writes overlaps [input, input + bytes).
bool output_over_input(const arbiter_allreduce_args& a, std::uint64_t bytes) {
  const auto* begin = static_cast<const std::byte*>(a.input);
  const bool norm = a.pattern != ARBITER_PATTERN_ALLREDUCE;
  const struct {
    const void* buffer;
    std::uint64_t bytes;
  } outputs[] = {{a.allreduce_out, bytes},
                 {norm ? a.residual_out : nullptr, bytes},
                 {norm ? a.norm_out : nullptr, bytes},
                 {a.pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 ? a.quant_out : nullptr,
                  std::uint64_t{a.tokens} * a.hidden}};
  for (const auto& o : outputs) {
    const auto* p = static_cast<const std::byte*>(o.buffer);
    if (p != nullptr && p < begin + bytes && begin < p + o.bytes) return true;
  }
  return false;
}

// Whether every output of a replicated two-shot call lies in registered
// memory: then `owners` holds every rank's outputs at the same offsets and
// `*key` identifies them across ranks (mixing each output's
// RegisteredMemory::key(), never 0). Otherwise the outputs are staged.
bool locate_owner_outputs(const Workspace& workspace, const arbiter_allreduce_args& a,
                          std::size_t row_bytes, OwnerOutputs& owners, std::uint64_t* key) {
  const auto outputs = staged_outputs(a, row_bytes);
  std::uint64_t mixed = 0;
  std::string why;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    std::byte* const local = outputs[k].buffer;
    if (local == nullptr) {
      for (std::int32_t q = 0; q < workspace.world_size(); ++q) owners.rows[k][q] = nullptr;
      mixed = mixed * 0x9E3779B97F4A7C15ull;
      continue;
    }
    const Allocation* allocation =
        workspace.registered.find(local, std::uint64_t{a.tokens} * outputs[k].row_bytes, why);
    if (allocation == nullptr) return false;
    const auto offset = static_cast<std::uint64_t>(local - allocation->local);
    for (std::int32_t q = 0; q < workspace.world_size(); ++q) {
      owners.rows[k][q] = allocation->base + q * allocation->stride + offset;
    }
    mixed = (mixed ^ RegisteredMemory::key(*allocation, local)) * 0x9E3779B97F4A7C15ull;
  }
  *key = mixed | 1;
  return true;
}

// A registered call (arbiter_backend_v2_memory): the checks of run(), then
// the input found in this workspace's registered memory and every rank's
// input located in the shared mapping at the same offset.
std::int32_t run_registered(arbiter_workspace* handle, const arbiter_allreduce_args* args, void*) {
  return guarded("run", [&]() -> Status {
    Workspace* started = nullptr;
    bool empty = false;
    bool joined = false;
    if (Status status = start_call(handle, args, &started, &empty, &joined);
        !status.ok() || joined) {
      return status;
    }
    Workspace& workspace = *started;
    if (empty) return workspace.world_size() > 1 ? run_empty(workspace) : Status();
    const arbiter_allreduce_args& a = *args;
    const std::size_t row_bytes = std::size_t{a.hidden} * common::dtype_size(a.dtype);
    const std::uint64_t bytes = std::uint64_t{a.tokens} * row_bytes;
    std::string why;
    const Allocation* allocation = workspace.registered.find(a.input, bytes, why);
    if (allocation == nullptr) {
      return refuse(workspace, {ARBITER_INVALID_ARGUMENT, "shm run (registered): " + why});
    }
    const std::uint64_t key = RegisteredMemory::key(*allocation, a.input);
    const std::int32_t ranks = workspace.world_size();
    const auto offset =
        static_cast<std::uint64_t>(static_cast<const std::byte*>(a.input) - allocation->local);
    const std::byte* inputs[kMaxRanks];
    for (std::int32_t q = 0; q < ranks; ++q) {
      inputs[q] =
          ranks == 1 ? allocation->local : allocation->base + q * allocation->stride + offset;
    }
    // The unfused path copies anyway; one-shot cannot read in place what
    // this rank overwrites while peers read it. Both copy in, and say so in
    // the key, so a peer that reads in place refuses instead of pairing.
    if (a.algorithm == ARBITER_ALGORITHM_NATIVE ||
        (a.algorithm == ARBITER_ALGORITHM_ONESHOT && output_over_input(a, bytes))) {
      workspace.registered_key = key | Workspace::kCopiedIn;
      return run_streamed(workspace, a);
    }
    workspace.registered_key = key;
    if (a.algorithm == ARBITER_ALGORITHM_ONESHOT) {
      return run_oneshot_registered(workspace, a, inputs);
    }
    // A replicated call whose outputs are registered too copies the other
    // slices' outputs from their owners (the key says so, so a rank whose
    // outputs are staged refuses instead of pairing), from the workspace's
    // threshold up (owners_threshold.h; below it staging was faster).
    OwnerOutputs owners;
    const OwnerOutputs* from_owners = nullptr;
    if (ranks > 1 && (a.flags & ARBITER_RUN_RESIDUAL_REPLICATED) != 0 &&
        common::pattern_has_norm(a.pattern) &&
        std::uint64_t{a.tokens} * row_bytes >= workspace.owners_from_bytes &&
        locate_owner_outputs(workspace, a, row_bytes, owners, &workspace.registered_outputs_key)) {
      from_owners = &owners;
    }
    // Two-shot's sums and staged outputs go through the workspace: slices
    // of at most a slot, each reading its tokens of every input in place.
    const std::uint64_t slice_tokens = workspace.slot_bytes() / row_bytes;
    if (a.tokens <= slice_tokens) return run_twoshot(workspace, a, inputs, from_owners);
    const auto full = staged_outputs(a, row_bytes);
    Status status;
    common::for_each_token_slice(a, slice_tokens, [&](const arbiter_allreduce_args& slice) {
      const auto shift =
          static_cast<const std::byte*>(slice.input) - static_cast<const std::byte*>(a.input);
      const std::byte* sliced[kMaxRanks];
      for (std::int32_t q = 0; q < ranks; ++q) sliced[q] = inputs[q] + shift;
      OwnerOutputs sliced_owners;
      if (from_owners != nullptr) {
        const auto part = staged_outputs(slice, row_bytes);
        for (std::size_t k = 0; k < full.size(); ++k) {
          const std::ptrdiff_t moved =
              full[k].buffer == nullptr ? 0 : part[k].buffer - full[k].buffer;
          for (std::int32_t q = 0; q < ranks; ++q) {
            sliced_owners.rows[k][q] =
                owners.rows[k][q] == nullptr ? nullptr : owners.rows[k][q] + moved;
          }
        }
      }
      status =
          run_twoshot(workspace, slice, sliced, from_owners == nullptr ? nullptr : &sliced_owners);
      return status.ok();
    });
    return status;
  });
}

std::int32_t alloc_registered(arbiter_workspace* handle, std::uint64_t bytes, void** local) {
  return guarded("alloc", [&]() -> Status {
    if (handle == nullptr || local == nullptr) {
      return {ARBITER_INVALID_ARGUMENT, "shm alloc: workspace and local must not be NULL"};
    }
    *local = nullptr;
    Workspace& workspace = *from_handle(handle);
    if (Status status = workspace.usable(); !status.ok()) return status;
    if (workspace.oob == nullptr) return {ARBITER_INTERNAL, "shm alloc: the workspace has no oob"};
    const Status status =
        workspace.registered.allocate(*workspace.oob, workspace.timeout_ms(), bytes, local);
    if (status.code() == ARBITER_TIMEOUT && workspace.aborted()) {
      return common::aborted_while_exchanging("shm", status);
    }
    return status;
  });
}

std::int32_t free_registered(arbiter_workspace* handle, void* local) {
  return guarded("free", [&]() -> Status {
    if (handle == nullptr) return {ARBITER_INVALID_ARGUMENT, "shm free: workspace is NULL"};
    return from_handle(handle)->registered.release(local);
  });
}

void workspace_destroy(arbiter_workspace* handle) {
  try {
    delete from_handle(handle);
  } catch (...) {
    // munmap cannot throw; nothing to report through a void entry point.
  }
}

const char* last_error() { return last_error_message(); }

void abort_workspace(arbiter_workspace* handle) {
  if (handle != nullptr) from_handle(handle)->abort();
}

}  // namespace

}  // namespace arbiter::shm

extern "C" __attribute__((visibility("default"))) const arbiter_backend_v1_t arbiter_backend_v1 = {
    ARBITER_BACKEND_ABI_VERSION,
    "shm",
    arbiter::shm::probe,
    arbiter::shm::workspace_create,
    arbiter::shm::max_message_bytes,
    arbiter::shm::run,
    arbiter::shm::workspace_destroy,
    arbiter::shm::last_error,
};

extern "C" __attribute__((visibility("default")))
const arbiter_backend_faults_v1_t arbiter_backend_v1_faults = {
    1,
    ARBITER_MODULE_VERSION,
    arbiter::shm::abort_workspace,
};

extern "C" __attribute__((visibility("default")))
const arbiter_backend_memory_v2_t arbiter_backend_v2_memory = {
    2,
    0,
    arbiter::shm::kRegisteredAlignment,
    arbiter::shm::alloc_registered,
    arbiter::shm::free_registered,
    arbiter::shm::run_registered,
};

extern "C" __attribute__((visibility("default")))
const arbiter_backend_footprint_v1_t arbiter_backend_v1_footprint = {
    1,
    0,
    arbiter::shm::footprint,
};
