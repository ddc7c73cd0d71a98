// Sizes and capabilities: what users write in tables and on the command line.
#define BOOST_TEST_MODULE policy_size
#include <boost/test/unit_test.hpp>

#include "print.h"

#include "arbiter/policy.h"
#include "arbiter/size.h"
#include "arbiter/types.h"

using namespace arbiter;

BOOST_AUTO_TEST_CASE(plain_numbers_are_mib_and_exact) {
  BOOST_TEST(*parse_size("64", true).value == 64 * kMiB);
  BOOST_TEST(*parse_size("0.5", true).value == 524288u);
  BOOST_TEST(*parse_size("1.5", true).value == 1572864u);
  BOOST_TEST(*parse_size("0.25", true).value == 262144u);
}

BOOST_AUTO_TEST_CASE(binary_units_parse) {
  BOOST_TEST(*parse_size("512KiB", true).value == 512 * kKiB);
  BOOST_TEST(*parse_size("64MiB", true).value == 64 * kMiB);
  BOOST_TEST(*parse_size("64 MiB", true).value == 64 * kMiB);
  BOOST_TEST(*parse_size("1GiB", true).value == kGiB);
  BOOST_TEST(*parse_size("1TiB", true).value == kTiB);
  BOOST_TEST(*parse_size("4096B", true).value == 4096u);
  BOOST_TEST(*parse_size("1.5MiB", true).value == 1572864u);
}

BOOST_AUTO_TEST_CASE(cli_plain_numbers_are_bytes) {
  BOOST_TEST(*parse_size("524288", false).value == 524288u);
  BOOST_TEST(*parse_size("64MiB", false).value == 64 * kMiB);
  BOOST_TEST(*parse_size("0.5MiB", false).value == 524288u);
}

// A table value pasted where bytes go: "0.5" is half a MiB in the tables and
// half a byte on the command line. Neither reading is taken; the error gives
// both spellings of what was probably meant.
BOOST_AUTO_TEST_CASE(cli_bare_fractions_are_refused_with_both_readings) {
  const Parsed<std::uint64_t> r = parse_size("0.5", false);
  BOOST_TEST(!r.value.has_value());
  BOOST_TEST(r.error.find("0.5 what?") != std::string::npos, r.error);
  BOOST_TEST(r.error.find("in the tables a bare number is MiB") != std::string::npos, r.error);
  BOOST_TEST(r.error.find("write 0.5MiB or 524288") != std::string::npos, r.error);
  // Whole-looking and tiny fractions too; no byte count when MiB is not whole bytes.
  BOOST_TEST(parse_size("64.0", false).error.find("write 64.0MiB or 67108864") !=
             std::string::npos);
  const std::string tiny = parse_size("0.0000001", false).error;
  BOOST_TEST(tiny.find("what?") != std::string::npos, tiny);
  BOOST_TEST(tiny.find(" or ") == std::string::npos, tiny);
  // The tables keep their rule.
  BOOST_TEST(*parse_size("0.5", true).value == 524288u);
}

