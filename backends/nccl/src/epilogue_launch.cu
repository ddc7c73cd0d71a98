// Launcher of the epilogue kernel: runtime dtype, quantisation and pack width
// become template arguments here, in one dispatch switch. NVFP4 exists only
// for fp16/bf16 with 16-byte packs (the host admits nothing else).
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
// (quant_out on the bytes a thread stores at once: FP8 one per element of
// the pack, NVFP4 4-byte words).
bool fits_16_byte_packs(const EpilogueParams& p, std::uint32_t element_bytes) {
  const std::uint32_t pack = 16 / element_bytes;
  const std::uint32_t quant = p.epilogue == common::Epilogue::kNormFp8   ? pack
                              : p.epilogue == common::Epilogue::kNormFp4 ? 4
                                                                         : 1;
  return p.hidden % pack == 0 && aligned(p.sum, 16) && aligned(p.allreduce_out, 16) &&
         aligned(p.residual_in, 16) && aligned(p.residual_out, 16) && aligned(p.gamma, 16) &&
         aligned(p.norm_out, 16) && aligned(quant > 1 ? p.quant_out : nullptr, quant);
}

template <arbiter_dtype kDtype, int kPack, common::Epilogue kEpilogue>
cudaError_t launch(const EpilogueParams& p, cudaStream_t stream) {
  // One thread per unit: a pack, or an NVFP4 block of 16 elements.
  const std::uint32_t unit =
      kEpilogue == common::Epilogue::kNormFp4 ? common::kNvfp4BlockSize : kPack;
  const std::uint32_t units = p.hidden / unit;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(std::min(p.tokens, kMaxGrid));
  config.blockDim = dim3(std::min(units, kMaxEpilogueThreads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1] = {};
  if (p.pdl) {
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, residual_rmsnorm_kernel<kDtype, kPack, kEpilogue>, p);
}

template <arbiter_dtype kDtype>
cudaError_t launch_dtype(const EpilogueParams& p, cudaStream_t stream) {
  using common::Epilogue;
  constexpr int kVector = 16 / static_cast<int>(sizeof(StorageBits<kDtype>));
  const bool vectors = fits_16_byte_packs(p, sizeof(StorageBits<kDtype>));
  switch (p.epilogue) {
    case Epilogue::kNorm:
      return vectors ? launch<kDtype, kVector, Epilogue::kNorm>(p, stream)
                     : launch<kDtype, 1, Epilogue::kNorm>(p, stream);
    case Epilogue::kNormFp8:
      return vectors ? launch<kDtype, kVector, Epilogue::kNormFp8>(p, stream)
                     : launch<kDtype, 1, Epilogue::kNormFp8>(p, stream);
    case Epilogue::kNormFp4:
      if constexpr (kDtype == ARBITER_DTYPE_FP32) {
        return cudaErrorInvalidValue;
      } else {
        if (!vectors || p.hidden % common::kNvfp4BlockSize != 0) return cudaErrorInvalidValue;
        return launch<kDtype, kVector, Epilogue::kNormFp4>(p, stream);
      }
    case Epilogue::kAllreduce:
      break;
  }
  return cudaErrorInvalidValue;
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
