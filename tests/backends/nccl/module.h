// The nccl module as the host loads it: dlopen()ed from the plugin folder of
// the build, its v1 entry looked up by name.
#pragma once

#include <dlfcn.h>

#include <string>

#include "arbiter_backend.h"

namespace arbiter::test {

inline std::string nccl_module_path() {
  return std::string(ARBITER_PLUGIN_DIR) + "/libarbiter-nccl.so";
}

class NcclModule {
 public:
  NcclModule() {
    handle_ = dlopen(nccl_module_path().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* e = dlerror();
      error_ = e != nullptr ? e : "dlopen failed";
      return;
    }
    api_ = static_cast<const arbiter_backend_v1_t*>(dlsym(handle_, ARBITER_BACKEND_SYMBOL_V1));
    if (api_ == nullptr) error_ = "no symbol " ARBITER_BACKEND_SYMBOL_V1;
  }
  ~NcclModule() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  NcclModule(const NcclModule&) = delete;
  NcclModule& operator=(const NcclModule&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  // NULL when the module or its symbol is missing; error() says why.
  const arbiter_backend_v1_t* api() const { return api_; }
  const std::string& error() const { return error_; }

 private:
  void* handle_ = nullptr;
  const arbiter_backend_v1_t* api_ = nullptr;
  std::string error_;
};

}  // namespace arbiter::test
