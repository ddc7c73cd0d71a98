// ARBITER_HD marks functions that both the host compiler and nvcc compile:
// `__host__ __device__` under nvcc, nothing under plain g++.
#pragma once

#ifdef __CUDACC__
#define ARBITER_HD __host__ __device__
#else
#define ARBITER_HD
#endif
