#include "nccl_library.h"

#include <dlfcn.h>
#include <link.h>

#include <filesystem>
#include <system_error>

namespace arbiter::nccl_search {
namespace {

namespace fs = std::filesystem;

using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*)

// Fills path and version from a handle of a loaded libnccl.so.2.
NcclChoice loaded(void* handle, std::string source) {
  NcclChoice c;
  c.found = true;
  c.handle = handle;
  c.source = std::move(source);
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name) {
    c.path = map->l_name;
  }
  if (auto get = reinterpret_cast<GetVersion>(dlsym(handle, "ncclGetVersion"))) {
    int v = 0;
    if (get(&v) == 0) c.version = v;
  }
  return c;
}

// dlopen of a file or soname; the loader's message on failure.
void* open(const std::string& what, std::string* error) {
  dlerror();
  void* h = dlopen(what.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    *error = e ? e : "dlopen failed";
  }
  return h;
}

// "22803" -> "2.28.3" (NCCL >= 2.9 encodes major*10000 + minor*100 + patch).
std::string version_text(int v) {
  if (v <= 0) return "of unknown version";
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

}  // namespace

NcclChoice find_nccl(const NcclSearch& search) {
  // 1. Already in the process: the module's DT_NEEDED will bind to it anyway.
  const std::string& soname = search.soname;
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    return loaded(h, "already loaded by this process");
  }
  std::string error;
  // 2. The explicit choice, without fallback.
  if (!search.explicit_path.empty()) {
    std::error_code ec;
    fs::path p(search.explicit_path);
    if (fs::is_directory(p, ec)) p /= soname;
    if (void* h = open(p.string(), &error)) return loaded(h, "ARBITER_NCCL_LIBRARY");
    NcclChoice c;
    c.reason = "ARBITER_NCCL_LIBRARY=" + search.explicit_path + " does not load (" + error +
               "): set it to a " + soname + " or the folder that holds one, or unset it";
    return c;
  }
  std::string tried = "not loaded by this process yet; ARBITER_NCCL_LIBRARY not set";
  // 3. pip's NCCL wheel.
  for (const std::string& folder : search.wheel_folders) {
    const fs::path p = fs::path(folder) / soname;
    std::error_code ec;
    if (!fs::exists(p, ec)) {
      tried += "; no " + p.lexically_normal().string();
      continue;
    }
    if (void* h = open(p.string(), &error)) return loaded(h, "the nvidia-nccl-cu13 wheel");
    tried += "; " + p.lexically_normal().string() + ": " + error;
  }
  // 4. The system.
  if (void* h = open(soname, &error)) return loaded(h, "the system's library path");
  NcclChoice c;
  c.reason = soname + " not found (" + tried + "; system: " + error +
             "): install NCCL (pip install nvidia-nccl-cu13, or the system's package), "
             "import torch first, or set ARBITER_NCCL_LIBRARY to a " +
             soname;
  return c;
}

NcclChoice loaded_by_module(const std::string& soname) {
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    return loaded(h, "the nccl module's RUNPATH");
  }
  return {};
}

std::string describe(const NcclChoice& c) {
  return std::string(kSoname) + " " + version_text(c.version) + " (" + c.path + "; " + c.source +
         ")";
}

}  // namespace arbiter::nccl_search
