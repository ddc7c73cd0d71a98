// Vocabulary types shared by the policy, the runtime and the tools.
//
// Every enum has explicit values that only ever grow: they are written into
// traces, JSON and fingerprints, and a reordering would change all three.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace arbiter {

// An index into Tables::origins that names no origin: the setting was never
// written by any layer, or a trace step used no table cell.
inline constexpr std::uint16_t kNoOrigin = 0xFFFF;

enum class Dtype : std::uint8_t { kFp16 = 0, kBf16 = 1, kFp32 = 2 };
inline constexpr int kDtypeCount = 3;

// What is fused after the sum. NVFP4 needs capability >= 100.
enum class Pattern : std::uint8_t {
  kAllreduce = 0,
  kResidualRmsnorm = 1,
  kResidualRmsnormFp8 = 2,
  kResidualRmsnormFp4 = 3,
};
inline constexpr int kPatternCount = 4;

// Whether a residual pattern's residual input is the same on every rank
// (ARBITER_RUN_RESIDUAL_REPLICATED): a two-shot then reads only its own
// slice of it. A table key; `allreduce` has no residual.
enum class Residual : std::uint8_t { kDistinct = 0, kReplicated = 1 };

// Where a call's input lies: ordinary (copied) memory, which the backend
// copies into its workspace, or memory registered with the communicator
// (ABI v2), which peers read in place. A table key: the costs differ.
enum class BufferKind : std::uint8_t { kCopied = 0, kRegistered = 1 };

enum class Algorithm : std::uint8_t { kOneshot = 0, kTwoshot = 1, kNative = 2 };

// The backends the policy can choose between. The set is closed on purpose:
// a table naming anything else is rejected, never mapped to a default.
enum class Backend : std::uint8_t {
  kTrtllm = 0,
  kMnnvl = 1,
  kNccl = 2,
  kShm = 3,
  kNone = 255,  // nothing may serve the call (e.g. the fallback was disabled)
};
inline constexpr int kBackendCount = 4;

// Where a rank's data lives: GPU backends never serve CPU ranks and the other
// way round.
enum class DeviceKind : std::uint8_t { kGpu = 0, kCpu = 1 };
inline constexpr int kDeviceKindCount = 2;

// SM version as major*10+minor (90, 100, 103, ...), or the CPU pseudo
// capability. Parsing accepts "103", "10.3", "sm_103", "sm103" and "cpu".
class Capability {
 public:
  static constexpr std::uint16_t kCpuCode = 0;
  static constexpr std::uint16_t kMinSm = 50;
  static constexpr std::uint16_t kMaxSm = 199;

  constexpr Capability() = default;
  static constexpr Capability sm(std::uint16_t sm) { return Capability(sm); }
  static constexpr Capability cpu() { return Capability(kCpuCode); }

  constexpr std::uint16_t code() const { return code_; }
  constexpr bool is_cpu() const { return code_ == kCpuCode; }
  constexpr DeviceKind device() const { return is_cpu() ? DeviceKind::kCpu : DeviceKind::kGpu; }
  friend constexpr bool operator==(Capability, Capability) = default;
  friend constexpr auto operator<=>(Capability, Capability) = default;

 private:
  explicit constexpr Capability(std::uint16_t code) : code_(code) {}
  std::uint16_t code_ = kCpuCode;
};

// Result of parsing user input: a value, or a message that says what to do.
template <class T>
struct Parsed {
  std::optional<T> value;
  std::string error;
  explicit operator bool() const { return value.has_value(); }
};

Parsed<Capability> parse_capability(std::string_view text);
Parsed<Dtype> parse_dtype(std::string_view text);
Parsed<Pattern> parse_pattern(std::string_view text);
Parsed<Backend> parse_backend(std::string_view text);
Parsed<Algorithm> parse_algorithm(std::string_view text);
Parsed<Residual> parse_residual(std::string_view text);
Parsed<BufferKind> parse_buffer_kind(std::string_view text);

std::string capability_name(Capability c);  // "103" or "cpu"
std::string_view dtype_name(Dtype d);
std::string_view pattern_name(Pattern p);
std::string_view backend_name(Backend b);
std::string_view algorithm_name(Algorithm a);
std::string_view residual_name(Residual r);
std::string_view buffer_kind_name(BufferKind b);
std::string_view device_kind_name(DeviceKind d);
// "trtllm, nccl" for bits (1 << Backend) set in `mask`; "none" when empty.
std::string backend_mask_names(std::uint32_t mask);
constexpr int element_size(Dtype d) { return d == Dtype::kFp32 ? 4 : 2; }

}  // namespace arbiter
