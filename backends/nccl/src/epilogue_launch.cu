// Launcher of the epilogue kernel: runtime dtype, quantisation and pack width
// become template arguments here, in one dispatch switch.
#include <algorithm>
#include <cstdint>

#include "epilogue.cuh"
#include "epilogue_launch.h"

namespace arbiter::nccl {
namespace {

constexpr std::uint32_t kMaxGrid = 0x7FFFFFFFu;

bool aligned(const void* p, std::uintptr_t bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// 16-byte packs need every row, and so every pointer, on a 16-byte boundary
// (quant_out on the pack's width in bytes).
bool fits_16_byte_packs(const EpilogueParams& p, std::uint32_t element_bytes) {
  const std::uint32_t pack = 16 / element_bytes;
  return p.hidden % pack == 0 && aligned(p.sum, 16) && aligned(p.allreduce_out, 16) &&
         aligned(p.residual_in, 16) && aligned(p.residual_out, 16) && aligned(p.gamma, 16) &&
         aligned(p.norm_out, 16) && aligned(p.fp8 ? p.quant_out : nullptr, pack);
}

template <arbiter_dtype kDtype, int kPack, bool kFp8>
cudaError_t launch(const EpilogueParams& p, cudaStream_t stream) {
  const std::uint32_t packs = p.hidden / kPack;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(std::min(p.tokens, kMaxGrid));
  config.blockDim = dim3(std::min(packs, kMaxEpilogueThreads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1] = {};
  if (p.pdl) {
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, residual_rmsnorm_kernel<kDtype, kPack, kFp8>, p);
}

template <arbiter_dtype kDtype>
cudaError_t launch_dtype(const EpilogueParams& p, cudaStream_t stream) {
  constexpr int kVector = 16 / static_cast<int>(sizeof(StorageBits<kDtype>));
  if (fits_16_byte_packs(p, sizeof(StorageBits<kDtype>))) {
    return p.fp8 ? launch<kDtype, kVector, true>(p, stream)
                 : launch<kDtype, kVector, false>(p, stream);
  }
  return p.fp8 ? launch<kDtype, 1, true>(p, stream) : launch<kDtype, 1, false>(p, stream);
}

}  // namespace

cudaError_t launch_residual_rmsnorm(const EpilogueParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.hidden == 0) return cudaSuccess;
  switch (p.dtype) {
    case ARBITER_DTYPE_FP16:
      return launch_dtype<ARBITER_DTYPE_FP16>(p, stream);
    case ARBITER_DTYPE_BF16:
      return launch_dtype<ARBITER_DTYPE_BF16>(p, stream);
    case ARBITER_DTYPE_FP32:
      return launch_dtype<ARBITER_DTYPE_FP32>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace arbiter::nccl
