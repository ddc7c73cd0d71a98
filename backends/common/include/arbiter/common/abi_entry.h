// The boundary of a backend module's C entry points: no exception crosses
// it, and a failure leaves its message in the module's per-thread last error.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// Stores a failed Status's message, prefixed with the module's name once.
inline std::int32_t report(std::string& last_error, const char* module, const Status& s) {
  if (!s.ok()) {
    const std::string prefix = std::string(module) + ": ";
    last_error = s.message().rfind(module, 0) == 0 ? s.message() : prefix + s.message();
  }
  return s.code();
}

// Runs `body` (returning an ABI status); any exception becomes
// ARBITER_INTERNAL with its message.
template <typename Body>
std::int32_t guarded(std::string& last_error, const char* module, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    last_error = std::string(module) + ": out of host memory";
  } catch (const std::exception& e) {
    try {
      last_error = std::string(module) + ": unexpected exception: " + e.what();
    } catch (...) {
    }
  } catch (...) {
    last_error = std::string(module) + ": unexpected exception";
  }
  return ARBITER_INTERNAL;
}

// The v1 entry points of a module implemented by `Impl`: argument checks,
// workspace allocation, the per-thread last error and the exception
// boundary are here; Impl provides, as static members:
//   const char* kName;
//   Status probe(const arbiter_probe_args&, arbiter_backend_caps*);
//   Status create_workspace(const arbiter_oob&, const arbiter_workspace_spec&,
//                           arbiter_workspace&);   (collective; frees what it
//                           made on failure)
//   std::uint64_t max_message_bytes(const arbiter_workspace&, arbiter_algorithm);
//   Status run(arbiter_workspace&, const arbiter_allreduce_args*, void* stream);
//   void destroy(arbiter_workspace&);              (collective teardown)
//   void abort(arbiter_workspace&);                (any thread; never blocks)
// and faults() the companion (arbiter_backend_faults_v1_t) with the
// module's build, ARBITER_MODULE_VERSION (backends/CMakeLists.txt), and
// footprint_table() the footprint companion (see footprint() below).
// Instantiate where arbiter_workspace is a complete type (Workspace is a
// parameter only so that the allocation is checked there, not here).
template <typename Impl, typename Workspace = arbiter_workspace>
struct BackendEntries {
  static std::string& error() {
    thread_local std::string message;
    return message;
  }
  static std::int32_t fail(const Status& s) { return report(error(), Impl::kName, s); }

  static std::int32_t probe(const arbiter_probe_args* args, arbiter_backend_caps* caps) {
    return guarded(error(), Impl::kName, [&] {
      if (args == nullptr || caps == nullptr) {
        return fail(Status(ARBITER_INVALID_ARGUMENT, "probe: args and caps must not be NULL"));
      }
      return fail(Impl::probe(*args, caps));
    });
  }
  static std::int32_t create(const arbiter_oob* oob, const arbiter_workspace_spec* spec,
                             arbiter_workspace** out) {
    return guarded(error(), Impl::kName, [&] {
      if (out == nullptr) return fail(Status(ARBITER_INVALID_ARGUMENT, "out is NULL"));
      *out = nullptr;
      if (oob == nullptr || spec == nullptr || oob->allgather == nullptr ||
          oob->barrier == nullptr) {
        return fail(
            Status(ARBITER_INVALID_ARGUMENT, "oob, its functions and spec must not be NULL"));
      }
      auto* ws = new Workspace();
      if (Status s = Impl::create_workspace(*oob, *spec, *ws); !s.ok()) {
        delete ws;
        return fail(s);
      }
      *out = ws;
      return std::int32_t{ARBITER_OK};
    });
  }
  static std::uint64_t max_message_bytes(const arbiter_workspace* ws, arbiter_algorithm algorithm) {
    return ws == nullptr ? 0 : Impl::max_message_bytes(*ws, algorithm);
  }
  static std::int32_t run(arbiter_workspace* ws, const arbiter_allreduce_args* args, void* stream) {
    return guarded(error(), Impl::kName, [&] {
      if (ws == nullptr) return fail(Status(ARBITER_INVALID_ARGUMENT, "workspace is NULL"));
      return fail(Impl::run(*ws, args, stream));
    });
  }
  static void destroy(arbiter_workspace* ws) {
    if (ws == nullptr) return;
    guarded(error(), Impl::kName, [&] {
      Impl::destroy(*ws);
      return std::int32_t{ARBITER_OK};
    });
    delete ws;
  }
  static const char* last_error() { return error().c_str(); }
  static void abort(arbiter_workspace* ws) {
    if (ws == nullptr) return;
    try {
      Impl::abort(*ws);
    } catch (...) {
      // abort() never throws; nothing to report through a void entry point.
    }
  }

#ifdef ARBITER_MODULE_VERSION
  static constexpr arbiter_backend_faults_v1_t faults() {
    return arbiter_backend_faults_v1_t{1, ARBITER_MODULE_VERSION, &abort};
  }
#endif

