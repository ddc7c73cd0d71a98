#include "module_dir.h"

#include <dlfcn.h>
#include <ucs/config/global_opts.h>
#include <ucs/type/status.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

namespace arbiter::bootstrap {

void confine_ucx_modules() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* set = std::getenv("UCX_MODULE_DIR"); set != nullptr && *set != '\0') return;
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&ucs_status_string), &info) || info.dli_fname == nullptr) {
      return;
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path beside =
        fs::weakly_canonical(fs::path(info.dli_fname).parent_path() / "ucx", ec);
    const char* compiled = ucs_global_opts.module_dir;
    if (compiled != nullptr && fs::weakly_canonical(compiled, ec) == beside) return;
    // The search paths are fixed at the first module load, which comes later.
    (void)ucs_global_opts_set_value("MODULE_DIR", beside.c_str());
  });
}

}  // namespace arbiter::bootstrap
