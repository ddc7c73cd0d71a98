// libFuzzer target: the scalar parsers users type into tables and flags:
// sizes (plain numbers as MiB and as bytes, quoted sizes), capabilities and
// the closed name sets. Beyond "no crash or undefined behaviour", it checks
// that every accepted value is in range and prints back to itself, and that
// every rejection says why.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "arbiter/size.h"
#include "arbiter/types.h"
#include "fuzz_check.h"

namespace {

using namespace arbiter;

template <class E>
void check_name(std::string_view text, Parsed<E> (*parse)(std::string_view),
                std::string_view (*name)(E)) {
  const Parsed<E> r = parse(text);
  if (r.value) {
    // Closed, case-sensitive sets: only the exact name is accepted.
    ARBITER_FUZZ_CHECK(name(*r.value) == text, "a name parsed from other text");
    ARBITER_FUZZ_CHECK(r.error.empty(), "a parsed name with an error");
  } else {
    ARBITER_FUZZ_CHECK(!r.error.empty(), "a rejected name without a message");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 256) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  for (const bool plain_is_mib : {false, true}) {
    const Parsed<std::uint64_t> r = parse_size(text, plain_is_mib);
    if (!r.value) {
      ARBITER_FUZZ_CHECK(!r.error.empty(), "a rejected size without a message");
      continue;
    }
    const std::uint64_t bytes = *r.value;
    // Where a bare number is bytes, a fraction without a unit is refused.
    const bool bare = !text.empty() &&
                      (std::isdigit(static_cast<unsigned char>(text.back())) || text.back() == '.');
    ARBITER_FUZZ_CHECK(plain_is_mib || !bare || text.find('.') == std::string_view::npos,
                       "a bare fraction accepted as bytes");
    ARBITER_FUZZ_CHECK(bytes >= 1 && bytes <= kMaxSizeBytes, "a size outside 1 B .. 1 TiB");
    const std::string printed = format_size(bytes);
    const Parsed<std::uint64_t> back = parse_size(printed, false);
    ARBITER_FUZZ_CHECK(back.value && *back.value == bytes, "format_size() does not parse back");
    const Parsed<std::uint64_t> quoted = parse_size_string(printed);
    ARBITER_FUZZ_CHECK(quoted.value && *quoted.value == bytes,
                       "format_size() is not a valid quoted size");
  }
  const Parsed<std::uint64_t> quoted = parse_size_string(text);
  if (quoted.value) {
    const Parsed<std::uint64_t> plain = parse_size(text, true);
    ARBITER_FUZZ_CHECK(plain.value && *plain.value == *quoted.value,
                       "a quoted size reads differently from the same text unquoted");
  } else {
    ARBITER_FUZZ_CHECK(!quoted.error.empty(), "a rejected quoted size without a message");
  }

  const Parsed<Capability> cap = parse_capability(text);
  if (cap.value) {
    const Capability c = *cap.value;
    ARBITER_FUZZ_CHECK(
        c.is_cpu() || (c.code() >= Capability::kMinSm && c.code() <= Capability::kMaxSm),
        "a capability outside 50..199");
    const Parsed<Capability> back = parse_capability(capability_name(c));
    ARBITER_FUZZ_CHECK(back.value && *back.value == c, "capability_name() does not parse back");
  } else {
    ARBITER_FUZZ_CHECK(!cap.error.empty(), "a rejected capability without a message");
  }

  check_name<Dtype>(text, parse_dtype, dtype_name);
  check_name<Pattern>(text, parse_pattern, pattern_name);
  check_name<Backend>(text, parse_backend, backend_name);
  check_name<Algorithm>(text, parse_algorithm, algorithm_name);
  return 0;
}
