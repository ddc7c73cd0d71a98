#include "arbiter/size.h"

#include <bit>
#include <cctype>
#include <string>

namespace arbiter {
namespace {

struct Unit {
  std::string_view name;
  std::uint64_t bytes;
};
constexpr Unit kUnits[] = {{"TiB", kTiB}, {"GiB", kGiB}, {"MiB", kMiB}, {"KiB", kKiB}, {"B", 1}};
static_assert(std::has_single_bit(kTiB) && std::has_single_bit(kKiB) && kTiB == kMaxSizeBytes &&
                  std::has_single_bit(kMaxAmountBytes),
              "scaled() takes units and limits that are powers of two");

// mantissa / 10^frac_digits * unit in bytes, exactly and without overflow:
// a 30-digit mantissa times 1 TiB does not fit in 128 bits, and wrapping
// turned such a size into a small plausible one. The whole part is checked
// against the limit first; the fraction's 10^f is 5^f * 2^f, and the unit a
// power of two, so the fives must divide it and the twos become a shift.
struct Scaled {
  enum Kind { kWhole, kFraction, kTooLarge } kind;
  std::uint64_t bytes;
};
Scaled scaled(unsigned __int128 mantissa, int frac_digits, std::uint64_t unit,
              std::uint64_t limit = kMaxSizeBytes) {
  unsigned __int128 tens = 1, fives = 1;
  for (int k = 0; k < frac_digits; ++k) {
    tens *= 10;  // 10^30 < 2^100
    fives *= 5;
  }
  const unsigned __int128 whole = mantissa / tens, rest = mantissa % tens;
  const std::uint64_t most = limit / unit;  // exact: both powers of two
  if (whole > most || (whole == most && rest != 0)) return {Scaled::kTooLarge, 0};
  if (rest % fives != 0) return {Scaled::kFraction, 0};
  unsigned __int128 part = rest / fives;  // < 2^frac_digits
  const int shift = std::countr_zero(unit) - frac_digits;
  if (shift < 0) {
    if ((part & ((static_cast<unsigned __int128>(1) << -shift) - 1)) != 0) {
      return {Scaled::kFraction, 0};
    }
    part >>= -shift;
  } else {
    part <<= shift;  // < 2^(frac_digits + shift) <= unit
  }
  return {Scaled::kWhole, static_cast<std::uint64_t>(whole * unit + part)};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) {
    s.remove_prefix(1);
  }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
    s.remove_suffix(1);
  }
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "0.5" given where a bare number is bytes: say both readings and how to
// write the one that was meant.
std::string bare_fraction_error(std::string_view s, unsigned __int128 mantissa, int frac_digits) {
  const std::string number(s);
  std::string fix = "write " + number + "MiB";
  const Scaled as_mib = scaled(mantissa, frac_digits, kMiB);
  if (as_mib.kind == Scaled::kWhole && as_mib.bytes > 0) {
    fix += " or " + std::to_string(as_mib.bytes);
  }
  return "size '" + number + "': " + number +
         " what? in the tables a bare number is MiB; on the command line a bare number is bytes "
         "and must be whole: " +
         fix + " (or give the unit you meant: B, KiB, MiB, GiB, TiB)";
}

// parse_size() with another limit: `limit` bytes at most (a power of two),
// named by `too_large` when exceeded.
Parsed<std::uint64_t> parse_bytes(std::string_view text, bool plain_is_mib, std::uint64_t limit,
                                  std::string_view too_large);

}  // namespace

Parsed<std::uint64_t> parse_size(std::string_view text, bool plain_is_mib) {
  return parse_bytes(text, plain_is_mib, kMaxSizeBytes,
                     "is above 1 TiB, which is not a plausible message size");
}

Parsed<std::uint64_t> parse_amount(std::string_view text) {
  return parse_bytes(text, /*plain_is_mib=*/false, kMaxAmountBytes, "is above 8388608 TiB");
}

