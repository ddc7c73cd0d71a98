#include "wait_policy.h"

#include <string>

namespace arbiter::shm {

Status choose_wait_policy(const char* text, WaitRequest* out) {
  const std::string name = text == nullptr ? "" : text;
  if (name.empty() || name == "auto") {
    *out = WaitRequest::kAuto;
    return {};
  }
  if (name == "yield") {
    *out = WaitRequest::kYield;
    return {};
  }
  if (name == "spin") {
    *out = WaitRequest::kSpin;
    return {};
  }
  return {ARBITER_INVALID_ARGUMENT,
          "ARBITER_SHM_WAIT='" + name +
              "' is not a wait policy; use auto (the default), yield or spin, or unset it"};
}

WaitPolicy resolve_wait_policy(WaitRequest request, std::int32_t ranks, std::uint32_t cpus) {
  switch (request) {
    case WaitRequest::kYield:
      return WaitPolicy::kYield;
    case WaitRequest::kSpin:
      return WaitPolicy::kSpin;
    case WaitRequest::kAuto:
      break;
  }
  const bool core_each = cpus > 0 && ranks > 0 && static_cast<std::uint32_t>(ranks) <= cpus;
  return core_each ? WaitPolicy::kSpin : WaitPolicy::kYield;
}

}  // namespace arbiter::shm
