// One POSIX shared-memory object that the processes of a group map: one
// creates it under a fresh name, the others open that name and map it. The
// shm module's workspaces and registered memory, and the runtime's fault
// board (runtime/src/fault_board.h), are such objects.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "arbiter/common/status.h"

namespace arbiter::common {

// `call` and errno's text.
inline std::string errno_text(const std::string& call) {
  return call + ": " + std::strerror(errno);
}

// Creates and maps an object of `bytes` bytes named `prefix` + 16 hex
// digits (`name`): this process's group id (8), then random ones (8), so
// that `arbiter launch`, whose ranks lead their process groups, can remove
// what its ranks left behind once their groups are gone
// (tools/cmd_launch.cpp). Its pages are reserved (posix_fallocate: a full
// /dev/shm fails here, not with SIGBUS at the first touch; `full_hint` is
// added to that error). On failure nothing is left: no name, no mapping.
// May throw what std::random_device throws (no entropy source).
inline Status create_shm_object(const char* prefix, std::uint64_t bytes, const char* full_hint,
                                std::string& name, void** base) {
  std::random_device random;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%08x%08x", static_cast<unsigned>(getpgrp()), random());
    name = std::string(prefix) + suffix;
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST)
      return {ARBITER_UNAVAILABLE, errno_text("shm_open(" + name + ")")};
  }
  if (fd < 0) return {ARBITER_UNAVAILABLE, "shm_open: no free name after 16 attempts"};
  Status status;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    status = {ARBITER_UNAVAILABLE, errno_text("ftruncate(" + name + ")")};
  } else if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
             error != 0 && error != EOPNOTSUPP && error != EINVAL) {
    // Reserve the pages now: on a full /dev/shm a later first touch would
    // kill the process with SIGBUS instead of failing here.
    status = {ARBITER_UNAVAILABLE, "posix_fallocate(" + std::to_string(bytes) +
                                       " bytes) on /dev/shm: " + std::strerror(error) + full_hint};
  } else if (*base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             *base == MAP_FAILED) {
    *base = nullptr;
    status = {ARBITER_UNAVAILABLE, errno_text("mmap(" + name + ")")};
  }
  close(fd);
  if (!status.ok()) shm_unlink(name.c_str());
  return status;
}

// The process group that created an object of create_shm_object()'s,
// read from its name (with or without the leading '/'), or nothing when the
// name is not of that form.
inline std::optional<pid_t> shm_object_creator_group(std::string_view name) {
  if (name.size() < 16) return std::nullopt;
  const std::string_view group = name.substr(name.size() - 16, 8);
  if (group.find_first_not_of("0123456789abcdef") != std::string_view::npos) return std::nullopt;
  return static_cast<pid_t>(std::stoul(std::string(group), nullptr, 16));
}

// Opens and maps the whole of object `name`, which must hold `bytes` bytes;
// another size is `wrong_size`: "NAME has N bytes, " + `expected`.
inline Status map_shm_object(const std::string& name, std::uint64_t bytes,
                             arbiter_status wrong_size, const std::string& expected, void** base) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return {ARBITER_UNAVAILABLE, errno_text("shm_open(" + name + ")")};
  struct stat info {};
  Status status;
  if (fstat(fd, &info) != 0) {
    status = {ARBITER_UNAVAILABLE, errno_text("fstat(" + name + ")")};
  } else if (static_cast<std::uint64_t>(info.st_size) != bytes) {
    status = {wrong_size, name + " has " + std::to_string(info.st_size) + " bytes, " + expected};
  } else if (*base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             *base == MAP_FAILED) {
    *base = nullptr;
    status = {ARBITER_UNAVAILABLE, errno_text("mmap(" + name + ")")};
  }
  close(fd);
  return status;
}

}  // namespace arbiter::common
