// gemma4_t4 kernels: shared device helpers.
//
// Every kernel in kernels/ is compiled for sm_75 (Tesla T4) and up and uses only sm_75 features: no bf16
// arithmetic, no cp.async, at most 48 KiB of static shared memory per block. Launchers are
// `cudaError_t launch_<op>(..., cudaStream_t)`: they never allocate and report launch errors.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace gemma4_t4 {
namespace kernels {

constexpr float kHalfMax = 65504.f;

// fp32 -> fp16 with saturation: Gemma activations can pass the fp16 range; inf would poison a whole row.
// NaN stays NaN (a real fault must stay visible downstream).
__device__ __forceinline__ half to_half_sat(float v) {
  return __float2half_rn(v != v ? v : fminf(fmaxf(v, -kHalfMax), kHalfMax));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024). Every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < int(blockDim.x >> 5) ? partial[lane] : 0.f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < int(blockDim.x >> 5) ? partial[lane] : -INFINITY;
    s = warp_max(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// 8 halves packed in 16 bytes -> floats
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const half2* h = reinterpret_cast<const half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

inline unsigned ceil_div(size_t a, size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace kernels
}  // namespace gemma4_t4
