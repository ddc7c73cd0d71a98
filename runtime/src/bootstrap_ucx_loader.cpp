#include "bootstrap_ucx_loader.h"

#include <dlfcn.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "arbiter/bootstrap.h"

namespace arbiter::bootstrap {
namespace {

namespace fs = std::filesystem;

constexpr const char* kInstallHint =
    "The UCX bootstrap needs UCX 1.x (libucp.so.0, libucs.so.0, libuct.so.0, libucm.so.0): "
    "install it (Debian/Ubuntu: apt-get install libucx0; the arbiter wheel carries its own), "
    "put the folder of a UCX build on LD_LIBRARY_PATH, or load the libucx-cu13 wheel's "
    "libraries first (import libucx; libucx.load_library()). Or give the communicator your "
    "framework's own process group (an arbiter_oob) instead of joining from the environment.";

// The folder that holds libarbiter_runtime (the library this code is in).
fs::path runtime_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&runtime_folder), &info) && info.dli_fname) {
    return fs::path(info.dli_fname).parent_path();
  }
  return {};
}

[[noreturn]] void unavailable(const std::string& message) {
  throw BootstrapError(ARBITER_UNAVAILABLE, "bootstrap: " + message);
}

const arbiter_bootstrap_ucx_v1_t* load() {
  const fs::path path = runtime_folder() / ARBITER_BOOTSTRAP_UCX_FILE;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    unavailable(path.string() +
                " is missing: this arbiter install is incomplete (reinstall it, or rebuild "
                "with UCX found at configure time)");
  }
  dlerror();
  // Never closed: UCX keeps threads and hooks that must outlive every group.
  void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) {
    const char* error = dlerror();
    unavailable("UCX is not available to join a group of several ranks (" +
                std::string(error ? error : "dlopen failed") + "). " + kInstallHint);
  }
  const auto* table =
      static_cast<const arbiter_bootstrap_ucx_v1_t*>(dlsym(dl, ARBITER_BOOTSTRAP_UCX_SYMBOL));
  if (table == nullptr) {
    unavailable(path.string() + " has no " + ARBITER_BOOTSTRAP_UCX_SYMBOL +
                " (not arbiter's UCX bootstrap library; reinstall arbiter)");
  }
  if (table->version != ARBITER_BOOTSTRAP_UCX_VERSION || table->arbiter_version == nullptr ||
      std::strcmp(table->arbiter_version, ARBITER_VERSION) != 0) {
    unavailable(path.string() + " is from arbiter " +
                (table->arbiter_version ? table->arbiter_version : "?") + ", this runtime is " +
                ARBITER_VERSION + ": the two come from different installs (reinstall arbiter)");
  }
  return table;
}

}  // namespace

const arbiter_bootstrap_ucx_v1_t& ucx_library() {
  static std::mutex mutex;
  static const arbiter_bootstrap_ucx_v1_t* table = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (table == nullptr) table = load();
  return *table;
}

}  // namespace arbiter::bootstrap
