// A kernel that cannot fit its registers: 32 per thread (1024 threads, two
// blocks per SM) against 96 values live at once. Compiled with the spill
// guard's ptxas options, it must fail the build (check.cmake).
#include <cstdint>

__global__ void __launch_bounds__(1024, 2) spilling_kernel(const float* in, float* out, int n) {
  float v[96];
#pragma unroll
  for (int k = 0; k < 96; ++k) v[k] = in[(threadIdx.x * 97 + k * 31) % n];
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 96; ++k) acc += v[k] * v[95 - k] + v[(k * 7) % 96];
#pragma unroll
  for (int k = 0; k < 96; ++k) out[threadIdx.x * 96 + k] = v[k] * acc;
}
