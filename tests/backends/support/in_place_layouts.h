// In-place calls as the aliasing contract (arbiter_backend.h) allows them:
// which output lands over input, over residual_in, in its own buffer, or is
// not asked for. The backend suites run each and expect the bits of the same
// call with separate buffers.
#pragma once

#include "arbiter_backend.h"

namespace arbiter::test {

enum class Place { kNone, kOwn, kInput, kResidual };

struct InPlaceLayout {
  arbiter_pattern pattern;
  Place allreduce_out, residual_out, norm_out;
};

// Every value output over each source it may take, and vLLM's call.
inline constexpr InPlaceLayout kInPlaceLayouts[] = {
    {ARBITER_PATTERN_ALLREDUCE, Place::kInput, Place::kNone, Place::kNone},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, Place::kResidual, Place::kOwn, Place::kOwn},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, Place::kNone, Place::kResidual, Place::kInput},  // vLLM
    {ARBITER_PATTERN_RESIDUAL_RMSNORM, Place::kInput, Place::kResidual, Place::kOwn},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, Place::kOwn, Place::kInput, Place::kResidual},
    {ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8, Place::kResidual, Place::kOwn, Place::kInput},
};

// Where output `p` of an in-place call goes: `own`, `input`, `residual` or NULL.
inline void* place_output(Place p, void* own, void* input, void* residual) {
  switch (p) {
    case Place::kNone:
      return nullptr;
    case Place::kOwn:
      return own;
    case Place::kInput:
      return input;
    case Place::kResidual:
      return residual;
  }
  return nullptr;
}

}  // namespace arbiter::test
