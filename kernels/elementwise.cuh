// gemma4_t4 kernels: the small element-wise steps of the forward pass.
//
//   embed:        h[r, :] = float(E[id[r], :]) * scale                          E: [V, H] fp16, h fp32
//   to_half:      out[i] = half(x[i]) (saturating)
//   widen:        out[i] = float(x[i]), x the raw bits of bf16 / fp16 / fp32 values (rows gathered on the host
//                 from a checkpoint tensor, converted here: exact)
//   gelu_mul:     a[r, i] = half(gelu_tanh(g[r, i]) * u[r, i])                  g, u: rows of I fp32 or fp16,
//                 any row stride (a joint gate/up GEMM's [rows, 2 I] output: g = y, u = y + I); a: [rows, I]
//                 fp16. fp16 inputs past the fp16 range (+-inf: a GEMM rounds, it does not saturate) are taken
//                 as +-65504, so the product stays finite; NaN stays NaN
//   ple_combine:  ple[r, l, :] = (rmsnorm(proj[r, l, :] * pscale) * w + tok[r, l, :] * tscale) * mix
//                 proj, tok, ple: [rows, L, D] fp32 (tok: the rows of embed_tokens_per_layer)
//   ple_gate:     a[r, k] = half(gelu_tanh(g[r, k]) * ple[r, layer, k])          g: [rows, D] fp32
//   softcap:      x = tanh(x / cap) * cap, in place                              x: [n] fp32
//   argmax_rows:  out[r] = argmax_i x[r, i] (first on ties)                       x: [rows, V] fp32
// gelu_mul and ple_gate serve passes of more than 32 rows (after the GEMMs); decode passes get the same math
// from the GEMV epilogues in gemv.cuh (GemvEpilogue::GeluMul, GeluPle) without the fp32 round trip.
// sm_75 safe; static shared memory only in the reductions (<= 2 KiB).
#pragma once

#include <climits>
#include <cstring>
#include <type_traits>

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

static __global__ void embed_kernel(const half* __restrict__ E, const int* __restrict__ ids, int H, float scale,
                                    float* __restrict__ h) {
  GEMMA4_T4_KTRACE_SCOPE(kKtEmbed, 0);
  pdl_enter();
  const half* e = E + size_t(ids[blockIdx.x]) * H;
  float* o = h + size_t(blockIdx.x) * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = __half2float(e[c]) * scale;
}

inline cudaError_t launch_embed(const half* E, const int* ids, int rows, int H, float scale, float* h,
                                const Launch& launch) {
  if (rows <= 0) return cudaSuccess;
  return launch_kernel(embed_kernel, rows, 256, launch, E, ids, H, scale, h);
}

// dst[r, 0..width) = src[idx[r], 0..width) for r < rows (idx null: row r), T = float or half; ld in elements. The
// rows read and the rows written must not overlap.
template <typename T>
static __global__ void gather_rows_kernel(const T* __restrict__ src, size_t ld_src, const int* __restrict__ idx,
                                          int width, T* __restrict__ dst, size_t ld_dst) {
  GEMMA4_T4_KTRACE_SCOPE(kKtElementwise, 3);
  pdl_enter();
  const T* s = src + size_t(idx ? idx[blockIdx.x] : int(blockIdx.x)) * ld_src;
  T* d = dst + size_t(blockIdx.x) * ld_dst;
  for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

template <typename T>
inline cudaError_t launch_gather_rows(const T* src, size_t ld_src, const int* idx, int rows, int width, T* dst,
                                      size_t ld_dst, const Launch& launch) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "fp32 or fp16 rows");
  if (rows <= 0 || width <= 0) return cudaSuccess;
  return launch_kernel(gather_rows_kernel<T>, rows, 256, launch, src, ld_src, idx, width, dst, ld_dst);
}

static __global__ void to_half_kernel(const float* __restrict__ x, size_t n, half* __restrict__ out) {
  GEMMA4_T4_KTRACE_SCOPE(kKtElementwise, 2);
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = to_half_sat(x[i]);
}

inline cudaError_t launch_to_half(const float* x, size_t n, half* out, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  return launch_kernel(to_half_kernel, ceil_div(n, 256), 256, launch, x, n, out);
}

// Raw element types of launch_widen (the safetensors dtypes a float tensor may have).
enum class RawFloat { F32, F16, BF16 };

static __global__ void widen_kernel(const void* __restrict__ x, RawFloat type, size_t n, float* __restrict__ out) {
  GEMMA4_T4_KTRACE_SCOPE(kKtElementwise, 1);
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (type == RawFloat::F32) {
    out[i] = static_cast<const float*>(x)[i];
  } else {
    const unsigned short b = static_cast<const unsigned short*>(x)[i];
    out[i] = type == RawFloat::BF16 ? __uint_as_float(unsigned(b) << 16) : __half2float(__ushort_as_half(b));
  }
}

