// Bootstrap options from the launcher's environment (torchrun's names).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "arbiter/bootstrap.h"

namespace arbiter {

namespace {

constexpr const char* kLaunchHint =
    "start the program with `arbiter launch --nproc N -- PROGRAM` or torchrun, which set "
    "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

[[noreturn]] void fail(const std::string& message) {
  throw BootstrapError(ARBITER_INVALID_ARGUMENT, "bootstrap: " + message);
}

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string require(const char* name) {
  std::optional<std::string> value = get(name);
  if (!value) fail(std::string(name) + " is not set (hint: " + kLaunchHint + ")");
  if (value->empty()) fail(std::string(name) + " is empty (hint: " + kLaunchHint + ")");
  return *value;
}

// A whole decimal number in [low, high]; no sign, blanks or suffixes.
long parse_integer(const char* name, const std::string& text, long low, long high,
                   const char* what) {
  bool digits = !text.empty() && text.size() <= 18;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  const long value = digits ? std::strtol(text.c_str(), nullptr, 10) : -1;
  if (!digits || value < low || value > high) {
    fail(std::string(name) + "='" + text + "' is not " + what + " (hint: " + kLaunchHint + ")");
  }
  return value;
}

std::chrono::milliseconds parse_seconds(const char* name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(seconds) ||
      seconds <= 0 || seconds > 7 * 24 * 3600.0) {
    fail(std::string(name) + "='" + text +
         "' is not a number of seconds above 0 (e.g. 60 or 2.5; unset it for the default)");
  }
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000.0)));
}

}  // namespace

std::string derive_job_token(const std::string& master_addr, std::uint16_t port, int world_size) {
  const std::string key =
      master_addr + ":" + std::to_string(port) + "/" + std::to_string(world_size);
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : key) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return std::string("derived-") + hex;
}

BootstrapOptions bootstrap_options_from_environment(std::chrono::milliseconds timeout) {
  BootstrapOptions o;
  constexpr long kMaxRanks = 1 << 20;
  o.world_size = static_cast<int>(
      parse_integer("WORLD_SIZE", require("WORLD_SIZE"), 1, kMaxRanks, "a whole number >= 1"));
  o.rank =
      static_cast<int>(parse_integer("RANK", require("RANK"), 0, kMaxRanks, "a whole number >= 0"));
  if (o.rank >= o.world_size) {
    fail("RANK=" + std::to_string(o.rank) + " is not below WORLD_SIZE=" +
         std::to_string(o.world_size) + " (hint: ranks are numbered 0 .. WORLD_SIZE-1)");
  }
  // Only GPU ranks need it (their device); CPU ranks started by hand may
  // leave it out.
  o.local_rank = -1;
  if (std::optional<std::string> l = get("LOCAL_RANK"); l && !l->empty()) {
    o.local_rank = static_cast<int>(
        parse_integer("LOCAL_RANK", *l, 0, kMaxRanks, "a whole number >= 0 (the GPU ordinal)"));
  }
  if (std::optional<std::string> lws = get("LOCAL_WORLD_SIZE");
      lws && !lws->empty() && o.local_rank >= 0) {
    const long local_world =
        parse_integer("LOCAL_WORLD_SIZE", *lws, 1, kMaxRanks, "a whole number >= 1");
    if (o.local_rank >= local_world) {
      fail("LOCAL_RANK=" + std::to_string(o.local_rank) +
           " is not below LOCAL_WORLD_SIZE=" + std::to_string(local_world) +
           " (hint: local ranks are numbered 0 .. LOCAL_WORLD_SIZE-1)");
    }
  }

  o.timeout = timeout;
  if (std::optional<std::string> t = get("ARBITER_BOOTSTRAP_TIMEOUT"); t && !t->empty()) {
    o.timeout = parse_seconds("ARBITER_BOOTSTRAP_TIMEOUT", *t);
  }

  // A single rank talks to nobody: no address needed.
  const bool need_address = o.world_size > 1;
  if (need_address || get("MASTER_ADDR")) {
    o.master_addr = need_address ? require("MASTER_ADDR") : *get("MASTER_ADDR");
  }
  std::optional<std::string> port_text = get("ARBITER_BOOTSTRAP_PORT");
  const char* port_name = "ARBITER_BOOTSTRAP_PORT";
  if (!port_text || port_text->empty()) {
    port_name = "MASTER_PORT";
    port_text =
        need_address ? std::optional<std::string>(require("MASTER_PORT")) : get("MASTER_PORT");
  }
  if (port_text && !port_text->empty()) {
    o.master_port = static_cast<std::uint16_t>(
        parse_integer(port_name, *port_text, 1, 65535, "a port number in 1..65535"));
  }

  if (std::optional<std::string> token = get("ARBITER_JOB_TOKEN"); token) {
    if (token->empty() || token->size() > 1024) {
      fail(
          "ARBITER_JOB_TOKEN is empty or longer than 1024 bytes (hint: unset it to derive one, "
          "or give every rank the same short random string)");
    }
    o.job_token = *token;
  } else {
    o.job_token = derive_job_token(o.master_addr, o.master_port, o.world_size);
  }
  return o;
}

}  // namespace arbiter
