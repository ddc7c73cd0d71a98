// A backend module as the host loads it: dlopen()ed from the plugin folder of
// the build (ARBITER_PLUGIN_DIR), its v1 entry looked up by name.
#pragma once

#include <dlfcn.h>

#include <string>

#include "arbiter_backend.h"

namespace arbiter::test {

inline std::string module_path(const std::string& name) {
  return std::string(ARBITER_PLUGIN_DIR) + "/libarbiter-" + name + ".so";
}

class BackendModule {
 public:
  explicit BackendModule(const std::string& name) : path_(module_path(name)) {
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* e = dlerror();
      error_ = e != nullptr ? e : "dlopen failed";
      return;
    }
    api_ = static_cast<const arbiter_backend_v1_t*>(dlsym(handle_, ARBITER_BACKEND_SYMBOL_V1));
    if (api_ == nullptr) error_ = "no symbol " ARBITER_BACKEND_SYMBOL_V1;
    memory_ = static_cast<const arbiter_backend_memory_v2_t*>(
        dlsym(handle_, ARBITER_BACKEND_MEMORY_SYMBOL_V2));
  }
  ~BackendModule() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  BackendModule(const BackendModule&) = delete;
  BackendModule& operator=(const BackendModule&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  // NULL when the module or its symbol is missing; error() says why.
  const arbiter_backend_v1_t* api() const { return api_; }
  // The registered-memory companion (ABI v2), or NULL.
  const arbiter_backend_memory_v2_t* memory() const { return memory_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
  const arbiter_backend_v1_t* api_ = nullptr;
  const arbiter_backend_memory_v2_t* memory_ = nullptr;
  std::string error_;
};

inline std::string nccl_module_path() { return module_path("nccl"); }

class NcclModule : public BackendModule {
 public:
  NcclModule() : BackendModule("nccl") {}
};

}  // namespace arbiter::test