inline cudaError_t launch_widen(const void* x, RawFloat type, size_t n, float* out, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  return launch_kernel(widen_kernel, ceil_div(n, 256), 256, launch, x, type, n, out);
}

// A GEMM output as the GELU product's input: fp32 as it is; fp16 clamped to its finite range (NaN kept).
__device__ __forceinline__ float gelu_in(float v) { return v; }
__device__ __forceinline__ float gelu_in(half h) {
  const float v = __half2float(h);
  return v != v ? v : fminf(fmaxf(v, -kHalfMax), kHalfMax);
}
__device__ __forceinline__ float4 gelu_in4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 gelu_in4(const half* p) {
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  half h[4];
  memcpy(h, &w, 8);
  return make_float4(gelu_in(h[0]), gelu_in(h[1]), gelu_in(h[2]), gelu_in(h[3]));
}

// Grid (column blocks, rows): row blockIdx.y. V = 4: each thread takes 4 consecutive columns (16-byte (fp32) or
// 8-byte (fp16) loads of g and u, one 8-byte store; cols, ld and the pointers aligned for it), else one. The same
// expression per element either way.
template <int V, typename T>
static __global__ void gelu_mul_kernel(const T* __restrict__ g, const T* __restrict__ u, size_t ld, int cols,
                                       half* __restrict__ out) {
  GEMMA4_T4_KTRACE_SCOPE(kKtElementwise, 4);
  pdl_enter();
  const size_t c = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (c >= size_t(cols)) return;
  const size_t in = size_t(blockIdx.y) * ld + c, o = size_t(blockIdx.y) * cols + c;
  if constexpr (V == 4) {
    const float4 gv = gelu_in4(g + in), uv = gelu_in4(u + in);
    const half2 lo = __halves2half2(to_half_sat(gelu_tanh(gv.x) * uv.x), to_half_sat(gelu_tanh(gv.y) * uv.y));
    const half2 hi = __halves2half2(to_half_sat(gelu_tanh(gv.z) * uv.z), to_half_sat(gelu_tanh(gv.w) * uv.w));
    *reinterpret_cast<uint2*>(out + o) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else {
    out[o] = to_half_sat(gelu_tanh(gelu_in(g[in])) * gelu_in(u[in]));
  }
}

// rows rows of cols products; g and u rows ld elements apart (ld >= cols), out packed [rows, cols]. T: float
// (the GEMMs' fp32 outputs) or half (a cuBLAS GEMM's fp16 output).
template <typename T>
inline cudaError_t launch_gelu_mul_rows(const T* g, const T* u, size_t ld, int rows, int cols, half* out,
                                        const Launch& launch) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "fp32 or fp16 inputs");
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ld < size_t(cols) || rows > 65535) return cudaErrorInvalidValue;
  constexpr unsigned kIn4 = 4 * sizeof(T);  // bytes of four inputs
  if (cols % 4 == 0 && ld % 4 == 0 && is_aligned(g, kIn4) && is_aligned(u, kIn4) && is_aligned(out, 8))
    return launch_kernel(gelu_mul_kernel<4, T>, dim3(ceil_div(size_t(cols) / 4, 256), unsigned(rows)), 256, launch, g,
                         u, ld, cols, out);
  return launch_kernel(gelu_mul_kernel<1, T>, dim3(ceil_div(size_t(cols), 256), unsigned(rows)), 256, launch, g, u, ld,
                       cols, out);
}

// n products of packed g and u: one row of n.
inline cudaError_t launch_gelu_mul(const float* g, const float* u, size_t n, half* out, const Launch& launch) {
  if (n > size_t(INT_MAX)) return cudaErrorInvalidValue;
  return launch_gelu_mul_rows(g, u, n, 1, int(n), out, launch);
}

// Grid (rows, L); block 32..256 threads over D.
static __global__ void ple_combine_kernel(const float* __restrict__ proj, const float* __restrict__ tok,
                                          const float* __restrict__ w, int L, int D, float pscale, float tscale,
                                          float mix, float eps, float* __restrict__ ple) {
  GEMMA4_T4_KTRACE_SCOPE(kKtElementwise, 5);
  pdl_enter();
  const size_t off = (size_t(blockIdx.x) * L + blockIdx.y) * D;
  float ss = 0.f;
  for (int k = threadIdx.x; k < D; k += blockDim.x) {
    const float v = proj[off + k] * pscale;
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss) / D + eps);
  for (int k = threadIdx.x; k < D; k += blockDim.x)
    ple[off + k] = (proj[off + k] * pscale * r * w[k] + tok[off + k] * tscale) * mix;
}

