// gemma4_t4 kernels: decode matmuls (a batch of 1..16 rows against a weight read once).
//
//   y[r, o] = sum_i x[r, i] * W[o, i]     x: [n, in] fp16 (row stride in), y: [n, out] fp32 (row stride ldy)
// Weights, two layouts:
//   fp16   W [out, in] row-major; in % 8 == 0 (16-byte rows).
//   w4a16  the compressed-tensors words kept as stored: Wq [out, in/8] u32, column 8j+k = nibble k of word j
//          holding q + 8; scales S [out, in/32] fp16; w = (nibble - 8) * S[o, i/32]; in % 32 == 0. One
//          16-byte load = 4 words = 32 columns = exactly one scale group, so this IS the kernel's layout:
//          the load repacks nothing but the scales (bf16 -> fp16).
// Decode is bandwidth-bound: each weight byte is read once per step for all n rows, so the n accumulators
// live in registers (N is a template bound, n <= N at run time) and x (tiny, reused by every row) comes
// through the read-only cache. One warp per output row; 8 warps per block. fp32 accumulation. sm_75 safe,
// no shared memory.
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr int kGemvWarps = 8;

template <int N>
static __global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_f16_kernel(const half* __restrict__ W, const half* __restrict__ x, int n, int out, int in,
                    float* __restrict__ y, int ldy) {
  const int o = blockIdx.x * kGemvWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (o >= out) return;
  const uint4* wr = reinterpret_cast<const uint4*>(W + size_t(o) * in);
  const int chunks = in / 8;
  float acc[N];
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = 0.f;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    float wf[8];
    unpack8(__ldg(wr + c), wf);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      if (r < n) {
        float xf[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(x + size_t(r) * in) + c), xf);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[r] = fmaf(wf[k], xf[k], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0 && r < n) y[size_t(r) * ldy + o] = s;
  }
}

template <int N>
static __global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_w4_kernel(const uint32_t* __restrict__ Wq, const half* __restrict__ S, const half* __restrict__ x, int n,
                   int out, int in, float* __restrict__ y, int ldy) {
  const int o = blockIdx.x * kGemvWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (o >= out) return;
  const int groups = in / 32;
  const uint4* wr = reinterpret_cast<const uint4*>(Wq + size_t(o) * (in / 8));
  const half* sr = S + size_t(o) * groups;
  float acc[N];
#pragma unroll
  for (int r = 0; r < N; ++r) acc[r] = 0.f;
#pragma unroll 2
  for (int g = lane; g < groups; g += 32) {
    const uint4 q = __ldg(wr + g);
    const float s = __half2float(sr[g]);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    float wf[32];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 8; ++k) wf[8 * j + k] = float(int((words[j] >> (4 * k)) & 0xFu) - 8);
#pragma unroll
    for (int r = 0; r < N; ++r) {
      if (r < n) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + size_t(r) * in + size_t(g) * 32);
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float xf[8];
          unpack8(__ldg(xr + j), xf);
#pragma unroll
          for (int k = 0; k < 8; ++k) part = fmaf(wf[8 * j + k], xf[k], part);
        }
        acc[r] = fmaf(part, s, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0 && r < n) y[size_t(r) * ldy + o] = s;
  }
}

constexpr int kGemvMaxRows = 16;

// W16 xor (Wq, S): exactly one weight layout is set.
inline cudaError_t launch_gemv(const half* W16, const uint32_t* Wq, const half* S, const half* x, int n, int out,
                               int in, float* y, int ldy, cudaStream_t stream) {
  if (n <= 0 || out <= 0) return cudaSuccess;
  if (n > kGemvMaxRows) return cudaErrorInvalidValue;
  const dim3 grid(ceil_div(size_t(out), kGemvWarps)), block(kGemvWarps * 32);
#define GEMMA4_T4_GEMV_CASE(NN)                                                                      \
  if (n <= NN) {                                                                                   \
    if (W16) gemv_f16_kernel<NN><<<grid, block, 0, stream>>>(W16, x, n, out, in, y, ldy);          \
    else gemv_w4_kernel<NN><<<grid, block, 0, stream>>>(Wq, S, x, n, out, in, y, ldy);             \
    return cudaGetLastError();                                                                     \
  }
  GEMMA4_T4_GEMV_CASE(1)
  GEMMA4_T4_GEMV_CASE(2)
  GEMMA4_T4_GEMV_CASE(4)
  GEMMA4_T4_GEMV_CASE(8)
  GEMMA4_T4_GEMV_CASE(16)
#undef GEMMA4_T4_GEMV_CASE
  return cudaErrorInvalidValue;
}

// Prefill path for w4a16: unpack to fp16 tiles for cuBLAS. out16: [out, in] fp16. One thread per word.
static __global__ void dequant_w4_kernel(const uint32_t* __restrict__ Wq, const half* __restrict__ S, int out, int in,
                                  half* __restrict__ out16) {
  const size_t words = size_t(out) * (in / 8);
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= words) return;
  const size_t o = idx / (in / 8), j = idx % (in / 8);
  const uint32_t w = Wq[idx];
  const float s = __half2float(S[o * (in / 32) + j / 4]);
  half* dst = out16 + o * in + j * 8;
#pragma unroll
  for (int k = 0; k < 8; ++k) dst[k] = __float2half_rn(float(int((w >> (4 * k)) & 0xFu) - 8) * s);
}

inline cudaError_t launch_dequant_w4(const uint32_t* Wq, const half* S, int out, int in, half* out16,
                                     cudaStream_t stream) {
  const size_t words = size_t(out) * (in / 8);
  if (words == 0) return cudaSuccess;
  dequant_w4_kernel<<<ceil_div(words, 256), 256, 0, stream>>>(Wq, S, out, in, out16);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace gemma4_t4
