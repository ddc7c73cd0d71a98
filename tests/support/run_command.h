// Runs a shell command for CLI tests and captures its output and exit code.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace arbiter::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `command` is run by /bin/sh with stderr folded into stdout.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buffer;
  std::size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Single-quotes `s` for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

// The arbiter program under test, with the environment cleared of the
// variables that would change its answers.
inline std::string arbiter_command(const std::string& args) {
  return std::string("env -u ARBITER_CONFIG -u ARBITER_BACKENDS ") + ARBITER_BIN + " " + args;
}

inline std::string data_path(const std::string& relative) {
  return std::string(ARBITER_TEST_DATA) + "/" + relative;
}

}  // namespace arbiter::test
