// The trtllm kernels' launch configuration is the shared one
// (arbiter/common/launch_config.h); these names keep trtllm code short.
#pragma once

#include "arbiter/common/launch_config.h"

namespace arbiter::trtllm {

using common::check_hidden;
using common::choose_launch_config;
using common::DeviceLimits;
using common::kMaxClusterSize;
using common::kMaxCtaThreads;
using common::kMaxGridBlocks;
using common::kMinSpreadCtaThreads;
using common::kNvfp4BlockElements;
using common::kVectorBytes;
using common::kWarpSize;
using common::LaunchConfig;
using common::LaunchRequest;
using common::max_hidden;
using common::vector_elements;

}  // namespace arbiter::trtllm