inline cudaError_t launch_ple_combine(const float* proj, const float* tok, const float* w, int rows, int L, int D,
                                      float pscale, float tscale, float mix, float eps, float* ple,
                                      const Launch& launch) {
  if (rows <= 0) return cudaSuccess;
  const int threads = D >= 256 ? 256 : (D >= 64 ? 64 : 32);
  return launch_kernel(ple_combine_kernel, dim3(rows, L), threads, launch, proj, tok, w, L, D, pscale, tscale, mix, eps,
                       ple);
}

static __global__ void ple_gate_kernel(const float* __restrict__ g, int parts, size_t part_ld,
                                       const float* __restrict__ ple, int rows, int L, int D, int layer,
                                       half* __restrict__ out) {
  GEMMA4_T4_KTRACE_SCOPE(kKtElementwise, 6);
  pdl_enter();
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * D) return;
  const size_t r = i / D, k = i % D;
  out[i] = to_half_sat(gelu_tanh(sum_parts(g + i, parts, part_ld)) * ple[(r * L + layer) * D + k]);
}

// parts (>= 1): g is the sum of that many [rows, D] arrays, part p at g + p * part_ld floats (a split-K int4 GEMM's
// partial tiles, gemm_w4.cuh keep_parts: the sums its reduce kernel would have written).
inline cudaError_t launch_ple_gate(const float* g, const float* ple, int rows, int L, int D, int layer, half* out,
                                   const Launch& launch, int parts = 1, size_t part_ld = 0) {
  if (rows <= 0) return cudaSuccess;
  if (parts < 1 || (parts > 1 && part_ld < size_t(rows) * size_t(D))) return cudaErrorInvalidValue;
  return launch_kernel(ple_gate_kernel, ceil_div(size_t(rows) * D, 256), 256, launch, g, parts, part_ld, ple, rows, L,
                       D, layer, out);
}

// V = 4: each thread caps 4 consecutive floats (one 16-byte load and store; n and x aligned for it), else one.
template <int V>
static __global__ void softcap_kernel(float* __restrict__ x, size_t n, float cap) {
  GEMMA4_T4_KTRACE_SCOPE(kKtSoftcap, 0);
  pdl_enter();
  const size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  if constexpr (V == 4) {
    float4 v = *reinterpret_cast<const float4*>(x + i);
    v.x = tanhf(v.x / cap) * cap;
    v.y = tanhf(v.y / cap) * cap;
    v.z = tanhf(v.z / cap) * cap;
    v.w = tanhf(v.w / cap) * cap;
    *reinterpret_cast<float4*>(x + i) = v;
  } else {
    x[i] = tanhf(x[i] / cap) * cap;
  }
}

inline cudaError_t launch_softcap(float* x, size_t n, float cap, const Launch& launch) {
  if (n == 0 || cap <= 0.f) return cudaSuccess;
  if (n % 4 == 0 && is_aligned(x, 16))
    return launch_kernel(softcap_kernel<4>, ceil_div(n / 4, 256), 256, launch, x, n, cap);
  return launch_kernel(softcap_kernel<1>, ceil_div(n, 256), 256, launch, x, n, cap);
}

// One block (256 threads) per row.
static __global__ void argmax_rows_kernel(const float* __restrict__ x, int V, int* __restrict__ out) {
  GEMMA4_T4_KTRACE_SCOPE(kKtArgmax, 0);
  pdl_enter();
  __shared__ float bv[256];
  __shared__ int bi[256];
  const float* xr = x + size_t(blockIdx.x) * V;
  float best = -INFINITY;
  int besti = V;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (xr[i] > best) {  // strictly greater: keeps the first index within a thread
      best = xr[i];
      besti = i;
    }
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = besti;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float v = bv[threadIdx.x + s];
      const int j = bi[threadIdx.x + s];
      if (v > bv[threadIdx.x] || (v == bv[threadIdx.x] && j < bi[threadIdx.x])) {
        bv[threadIdx.x] = v;
        bi[threadIdx.x] = j;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = bi[0] < V ? bi[0] : 0;
}

inline cudaError_t launch_argmax_rows(const float* x, int rows, int V, int* out, const Launch& launch) {
  if (rows <= 0) return cudaSuccess;
  return launch_kernel(argmax_rows_kernel, rows, 256, launch, x, V, out);
}

}  // namespace kernels
}  // namespace gemma4_t4
