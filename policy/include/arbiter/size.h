// Message sizes: exact integer bytes, never floating point.
//
// vLLM once computed 0.5 MiB as the float 524288.0 and broke an allocation;
// here "0.5" MiB parses to the integer 524288 or fails.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "arbiter/types.h"

namespace arbiter {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;
inline constexpr std::uint64_t kGiB = 1024 * kMiB;
inline constexpr std::uint64_t kTiB = 1024 * kGiB;
// Anything above this is a typo, not a message size.
inline constexpr std::uint64_t kMaxSizeBytes = kTiB;

// Parses "64", "0.5" (a plain number is MiB), "512KiB", "64 MiB", "1GiB",
// "4096B". The result must be a whole number of bytes in 1 .. 1 TiB.
// With plain_is_mib == false (the command line, benchmarks; Python follows
// the same rule) a plain number is bytes and must be a whole number:
// "524288" is accepted, "0.5" is refused with both readings spelled out
// ("0.5 what? In the tables a bare number is MiB; ... write 0.5MiB or
// 524288"), so a value pasted from a table can never mean half a byte.
Parsed<std::uint64_t> parse_size(std::string_view text, bool plain_is_mib);

// An amount of memory rather than a message (a workspace budget): the same
// grammar as parse_size() with a bare number in bytes, up to
// kMaxAmountBytes (2^63, 8388608 TiB) instead of 1 TiB.
inline constexpr std::uint64_t kMaxAmountBytes = std::uint64_t{1} << 63;
Parsed<std::uint64_t> parse_amount(std::string_view text);

// A size written as a quoted YAML string ("64 MiB", '512KiB'): a string
// carries its unit (FORMAT.md). A quoted plain number ("64", "0.5") is
// rejected: whoever quoted it may have meant bytes, and "524288" read as
// MiB would silently become 512 GiB.
Parsed<std::uint64_t> parse_size_string(std::string_view text);

// "64 MiB", "512 KiB", "1536 KiB", "3 B": the largest binary unit that
// divides the value exactly, so the text parses back to the same bytes.
std::string format_size(std::uint64_t bytes);

}  // namespace arbiter
