// Status and Result<T> for backend host code: an ABI status code plus a
// message that says what to do. Host-only (std::string); nothing here crosses
// the plugin boundary but the code and a C string.
#pragma once

#include <string>
#include <utility>

#include "arbiter_backend.h"

namespace arbiter::common {

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

// A value, or the Status that says why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  const T& value() const { return value_; }

 private:
  Status status_;
  T value_{};
};

}  // namespace arbiter::common
