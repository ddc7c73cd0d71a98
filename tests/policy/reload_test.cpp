// PolicyHolder: tables reloaded while other threads decide. Readers see the
// old tables or the new ones, never a mix; a bad table changes nothing; a
// decision through the holder neither locks nor allocates. The hardening
// script runs this suite under ThreadSanitizer.
#define BOOST_TEST_MODULE policy_reload
#include <boost/test/unit_test.hpp>

#include "print.h"

#include <sys/stat.h>
#include <unistd.h>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "arbiter/policy.h"
#include "arbiter/policy_holder.h"
#include "arbiter/size.h"

using namespace arbiter;
namespace fs = std::filesystem;

// Counts the allocations a thread makes while its flag is set. Not under
// ThreadSanitizer, whose runtime defines every operator new itself (the
// other builds check that decisions allocate nothing).
#if defined(__SANITIZE_THREAD__)
#define ARBITER_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ARBITER_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef ARBITER_COUNT_ALLOCATIONS
#define ARBITER_COUNT_ALLOCATIONS 1
#endif

namespace {
thread_local bool t_count_allocations = false;
std::atomic<long> g_allocations{0};
}  // namespace

#if ARBITER_COUNT_ALLOCATIONS
// GCC 12 takes free() in a replaced operator delete for a mismatch with the
// operator new it inlined; the pair below is malloc/free throughout.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  if (t_count_allocations) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
// The other forms too, so that memory is always freed the way it was
// allocated (AddressSanitizer reports new and free mixed).
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return ::operator new(n, t);
}
void operator delete[](void* p) noexcept { ::operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { ::operator delete(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

namespace {

// Two site tables that change the decisions for the requests below, and one
// with an error.
constexpr const char* kSiteA =
    "format: 1\n"
    "fusion:\n"
    "  - {capability: 103, world_size: 8, max: 8MiB}\n"
    "  - {capability: 90, world_size: 4, max: off}\n"
    "  - {capability: 100, world_size: 16, nodes: 4, max: 4MiB}\n"
    "oneshot:\n"
    "  cells:\n"
    "    - {capability: 103, world_size: 8, max: 256KiB}\n";
constexpr const char* kSiteB =
    "format: 1\n"
    "fusion:\n"
    "  - {capability: 103, world_size: 8, max: off}\n"
    "  - {capability: 90, world_size: 4, max: 16MiB}\n"
    "  - {capability: 100, world_size: 16, nodes: 4, max: 128MiB}\n"
    "oneshot:\n"
    "  default: oneshot\n"
    "  cells:\n"
    "    - {capability: 90, world_size: 4, max: 8MiB}\n";
constexpr const char* kSiteBad =
    "format: 1\n"
    "fusion:\n"
    "  - {capability: 103, world_size: 8, max: 8MB}\n";

// Files in a fresh folder, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("arbiter-reload-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path file = path / name;
    std::ofstream(file, std::ios::binary) << text;
    return file.string();
  }
};

LoadOptions site(const std::string& file) {
  LoadOptions o;
  o.site_files = {file};
  return o;
}

Policy must_load(const LoadOptions& options) {
  LoadResult r = Policy::load(options);
  for (const Diagnostic& d : r.diagnostics) BOOST_TEST_MESSAGE(d.to_string());
  BOOST_REQUIRE(r.policy.has_value());
  return *r.policy;
}

Request request(std::uint16_t sm, std::uint32_t ws, std::uint32_t nodes, std::uint64_t bytes) {
  Request r;
  r.capability = Capability::sm(sm);
  r.world_size = ws;
  r.nodes = nodes;
  r.nvlink_domain = true;
  r.multicast = nodes > 1;
  r.message_bytes = bytes;
  return r;
}

const std::vector<Request>& requests() {
  static const std::vector<Request> all = [] {
    std::vector<Request> v;
    for (std::uint64_t bytes : {64 * kKiB, 512 * kKiB, 1 * kMiB, 4 * kMiB, 12 * kMiB}) {
      v.push_back(request(103, 8, 1, bytes));
      v.push_back(request(90, 4, 1, bytes));
      v.push_back(request(100, 16, 4, bytes));
    }
    return v;
  }();
  return all;
}

// What every request decides under one set of tables.
struct Expected {
  std::uint64_t fingerprint = 0;
  std::vector<Decision> decisions;
};

Expected expected_of(const Policy& p) {
  Expected e;
  e.fingerprint = p.fingerprint();
  for (const Request& r : requests()) e.decisions.push_back(p.decide(r));
  return e;
}

bool same(const Decision& a, const Decision& b) {
  return a.same_choice(b) && a.reason == b.reason && a.cap == b.cap &&
         a.fusion_origin == b.fusion_origin && a.oneshot_origin == b.oneshot_origin;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_two_site_tables_decide_differently) {
  TempDir dir;
  const Expected a = expected_of(must_load(site(dir.write("a.yaml", kSiteA))));
  const Expected b = expected_of(must_load(site(dir.write("b.yaml", kSiteB))));
  BOOST_TEST(a.fingerprint != b.fingerprint);
  int differ = 0;
  for (std::size_t i = 0; i < a.decisions.size(); ++i) {
    if (!a.decisions[i].same_choice(b.decisions[i])) ++differ;
  }
  // Most requests tell the versions apart, so a reader that mixed them
  // would be caught.
  BOOST_TEST(differ >= 8, differ << " of " << a.decisions.size() << " requests differ");
}

BOOST_AUTO_TEST_CASE(readers_see_one_version_or_the_other_while_a_writer_reloads) {
  TempDir dir;
  const std::string file_a = dir.write("a.yaml", kSiteA);
  const std::string file_b = dir.write("b.yaml", kSiteB);
  const std::string file_bad = dir.write("bad.yaml", kSiteBad);
  const Expected a = expected_of(must_load(site(file_a)));
  const Expected b = expected_of(must_load(site(file_b)));
  const std::map<std::uint64_t, const Expected*> by_fingerprint = {{a.fingerprint, &a},
                                                                   {b.fingerprint, &b}};

  PolicyHolder holder(must_load(site(file_a)));
  constexpr int kReaders = 6;
  constexpr int kReloads = 60;
  std::atomic<bool> done{false};

  struct ReaderStats {
    long snapshots = 0;
    long decisions = 0;
    long mismatches = 0;     // a decision that is not the one of its snapshot's version
    long unknown = 0;        // a fingerprint of neither version
    long holder_strays = 0;  // holder.decide() matching neither version
    long saw_a = 0, saw_b = 0;
    long allocations = 0;
  };
  std::array<ReaderStats, kReaders> stats{};

  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t) {
    readers.emplace_back([&, t] {
      ReaderStats& s = stats[t];
      const long before = g_allocations.load();
      // Only decisions are counted: the loop itself allocates nothing.
      t_count_allocations = true;
      std::size_t next = static_cast<std::size_t>(t);
      while (!done.load(std::memory_order_acquire)) {
        // One snapshot: its fingerprint and its decisions come from the
        // same immutable version.
        const Policy& snapshot = holder.current();
        const std::uint64_t fingerprint = snapshot.fingerprint();
        const auto it = by_fingerprint.find(fingerprint);
        ++s.snapshots;
        if (it == by_fingerprint.end()) {
          ++s.unknown;
          continue;
        }
        (it->second == &a ? s.saw_a : s.saw_b)++;
        const std::vector<Request>& all = requests();
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (!same(snapshot.decide(all[i]), it->second->decisions[i])) ++s.mismatches;
          ++s.decisions;
        }
        // The shorthand reads the current version once per call: whichever
        // it was, the answer is that version's.
        const std::size_t i = next++ % all.size();
        const Decision d = holder.decide(all[i]);
        if (!same(d, a.decisions[i]) && !same(d, b.decisions[i])) ++s.holder_strays;
      }
      t_count_allocations = false;
      s.allocations = g_allocations.load() - before;
    });
  }

  // The writer alternates the two tables, with a bad one now and then.
  std::vector<std::string> writer_errors;
  int bad_reloads = 0;
  for (int k = 1; k <= kReloads; ++k) {
    if (k % 10 == 5) {
      const std::uint64_t before = holder.fingerprint();
      const ReloadResult r = holder.reload(site(file_bad));
      ++bad_reloads;
      if (r.published || holder.fingerprint() != before) {
        writer_errors.push_back("bad table published at reload " + std::to_string(k));
      }
    }
    const ReloadResult r = holder.reload(site(k % 2 ? file_b : file_a));
    if (!r.published) writer_errors.push_back("reload " + std::to_string(k) + " failed");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  done.store(true, std::memory_order_release);
  for (std::thread& r : readers) r.join();

  BOOST_TEST(
      writer_errors.empty(),
      writer_errors.size() << " writer errors, first: "
                           << (writer_errors.empty() ? std::string() : writer_errors.front()));
  long snapshots = 0, saw_a = 0, saw_b = 0;
  for (int t = 0; t < kReaders; ++t) {
    const ReaderStats& s = stats[t];
    BOOST_TEST_CONTEXT("reader " << t << ": " << s.snapshots << " snapshots, " << s.decisions
                                 << " decisions") {
      BOOST_TEST(s.mismatches == 0);
      BOOST_TEST(s.unknown == 0);
      BOOST_TEST(s.holder_strays == 0);
      BOOST_TEST(s.allocations == 0, "decisions allocated " << s.allocations << " times");
    }
    snapshots += s.snapshots;
    saw_a += s.saw_a;
    saw_b += s.saw_b;
  }
  BOOST_TEST_MESSAGE(snapshots << " snapshots (" << saw_a << " of A, " << saw_b << " of B) during "
                               << kReloads << " reloads and " << bad_reloads << " bad ones");
  // The readers ran across the reloads and saw both versions.
  BOOST_TEST(saw_a > 0);
  BOOST_TEST(saw_b > 0);
  BOOST_TEST(holder.generation() == static_cast<std::uint64_t>(kReloads));
  BOOST_TEST(holder.retained_versions() == static_cast<std::size_t>(kReloads) + 1);
  BOOST_TEST(holder.fingerprint() == (kReloads % 2 ? b.fingerprint : a.fingerprint));
}

BOOST_AUTO_TEST_CASE(a_bad_table_changes_nothing_and_returns_its_errors) {
  TempDir dir;
  const std::string file_a = dir.write("a.yaml", kSiteA);
  const std::string file_bad = dir.write("bad.yaml", kSiteBad);
  PolicyHolder holder(must_load(site(file_a)));
  const Policy* before = &holder.current();
  const std::uint64_t fingerprint = holder.fingerprint();

  const ReloadResult r = holder.reload(site(file_bad));
  BOOST_TEST(!r.published);
  BOOST_TEST(r.generation == 0u);
  BOOST_TEST(has_errors(r.diagnostics));
  BOOST_TEST_REQUIRE(!r.diagnostics.empty());
  BOOST_TEST(r.diagnostics.front().file == file_bad);
  BOOST_TEST(r.diagnostics.front().line == 3u);
  BOOST_TEST(r.diagnostics.front().message.find("'MB'") != std::string::npos);
  BOOST_TEST(&holder.current() == before);
  BOOST_TEST(holder.fingerprint() == fingerprint);
  BOOST_TEST(holder.generation() == 0u);
  BOOST_TEST(holder.retained_versions() == 1u);

  // A file that is missing, and a good file layered with a bad one: nothing
  // either (loading is all or nothing).
  BOOST_TEST(!holder.reload(site((dir.path / "missing.yaml").string())).published);
  LoadOptions both;
  both.site_files = {file_a, file_bad};
  BOOST_TEST(!holder.reload(both).published);
  BOOST_TEST(&holder.current() == before);
  BOOST_TEST(holder.fingerprint() == fingerprint);
}

BOOST_AUTO_TEST_CASE(a_good_reload_returns_its_warnings_and_generation) {
  TempDir dir;
  PolicyHolder holder(must_load(LoadOptions{}));
  // Valid, with a warning: a one-shot cap above the fusion cap.
  const std::string warn = dir.write(
      "warn.yaml",
      "format: 1\noneshot:\n  cells:\n    - {capability: 103, world_size: 8, max: 4MiB}\n");
  const ReloadResult r = holder.reload(site(warn));
  BOOST_TEST(r.published);
  BOOST_TEST(r.generation == 1u);
  BOOST_TEST(!has_errors(r.diagnostics));
  BOOST_TEST(!r.diagnostics.empty());
  BOOST_TEST(holder.generation() == 1u);
  BOOST_TEST(holder.publish(must_load(LoadOptions{})) == 2u);
  BOOST_TEST(holder.fingerprint() == must_load(LoadOptions{}).fingerprint());
}

BOOST_AUTO_TEST_CASE(a_reference_to_an_old_version_stays_valid_across_reloads) {
  TempDir dir;
  const std::string file_a = dir.write("a.yaml", kSiteA);
  const std::string file_b = dir.write("b.yaml", kSiteB);
  PolicyHolder holder(must_load(site(file_a)));
  const Policy& old = holder.current();
  const Expected a = expected_of(old);
  for (int k = 0; k < 11; ++k) {  // ends on B
    BOOST_TEST(holder.reload(site(k % 2 == 0 ? file_b : file_a)).published);
  }
  // Still the tables of A, decided from memory the holder kept alive.
  BOOST_TEST(old.fingerprint() == a.fingerprint);
  for (std::size_t i = 0; i < requests().size(); ++i) {
    BOOST_TEST(same(old.decide(requests()[i]), a.decisions[i]));
  }
  BOOST_TEST(holder.fingerprint() != a.fingerprint);
}

// Two reloads at once: the one called last wins, whichever finishes loading
// first. Reload A reads a FIFO, so it stays inside its load until this test
// writes the (older) tables; meanwhile reload B publishes. A used to publish
// over B when it finished: the tables read earlier were left in use.
BOOST_AUTO_TEST_CASE(a_reload_called_earlier_never_replaces_one_called_later) {
  TempDir dir;
  const std::string fifo = (dir.path / "slow.yaml").string();
  BOOST_TEST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string file_b = dir.write("b.yaml", kSiteB);
  PolicyHolder holder(must_load(LoadOptions{}));
  ReloadResult a;
  std::thread slow([&] { a = holder.reload(site(fifo)); });
  // Opening for writing returns once reload A has opened the FIFO to read
  // it: A has begun (and taken its turn) before B is called.
  std::ofstream writer(fifo, std::ios::binary);
  const ReloadResult b = holder.reload(site(file_b));
  BOOST_TEST(b.published);
  BOOST_TEST(b.generation == 1u);
  writer << kSiteA;
  writer.close();
  slow.join();
  BOOST_TEST(!a.published);
  BOOST_TEST(a.superseded);
  BOOST_TEST(!has_errors(a.diagnostics));
  BOOST_TEST(a.generation == 1u);
  BOOST_TEST(holder.generation() == 1u);
  BOOST_TEST(holder.fingerprint() == must_load(site(file_b)).fingerprint());
  // A later reload of the same tables A read publishes as usual.
  BOOST_TEST(holder.reload(site(dir.write("a.yaml", kSiteA))).published);
  BOOST_TEST(holder.generation() == 2u);
}

// publish() always installs (its turn is taken under the writer lock), so
// concurrent publishes and reloads each get a generation of their own, and
// a reload is superseded only by a writer called after it.
BOOST_AUTO_TEST_CASE(concurrent_publishes_each_install_and_reloads_never_go_back) {
  TempDir dir;
  const std::string file_a = dir.write("a.yaml", kSiteA);
  const Policy a = must_load(site(file_a));
  PolicyHolder holder(must_load(LoadOptions{}));
  constexpr int kPublishers = 3, kPublishes = 100, kReloads = 20;
  std::atomic<int> installed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kPublishers; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPublishes; ++i) {
        if (holder.publish(a) > 0) installed.fetch_add(1);
      }
    });
  }
  std::atomic<int> reloaded{0}, superseded{0};
  threads.emplace_back([&] {
    for (int i = 0; i < kReloads; ++i) {
      const ReloadResult r = holder.reload(site(file_a));
      (r.published ? reloaded : superseded).fetch_add(1);
      if (r.published == r.superseded) BOOST_ERROR("published and superseded must differ");
    }
  });
  for (std::thread& t : threads) t.join();
  BOOST_TEST(installed.load() == kPublishers * kPublishes);
  BOOST_TEST(reloaded.load() + superseded.load() == kReloads);
  BOOST_TEST(holder.generation() == std::uint64_t(installed.load() + reloaded.load()));
  BOOST_TEST(holder.fingerprint() == a.fingerprint());
}
