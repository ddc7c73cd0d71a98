// Errors and warnings about tables, in the form compilers use:
//   configs/site.yaml:14:7: error: world size 1 is below 2 (hint: ...)
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace arbiter {

enum class Severity : std::uint8_t { kError = 0, kWarning = 1 };

struct Diagnostic {
  Severity severity = Severity::kError;
  std::string file;          // as given by the user, or "default.yaml" (embedded)
  std::uint32_t line = 0;    // 1-based; 0 when not about a place in a file
  std::uint32_t column = 0;  // 1-based; 0 when unknown
  std::string message;
  std::string hint;  // empty when none helps

  // "FILE:LINE:COL: error: MESSAGE (hint: HINT)"
  std::string to_string() const;
};

bool has_errors(const std::vector<Diagnostic>& diagnostics);

// Thrown at load time only (never by a decision) when tables are invalid.
class LoadError : public std::runtime_error {
 public:
  explicit LoadError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

}  // namespace arbiter
