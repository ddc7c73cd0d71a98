// Backend modules: found on disk, loaded once, probed, and recorded as
// available or "unavailable: <reason>". A broken module (missing symbol,
// unknown ABI version, failing probe) is recorded, never fatal.
//
// Thread-safety: a Registry is built once and then read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arbiter/types.h"
#include "arbiter_backend.h"

namespace arbiter {

// One module file as found and loaded.
struct ModuleInfo {
  std::string path;
  std::string name;  // from the module ("shm"); the file name if unreadable
  // The ABI the module speaks: its entry struct's version, raised to 2 when
  // it also exports the registered-memory companion (arbiter_backend_v2_memory).
  // 0 when no known entry symbol was found.
  std::uint32_t abi_version = 0;
  bool available = false;
  std::string reason;              // why not available; empty when available
  std::optional<Backend> backend;  // the policy's backend this module serves
  arbiter_backend_caps caps{};     // valid when available
  // The module's faults companion (arbiter_backend_v1_faults), or nullptr
  // for a module built before it: its workspaces cannot be aborted.
  const arbiter_backend_faults_v1_t* faults = nullptr;
  // The module's build as it reports it ("" without the companion); a
  // communicator refuses ranks that loaded different builds.
  std::string build;
  // The module's registered-memory companion (ABI v2), or nullptr (a v1
  // module: every call copies its input into the workspace).
  const arbiter_backend_memory_v2_t* memory = nullptr;
  // The module's footprint companion (arbiter_backend_v1_footprint), or
  // nullptr. Set also when probe() failed: it sizes workspaces without a
  // device, and the module's handle stays open while the Registry lives.
  const arbiter_backend_footprint_v1_t* footprint = nullptr;
  // The module's last_error(), for the footprint's refusals (with it).
  const char* (*last_error)(void) = nullptr;
  // The system library the module runs on, when it has one: for nccl
  // "libnccl.so.2 2.28.3 (/path; how it was found)". Empty otherwise.
  std::string dependency;
};

// A backend this build of arbiter did not produce, and why (e.g. no CUDA
// compiler at build time).
struct AbsentModule {
  std::string name;
  std::string reason;
};

// An entry of DiscoverOptions::search_path that cannot be searched: it does
// not exist, cannot be read, or is neither a folder nor a file.
struct SearchPathError {
  std::string place;
  std::string reason;
};

struct DiscoverOptions {
  // Folders or module files searched first, in order; by default the
  // ':'-separated ARBITER_PLUGIN_PATH.
  std::vector<std::string> search_path;
  // What search_path is called in errors about its entries.
  std::string search_path_name = "DiscoverOptions::search_path";
  // Search the install's plugin folder (next to libarbiter_runtime) after
  // search_path.
  bool default_folder = true;
  // What probe() is asked about: the rank's device kind and CUDA ordinal
  // (LOCAL_RANK; -1 for CPU ranks).
  arbiter_probe_args probe{ARBITER_DEVICE_GPU, 0};
  // Where the nccl module's libnccl.so.2 comes from, first hit wins: one this
  // process has already loaded (torch's); nccl_library (a file, or a folder
  // holding libnccl.so.2; when set and unusable the module is unavailable,
  // never a silent fallback); each of nccl_wheel_folders (pip's
  // nvidia-nccl-cu13 wheel, <site-packages>/nvidia/nccl/lib); the system's
  // library path. When none is found the module is unavailable with that
  // reason, and the other modules are unaffected.
  std::string nccl_library;
  std::vector<std::string> nccl_wheel_folders;

  // search_path from ARBITER_PLUGIN_PATH; probe.device from LOCAL_RANK;
  // nccl_library from ARBITER_NCCL_LIBRARY; nccl_wheel_folders: the wheel's
  // folder beside this install when arbiter itself is installed as a wheel.
  static DiscoverOptions from_environment();
};

class Registry {
 public:
  // Finds, loads and probes every module. Never throws for a bad module.
  static Registry discover(const DiscoverOptions& options);

  Registry(Registry&&) noexcept;
  Registry& operator=(Registry&&) noexcept;
  ~Registry();

  // Every module found, in search order.
  const std::vector<ModuleInfo>& modules() const;
  // The available module serving `backend`, or nullptr.
  const arbiter_backend_v1_t* backend(Backend backend) const;
  const ModuleInfo* info(Backend backend) const;
  // Its faults companion, or nullptr (none, or no available module).
  const arbiter_backend_faults_v1_t* faults(Backend backend) const;
  // Its registered-memory companion, or nullptr (none, or no available module).
  const arbiter_backend_memory_v2_t* memory(Backend backend) const;
  // Bit (1 << Backend) for every available backend.
  std::uint32_t available_mask() const;
  // What the modules were probed for (DiscoverOptions::probe).
  const arbiter_probe_args& probed() const;
  // search_path entries that could not be searched (the default folder is
  // not one: a build or install without modules is not an error). Skipped,
  // they would leave the modules they were meant to supply to others: a
  // communicator refuses to be created while this is not empty.
  const std::vector<SearchPathError>& search_errors() const;
  // search_errors() as one message naming each entry and the fix; "" when
  // there are none.
  std::string search_error_message() const;

  // The folder the runtime looks in by default.
  static std::string default_plugin_folder();
  // The backends this build did not produce, with the reason (fixed at
  // build time); a module of that name found on disk is still loaded.
  static std::vector<AbsentModule> not_built();

 private:
  struct Impl;
  explicit Registry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbiter
