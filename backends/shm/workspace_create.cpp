// Workspace creation: a collective rendezvous over the host's oob.
//
//   1. allgather each rank's parameters, host identity and local verdict;
//      every rank derives the same go/no-go from the same data;
//   2. rank 0 creates the POSIX shared-memory object (random name, O_EXCL),
//      reserves its pages, lays it out, and broadcasts name and status;
//   3. the others open and map it; allgather of every rank's status (this is
//      also the barrier after which everyone has the object open);
//   4. rank 0 unlinks the name, so a crash afterwards leaves nothing behind;
//      every rank opens a pidfd for each peer's process (liveness.h), so that
//      a call waiting on a peer that died returns within milliseconds.
// The default wait policy (wait_policy.h) follows from step 1 too: every
// rank's affinity mask and cgroup CPU quota say whether each rank has a CPU
// of its own.
// A failure anywhere fails creation on every rank, with the failing rank and
// its reason in the message. Every oob call carries spec.timeout_ms.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/common/fault_injection.h"
#include "arbiter/common/liveness.h"
#include "arbiter/common/names.h"
#include "arbiter/common/numeric.h"
#include "cpu_budget.h"
#include "footprint.h"
#include "owners_threshold.h"
#include "shm_object.h"
#include "workspace.h"

namespace arbiter::shm {

namespace {

constexpr std::size_t kTextBytes = 192;
constexpr std::size_t kNameBytes = 64;
constexpr const char* kNamePrefix = "/arbiter-shm-";

// Step 1, from every rank.
struct Hello {
  std::int32_t status;
  std::int32_t rank;
  std::int32_t world_size;
  std::uint32_t dtype;
  std::uint32_t hidden;
  std::int32_t pid;
  std::uint64_t max_message_bytes;
  std::uint64_t slot_bytes;         // from max_message_bytes and hidden (0 when the spec is bad)
  std::uint64_t owners_from_bytes;  // ARBITER_SHM_OWNERS_FROM
  std::uint64_t pid_namespace;
  CpuBudget cpus;  // where this rank may run, and its cgroup's quota
  char host[kNameBytes];
  char message[kTextBytes];
};

// Step 2, from rank 0.
struct Announcement {
  std::int32_t status;
  std::uint32_t reserved;
  std::uint64_t total_bytes;
  char name[kNameBytes];
  char message[kTextBytes];
};

// Step 3, from every rank.
struct Report {
  std::int32_t status;
  char message[kTextBytes];
};

// Hostname plus boot id: two machines (or containers on two machines) with
// the same hostname still differ.
std::string host_identity() {
  char name[kNameBytes] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::strcpy(name, "?");
  return std::string(name) + "/" + common::Liveness::boot_id().substr(0, 8);
}

Status oob_failed(const arbiter_oob& oob, std::int32_t code, const char* step) {
  return shm::oob_failed(oob, code, "shm workspace creation", step);
}

// Also chooses this rank's kernels (ARBITER_SHM_ISA), wait policy
// (ARBITER_SHM_WAIT) and owners' threshold (ARBITER_SHM_OWNERS_FROM).
Status check_spec(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                  const TokenKernels** kernels, WaitRequest* wait_request,
                  std::uint64_t* owners_from_bytes) {
  if (const Status shape = check_shape(spec); !shape.ok()) return shape;
  if (oob.size != spec.world_size) {
    return {ARBITER_INVALID_ARGUMENT, "spec.world_size is " + std::to_string(spec.world_size) +
                                          " but the oob group has " + std::to_string(oob.size) +
                                          " ranks (scope the oob to the all-reduce group)"};
  }
  if (oob.rank != spec.rank) {
    return {ARBITER_INVALID_ARGUMENT, "spec.rank is " + std::to_string(spec.rank) +
                                          " but the oob says this is rank " +
                                          std::to_string(oob.rank)};
  }
  if (spec.timeout_ms <= 0) {
    return {ARBITER_INVALID_ARGUMENT,
            "timeout_ms must be positive, got " + std::to_string(spec.timeout_ms)};
  }
  if (const Status chosen = choose_token_kernels(std::getenv("ARBITER_SHM_ISA"), kernels);
      !chosen.ok()) {
    return chosen;
  }
  if (const Status chosen = choose_wait_policy(std::getenv("ARBITER_SHM_WAIT"), wait_request);
      !chosen.ok()) {
    return chosen;
  }
  if (const Status chosen =
          choose_owners_from(std::getenv("ARBITER_SHM_OWNERS_FROM"), owners_from_bytes);
      !chosen.ok()) {
    return chosen;
  }
  if (const common::Status& faults = common::FaultInjection::get().error(); !faults.ok()) {
    return faults;
  }
  return {};
}

// Step 1's verdict, computed identically on every rank from the same data.
Status judge_hellos(const std::vector<Hello>& hellos) {
  for (std::size_t rank = 0; rank < hellos.size(); ++rank) {
    if (hellos[rank].status != ARBITER_OK) {
      return {static_cast<arbiter_status>(hellos[rank].status),
              "shm workspace creation failed on rank " + std::to_string(rank) + ": " +
                  read_text(hellos[rank].message)};
    }
  }
  // The allgather orders by the group's ranks; a process whose oob.rank is
  // not its place there (two processes that both say rank 0, or a group
  // whose order is not the ranks') would share another's slots.
  for (std::size_t place = 0; place < hellos.size(); ++place) {
    if (hellos[place].rank != static_cast<std::int32_t>(place)) {
      return {ARBITER_INVALID_ARGUMENT,
              "shm workspace creation: the oob group's rank " + std::to_string(place) +
                  " says it is rank " + std::to_string(hellos[place].rank) +
                  "; every process must pass its own rank in the group, each a different one"};
    }
  }
  const Hello& first = hellos.front();
  for (std::size_t rank = 1; rank < hellos.size(); ++rank) {
    const Hello& other = hellos[rank];
    auto differ = [&](const char* field, const std::string& theirs, const std::string& ours) {
      return Status{ARBITER_INVALID_ARGUMENT,
                    std::string("shm workspace creation: ranks differ in ") + field + ": rank " +
                        std::to_string(rank) + " has " + theirs + ", rank 0 has " + ours +
                        "; every rank must create the workspace with the same spec"};
    };
    if (other.world_size != first.world_size) {
      return differ("world size", std::to_string(other.world_size),
                    std::to_string(first.world_size));
    }
    if (other.dtype != first.dtype) {
      return differ("dtype", common::dtype_text(other.dtype), common::dtype_text(first.dtype));
    }
    if (other.hidden != first.hidden) {
      return differ("hidden", std::to_string(other.hidden), std::to_string(first.hidden));
    }
    if (other.max_message_bytes != first.max_message_bytes) {
      return differ("max_message_bytes", std::to_string(other.max_message_bytes),
                    std::to_string(first.max_message_bytes));
    }
    if (other.slot_bytes != first.slot_bytes) {  // follows from the above; kept as a guard
      return differ("slot bytes", std::to_string(other.slot_bytes),
                    std::to_string(first.slot_bytes));
    }
    // Which path a call takes must agree, or its registered-outputs keys
    // would differ and every such call be refused.
    if (other.owners_from_bytes != first.owners_from_bytes) {
      return differ("ARBITER_SHM_OWNERS_FROM (bytes)", std::to_string(other.owners_from_bytes),
                    std::to_string(first.owners_from_bytes));
    }
    if (std::strncmp(other.host, first.host, kNameBytes) != 0) {
      return {ARBITER_UNAVAILABLE, "shm needs every rank on one host: rank 0 runs on " +
                                       read_text(first.host) + ", rank " + std::to_string(rank) +
                                       " on " + read_text(other.host)};
    }
  }
  return {};
}

std::uint32_t cpus_of_group(const std::vector<Hello>& hellos) {
  std::vector<CpuBudget> budgets;
  for (const Hello& hello : hellos) budgets.push_back(hello.cpus);
  return group_cpus(budgets);
}

void fill_header(void* base, const Layout& layout, const arbiter_workspace_spec& spec) {
  auto* header = static_cast<SharedHeader*>(base);
  header->magic = kMagic;
  header->layout_version = kLayoutVersion;
  header->world_size = spec.world_size;
  header->dtype = spec.dtype;
  header->slot_bytes = layout.slot_bytes;
  header->total_bytes = layout.total;
  header->fault = 0;
  header->sleepers = 0;
}

// Step 2 on rank 0. On success `name` is linked and `*base` mapped; on
// failure neither exists any more.
Status create_object(const Layout& layout, const arbiter_workspace_spec& spec, std::string& name,
                     void** base) {
  Status status = create_shm_object(kNamePrefix, layout.total, "", name, base);
  if (status.ok()) fill_header(*base, layout, spec);
  return status;
}

// Step 3 on ranks other than 0.
Status map_object(const std::string& name, const Layout& layout, const arbiter_workspace_spec& spec,
                  void** base) {
  if (Status status = map_shm_object(name, layout.total, ARBITER_INTERNAL,
                                     "expected " + std::to_string(layout.total), base);
      !status.ok()) {
    return status;
  }
  const auto* header = static_cast<const SharedHeader*>(*base);
  if (header->magic != kMagic || header->layout_version != kLayoutVersion ||
      header->world_size != spec.world_size || header->dtype != spec.dtype ||
      header->slot_bytes != layout.slot_bytes || header->total_bytes != layout.total) {
    munmap(*base, layout.total);
    *base = nullptr;
    return {ARBITER_INTERNAL, name + " does not hold the workspace this rank expects"};
  }
  return {};
}

// A single rank's workspace: the same layout in anonymous private memory.
// Its algorithms meet no peer (every barrier and wait passes at once).
Status create_private(const arbiter_oob& oob, const Layout& layout,
                      const arbiter_workspace_spec& spec, const TokenKernels& kernels,
                      Workspace** out) {
  void* base =
      mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    const std::string call = "mmap of " + std::to_string(layout.total) + " private bytes";
    return {ARBITER_UNAVAILABLE, "shm workspace creation: " + errno_text(call)};
  }
  fill_header(base, layout, spec);
  try {
    *out = new Workspace(base, layout, 0, 1, spec.dtype, spec.timeout_ms, kernels, nullptr);
    (*out)->oob = &oob;
  } catch (...) {
    munmap(base, layout.total);
    throw;
  }
  return {};
}

}  // namespace

Status create_workspace(const arbiter_oob& oob, const arbiter_workspace_spec& spec,
                        Workspace** out) {
  *out = nullptr;
  const std::int64_t timeout = spec.timeout_ms;
  const std::size_t ranks = oob.size > 0 ? static_cast<std::size_t>(oob.size) : 1;

  // 1. Parameters and local verdicts.
  Hello hello{};
  const TokenKernels* kernels = &kScalarKernels;
  WaitRequest wait_request = WaitRequest::kAuto;
  std::uint64_t owners_from_bytes = kDefaultOwnersFromBytes;
  const Status local = check_spec(oob, spec, &kernels, &wait_request, &owners_from_bytes);
  hello.status = local.code();
  hello.rank = oob.rank;
  hello.world_size = spec.world_size;
  hello.dtype = spec.dtype;
  hello.hidden = spec.hidden;
  hello.pid = static_cast<std::int32_t>(getpid());
  hello.max_message_bytes = spec.max_message_bytes;
  hello.pid_namespace = common::Liveness::own_pid_namespace();
  hello.cpus = own_cpu_budget();
  // Sized by layout_for(), as the footprint companion reports it.
  hello.slot_bytes = local.ok() ? layout_for(spec).slot_bytes : 0;
  hello.owners_from_bytes = owners_from_bytes;
  copy_text(hello.host, host_identity());
  copy_text(hello.message, local.message());
  std::vector<Hello> hellos(ranks);
  common::FaultInjection::get().at("shm.create.hello", oob.rank, 0);
  std::int32_t code = oob.allgather(oob.ctx, &hello, hellos.data(), sizeof(Hello), timeout);
  if (code != ARBITER_OK) return oob_failed(oob, code, "allgather of workspace parameters");
  if (Status verdict = judge_hellos(hellos); !verdict.ok()) return verdict;
  // The verdict saw a world size > 0; a slot is at most max(1 MiB, one row of
  // at most 16 GiB): always a layout.
  const Layout layout = *compute_layout(spec.world_size, hello.slot_bytes);

  // A group of one shares nothing: private memory, no /dev/shm object.
  if (spec.world_size == 1) return create_private(oob, layout, spec, *kernels, out);
  // (One rank never waits: its policy does not matter.)
  const WaitPolicy wait_policy =
      resolve_wait_policy(wait_request, spec.world_size, cpus_of_group(hellos));

  // 2. Rank 0 creates; everyone learns the name or why there is none.
  Announcement announcement{};
  std::string name;
  void* base = nullptr;
  if (spec.rank == 0) {
    const Status created = create_object(layout, spec, name, &base);
    announcement.status = created.code();
    announcement.total_bytes = layout.total;
    copy_text(announcement.name, name);
    copy_text(announcement.message, created.message());
  }
  auto abandon = [&] {
    if (base != nullptr) munmap(base, layout.total);
    if (spec.rank == 0 && announcement.status == ARBITER_OK) shm_unlink(name.c_str());
  };
  code = oob.broadcast(oob.ctx, &announcement, sizeof announcement, 0, timeout);
  if (code != ARBITER_OK) {
    abandon();
    return oob_failed(oob, code, "broadcast of the shared-memory name");
  }
  if (announcement.status != ARBITER_OK) {
    return {static_cast<arbiter_status>(announcement.status),
            "shm workspace creation: rank 0 could not create the shared memory (" +
                std::to_string(layout.total) + " bytes): " + read_text(announcement.message)};
  }
  name = read_text(announcement.name);

  // 3. Everyone else maps it; the allgather is the barrier after which
  // every rank holds the object (or has said why not).
  Report report{};
  if (spec.rank != 0) {
    const Status mapped = map_object(name, layout, spec, &base);
    report.status = mapped.code();
    copy_text(report.message, mapped.message());
  }
  std::vector<Report> reports(ranks);
  common::FaultInjection::get().at("shm.create.mapped", oob.rank, 0);
  code = oob.allgather(oob.ctx, &report, reports.data(), sizeof(Report), timeout);
  // 4. Nobody opens it by name any more. Rank 0 removes the name; after a
  // failed exchange every rank that knows it does too (rank 0 may have
  // stopped or died after the others mapped it, and would leave it behind).
  if (spec.rank == 0 || code != ARBITER_OK) shm_unlink(name.c_str());
  if (code != ARBITER_OK) {
    if (base != nullptr) munmap(base, layout.total);
    return oob_failed(oob, code, "allgather of mapping results");
  }
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    if (reports[rank].status != ARBITER_OK) {
      if (base != nullptr) munmap(base, layout.total);
      return {static_cast<arbiter_status>(reports[rank].status),
              "shm workspace creation: rank " + std::to_string(rank) + " could not map " + name +
                  ": " + read_text(reports[rank].message)};
    }
  }
  try {
    std::vector<std::int32_t> pids;
    std::vector<std::uint64_t> namespaces;
    for (const Hello& h : hellos) {
      pids.push_back(h.pid);
      namespaces.push_back(h.pid_namespace);
    }
    *out = new Workspace(base, layout, spec.rank, spec.world_size, spec.dtype, timeout, *kernels,
                         std::make_unique<common::Liveness>(spec.rank, pids, namespaces));
    (*out)->oob = &oob;
    (*out)->wait_policy = wait_policy;
    (*out)->owners_from_bytes = owners_from_bytes;
  } catch (...) {
    munmap(base, layout.total);
    throw;
  }
  return {};
}

}  // namespace arbiter::shm
