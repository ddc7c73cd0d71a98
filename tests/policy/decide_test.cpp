// decide() (precomputed routes) and explain() (the rule walk) must agree on
// every request, for every table; decide() allocates nothing.
#define BOOST_TEST_MODULE policy_decide
#include <boost/test/unit_test.hpp>

#include "print.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "arbiter/policy.h"
#include "arbiter/size.h"

namespace {
std::atomic<long> g_allocations{0};
}

// Count every allocation in this test program.
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
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
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using namespace arbiter;

namespace {

Policy with(const std::string& yaml, std::optional<std::string> env = std::nullopt) {
  LoadOptions o;
  if (!yaml.empty()) o.overrides.yaml("site.yaml", yaml);
  o.backends_env = std::move(env);
  return Policy::load_or_throw(o);
}

std::vector<Policy> policies() {
  return {
      with(""),
      with("format: 1\nfusion:\n"
           "  - {capability: 103, world_size: 16, nodes: 4, pattern: allreduce, max: 8MiB}\n"
           "  - {capability: 103, world_size: 8, nodes: 2, pattern: allreduce, max: 64MiB}\n"
           "  - {capability: 100, world_size: 4, dtype: fp32, max: off}\n"
           "  - {capability: 90, world_size: 2, pattern: residual_rmsnorm_fp8, max: 3MiB}\n"),
      with("format: 1\nfusion:\n"
           "  - {capability: 90, world_size: 2, residual: replicated, max: 128MiB}\n"
           "  - {capability: cpu, world_size: 4, residual: replicated, dtype: bf16, max: 1}\n"
           "oneshot:\n"
           "  default: oneshot\n"
           "  cells:\n"
           "    - {capability: cpu, world_size: 2, residual: replicated, max: 4KiB}\n"
           "    - {capability: 90, world_size: 2, residual: replicated, max: 64KiB}\n"),
      with("format: 1\noneshot: {default: twoshot}\n"
           "fusion: [{capability: 90, world_size: 6, max: 1}]\n"),
      with("format: 1\npreference: {single_node: [mnnvl, trtllm]}\n"
           "backends: {trtllm: {world_sizes: [2, 8]}, nccl: {world_sizes: {min: 2, max: 8}}}\n"),
      with("", std::string("trtllm,nccl")),
      with("", std::string("mnnvl")),
  };
}

// Sizes around every edge of the default tables and a few beyond.
std::vector<std::uint64_t> sizes() {
  std::vector<std::uint64_t> out = {0, 1, 4096, 1000000, kTiB, kTiB + 1};
  for (std::uint64_t base : {kMiB / 2, kMiB, 2 * kMiB, 3 * kMiB, 4 * kMiB, 8 * kMiB, 32 * kMiB,
                             64 * kMiB, 64 * kKiB, 128 * kKiB, 256 * kKiB, 512 * kKiB}) {
    out.push_back(base - 1);
    out.push_back(base);
    out.push_back(base + 1);
  }
  return out;
}

// Built once, before any allocation is counted.
const std::vector<std::uint64_t> all_sizes = sizes();

template <class Fn>
void for_each_request(Fn&& fn) {
  const std::uint16_t caps[] = {0, 80, 90, 100, 103, 107, 120};
  const std::uint32_t world_sizes[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 17, 64, 65, 2000};
  for (std::uint16_t code : caps) {
    const Capability cap = code == 0 ? Capability::cpu() : Capability::sm(code);
    for (std::uint32_t ws : world_sizes) {
      for (std::uint32_t nodes : {0u, 1u, 2u, 4u, 9u}) {
        for (int flags = 0; flags < 8; ++flags) {
          for (int pt = 0; pt < kPatternCount; ++pt) {
            for (int dt = 0; dt < kDtypeCount; ++dt) {
              for (std::uint64_t bytes : all_sizes) {
                for (std::uint32_t tokens : {0u, 3u}) {
                  for (std::uint32_t excluded : {0u, 2u}) {
                    Request r;
                    r.capability = cap;
                    r.world_size = ws;
                    r.nodes = nodes;
                    r.nvlink_domain = flags & 1;
                    r.multicast = flags & 2;
                    r.residual_replicated = flags & 4;
                    r.pattern = static_cast<Pattern>(pt);
                    r.dtype = static_cast<Dtype>(dt);
                    r.message_bytes = bytes;
                    r.tokens = tokens;
                    r.excluded_backends = excluded;
                    fn(r);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(decide_agrees_with_explain_on_every_request) {
  long checked = 0, mismatched = 0;
  for (const Policy& p : policies()) {
    for_each_request([&](const Request& r) {
      const Decision fast = p.decide(r);
      const Decision full = p.explain(r);
      ++checked;
      const bool same = fast.backend == full.backend && fast.algorithm == full.algorithm &&
                        fast.fused == full.fused && fast.reason == full.reason &&
                        fast.cap == full.cap && fast.fusion_origin == full.fusion_origin &&
                        fast.oneshot_origin == full.oneshot_origin && fast.trace.size() == 0;
      if (!same && ++mismatched <= 5) {
        BOOST_ERROR("decide != explain for " << p.explain_text(r, full) << "decide said "
                                             << backend_name(fast.backend) << " "
                                             << algorithm_name(fast.algorithm) << " reason "
                                             << static_cast<int>(fast.reason));
      }
    });
  }
  BOOST_TEST(mismatched == 0);
  BOOST_TEST_MESSAGE("checked " << checked << " requests");
  BOOST_TEST(checked > 1000000);
}

// fused_choice(): what decide() runs fused, wherever decide() fuses; the
// same walk above the cap (for `arbiter tune`, which weighs that option).
BOOST_AUTO_TEST_CASE(fused_choice_is_the_fused_decision_without_the_cap) {
  long fused = 0, n = 0;
  for (const Policy& p : policies()) {
    for_each_request([&](const Request& r) {
      if (++n % 8 != 0) return;  // a sample keeps the suite quick
      const Decision d = p.decide(r);
      const Decision choice = p.fused_choice(r);
      if (d.fused) {
        ++fused;
        if (!choice.same_choice(d))
          BOOST_ERROR("fused_choice != decide for " << p.explain_text(r, d));
      }
      if (choice.backend == Backend::kNone && d.fused) BOOST_ERROR("no fused choice, but fused");
      BOOST_TEST_REQUIRE(choice.trace.size() == 0);
    });
  }
  BOOST_TEST(fused > 10000);
  Request r;
  r.capability = Capability::sm(100);
  r.world_size = 4;
  r.message_bytes = kTiB;  // far above the default cap
  BOOST_TEST(!with("").decide(r).fused);
  const Decision above = with("").fused_choice(r);
  BOOST_TEST((above.backend == Backend::kTrtllm && above.algorithm == Algorithm::kTwoshot));
  BOOST_TEST(above.fused);
  r.nodes = 2;  // no NVLink domain: nothing fused is eligible
  BOOST_TEST((with("").fused_choice(r).backend == Backend::kNone));
}

// Each band of sweep() says what decide() says at both of its ends, reason
// and cap included, and no two adjacent bands say the same. Bands merged on
// the choice alone labelled "above the cap" sizes with the reason of those
// below it ("no eligible fused backend", where ARBITER_BACKENDS left only
// the fallback).
BOOST_AUTO_TEST_CASE(every_sweep_band_says_what_decide_says_at_both_ends) {
  long bands = 0, n = 0;
  auto same = [](const Decision& a, const Decision& b) {
    return a.same_choice(b) && a.reason == b.reason && a.cap == b.cap;
  };
  for (const Policy& p : policies()) {
    for_each_request([&](Request r) {
      if (r.message_bytes != 0 || ++n % 16 != 0) return;  // a sample keeps the suite quick
      const std::vector<Band> swept = sweep(p, r, 1, 128 * kMiB);
      for (std::size_t i = 0; i < swept.size(); ++i) {
        ++bands;
        for (std::uint64_t at : {swept[i].first, swept[i].last}) {
          r.message_bytes = at;
          if (!same(p.decide(r), swept[i].decision)) {
            BOOST_ERROR("band " << swept[i].first << ".." << swept[i].last << " disagrees with "
                                << p.explain_text(r, p.explain(r)));
          }
        }
        if (i > 0 && same(swept[i - 1].decision, swept[i].decision)) {
          BOOST_ERROR("bands " << i - 1 << " and " << i << " say the same");
        }
      }
    });
  }
  BOOST_TEST(bands > 1000);
}

BOOST_AUTO_TEST_CASE(decide_never_allocates) {
  const std::vector<Policy> all = policies();
  long decisions = 0;
  long allocations[3] = {0, 0, 0};
  for (const Policy& p : all) {
    long before = g_allocations.load();
    for_each_request([&](const Request& r) { decisions += p.decide(r).fused; });
    allocations[0] += g_allocations.load() - before;
    before = g_allocations.load();
    for_each_request([&](const Request& r) { decisions += p.max_fused_bytes(r).has_value(); });
    allocations[1] += g_allocations.load() - before;
    before = g_allocations.load();
    // The trace is fixed-size too.
    for_each_request([&](const Request& r) { decisions += p.explain(r).trace.size(); });
    allocations[2] += g_allocations.load() - before;
  }
  BOOST_TEST(allocations[0] == 0);
  BOOST_TEST(allocations[1] == 0);
  BOOST_TEST(allocations[2] == 0);
  BOOST_TEST(decisions > 0);
}

BOOST_AUTO_TEST_CASE(an_excluded_backend_hands_the_call_to_the_next_choice) {
  const Policy p = with("format: 1\npreference: {single_node: [trtllm, mnnvl]}\n");
  Request r;
  r.capability = Capability::sm(100);
  r.world_size = 4;
  r.multicast = true;
  r.message_bytes = kMiB;
  BOOST_TEST(p.decide(r).backend == Backend::kTrtllm);
  r.excluded_backends = 1u << static_cast<int>(Backend::kTrtllm);
  BOOST_TEST(p.decide(r).backend == Backend::kMnnvl);
  r.excluded_backends |= 1u << static_cast<int>(Backend::kMnnvl);
  const Decision d = p.explain(r);
  BOOST_TEST(d.backend == Backend::kNccl);
  BOOST_TEST(p.explain_text(r, d).find("excluded by the caller") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(invalid_requests_fall_back_without_crashing) {
  const Policy p = with("");
  for (auto [ws, nodes] : {std::pair{0u, 1u}, {1u, 2u}, {4u, 0u}, {4u, 5u}}) {
    Request r;
    r.capability = Capability::sm(100);
    r.world_size = ws;
    r.nodes = nodes;
    r.message_bytes = 1;
    const Decision d = p.decide(r);
    BOOST_TEST(!d.fused);
    BOOST_TEST((d.reason == Reason::kInvalidRequest || d.reason == Reason::kNoBackend));
  }
  // Capabilities only C++ can make (every parser refuses them): the lookups
  // read their low byte, so 356 decided as 100, and 256 as cpu (shm for a
  // GPU rank) on the fast path while explain() said trtllm.
  for (std::uint16_t code : {1, 30, 49, 200, 255, 256, 356, 65535}) {
    Request r;
    r.capability = Capability::sm(code);
    r.world_size = 2;
    r.message_bytes = 512 * kKiB;
    const Decision fast = p.decide(r);
    const Decision full = p.explain(r);
    BOOST_TEST(fast.reason == Reason::kInvalidRequest, code);
    BOOST_TEST(full.reason == Reason::kInvalidRequest, code);
    BOOST_TEST((fast.backend == full.backend && !fast.fused && fast.backend != Backend::kShm),
               code);
    BOOST_TEST(!p.max_fused_bytes(r).has_value());
    BOOST_TEST(p.explain_text(r, full).find("a capability of cpu or 50..199") != std::string::npos);
  }
}
