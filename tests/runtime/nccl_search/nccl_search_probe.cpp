// Runs the runtime's NCCL search (runtime/src/nccl_library.h) once, in a
// fresh process, and prints what it chose:
//   nccl_search_probe SONAME [--explicit PATH] [--wheel FOLDER]...
//   found=1 version=22801 source=<how> path=<file>     or
//   found=0 reason=<why>
// The caller sets LD_PRELOAD (already loaded) and LD_LIBRARY_PATH (system).
#include <cstdio>
#include <string>

#include "nccl_library.h"

int main(int argc, char** argv) {
  using namespace arbiter::nccl_search;
  if (argc < 2) {
    std::fprintf(stderr, "usage: nccl_search_probe SONAME [--explicit PATH] [--wheel FOLDER]...\n");
    return 2;
  }
  NcclSearch search;
  search.soname = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--explicit") {
      search.explicit_path = argv[i + 1];
    } else if (flag == "--wheel") {
      search.wheel_folders.push_back(argv[i + 1]);
    } else {
      std::fprintf(stderr, "nccl_search_probe: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  const NcclChoice c = find_nccl(search);
  if (c.found) {
    std::printf("found=1 version=%d source=%s path=%s\n", c.version, c.source.c_str(),
                c.path.c_str());
  } else {
    std::printf("found=0 reason=%s\n", c.reason.c_str());
  }
  return 0;
}
