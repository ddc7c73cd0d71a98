#include "shm_object.h"

namespace arbiter::shm {

Status oob_failed(const arbiter_oob& oob, std::int32_t code, const char* who, const char* step) {
  const bool known = code > ARBITER_OK && code <= ARBITER_INTERNAL;
  const char* reason = oob.last_error ? oob.last_error(oob.ctx) : nullptr;
  return {known ? static_cast<arbiter_status>(code) : ARBITER_INTERNAL,
          std::string(who) + ": oob " + step + " failed (code " + std::to_string(code) +
              "): " + (reason != nullptr && *reason != '\0' ? reason : "no reason given")};
}

}  // namespace arbiter::shm
