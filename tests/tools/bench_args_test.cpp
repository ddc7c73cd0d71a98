// `arbiter bench`'s sweep and call arguments, without ranks:
// --residual-replicated puts ARBITER_RUN_RESIDUAL_REPLICATED on every call of
// a residual pattern (never on allreduce), and is refused for allreduce alone.
#define BOOST_TEST_MODULE tools_bench_args
#include <boost/test/unit_test.hpp>

#include "bench_check.h"
#include "bench_sweep.h"

using namespace arbiter;
using namespace arbiter::cli;
using namespace arbiter::cli::bench;

namespace {

Settings settings_of(std::vector<std::string> args) {
  po::options_description desc;
  add_options(desc);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(desc).run(), vm);
  po::notify(vm);
  return read_settings(vm);
}

}  // namespace

BOOST_AUTO_TEST_CASE(residual_replicated_reaches_every_residual_call) {
  Settings s = settings_of({"--residual-replicated", "--pattern",
                            "allreduce,residual_rmsnorm,residual_rmsnorm_fp8", "--tokens", "1,4"});
  BOOST_TEST(s.residual_replicated);
  resolve(s, DeviceKind::kCpu);
  const std::vector<Point> points = make_sweep(s);
  BOOST_TEST_REQUIRE(points.size() == 6u);
  Buffers buffers;
  for (const Point& p : points) {
    BOOST_TEST_CONTEXT(pattern_name(p.pattern) << " x " << p.tokens) {
      const arbiter_allreduce_args a = make_args(p, buffers);
      const bool flagged = (a.flags & ARBITER_RUN_RESIDUAL_REPLICATED) != 0;
      if (p.pattern == Pattern::kAllreduce) {
        BOOST_TEST(!p.residual_replicated);
        BOOST_TEST(!p.residual().has_value());
        BOOST_TEST(!flagged);
      } else {
        BOOST_TEST(p.residual_replicated);
        BOOST_TEST((p.residual() == Residual::kReplicated));
        BOOST_TEST(flagged);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(without_the_flag_no_call_carries_it) {
  Settings s = settings_of({"--pattern", "allreduce,residual_rmsnorm"});
  BOOST_TEST(!s.residual_replicated);
  resolve(s, DeviceKind::kCpu);
  for (const Point& p : make_sweep(s)) {
    BOOST_TEST((make_args(p, Buffers{}).flags & ARBITER_RUN_RESIDUAL_REPLICATED) == 0u);
    if (p.pattern != Pattern::kAllreduce) BOOST_TEST((p.residual() == Residual::kDistinct));
  }
}

BOOST_AUTO_TEST_CASE(residual_replicated_with_allreduce_alone_is_a_usage_error) {
  try {
    (void)settings_of({"--residual-replicated", "--pattern", "allreduce"});
    BOOST_FAIL("accepted");
  } catch (const UsageError& e) {
    BOOST_TEST(e.message.starts_with("--residual-replicated: pattern allreduce has no residual"),
               e.message);
  }
}

// A size sweep measures no size above TO: one token of hidden 4096 bf16 is
// 8 KiB, so --sizes 1KiB:2KiB measured 8 KiB, and rounding to the nearest
// token count went past TO too.
BOOST_AUTO_TEST_CASE(a_size_sweep_measures_nothing_above_its_end) {
  try {
    (void)settings_of({"--sizes", "1KiB:2KiB"});
    BOOST_FAIL("accepted");
  } catch (const UsageError& e) {
    BOOST_TEST(e.message.starts_with("--sizes: up to 2 KiB, but one token of hidden 4096 bf16 is "
                                     "8 KiB"),
               e.message);
  }
  Settings s = settings_of({"--sizes", "8KiB:40KiB", "--hidden", "3072,4096", "--dtype", "fp32"});
  resolve(s, DeviceKind::kCpu);
  const std::vector<Point> points = make_sweep(s);
  BOOST_TEST(!points.empty());
  for (const Point& p : points) BOOST_TEST(p.bytes <= 40u * 1024, p.hidden << " x " << p.tokens);
}

// --registered measures every option a second time with registered buffers:
// the same options in the same order, then their twins, each labelled so.
BOOST_AUTO_TEST_CASE(registered_adds_a_registered_twin_of_every_option) {
  BOOST_TEST(!settings_of({}).registered);
  BOOST_TEST(settings_of({"--registered"}).registered);
  const Policy policy = Policy::load_or_throw(LoadOptions{});
  const std::vector<Option> plain = options_for(policy.tables(), DeviceKind::kCpu);
  const std::vector<Option> both = options_for(policy.tables(), DeviceKind::kCpu, true);
  BOOST_TEST_REQUIRE(!plain.empty());
  BOOST_TEST_REQUIRE(both.size() == 2 * plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const Option& copied = both[i];
    const Option& twin = both[plain.size() + i];
    BOOST_TEST(!plain[i].registered);
    BOOST_TEST(!copied.registered);
    BOOST_TEST(twin.registered);
    BOOST_TEST((copied.backend == plain[i].backend && twin.backend == plain[i].backend));
    BOOST_TEST((copied.algorithm == plain[i].algorithm && twin.algorithm == plain[i].algorithm));
    BOOST_TEST((copied.fused == plain[i].fused && twin.fused == plain[i].fused));
    BOOST_TEST(twin.label() == plain[i].label() + " registered");
  }
  BOOST_TEST(both.front().label() == "shm oneshot fused");
}
