// Where the nccl module's libnccl.so.2 comes from (private to the registry).
//
// The module needs libnccl.so.2 by soname (DT_NEEDED). Before the registry
// dlopens it, find_nccl() loads one NCCL in this order, first hit wins:
//   1. a libnccl.so.2 this process has already loaded (torch's, from its
//      nvidia-nccl wheel: one NCCL per process);
//   2. NcclSearch::explicit_path (ARBITER_NCCL_LIBRARY): the file, or a folder
//      holding libnccl.so.2. When set and unusable, NCCL is not found: an
//      explicit choice never falls back silently;
//   3. NcclSearch::wheel_folders: folders of pip's nvidia-nccl-cu13 wheel
//      (<site-packages>/nvidia/nccl/lib);
//   4. the system: the dynamic loader's own search (LD_LIBRARY_PATH,
//      ld.so.cache, the default folders).
// The module's DT_NEEDED then resolves to the loaded file by its soname.
// When none is found the registry still tries the module, whose RUNPATH may
// name the CUDA toolkit's lib folder (a build tree); if that fails too, the
// module is unavailable with NcclChoice::reason.
#pragma once

#include <string>
#include <vector>

namespace arbiter::nccl_search {

inline constexpr const char* kSoname = "libnccl.so.2";

struct NcclSearch {
  std::string explicit_path;               // empty: not set
  std::vector<std::string> wheel_folders;  // tried in order
  std::string soname = kSoname;            // another only in tests
};

struct NcclChoice {
  bool found = false;
  std::string path;        // the file loaded (from the loader's own records)
  std::string source;      // how it was found, e.g. "already loaded by this process"
  int version = 0;         // ncclGetVersion(), 0 when the library has none
  std::string reason;      // when not found: what was tried, and what to do
  void* handle = nullptr;  // dlopen handle; the caller keeps it open
};

NcclChoice find_nccl(const NcclSearch& search);

// "libnccl.so.2 2.28.3 (/path; already loaded by this process)", for a
// choice that was found.
std::string describe(const NcclChoice& choice);

// The libnccl.so.2 the process has loaded now (after the module pulled it
// in through its RUNPATH), with source "the nccl module's RUNPATH".
NcclChoice loaded_by_module(const std::string& soname = kSoname);

}  // namespace arbiter::nccl_search
