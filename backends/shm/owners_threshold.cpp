#include "owners_threshold.h"

#include <string>

namespace arbiter::shm {

Status choose_owners_from(const char* request, std::uint64_t* out) {
  const std::string text = request == nullptr ? "" : request;
  if (text.empty()) {
    *out = kDefaultOwnersFromBytes;
    return {};
  }
  std::size_t digits = 0;
  std::uint64_t value = 0;
  bool overflow = false;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    const std::uint64_t digit = static_cast<std::uint64_t>(text[digits] - '0');
    if (value > (UINT64_MAX - digit) / 10) overflow = true;
    value = value * 10 + digit;
    ++digits;
  }
  const std::string unit = text.substr(digits);
  const int shift = unit.empty() ? 0 : unit == "KiB" ? 10 : unit == "MiB" ? 20 : -1;
  // 1 TiB is far above any call a workspace takes.
  constexpr std::uint64_t kMax = std::uint64_t{1} << 40;
  if (digits == 0 || shift < 0 || overflow || value > (kMax >> shift)) {
    return {ARBITER_INVALID_ARGUMENT,
            "ARBITER_SHM_OWNERS_FROM='" + text +
                "' is not a size; give bytes per rank, with KiB or MiB if you like "
                "(64KiB is the default, 0 takes the owners' path at every size), or unset it"};
  }
  *out = value << shift;
  return {};
}

}  // namespace arbiter::shm
