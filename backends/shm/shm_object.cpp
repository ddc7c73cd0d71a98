#include "shm_object.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>

namespace arbiter::shm {

std::string errno_text(const std::string& call) { return call + ": " + std::strerror(errno); }

Status oob_failed(const arbiter_oob& oob, std::int32_t code, const char* who, const char* step) {
  const bool known = code > ARBITER_OK && code <= ARBITER_INTERNAL;
  const char* reason = oob.last_error ? oob.last_error(oob.ctx) : nullptr;
  return {known ? static_cast<arbiter_status>(code) : ARBITER_INTERNAL,
          std::string(who) + ": oob " + step + " failed (code " + std::to_string(code) +
              "): " + (reason != nullptr && *reason != '\0' ? reason : "no reason given")};
}

Status create_shm_object(const char* prefix, std::uint64_t bytes, const char* full_hint,
                         std::string& name, void** base) {
  std::random_device random;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
    name = std::string(prefix) + suffix;
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) return {ARBITER_UNAVAILABLE, errno_text("shm_open")};
  }
  if (fd < 0) return {ARBITER_UNAVAILABLE, "shm_open: no free name after 16 attempts"};
  Status status;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    status = {ARBITER_UNAVAILABLE, errno_text("ftruncate")};
  } else if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
             error != 0 && error != EOPNOTSUPP && error != EINVAL) {
    // Reserve the pages now: on a full /dev/shm a later first touch would
    // kill the process with SIGBUS instead of failing here.
    status = {ARBITER_UNAVAILABLE, "posix_fallocate(" + std::to_string(bytes) +
                                       " bytes) on /dev/shm: " + std::strerror(error) + full_hint};
  } else if (*base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             *base == MAP_FAILED) {
    *base = nullptr;
    status = {ARBITER_UNAVAILABLE, errno_text("mmap")};
  }
  close(fd);
  if (!status.ok()) shm_unlink(name.c_str());
  return status;
}

Status map_shm_object(const std::string& name, std::uint64_t bytes, arbiter_status wrong_size,
                      const std::string& expected, void** base) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return {ARBITER_UNAVAILABLE, errno_text("shm_open(" + name + ")")};
  struct stat info {};
  Status status;
  if (fstat(fd, &info) != 0) {
    status = {ARBITER_UNAVAILABLE, errno_text("fstat")};
  } else if (static_cast<std::uint64_t>(info.st_size) != bytes) {
    status = {wrong_size, name + " has " + std::to_string(info.st_size) + " bytes, " + expected};
  } else if (*base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             *base == MAP_FAILED) {
    *base = nullptr;
    status = {ARBITER_UNAVAILABLE, errno_text("mmap")};
  }
  close(fd);
  return status;
}

}  // namespace arbiter::shm