BOOST_AUTO_TEST_CASE(bad_sizes_are_rejected_with_a_reason) {
  struct Case {
    const char* text;
    const char* words;
  } cases[] = {
      {"0", "zero"},
      {"-1", "negative"},
      {".nan", "finite"},
      {"nan", "finite"},
      {".inf", "finite"},
      {"2TiB", "1 TiB"},
      {"0.3", "whole number of bytes"},
      {"1.5B", "whole number of bytes"},
      {"64MB", "binary"},
      {"64 mb", "binary"},
      {"1e3", "exponent"},
      {"lots", "not a number"},
      {"", "empty"},
      {"64 parsecs", "unknown size unit"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT("size '" << c.text << "'") {
      Parsed<std::uint64_t> r = parse_size(c.text, true);
      BOOST_TEST(!r.value.has_value());
      BOOST_TEST(r.error.find(c.words) != std::string::npos, "message: " << r.error);
    }
  }
}

// Thirty digits times a TiB do not fit in 128 bits: such a size used to
// wrap around to a small plausible one (64 MiB, 1 TiB) and be taken. It is
// computed exactly now, however many digits it has.
BOOST_AUTO_TEST_CASE(long_sizes_are_computed_exactly_not_wrapped) {
  for (const char* text : {"3094850098213.45074828296681TiB", "309485009821345068724781057TiB",
                           "999999999999999999999999999999TiB", "999999999999999999999999999999"}) {
    BOOST_TEST_CONTEXT("size '" << text << "'") {
      const Parsed<std::uint64_t> r = parse_size(text, true);
      BOOST_TEST(!r.value.has_value(), "parsed as " << r.value.value_or(0));
      BOOST_TEST(r.error.find("1 TiB") != std::string::npos, r.error);
      BOOST_TEST(!parse_size(text, false).value.has_value());
    }
  }
  // Thirty digits that do name a plausible size still parse: 0.5 TiB
  // spelled with trailing zeros, and 1 TiB less 2 KiB as (2^29 - 1) / 2^29
  // of a TiB.
  BOOST_TEST(parse_size("0.50000000000000000000000000000TiB", true).value.value_or(0) == kTiB / 2);
  BOOST_TEST(parse_size("0.99999999813735485076904296875TiB", true).value.value_or(0) ==
             kTiB - 2 * kKiB);
  BOOST_TEST(parse_size("0.12345678901234567890123456789TiB", true).error.find("whole number") !=
             std::string::npos);
  // "0.500…0" on the command line: both readings offered, exactly.
  BOOST_TEST(parse_size("0.50000000000000000000000000000", false).error.find("or 524288") !=
             std::string::npos);
}

// An amount of memory (a workspace budget) takes the same grammar up to
// 2^63 bytes, exactly, and never wraps.
BOOST_AUTO_TEST_CASE(amounts_reach_past_a_tib_exactly) {
  BOOST_TEST(parse_amount("2TiB").value.value_or(0) == 2 * kTiB);
  BOOST_TEST(parse_amount("8388608TiB").value.value_or(0) == kMaxAmountBytes);
  BOOST_TEST(parse_amount("9223372036854775808").value.value_or(0) == kMaxAmountBytes);
  for (const char* text :
       {"8388608.5TiB", "9223372036854775809", "8388609TiB", "999999999999999999999999999999TiB"}) {
    const Parsed<std::uint64_t> r = parse_amount(text);
    BOOST_TEST(!r.value.has_value(), text << " parsed as " << r.value.value_or(0));
    BOOST_TEST(r.error.find("above 8388608 TiB") != std::string::npos, r.error);
  }
  // A bare number is bytes, as everywhere on the command line.
  BOOST_TEST(parse_amount("0.5").error.find("or 524288") != std::string::npos);
  BOOST_TEST(parse_amount("0").error.find("zero") != std::string::npos);
}

// Units above TiB are not units here; only "1e6"-like text is an exponent.
BOOST_AUTO_TEST_CASE(large_units_are_not_called_exponents) {
  for (const char* text : {"20EiB", "1EB", "2PiB"}) {
    const std::string error = parse_size(text, false).error;
    BOOST_TEST(error.find("exponent") == std::string::npos, error);
    BOOST_TEST(error.find("known units: B, KiB, MiB, GiB, TiB") != std::string::npos, error);
  }
  BOOST_TEST(parse_size("1e6", false).error.find("exponent") != std::string::npos);
  BOOST_TEST(parse_size("1E+06", false).error.find("exponent") != std::string::npos);
}

// FORMAT.md: a plain number is MiB; a string carries its unit. A quoted
// number is a string without one, and is rejected rather than read as MiB.
BOOST_AUTO_TEST_CASE(quoted_sizes_need_a_unit) {
  BOOST_TEST(*parse_size_string("64MiB").value == 64 * kMiB);
  BOOST_TEST(*parse_size_string("64 MiB").value == 64 * kMiB);
  BOOST_TEST(*parse_size_string("1.5MiB").value == 1572864u);
  BOOST_TEST(*parse_size_string("4096B").value == 4096u);
  for (const char* text : {"64", "0.5", "524288", " 64 ", "64."}) {
    BOOST_TEST_CONTEXT("size \"" << text << "\"") {
      Parsed<std::uint64_t> r = parse_size_string(text);
      BOOST_TEST(!r.value.has_value());
      BOOST_TEST(r.error.find("without a unit") != std::string::npos, "message: " << r.error);
      BOOST_TEST(r.error.find("MiB") != std::string::npos, "message: " << r.error);
    }
  }
  // Other problems keep their own message.
  BOOST_TEST(parse_size_string("64MB").error.find("binary") != std::string::npos);
  BOOST_TEST(parse_size_string("0").error.find("zero") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(quoted_unitless_size_in_a_table_is_an_error_at_its_line) {
  auto load = [](const std::string& max) {
    LoadOptions o;
    o.overrides.yaml("site.yaml", "format: 1\nfusion:\n  - {capability: 103, world_size: 8, max: " +
                                      max + "}\n");
    return Policy::load(o);
  };
  for (const char* max : {"\"64\"", "'64'", "\"0.5\""}) {
    BOOST_TEST_CONTEXT("max: " << max) {
      LoadResult r = load(max);
      BOOST_TEST(!r.policy.has_value());
      BOOST_TEST_REQUIRE(!r.diagnostics.empty());
      BOOST_TEST(r.diagnostics.front().line == 3u);
      BOOST_TEST(r.diagnostics.front().message.find("without a unit") != std::string::npos);
    }
  }
  for (const char* max : {"64", "0.5", "\"64MiB\"", "'512 KiB'", "\"off\"", "off"}) {
    BOOST_TEST_CONTEXT("max: " << max) { BOOST_TEST(load(max).policy.has_value()); }
  }
}

// 2^31 tokens x 2^31 hidden x 4 bytes once wrapped to 0 bytes and was fused.
BOOST_AUTO_TEST_CASE(tokens_times_hidden_saturates_instead_of_wrapping) {
  static_assert(Request::message_bytes_of(4096, 7168, Dtype::kBf16) == 4096u * 7168u * 2u);
  constexpr std::uint64_t kAll = ~std::uint64_t{0};
  BOOST_TEST(Request::message_bytes_of(1ull << 31, 1ull << 31, Dtype::kFp32) == kAll);
  BOOST_TEST(Request::message_bytes_of(0xFFFFFFFFull, 0xFFFFFFFFull, Dtype::kFp16) == kAll);
  BOOST_TEST(Request::message_bytes_of(1ull << 32, 1ull << 32, Dtype::kFp16) == kAll);
  BOOST_TEST(Request::message_bytes_of(1ull << 31, 1ull << 31, Dtype::kFp16) == 1ull << 63);
  BOOST_TEST(Request::message_bytes_of(0, 7168, Dtype::kFp32) == 0u);
  const Policy policy = Policy::load_or_throw(LoadOptions{});
  const Request r = Request::with_tokens(Capability::sm(103), 8, 1u << 31, 1u << 31, Dtype::kFp32,
                                         Pattern::kResidualRmsnorm);
  BOOST_TEST(!policy.decide(r).fused);
  BOOST_TEST(policy.decide(r).reason == Reason::kAboveCap);
}

BOOST_AUTO_TEST_CASE(format_size_round_trips) {
  for (std::uint64_t bytes : {std::uint64_t{1}, std::uint64_t{1000}, 512 * kKiB,
                              std::uint64_t{524289}, 64 * kMiB, 1536 * kKiB, kGiB, 3 * kTiB / 4}) {
    const std::string text = format_size(bytes);
    BOOST_TEST_CONTEXT(text) { BOOST_TEST(*parse_size(text, false).value == bytes); }
  }
  BOOST_TEST(format_size(524288) == "512 KiB");
  BOOST_TEST(format_size(64 * kMiB) == "64 MiB");
  BOOST_TEST(format_size(1572864) == "1536 KiB");
}

BOOST_AUTO_TEST_CASE(capability_spellings_normalise) {
  for (const char* text : {"103", "10.3", "sm_103", "sm103"}) {
    BOOST_TEST_CONTEXT(text) { BOOST_TEST(parse_capability(text).value->code() == 103); }
  }
  BOOST_TEST(parse_capability("9.0").value->code() == 90);
  BOOST_TEST(parse_capability("sm_90").value->code() == 90);
  BOOST_TEST(parse_capability("cpu").value->is_cpu());
}

BOOST_AUTO_TEST_CASE(unknown_capability_spellings_are_rejected) {
  // 429496740.3 and 429496739.3 wrapped around to 107 and 97 (major x 10
  // overflowed): a table cell so spelled overrode sm_107's.
  for (const char* text : {"sm_90a", "ten", "10.33", "1000", "", "10.", "sm_", "CPU", "9",
                           "429496740.3", "429496739.3", "4294967295.9", "20.0"}) {
    BOOST_TEST_CONTEXT(text) {
      Parsed<Capability> r = parse_capability(text);
      BOOST_TEST(!r.value.has_value());
      BOOST_TEST(!r.error.empty());
    }
  }
  BOOST_TEST(parse_capability("9").error.find("did you mean 90") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(unknown_names_suggest_the_closest) {
  Parsed<Backend> b = parse_backend("trtlm");
  BOOST_TEST(!b.value.has_value());
  BOOST_TEST(b.error.find("did you mean 'trtllm'") != std::string::npos);
  BOOST_TEST(*parse_pattern("residual_rmsnorm_fp4").value == Pattern::kResidualRmsnormFp4);
  BOOST_TEST(!parse_dtype("float16").value.has_value());
}
