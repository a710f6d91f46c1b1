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
// through the read-only cache. R (1, 2 or 4 by the output count) output rows per warp; 8 warps per block.
// fp32 accumulation. sm_75 safe, no shared memory.
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr int kGemvWarps = 8;
constexpr int kGemvMaxRows = 16;

// R consecutive output rows per warp: their weight loads are issued together (more bytes in flight per
// warp: decode GEMVs are latency-bound otherwise) and each x chunk, once loaded, serves all R rows. Rows
// past `out` re-read the last row and are not written.
template <int N, int R>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_f16_kernel(const half* __restrict__ W, const half* __restrict__ x, int n, int out, int in,
                    float* __restrict__ y, int ldy) {
  const int o0 = (blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) * R, lane = threadIdx.x & 31;
  if (o0 >= out) return;
  const int chunks = in / 8;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(W + size_t(min(o0 + r, out - 1)) * in);
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < N; ++b) acc[r][b] = 0.f;
#pragma unroll 2
  for (int c = lane; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = __ldg(wr[r] + c);
#pragma unroll
    for (int b = 0; b < N; ++b) {
      if (b < n) {
        float xf[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(x + size_t(b) * in) + c), xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wf[8];
          unpack8(wv[r], wf);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[r][b] = fmaf(wf[k], xf[k], acc[r][b]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < N; ++b) {
      const float s = warp_sum(acc[r][b]);
      if (lane == 0 && b < n && o0 + r < out) y[size_t(b) * ldy + o0 + r] = s;
    }
}

template <int N, int R>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_w4_kernel(const uint32_t* __restrict__ Wq, const half* __restrict__ S, const half* __restrict__ x, int n,
                   int out, int in, float* __restrict__ y, int ldy) {
  const int o0 = (blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) * R, lane = threadIdx.x & 31;
  if (o0 >= out) return;
  const int groups = in / 32;
  const uint4* wr[R];
  const half* sr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int o = min(o0 + r, out - 1);
    wr[r] = reinterpret_cast<const uint4*>(Wq + size_t(o) * (in / 8));
    sr[r] = S + size_t(o) * groups;
  }
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < N; ++b) acc[r][b] = 0.f;
#pragma unroll 2
  for (int g = lane; g < groups; g += 32) {
    uint4 q[R];
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      q[r] = __ldg(wr[r] + g);
      s[r] = __half2float(sr[r][g]);
    }
#pragma unroll
    for (int b = 0; b < N; ++b) {
      if (b < n) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + size_t(b) * in + size_t(g) * 32);
        float xf[32];
#pragma unroll
        for (int j = 0; j < 4; ++j) unpack8(__ldg(xr + j), xf + 8 * j);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
          float part = 0.f;
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int k = 0; k < 8; ++k) part = fmaf(float(int((words[j] >> (4 * k)) & 0xFu) - 8), xf[8 * j + k], part);
          acc[r][b] = fmaf(part, s[r], acc[r][b]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < N; ++b) {
      const float v = warp_sum(acc[r][b]);
      if (lane == 0 && b < n && o0 + r < out) y[size_t(b) * ldy + o0 + r] = v;
    }
}

template <int N, int R>
inline cudaError_t launch_gemv_nr(const half* W16, const uint32_t* Wq, const half* S, const half* x, int n, int out,
                                  int in, float* y, int ldy, cudaStream_t stream) {
  const dim3 grid(ceil_div(size_t(out), size_t(kGemvWarps) * R)), block(kGemvWarps * 32);
  if (W16)
    gemv_f16_kernel<N, R><<<grid, block, 0, stream>>>(W16, x, n, out, in, y, ldy);
  else
    gemv_w4_kernel<N, R><<<grid, block, 0, stream>>>(Wq, S, x, n, out, in, y, ldy);
  return cudaGetLastError();
}

template <int N>
inline cudaError_t launch_gemv_n(const half* W16, const uint32_t* Wq, const half* S, const half* x, int n, int out,
                                 int in, float* y, int ldy, cudaStream_t stream) {
  // Several rows per warp only for a single input row: measured on the H200 (bench/RESULTS.md), R = 4 lifted
  // c = 1 decode but made batched decode (n = 8, 16) ~1.7x slower (the int4 unpack is repeated per row and
  // 244 registers cut occupancy). Enough blocks to cover the GPU first, then rows per warp.
  if (N == 1 && out >= 4 * 1024) return launch_gemv_nr<N, 4>(W16, Wq, S, x, n, out, in, y, ldy, stream);
  if (N == 1 && out >= 2 * 1024) return launch_gemv_nr<N, 2>(W16, Wq, S, x, n, out, in, y, ldy, stream);
  return launch_gemv_nr<N, 1>(W16, Wq, S, x, n, out, in, y, ldy, stream);
}

// W16 xor (Wq, S): exactly one weight layout is set.
inline cudaError_t launch_gemv(const half* W16, const uint32_t* Wq, const half* S, const half* x, int n, int out,
                               int in, float* y, int ldy, cudaStream_t stream) {
  if (n <= 0 || out <= 0) return cudaSuccess;
  if (n > kGemvMaxRows) return cudaErrorInvalidValue;
  if (n <= 1) return launch_gemv_n<1>(W16, Wq, S, x, n, out, in, y, ldy, stream);
  if (n <= 2) return launch_gemv_n<2>(W16, Wq, S, x, n, out, in, y, ldy, stream);
  if (n <= 4) return launch_gemv_n<4>(W16, Wq, S, x, n, out, in, y, ldy, stream);
  if (n <= 8) return launch_gemv_n<8>(W16, Wq, S, x, n, out, in, y, ldy, stream);
  return launch_gemv_n<16>(W16, Wq, S, x, n, out, in, y, ldy, stream);
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
