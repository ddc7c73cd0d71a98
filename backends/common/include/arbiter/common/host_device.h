// ARBITER_HD marks functions that both the host compiler and nvcc compile:
// `__host__ __device__` under nvcc, nothing under plain g++.
#pragma once

#ifdef __CUDACC__
#define ARBITER_HD __host__ __device__
#else
#define ARBITER_HD
#endif

// ARBITER_HOST_INLINE: always inlined in host code, so that a caller compiled
// for a wider ISA (the shm backend's per-level clones, token_kernels.cpp)
// vectorises the callee for that ISA instead of calling one baseline copy.
// Nothing under nvcc.
#if defined(__CUDACC__) || !defined(__GNUC__)
#define ARBITER_HOST_INLINE
#else
#define ARBITER_HOST_INLINE __attribute__((always_inline))
#endif
