#include "wait_policy.h"

#include <string>

namespace arbiter::shm {

Status choose_wait_policy(const char* request, WaitPolicy* out) {
  const std::string name = request == nullptr ? "" : request;
  if (name.empty() || name == "yield") {
    *out = WaitPolicy::kYield;
    return {};
  }
  if (name == "spin") {
    *out = WaitPolicy::kSpin;
    return {};
  }
  return {ARBITER_INVALID_ARGUMENT,
          "ARBITER_SHM_WAIT='" + name +
              "' is not a wait policy; use yield (the default) or spin, or unset it"};
}

}  // namespace arbiter::shm
