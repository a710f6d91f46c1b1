// gemma4_t4 kernels: RMSNorm family (fp32 residual stream in, fp16 matmul input out).
//
// Gemma 4 RMSNorm: y = x * (mean(x^2) + eps)^-0.5 * w   (w multiplies directly; no 1 + w), in fp32.
//
// rmsnorm:        out16[r] = half(norm(x[src(r)]) * w)  x: fp32, row stride ldx; src(r) = row_index[r] or r
// residual_norm:  h[r] = (h[r] + norm(y[r]) * w_post) * scalar         h: [rows, cols] fp32 residual
//                 y[r] = y_0[r] + y_1[r] + ... in part order: a k-split GEMV's parts (gemv.cuh ksplit) or a
//                 split-K int4 GEMM's partial tiles (gemm_w4.cuh keep_parts), part p at y + p * part_ld
//                 then, by `next`: out16[r] = half(norm(h[r]) * w_next)  (NextNorm::Norm)
//                                   out16[r] = half(h[r])                (NextNorm::Copy, PLE gate input)
//                                   nothing                              (NextNorm::None)
// NextNorm::Norm computes norm(h[r]) exactly as rmsnorm_kernel would on the updated row (same block size,
// same per-thread order, same reduction), so the CUDA backend folds every layer's input rmsnorm but the
// first into the previous layer's last residual_norm bit for bit (tested in tests/gpu/test_kernels.cu).
// One block per row; any cols. Rows of cols % 4 == 0 (row strides too, 16-byte aligned pointers) and
// cols <= 4 * 256 * kNormVec take the vectorised kernels: each thread issues all its 16-byte loads (x or h, y,
// and the weights) before it uses any, so a row costs one memory round trip per reduction instead of one per
// element it owns (a decode step runs ~100 of these one-row norms: latency is all they cost). Other rows take
// the scalar kernels. The path is a function of (cols, row stride, alignment) only, and rmsnorm and
// residual_norm's NextNorm::Norm use the same block size, per-thread order and reduction on either path.
// sm_75: plain loads, block reductions in static shared memory (132 B).
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

enum class NextNorm { None, Norm, Copy };

static __global__ void rmsnorm_kernel(const float* __restrict__ x, int ldx, const int* __restrict__ row_index,
                                      const float* __restrict__ w, int cols, float eps, half* __restrict__ out16) {
  GEMMA4_T4_KTRACE_SCOPE(kKtRmsNorm, 0);
  pdl_enter();
  const float* xr = x + size_t(row_index ? row_index[blockIdx.x] : blockIdx.x) * ldx;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  half* o = out16 + size_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = to_half_sat(xr[c] * r * w[c]);
}

static __global__ void residual_norm_kernel(float* __restrict__ h, const float* __restrict__ y, int parts,
                                            size_t part_ld, const float* __restrict__ w_post, int cols, float eps,
                                            float scalar, NextNorm next, const float* __restrict__ w_next,
                                            half* __restrict__ out16) {
  GEMMA4_T4_KTRACE_SCOPE(kKtResNorm, 0);
  pdl_enter();
  float* hr = h + size_t(blockIdx.x) * cols;
  const float* yr = y + size_t(blockIdx.x) * cols;
  const auto yat = [&](int c) { return sum_parts(yr + c, parts, part_ld); };
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = yat(c);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  float hs = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = (hr[c] + yat(c) * r * w_post[c]) * scalar;
    hr[c] = v;
    hs += v * v;
  }
  if (next == NextNorm::None) return;
  half* o = out16 + size_t(blockIdx.x) * cols;
  if (next == NextNorm::Copy) {
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = to_half_sat(hr[c]);
    return;
  }
  const float r2 = rsqrtf(block_sum(hs) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = to_half_sat(hr[c] * r2 * w_next[c]);
}

constexpr int kNormVec = 8;         // float4 chunks per thread, vectorised kernels (at most)
constexpr int kNormPartsAhead = 4;  // residual_norm: a k-split's parts loaded at once

