#include "arbiter/types.h"

#include <array>
#include <charconv>

#include "text_util.h"

namespace arbiter {
namespace {

constexpr std::array<std::string_view, kDtypeCount> kDtypeNames = {"fp16", "bf16", "fp32"};
constexpr std::array<std::string_view, kPatternCount> kPatternNames = {
    "allreduce", "residual_rmsnorm", "residual_rmsnorm_fp8", "residual_rmsnorm_fp4"};
constexpr std::array<std::string_view, kBackendCount> kBackendNames = {"trtllm", "mnnvl", "nccl",
                                                                       "shm"};
constexpr std::array<std::string_view, 3> kAlgorithmNames = {"oneshot", "twoshot", "native"};
constexpr std::array<std::string_view, 2> kResidualNames = {"distinct", "replicated"};
constexpr std::array<std::string_view, 2> kBufferKindNames = {"copied", "registered"};

template <class E, std::size_t N>
Parsed<E> parse_name(std::string_view text, const std::array<std::string_view, N>& names,
                     std::string_view what) {
  for (std::size_t i = 0; i < N; ++i) {
    if (text == names[i]) return {static_cast<E>(i), {}};
  }
  std::vector<std::string_view> known(names.begin(), names.end());
  return {std::nullopt, unknown_name_message(what, text, known)};
}

bool parse_uint(std::string_view s, unsigned& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

Parsed<Capability> parse_capability(std::string_view text) {
  const std::string original(text);
  if (text == "cpu") return {Capability::cpu(), {}};
  const char* hint = "write major*10+minor (90, 100, 103), \"10.3\", \"sm_103\" or cpu";
  unsigned value = 0;
  if (text.starts_with("sm_")) {
    text.remove_prefix(3);
  } else if (text.starts_with("sm")) {
    text.remove_prefix(2);
  }
  if (auto dot = text.find('.'); dot != std::string_view::npos) {
    unsigned major = 0, minor = 0;
    if (original.starts_with("sm") || !parse_uint(text.substr(0, dot), major) ||
        !parse_uint(text.substr(dot + 1), minor) || dot + 2 != text.size()) {
      return {std::nullopt, "unknown capability '" + original + "'; " + hint};
    }
    // Checked before the product: 429496740.3 wrapped around to 107.
    value = major > Capability::kMaxSm ? Capability::kMaxSm + 1 : major * 10 + minor;
  } else if (!parse_uint(text, value)) {
    return {std::nullopt, "unknown capability '" + original + "'; " + hint};
  }
  if (value < Capability::kMinSm || value > Capability::kMaxSm) {
    std::string msg = "capability '" + original + "' is outside " +
                      std::to_string(Capability::kMinSm) + ".." +
                      std::to_string(Capability::kMaxSm);
    if (value >= 5 && value <= 19 && text.find('.') == std::string_view::npos) {
      msg += "; did you mean " + std::to_string(value * 10) + "?";
    } else {
      msg += std::string("; ") + hint;
    }
    return {std::nullopt, msg};
  }
  return {Capability::sm(static_cast<std::uint16_t>(value)), {}};
}

Parsed<Dtype> parse_dtype(std::string_view text) {
  return parse_name<Dtype>(text, kDtypeNames, "dtype");
}
Parsed<Pattern> parse_pattern(std::string_view text) {
  return parse_name<Pattern>(text, kPatternNames, "pattern");
}
Parsed<Backend> parse_backend(std::string_view text) {
  return parse_name<Backend>(text, kBackendNames, "backend");
}
Parsed<Algorithm> parse_algorithm(std::string_view text) {
  return parse_name<Algorithm>(text, kAlgorithmNames, "algorithm");
}

Parsed<Residual> parse_residual(std::string_view text) {
  return parse_name<Residual>(text, kResidualNames, "residual");
}

Parsed<BufferKind> parse_buffer_kind(std::string_view text) {
  return parse_name<BufferKind>(text, kBufferKindNames, "buffers");
}

std::string capability_name(Capability c) { return c.is_cpu() ? "cpu" : std::to_string(c.code()); }
std::string_view dtype_name(Dtype d) { return kDtypeNames[static_cast<int>(d)]; }
std::string_view pattern_name(Pattern p) { return kPatternNames[static_cast<int>(p)]; }
std::string_view backend_name(Backend b) {
  return b == Backend::kNone ? "none" : kBackendNames[static_cast<int>(b)];
}
std::string_view algorithm_name(Algorithm a) { return kAlgorithmNames[static_cast<int>(a)]; }
std::string_view residual_name(Residual r) { return kResidualNames[static_cast<int>(r)]; }
std::string_view buffer_kind_name(BufferKind b) { return kBufferKindNames[static_cast<int>(b)]; }
std::string_view device_kind_name(DeviceKind d) { return d == DeviceKind::kGpu ? "gpu" : "cpu"; }
std::string backend_mask_names(std::uint32_t mask) {
  std::string s;
  for (int b = 0; b < kBackendCount; ++b) {
    if ((mask >> b) & 1u) {
      if (!s.empty()) s += ", ";
      s += kBackendNames[b];
    }
  }
  return s.empty() ? "none" : s;
}

}  // namespace arbiter
