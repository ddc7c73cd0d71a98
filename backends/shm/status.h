// Status values inside the shm module, and the per-thread message behind the
// ABI's last_error(). Nothing here crosses the plugin boundary but the code
// and a C string.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "arbiter_backend.h"

namespace arbiter::shm {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(arbiter_status code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == ARBITER_OK; }
  arbiter_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  arbiter_status code_ = ARBITER_OK;
  std::string message_;
};

// Records `status` as this thread's last error (when it is one) and returns
// its code for the ABI.
std::int32_t report(const Status& status);

// This thread's last error message; "" before any failure.
const char* last_error_message();

}  // namespace arbiter::shm