  // The footprint companion's entry, for an Impl that also provides
  //   Status footprint(const arbiter_workspace_spec&, arbiter_footprint*);
  // (pure: no device, no driver; fills *out only when it succeeds).
  static std::int32_t footprint(const arbiter_workspace_spec* spec, arbiter_footprint* out) {
    return guarded(error(), Impl::kName, [&] {
      if (spec == nullptr || out == nullptr) {
        return fail(Status(ARBITER_INVALID_ARGUMENT, "footprint: spec and out must not be NULL"));
      }
      return fail(Impl::footprint(*spec, out));
    });
  }
  static constexpr arbiter_backend_footprint_v1_t footprint_table() {
    return arbiter_backend_footprint_v1_t{1, 0, &footprint};
  }

  // The registered-memory companion (ABI v2, arbiter_backend_memory_v2_t),
  // for an Impl that also provides
  //   std::uint64_t kRegisteredAlignment;
  //   Status alloc_registered(arbiter_workspace&, std::uint64_t bytes, void** local);
  //   Status free_registered(arbiter_workspace&, void* local);
  //   Status run_registered(arbiter_workspace&, const arbiter_allreduce_args*, void* stream);
  static std::int32_t alloc_registered(arbiter_workspace* ws, std::uint64_t bytes, void** local) {
    return guarded(error(), Impl::kName, [&] {
      if (ws == nullptr || local == nullptr) {
        return fail(
            Status(ARBITER_INVALID_ARGUMENT, "alloc: workspace and local must not be NULL"));
      }
      *local = nullptr;
      return fail(Impl::alloc_registered(*ws, bytes, local));
    });
  }
  static std::int32_t free_registered(arbiter_workspace* ws, void* local) {
    return guarded(error(), Impl::kName, [&] {
      if (ws == nullptr || local == nullptr) {
        return fail(Status(ARBITER_INVALID_ARGUMENT, "free: workspace and local must not be NULL"));
      }
      return fail(Impl::free_registered(*ws, local));
    });
  }
  static std::int32_t run_registered(arbiter_workspace* ws, const arbiter_allreduce_args* args,
                                     void* stream) {
    return guarded(error(), Impl::kName, [&] {
      if (ws == nullptr) return fail(Status(ARBITER_INVALID_ARGUMENT, "workspace is NULL"));
      return fail(Impl::run_registered(*ws, args, stream));
    });
  }
  static constexpr arbiter_backend_memory_v2_t memory_table() {
    return arbiter_backend_memory_v2_t{
        2, 0, Impl::kRegisteredAlignment, &alloc_registered, &free_registered, &run_registered};
  }

  static constexpr arbiter_backend_v1_t table() {
    return arbiter_backend_v1_t{ARBITER_BACKEND_ABI_VERSION, Impl::kName, &probe,   &create,
                                &max_message_bytes,          &run,        &destroy, &last_error};
  }
};

}  // namespace arbiter::common
