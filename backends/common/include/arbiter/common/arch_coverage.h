// Which devices a build's kernels run on, from its CUDA architectures
// (shared by every CUDA backend: probe() offers only what was compiled).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace arbiter::common {

// Whether code built for `archs` (CMake's CUDA_ARCHITECTURES entries joined
// by ',', e.g. "90a,100a,103a") runs on a device of `capability`
// (major*10+minor). "a" targets run on exactly their capability, "f" targets
// on their family (same major, minor not below), plain SASS ("-real") on the
// same major, plain PTX ("-virtual", or a bare number, which is both) on any
// later device. An entry this does not understand ("all", "native") counts
// as covering everything, and so does an empty list. Entries numbered below
// `least` do not count (a kernel that traps when compiled for them).
inline bool kernel_built_for(std::uint32_t capability, const char* archs, std::uint32_t least = 0) {
  const std::string list(archs);
  if (list.empty()) return true;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string entry = list.substr(start, end - start);
    start = end + 1;
    if (entry.empty()) continue;
    bool sass = true;
    bool ptx = true;
    if (const std::size_t dash = entry.find('-'); dash != std::string::npos) {
      const std::string kind = entry.substr(dash + 1);
      entry.resize(dash);
      sass = kind == "real";
      ptx = kind == "virtual";
    }
    std::size_t digits = 0;
    while (digits < entry.size() && entry[digits] >= '0' && entry[digits] <= '9') ++digits;
    if (digits == 0 || digits > 4) return true;
    const auto arch = static_cast<std::uint32_t>(std::stoul(entry.substr(0, digits)));
    if (arch < least) continue;
    const std::string suffix = entry.substr(digits);
    const bool same_major = capability / 10 == arch / 10 && capability >= arch;
    if (suffix == "a") {
      if (capability == arch) return true;
    } else if (suffix == "f") {
      if (same_major) return true;
    } else if (suffix.empty()) {
      if ((sass && same_major) || (ptx && capability >= arch)) return true;
    } else {
      return true;
    }
  }
  return false;
}

// Whether a build for `archs` has the NVFP4 epilogue for a device of
// `capability`. The epilogues trap when compiled for an architecture below
// 100 (refused, never a silent no-op), so only entries from 100 on count:
// PTX for compute_90 JIT-compiled on a B200 has no quantiser.
inline constexpr std::uint32_t kNvfp4MinArch = 100;
inline bool nvfp4_kernel_built_for(std::uint32_t capability, const char* archs) {
  return capability >= kNvfp4MinArch && kernel_built_for(capability, archs, kNvfp4MinArch);
}

}  // namespace arbiter::common
