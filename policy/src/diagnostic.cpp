#include "arbiter/diagnostic.h"

namespace arbiter {

std::string Diagnostic::to_string() const {
  std::string out = file;
  if (line != 0) {
    out += ":" + std::to_string(line);
    if (column != 0) out += ":" + std::to_string(column);
  }
  out += severity == Severity::kError ? ": error: " : ": warning: ";
  out += message;
  if (!hint.empty()) out += " (hint: " + hint + ")";
  return out;
}

bool has_errors(const std::vector<Diagnostic>& diagnostics) {
  for (const Diagnostic& d : diagnostics) {
    if (d.severity == Severity::kError) return true;
  }
  return false;
}

namespace {
std::string summary(const std::vector<Diagnostic>& diagnostics) {
  std::string out;
  for (const Diagnostic& d : diagnostics) {
    if (d.severity != Severity::kError) continue;
    if (!out.empty()) out += "\n";
    out += d.to_string();
  }
  return out.empty() ? "invalid tuning tables" : out;
}
}  // namespace

LoadError::LoadError(std::vector<Diagnostic> diagnostics)
    : std::runtime_error(summary(diagnostics)), diagnostics_(std::move(diagnostics)) {}

}  // namespace arbiter