// Thread t owns chunks t, t + T, ..., t + (KV - 1) T of the row (4 floats each; zeros past the end, and everywhere
// for a null row). KV (<= kNormVec): the launch's chunks per thread (norm_chunks); chunks past the row are zeros,
// which add nothing to a sum, so every KV that covers the row gives the same results bit for bit.
template <int KV>
__device__ __forceinline__ void norm_load(const float* row, int n4, float4 (&v)[KV]) {
  const float4* p = reinterpret_cast<const float4*>(row);
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int j = int(threadIdx.x) + k * int(blockDim.x);
    v[k] = p && j < n4 ? p[j] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <int KV>
__device__ __forceinline__ float norm_sumsq(const float4 (&v)[KV]) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    ss += v[k].x * v[k].x;
    ss += v[k].y * v[k].y;
    ss += v[k].z * v[k].z;
    ss += v[k].w * v[k].w;
  }
  return ss;
}

// out[j] = half4(v[k] * r * w[k]) (or half4(v[k]) when w is null) for the thread's chunks.
template <int KV>
__device__ __forceinline__ void norm_store(half* out, int n4, const float4 (&v)[KV], float r, const float4 (&w)[KV],
                                           bool weighted) {
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int j = int(threadIdx.x) + k * int(blockDim.x);
    if (j >= n4) continue;
    const float4 a = v[k];
    const float4 b = weighted ? make_float4(a.x * r * w[k].x, a.y * r * w[k].y, a.z * r * w[k].z, a.w * r * w[k].w) : a;
    half2 lo = __halves2half2(to_half_sat(b.x), to_half_sat(b.y)),
          hi = __halves2half2(to_half_sat(b.z), to_half_sat(b.w));
    uint2 u;
    memcpy(&u.x, &lo, 4);
    memcpy(&u.y, &hi, 4);
    reinterpret_cast<uint2*>(out)[j] = u;
  }
}

static __global__ void __launch_bounds__(256)
    rmsnorm_vec_kernel(const float* __restrict__ x, int ldx, const int* __restrict__ row_index,
                       const float* __restrict__ w, int cols, float eps, half* __restrict__ out16) {
  GEMMA4_T4_KTRACE_SCOPE(kKtRmsNorm, 1);
  const int n4 = cols / 4;
  float4 wv[kNormVec];
  norm_load(w, n4, wv);  // a constant: before pdl_enter
  pdl_enter();
  float4 v[kNormVec];
  norm_load(x + size_t(row_index ? row_index[blockIdx.x] : blockIdx.x) * ldx, n4, v);
  const float r = rsqrtf(block_sum(norm_sumsq(v)) / cols + eps);
  norm_store(out16 + size_t(blockIdx.x) * cols, n4, v, r, wv, true);
}

// KV: chunks per thread (norm_chunks); the row's 4-float chunks are KV x blockDim at most.
template <int KV>
static __global__ void __launch_bounds__(256)
    residual_norm_vec_kernel(float* __restrict__ h, const float* __restrict__ y, int parts, size_t part_ld,
                             const float* __restrict__ w_post, int cols, float eps, float scalar, NextNorm next,
                             const float* __restrict__ w_next, half* __restrict__ out16) {
  GEMMA4_T4_KTRACE_SCOPE(kKtResNorm, KV);
  const int n4 = cols / 4;
  float4 wp[KV], wn[KV];
  norm_load(w_post, n4, wp);  // constants: before pdl_enter
  norm_load(next == NextNorm::Norm ? w_next : nullptr, n4, wn);
  pdl_enter();
  float* hr = h + size_t(blockIdx.x) * cols;
  float4 yv[KV], hv[KV];
  norm_load(y + size_t(blockIdx.x) * cols, n4, yv);
  norm_load(hr, n4, hv);
  // a k-split's further parts (a GEMV's 2..4, an int4 GEMM's up to ~20), added in part order; loaded PA at a time, so
  // that a block waits one L2 round trip per group of parts, not per part (PA 2 at 8 chunks: no spills)
  constexpr int PA = KV >= kNormVec ? 2 : kNormPartsAhead;
  for (int p0 = 1; p0 < parts; p0 += PA) {
    float4 t[PA][KV];
#pragma unroll
    for (int q = 0; q < PA; ++q)
      if (p0 + q < parts) norm_load(y + size_t(p0 + q) * part_ld + size_t(blockIdx.x) * cols, n4, t[q]);
#pragma unroll
    for (int q = 0; q < PA; ++q)
      if (p0 + q < parts)
#pragma unroll
        for (int k = 0; k < KV; ++k)
          yv[k] = make_float4(yv[k].x + t[q][k].x, yv[k].y + t[q][k].y, yv[k].z + t[q][k].z, yv[k].w + t[q][k].w);
  }
  const float r = rsqrtf(block_sum(norm_sumsq(yv)) / cols + eps);
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int j = int(threadIdx.x) + k * int(blockDim.x);
    if (j >= n4) continue;
    const float4 a = hv[k], b = yv[k], c = wp[k];
    hv[k] = make_float4((a.x + b.x * r * c.x) * scalar, (a.y + b.y * r * c.y) * scalar, (a.z + b.z * r * c.z) * scalar,
                        (a.w + b.w * r * c.w) * scalar);
    reinterpret_cast<float4*>(hr)[j] = hv[k];
  }
  if (next == NextNorm::None) return;
  half* o = out16 + size_t(blockIdx.x) * cols;
  if (next == NextNorm::Copy) {
    norm_store(o, n4, hv, 1.f, wn, false);
    return;
  }
  const float r2 = rsqrtf(block_sum(norm_sumsq(hv)) / cols + eps);  // zeros past the end add nothing
  norm_store(o, n4, hv, r2, wn, true);
}

