// gemma4_t4 kernels: the sampler's counter-based RNG, shared by the CUDA sampling kernel (sample.cuh) and the
// CPU sampler (include/gemma4_t4/sampler.hpp) so both draw the same number for the same (seed, counter).
// Plain C++ as well as CUDA: the CPU-only build includes it too (no CUDA header is needed).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GEMMA4_T4_HD __host__ __device__
#else
#define GEMMA4_T4_HD
#endif

namespace gemma4_t4 {
namespace detail {

GEMMA4_T4_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from 53 random bits.
GEMMA4_T4_HD inline double uniform01(uint64_t seed, uint64_t counter) {
  return double(splitmix64(seed ^ splitmix64(counter)) >> 11) * (1.0 / 9007199254740992.0);
}

// Order-preserving map of a float to an unsigned key (larger float -> larger key).
GEMMA4_T4_HD inline uint32_t float_key(uint32_t bits) { return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u); }

}  // namespace detail
}  // namespace gemma4_t4