namespace {

Parsed<std::uint64_t> parse_bytes(std::string_view text, bool plain_is_mib, std::uint64_t limit,
                                  std::string_view too_large) {
  const std::string quoted = "'" + std::string(text) + "'";
  auto fail = [&](std::string why) { return Parsed<std::uint64_t>{std::nullopt, std::move(why)}; };
  std::string_view s = trim(text);
  if (s.empty()) return fail("empty size");
  const std::string low = lower(s);
  if (low.find("nan") != std::string::npos || low.find("inf") != std::string::npos) {
    return fail("size " + quoted + " is not a finite number of bytes");
  }
  if (s.front() == '-') return fail("size " + quoted + " is negative");
  if (s.front() == '+') s.remove_prefix(1);

  // Number: digits [. digits]
  std::size_t i = 0;
  unsigned __int128 mantissa = 0;
  int int_digits = 0, frac_digits = 0;
  bool seen_dot = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && !seen_dot) {
      seen_dot = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    if (int_digits + frac_digits >= 30) {
      return fail("size " + quoted + " has too many digits");
    }
    mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
    (seen_dot ? frac_digits : int_digits)++;
  }
  if (int_digits + frac_digits == 0) {
    // In the tables a bare number is MiB; elsewhere it is whole bytes.
    return fail("size " + quoted + " is not a number; write e.g. " +
                (plain_is_mib ? "64 (MiB), 0.5, 512KiB or 1GiB" : "4096 (bytes), 512KiB or 1GiB"));
  }
  std::string_view unit_text = s.substr(i);
  if (unit_text.starts_with(' ')) unit_text.remove_prefix(1);  // "64 MiB"
  if (!unit_text.empty() && std::isspace(static_cast<unsigned char>(unit_text.front()))) {
    return fail("size " + quoted + " has more than one space before its unit");
  }
  // Outside the tables a bare number is bytes and must be whole: a fraction
  // there is almost always a table value (MiB) pasted where bytes go, and
  // reading "0.5" as half a byte, or guessing MiB, would answer another
  // question than the one asked.
  if (unit_text.empty() && !plain_is_mib && seen_dot) {
    return fail(bare_fraction_error(s, mantissa, frac_digits));
  }
  std::uint64_t unit = plain_is_mib ? kMiB : 1;
  if (!unit_text.empty()) {
    bool found = false;
    for (const Unit& u : kUnits) {
      if (unit_text == u.name) {
        unit = u.bytes;
        found = true;
        break;
      }
    }
    if (!found) {
      const std::string lu = lower(unit_text);
      std::string why = "unknown size unit '" + std::string(unit_text) + "' in " + quoted;
      if (lu == "kb" || lu == "mb" || lu == "gb" || lu == "tb" || lu == "k" || lu == "m" ||
          lu == "g") {
        why += "; sizes are binary: write KiB, MiB or GiB";
      } else if (lu.size() > 1 && lu[0] == 'e' &&
                 (std::isdigit(static_cast<unsigned char>(lu[1])) || lu[1] == '+' ||
                  lu[1] == '-')) {  // "1e6", not "EiB"
        why += "; exponents are not accepted: write the size with a unit, e.g. 64MiB";
      } else {
        why += "; known units: B, KiB, MiB, GiB, TiB";
      }
      return fail(why);
    }
  }
  const Scaled bytes = scaled(mantissa, frac_digits, unit, limit);
  if (bytes.kind == Scaled::kFraction) {
    return fail("size " + quoted + " is not a whole number of bytes");
  }
  if (bytes.kind == Scaled::kTooLarge) {
    return fail("size " + quoted + " " + std::string(too_large));
  }
  if (bytes.bytes == 0) {
    return fail("size " + quoted + " is zero");
  }
  return {bytes.bytes, {}};
}

}  // namespace

Parsed<std::uint64_t> parse_size_string(std::string_view text) {
  Parsed<std::uint64_t> r = parse_size(text, /*plain_is_mib=*/true);
  if (!r) return r;
  const std::string_view s = trim(text);
  const char last = s.back();  // not empty: parse_size accepted it
  if (std::isdigit(static_cast<unsigned char>(last)) || last == '.') {
    const std::string number(s);
    return {std::nullopt, "size '" + number +
                              "' is a quoted number without a unit; a quoted size needs one: "
                              "write " +
                              number + " unquoted (MiB) or \"" + number + "MiB\""};
  }
  return r;
}

std::string format_size(std::uint64_t bytes) {
  for (const Unit& u : kUnits) {
    if (bytes >= u.bytes && bytes % u.bytes == 0) {
      return std::to_string(bytes / u.bytes) + " " + std::string(u.name);
    }
  }
  return std::to_string(bytes) + " B";
}

}  // namespace arbiter
