#include "footprint.h"

#include <limits>
#include <string>

#include "arbiter/common/numeric.h"

namespace arbiter::shm {

namespace {
constexpr std::int32_t kMaxWorldSize = 63;  // world_size_mask has bits 0..63
}  // namespace

Status check_shape(const arbiter_workspace_spec& spec) {
  if (spec.world_size < 1 || spec.world_size > kMaxWorldSize) {
    return {ARBITER_UNSUPPORTED, "world size " + std::to_string(spec.world_size) +
                                     " is outside the 1..63 this backend supports"};
  }
  if (!common::is_valid_dtype(spec.dtype)) {
    return {ARBITER_INVALID_ARGUMENT, "unknown dtype " + std::to_string(spec.dtype)};
  }
  if (spec.nodes > 1) {
    return {ARBITER_UNSUPPORTED,
            "shm is single-node only; spec.nodes is " + std::to_string(spec.nodes)};
  }
  if (spec.max_message_bytes == 0 || spec.max_message_bytes > kMaxMessageBytes) {
    return {ARBITER_INVALID_ARGUMENT, "max_message_bytes " +
                                          std::to_string(spec.max_message_bytes) +
                                          " must be between 1 and 64 TiB"};
  }
  return {};
}

Layout layout_for(const arbiter_workspace_spec& spec) {
  const std::uint64_t row_bytes = std::uint64_t{spec.hidden} * common::dtype_size(spec.dtype);
  // check_shape bounded max_message_bytes, so a slot is at most max(1 MiB,
  // one row of at most 16 GiB): always a layout.
  return *compute_layout(spec.world_size, slot_bytes_for(spec.max_message_bytes, row_bytes));
}

int32_t footprint(const arbiter_workspace_spec* spec, arbiter_footprint* out) {
  if (spec == nullptr || out == nullptr) {
    return report({ARBITER_INVALID_ARGUMENT, "shm footprint: spec and out must not be NULL"});
  }
  if (const Status shape = check_shape(*spec); !shape.ok()) return report(shape);
  const Layout layout = layout_for(*spec);
  arbiter_footprint result{};
  // A group of one maps private memory; a group shares one /dev/shm object
  // that every rank maps whole.
  if (spec->world_size == 1) {
    result.host_bytes = layout.total;
  } else {
    result.shared_bytes = layout.total;
  }
  // run() streams any message through the slots a slice at a time.
  for (std::uint64_t& cap : result.max_message_bytes)
    cap = std::numeric_limits<std::uint64_t>::max();
  result.note = "";
  *out = result;
  return ARBITER_OK;
}

}  // namespace arbiter::shm