inline int norm_threads(int cols) { return cols >= 1024 ? 256 : (cols >= 256 ? 128 : 32); }

// The vectorised kernels' block: 32..256 threads, the fewest that hold the row in kNormVec chunks each.
inline int norm_vec_threads(int cols) {
  const int n4 = cols / 4;
  return n4 <= 32 * kNormVec ? 32 : (n4 <= 128 * kNormVec ? 128 : 256);
}

// The vectorised kernels' chunks per thread for a row of cols at norm_vec_threads(cols) threads: the fewest of 1, 2, 4
// and kNormVec that cover the row (registers: a residual_norm with k-split parts holds kNormPartsAhead more rows).
inline int norm_chunks(int cols) {
  const int n4 = cols / 4, t = norm_vec_threads(cols);
  return n4 <= t ? 1 : n4 <= 2 * t ? 2 : n4 <= 4 * t ? 4 : kNormVec;
}

inline bool norm_vec_ok(int cols, int ld, const void* a, const void* b, const void* c) {
  return cols % 4 == 0 && ld % 4 == 0 && cols / 4 <= 256 * kNormVec && is_aligned(a, 16) && is_aligned(b, 16) &&
         is_aligned(c, 16);
}

inline cudaError_t launch_rmsnorm(const float* x, int ldx, const int* row_index, const float* w, int rows, int cols,
                                  float eps, half* out16, const Launch& launch) {
  if (rows <= 0) return cudaSuccess;
  if (norm_vec_ok(cols, ldx, x, w, out16))
    return launch_kernel(rmsnorm_vec_kernel, rows, norm_vec_threads(cols), launch, x, ldx, row_index, w, cols, eps,
                         out16);
  return launch_kernel(rmsnorm_kernel, rows, norm_threads(cols), launch, x, ldx, row_index, w, cols, eps, out16);
}

// w_next: read only by NextNorm::Norm (may be null otherwise). parts (>= 1): y is the sum of that many [rows, cols]
// arrays, part p at y + p * part_ld floats (part_ld >= rows * cols; a multiple of 4 for the vectorised kernel).
inline cudaError_t launch_residual_norm(float* h, const float* y, const float* w_post, int rows, int cols, float eps,
                                        float scalar, NextNorm next, const float* w_next, half* out16,
                                        const Launch& launch, int parts = 1, size_t part_ld = 0) {
  if (rows <= 0) return cudaSuccess;
  if (parts < 1 || (parts > 1 && part_ld < size_t(rows) * size_t(cols))) return cudaErrorInvalidValue;
  if (norm_vec_ok(cols, cols, h, y, w_post) && norm_vec_ok(cols, cols, w_next, out16, nullptr) &&
      (parts == 1 || part_ld % 4 == 0)) {
    const int kv = norm_chunks(cols);
    const auto kernel = kv == 1   ? residual_norm_vec_kernel<1>
                        : kv == 2 ? residual_norm_vec_kernel<2>
                        : kv == 4 ? residual_norm_vec_kernel<4>
                                  : residual_norm_vec_kernel<kNormVec>;
    return launch_kernel(kernel, rows, norm_vec_threads(cols), launch, h, y, parts, part_ld, w_post, cols, eps, scalar,
                         next, w_next, out16);
  }
  return launch_kernel(residual_norm_kernel, rows, norm_threads(cols), launch, h, y, parts, part_ld, w_post, cols, eps,
                       scalar, next, w_next, out16);
}

}  // namespace kernels
}  // namespace gemma4_t4
