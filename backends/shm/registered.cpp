// Collective allocation of registered memory: rank 0 creates and reserves
// the object, broadcasts its name (or why it has none), the others map it,
// an allgather of every rank's result is the barrier after which rank 0
// unlinks the name. As workspace creation does, with less to agree on.
#include "registered.h"

#include <sys/mman.h>

#include <algorithm>

#include "arbiter/common/registered_lookup.h"
#include "shm_object.h"

namespace arbiter::shm {

namespace {

constexpr std::size_t kTextBytes = 160;

struct Announcement {
  std::int32_t status;
  char name[64];
  char message[kTextBytes];
};

struct Report {
  std::int32_t status;
  std::uint64_t bytes;  // asked for: must agree exactly, not only once rounded up
  char message[kTextBytes];
};

Status oob_failed(const arbiter_oob& oob, std::int32_t code, const char* step) {
  return shm::oob_failed(oob, code, "shm alloc", step);
}

}  // namespace

RegisteredMemory::~RegisteredMemory() {
  for (const Allocation& a : allocations_) munmap(a.base, a.total);
}

Status RegisteredMemory::allocate(const arbiter_oob& oob, std::int64_t timeout_ms,
                                  std::uint64_t bytes, void** local) {
  *local = nullptr;
  const std::uint64_t ranks = oob.size > 0 ? static_cast<std::uint64_t>(oob.size) : 1;
  const std::uint64_t stride =
      (bytes + kRegisteredAlignment - 1) / kRegisteredAlignment * kRegisteredAlignment;
  // A size no rank can take is refused on every rank together: this rank
  // still takes part in the exchanges below, so that its peers learn of it
  // at once instead of waiting out their deadline.
  Status invalid;
  if (bytes == 0 || stride < bytes || stride > (std::uint64_t{1} << 40) / ranks) {
    invalid = {ARBITER_INVALID_ARGUMENT,
               std::to_string(bytes) + " bytes per rank; ask for 1 byte to 1 TiB / ranks"};
  }
  const std::uint64_t total = stride * ranks;
  void* base = nullptr;
  if (ranks == 1) {
    if (!invalid.ok()) return {invalid.code(), "shm alloc: " + invalid.message()};
    base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return {ARBITER_UNAVAILABLE, errno_text("shm alloc: mmap")};
  } else {
    Announcement announcement{};
    std::string name;
    if (oob.rank == 0 && !invalid.ok()) {
      announcement.status = invalid.code();
      copy_text(announcement.message, "rank 0 asked for " + invalid.message());
    } else if (oob.rank == 0) {
      const Status created = create_shm_object(
          "/arbiter-shm-reg-", total, " (free space in /dev/shm, or allocate less)", name, &base);
      announcement.status = created.code();
      copy_text(announcement.name, name);
      copy_text(announcement.message, created.message());
    }
    std::int32_t code = oob.broadcast(oob.ctx, &announcement, sizeof announcement, 0, timeout_ms);
    if (code != ARBITER_OK) {
      if (base != nullptr) munmap(base, total);
      if (oob.rank == 0 && announcement.status == ARBITER_OK) shm_unlink(name.c_str());
      return oob_failed(oob, code, "broadcast of the name");
    }
    if (announcement.status == ARBITER_INVALID_ARGUMENT) {
      return {ARBITER_INVALID_ARGUMENT, "shm alloc: " + read_text(announcement.message)};
    }
    if (announcement.status != ARBITER_OK) {
      return {static_cast<arbiter_status>(announcement.status),
              "shm alloc: rank 0 could not create " + std::to_string(total) +
                  " bytes of shared memory: " + read_text(announcement.message)};
    }
    name = read_text(announcement.name);
    Report report{};
    report.bytes = bytes;
    if (oob.rank != 0 && !invalid.ok()) {
      report.status = invalid.code();
      copy_text(report.message, invalid.message());
    } else if (oob.rank != 0) {
      const Status mapped = map_shm_object(name, total, ARBITER_MISMATCH,
                                           "this rank expected " + std::to_string(total) +
                                               " (every rank must allocate the same size)",
                                           &base);
      report.status = mapped.code();
      copy_text(report.message, mapped.message());
    }
    std::vector<Report> reports(ranks);
    code = oob.allgather(oob.ctx, &report, reports.data(), sizeof(Report), timeout_ms);
    // Everyone holds it, or gave up: rank 0 removes the name, and after a
    // failed exchange so does every rank that knows it (rank 0 may have
    // stopped or died after the others mapped it, and would leave it behind).
    if (oob.rank == 0 || code != ARBITER_OK) shm_unlink(name.c_str());
    Status failed;
    if (code != ARBITER_OK) {
      failed = oob_failed(oob, code, "allgather of results");
    }
    for (std::uint64_t r = 0; r < ranks && failed.ok(); ++r) {
      if (reports[r].status == ARBITER_INVALID_ARGUMENT) {
        failed = {ARBITER_INVALID_ARGUMENT, "shm alloc: rank " + std::to_string(r) + " asked for " +
                                                read_text(reports[r].message)};
      } else if (reports[r].status != ARBITER_OK) {
        failed = {static_cast<arbiter_status>(reports[r].status),
                  "shm alloc: rank " + std::to_string(r) + " could not map " + name + ": " +
                      read_text(reports[r].message)};
      }
    }
    // Sizes that round up to the same pages mapped alike above; a view the
    // size of one rank's allocation would still cross the end of another's.
    for (std::uint64_t r = 0; r < ranks && failed.ok(); ++r) {
      if (reports[r].bytes != reports[0].bytes) {
        failed = {ARBITER_MISMATCH, "shm alloc: rank " + std::to_string(r) + " asked for " +
                                        std::to_string(reports[r].bytes) + " bytes, rank 0 for " +
                                        std::to_string(reports[0].bytes) +
                                        " (every rank must allocate the same size)"};
      }
    }
    if (!failed.ok()) {
      if (base != nullptr) munmap(base, total);
      return failed;
    }
  }
  Allocation a;
  a.serial = made_++;
  a.base = static_cast<std::byte*>(base);
  a.stride = stride;
  a.bytes = bytes;
  a.total = total;
  a.local = a.base + (ranks == 1 ? 0 : static_cast<std::uint64_t>(oob.rank) * stride);
  try {
    allocations_.push_back(a);
  } catch (...) {
    munmap(base, total);
    throw;
  }
  *local = a.local;
  return {};
}

Status RegisteredMemory::release(void* local) {
  const auto at = std::find_if(allocations_.begin(), allocations_.end(),
                               [&](const Allocation& a) { return a.local == local; });
  if (at == allocations_.end()) {
    return {ARBITER_INVALID_ARGUMENT,
            "shm free: the pointer is not the start of an allocation of this workspace (freed "
            "twice, a view into one, or another communicator's)"};
  }
  munmap(at->base, at->total);
  allocations_.erase(at);
  return {};
}

const Allocation* RegisteredMemory::find(const void* pointer, std::uint64_t bytes,
                                         std::string& why) const {
  return common::find_registered(allocations_, pointer, bytes, why,
                                 [](const Allocation&) { return true; });
}

std::uint64_t RegisteredMemory::key(const Allocation& allocation, const void* input) {
  return common::registered_key(
      allocation.serial,
      static_cast<std::uint64_t>(static_cast<const std::byte*>(input) - allocation.local));
}

}  // namespace arbiter::shm
