// Sizes and capabilities: what users write in tables and on the command line.
#define BOOST_TEST_MODULE policy_size
#include <boost/test/unit_test.hpp>

#include "print.h"

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
  for (const char* text : {"sm_90a", "ten", "10.33", "1000", "", "10.", "sm_", "CPU", "9"}) {
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
