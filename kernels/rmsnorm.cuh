// gemma4_t4 kernels: RMSNorm family (fp32 residual stream in, fp16 matmul input out).
//
// Gemma 4 RMSNorm: y = x * (mean(x^2) + eps)^-0.5 * w   (w multiplies directly; no 1 + w), in fp32.
//
// rmsnorm:        out16[r] = half(norm(x[src(r)]) * w)  x: fp32, row stride ldx; src(r) = row_index[r] or r
// residual_norm:  h_out[r] = (h_in[r] + norm(y[r]) * w_post) * scalar   h: [rows, cols] fp32 residual (h_in ==
//                 h_out: in place) then, by `next`: out16[r] = half(norm(h[r]) * w_next)  (NextNorm::Norm)
//                                                   out16[r] = half(h[r])                (NextNorm::Copy, PLE gate
//                                                   input) nothing                              (NextNorm::None)
// Three paths, a function of (cols, row stride, alignment) only:
//   row   cols % 4 == 0, cols <= 32 * 4 * kRowChunks (1536: E2B's hidden size), 16-byte aligned rows: one warp per
//         row, lane l owning float4 chunks l + 32 j. The arithmetic is the row_* functions below, with every
//         rounding explicit (no contraction left to the compiler), and it is shared: the GEMVs that build their
//         x from the residual stream themselves (gemv.cuh, GemvFold) and the persistent decode step
//         (decode_step.cuh) call the same functions, so a folded residual equals this kernel's bit for bit.
//   vec   other rows of cols % 4 == 0 up to 4 * 256 * kNormVec: one block per row, each thread issuing all its
//         16-byte loads (x or h, y, and the weights) before it uses any: one memory round trip per reduction.
//   scalar  the rest.
// On every path rmsnorm and residual_norm's NextNorm::Norm compute norm(h) the same way (same threads, order and
// reduction), so the CUDA backend folds every layer's input rmsnorm but the first into the previous layer's last
// residual_norm bit for bit (tested in tests/gpu/test_kernels.cu).
// sm_75: plain loads, warp shuffles, block reductions in static shared memory (132 B).
#pragma once

#include "common.cuh"
#include "mma.cuh"

namespace gemma4_t4 {
namespace kernels {

enum class NextNorm { None, Norm, Copy };

static __global__ void rmsnorm_kernel(const float* __restrict__ x, int ldx, const int* __restrict__ row_index,
                                      const float* __restrict__ w, int cols, float eps, half* __restrict__ out16) {
  pdl_enter();
  const float* xr = x + size_t(row_index ? row_index[blockIdx.x] : blockIdx.x) * ldx;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  half* o = out16 + size_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = to_half_sat(xr[c] * r * w[c]);
}

// h_in and h may be the same rows (in place): each element is read before the same thread writes it.
static __global__ void residual_norm_kernel(float* h, const float* h_in, const float* __restrict__ y,
                                            const float* __restrict__ w_post, int cols, float eps, float scalar,
                                            NextNorm next, const float* __restrict__ w_next, half* __restrict__ out16) {
  pdl_enter();
  float* hr = h + size_t(blockIdx.x) * cols;
  const float* hi = h_in + size_t(blockIdx.x) * cols;
  const float* yr = y + size_t(blockIdx.x) * cols;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += yr[c] * yr[c];
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  float hs = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = (hi[c] + yr[c] * r * w_post[c]) * scalar;
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

constexpr int kNormVec = 8;  // float4 chunks per thread, vectorised kernels

// Thread t owns chunks t, t + T, ..., t + (kNormVec - 1) T of the row (4 floats each; zeros past the end,
// and everywhere for a null row).
__device__ __forceinline__ void norm_load(const float* row, int n4, float4 (&v)[kNormVec]) {
  const float4* p = reinterpret_cast<const float4*>(row);
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
    const int j = int(threadIdx.x) + k * int(blockDim.x);
    v[k] = p && j < n4 ? p[j] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

__device__ __forceinline__ float norm_sumsq(const float4 (&v)[kNormVec]) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
    ss += v[k].x * v[k].x;
    ss += v[k].y * v[k].y;
    ss += v[k].z * v[k].z;
    ss += v[k].w * v[k].w;
  }
  return ss;
}

// out[j] = half4(v[k] * r * w[k]) (or half4(v[k]) when w is null) for the thread's chunks.
__device__ __forceinline__ void norm_store(half* out, int n4, const float4 (&v)[kNormVec], float r,
                                           const float4 (&w)[kNormVec], bool weighted) {
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
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
  const int n4 = cols / 4;
  float4 wv[kNormVec];
  norm_load(w, n4, wv);  // a constant: before pdl_enter
  pdl_enter();
  float4 v[kNormVec];
  norm_load(x + size_t(row_index ? row_index[blockIdx.x] : blockIdx.x) * ldx, n4, v);
  const float r = rsqrtf(block_sum(norm_sumsq(v)) / cols + eps);
  norm_store(out16 + size_t(blockIdx.x) * cols, n4, v, r, wv, true);
}

static __global__ void __launch_bounds__(256)
    residual_norm_vec_kernel(float* h, const float* h_in, const float* __restrict__ y, const float* __restrict__ w_post,
                             int cols, float eps, float scalar, NextNorm next, const float* __restrict__ w_next,
                             half* __restrict__ out16) {
  const int n4 = cols / 4;
  float4 wp[kNormVec], wn[kNormVec];
  norm_load(w_post, n4, wp);  // constants: before pdl_enter
  norm_load(next == NextNorm::Norm ? w_next : nullptr, n4, wn);
  pdl_enter();
  float* hr = h + size_t(blockIdx.x) * cols;
  float4 yv[kNormVec], hv[kNormVec];
  norm_load(y + size_t(blockIdx.x) * cols, n4, yv);
  norm_load(h_in + size_t(blockIdx.x) * cols, n4, hv);
  const float r = rsqrtf(block_sum(norm_sumsq(yv)) / cols + eps);
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
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

// ---- one warp per row: the row path's arithmetic, shared with gemv.cuh's GemvFold and decode_step.cuh ----

constexpr int kRowChunks = 12;  // float4 chunks of a row per lane: cols <= 32 * 4 * 12 = 1536
constexpr int kRowWarps = 4;    // rows per block of the row kernels

// The lane's chunks lane + 32 j of a row (zeros past n4 and for a null row). Coherent: through L2 (ld.cg), for
// rows other blocks of the same kernel wrote (the persistent step); else plain loads.
template <bool Coherent = false>
__device__ __forceinline__ void row_load(float4 (&v)[kRowChunks], const float* row, int n4) {
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    const int c = lane + 32 * j;
    const float4* p = reinterpret_cast<const float4*>(row) + c;
    v[j] = row && c < n4 ? (Coherent ? __ldcg(p) : *p) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// 1 / rms(row) = (mean(x^2) + eps)^-0.5 over the warp's row, in a fixed order: per lane, chunk by chunk
// (x^2 + y^2 + z^2 + w^2 as fused multiply-adds, then added), then warp_sum.
__device__ __forceinline__ float row_rstd(const float4 (&v)[kRowChunks], int cols, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    float t = __fmul_rn(v[j].x, v[j].x);
    t = __fmaf_rn(v[j].y, v[j].y, t);
    t = __fmaf_rn(v[j].z, v[j].z, t);
    t = __fmaf_rn(v[j].w, v[j].w, t);
    ss = __fadd_rn(ss, t);
  }
  return rsqrtf(warp_sum(ss) / float(cols) + eps);
}

// h = (h + y * r * w_post) * scalar over the lane's chunks (w_post: [cols], read through the read-only path).
__device__ __forceinline__ void row_residual(float4 (&h)[kRowChunks], const float4 (&y)[kRowChunks],
                                             const float* w_post, float r, float scalar, int n4) {
  const int lane = int(threadIdx.x & 31);
  const auto f = [&](float a, float b, float w) { return __fmul_rn(__fmaf_rn(__fmul_rn(b, r), w, a), scalar); };
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    const int c = lane + 32 * j;
    if (c >= n4) continue;
    const float4 w = __ldg(reinterpret_cast<const float4*>(w_post) + c);
    h[j] = make_float4(f(h[j].x, y[j].x, w.x), f(h[j].y, y[j].y, w.y), f(h[j].z, y[j].z, w.z), f(h[j].w, y[j].w, w.w));
  }
}

// out[4c..4c+3] = half(v * r * w) for the lane's chunks c (w null: half(v), r unused). out: fp16, 8-byte aligned.
__device__ __forceinline__ void row_store_half(half* out, const float4 (&v)[kRowChunks], float r, const float* w,
                                               int n4) {
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j) {
    const int c = lane + 32 * j;
    if (c >= n4) continue;
    float4 o = v[j];
    if (w) {
      const float4 ww = __ldg(reinterpret_cast<const float4*>(w) + c);
      o = make_float4(__fmul_rn(__fmul_rn(o.x, r), ww.x), __fmul_rn(__fmul_rn(o.y, r), ww.y),
                      __fmul_rn(__fmul_rn(o.z, r), ww.z), __fmul_rn(__fmul_rn(o.w, r), ww.w));
    }
    const half2 lo = __halves2half2(to_half_sat(o.x), to_half_sat(o.y)),
                hi = __halves2half2(to_half_sat(o.z), to_half_sat(o.w));
    uint2 u;
    memcpy(&u.x, &lo, 4);
    memcpy(&u.y, &hi, 4);
    reinterpret_cast<uint2*>(out)[c] = u;
  }
}

// The lane's chunks of a row into out (fp32).
__device__ __forceinline__ void row_store(float* out, const float4 (&v)[kRowChunks], int n4) {
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int j = 0; j < kRowChunks; ++j)
    if (lane + 32 * j < n4) reinterpret_cast<float4*>(out)[lane + 32 * j] = v[j];
}

// The row path's residual step for one warp's row, h (loaded) in registers: when y is set,
// h = (h + norm(y) * w_post) * scalar (y read like row_load<Coherent>); h stored to h_out when set; then, when x is
// set, x = half(norm(h) * w), or half(h) when w is null.
template <bool Coherent = false>
__device__ __forceinline__ void row_fold(float4 (&h)[kRowChunks], const float* y, const float* w_post, float scalar,
                                         float* h_out, const float* w, int cols, float eps, half* x) {
  const int n4 = cols / 4;
  if (y) {
    float4 yv[kRowChunks];
    row_load<Coherent>(yv, y, n4);
    row_residual(h, yv, w_post, row_rstd(yv, cols, eps), scalar, n4);
  }
  if (h_out) row_store(h_out, h, n4);
  if (x) row_store_half(x, h, w ? row_rstd(h, cols, eps) : 1.f, w, n4);
}

// The norms' weights (constants, cols floats) into L1 by the whole block, before it waits on its predecessor.
__device__ __forceinline__ void prefetch_row_weights(const float* a, const float* b, int cols) {
  for (int k = int(threadIdx.x); k < cols / 32; k += int(blockDim.x)) {
    if (a) prefetch_l1_line(a + 32 * k);
    if (b) prefetch_l1_line(b + 32 * k);
  }
}

static __global__ void __launch_bounds__(32 * kRowWarps)
    rmsnorm_row_kernel(const float* __restrict__ x, int ldx, const int* __restrict__ row_index,
                       const float* __restrict__ w, int rows, int cols, float eps, half* __restrict__ out16) {
  prefetch_row_weights(w, nullptr, cols);
  pdl_enter();
  const int r = int(blockIdx.x) * kRowWarps + int(threadIdx.x >> 5);
  if (r >= rows) return;
  float4 v[kRowChunks];
  row_load(v, x + size_t(row_index ? row_index[r] : r) * ldx, cols / 4);
  row_fold(v, nullptr, nullptr, 1.f, nullptr, w, cols, eps, out16 + size_t(r) * cols);
}

static __global__ void __launch_bounds__(32 * kRowWarps)
    residual_norm_row_kernel(float* h, const float* h_in, const float* __restrict__ y, const float* __restrict__ w_post,
                             int rows, int cols, float eps, float scalar, NextNorm next,
                             const float* __restrict__ w_next, half* __restrict__ out16) {
  prefetch_row_weights(w_post, next == NextNorm::Norm ? w_next : nullptr, cols);
  pdl_enter();
  const int r = int(blockIdx.x) * kRowWarps + int(threadIdx.x >> 5);
  if (r >= rows) return;
  float4 hv[kRowChunks];
  row_load(hv, h_in + size_t(r) * cols, cols / 4);
  row_fold(hv, y + size_t(r) * cols, w_post, scalar, h + size_t(r) * cols, next == NextNorm::Norm ? w_next : nullptr,
           cols, eps, next == NextNorm::None ? nullptr : out16 + size_t(r) * cols);
}

// Whether rows of `cols` floats at row stride ld take the row path (pointers: 16-byte aligned or null).
inline bool norm_row_ok(int cols, int ld, const void* a, const void* b, const void* c) {
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return cols > 0 && cols % 4 == 0 && ld % 4 == 0 && cols / 4 <= 32 * kRowChunks && al(a) && al(b) && al(c);
}

inline int norm_threads(int cols) { return cols >= 1024 ? 256 : (cols >= 256 ? 128 : 32); }

// The vectorised kernels' block: 32..256 threads, the fewest that hold the row in kNormVec chunks each.
inline int norm_vec_threads(int cols) {
  const int n4 = cols / 4;
  return n4 <= 32 * kNormVec ? 32 : (n4 <= 128 * kNormVec ? 128 : 256);
}

inline bool norm_vec_ok(int cols, int ld, const void* a, const void* b, const void* c) {
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return cols % 4 == 0 && ld % 4 == 0 && cols / 4 <= 256 * kNormVec && al(a) && al(b) && al(c);
}

inline cudaError_t launch_rmsnorm(const float* x, int ldx, const int* row_index, const float* w, int rows, int cols,
                                  float eps, half* out16, const Launch& launch) {
  if (rows <= 0) return cudaSuccess;
  if (norm_row_ok(cols, ldx, x, w, out16))
    return launch_kernel(rmsnorm_row_kernel, ceil_div(size_t(rows), kRowWarps), 32 * kRowWarps, launch, x, ldx,
                         row_index, w, rows, cols, eps, out16);
  if (norm_vec_ok(cols, ldx, x, w, out16))
    return launch_kernel(rmsnorm_vec_kernel, rows, norm_vec_threads(cols), launch, x, ldx, row_index, w, cols, eps,
                         out16);
  return launch_kernel(rmsnorm_kernel, rows, norm_threads(cols), launch, x, ldx, row_index, w, cols, eps, out16);
}

// w_next: read only by NextNorm::Norm (may be null otherwise). h_in: the residual read (null: h, in place); when
// not h, it must not overlap h.
inline cudaError_t launch_residual_norm(float* h, const float* y, const float* w_post, int rows, int cols, float eps,
                                        float scalar, NextNorm next, const float* w_next, half* out16,
                                        const Launch& launch, const float* h_in = nullptr) {
  if (rows <= 0) return cudaSuccess;
  if (!h_in) h_in = h;
  if (norm_row_ok(cols, cols, h, y, w_post) && norm_row_ok(cols, cols, w_next, out16, h_in))
    return launch_kernel(residual_norm_row_kernel, ceil_div(size_t(rows), kRowWarps), 32 * kRowWarps, launch, h, h_in,
                         y, w_post, rows, cols, eps, scalar, next, w_next, out16);
  if (norm_vec_ok(cols, cols, h, y, w_post) && norm_vec_ok(cols, cols, w_next, out16, h_in))
    return launch_kernel(residual_norm_vec_kernel, rows, norm_vec_threads(cols), launch, h, h_in, y, w_post, cols, eps,
                         scalar, next, w_next, out16);
  return launch_kernel(residual_norm_kernel, rows, norm_threads(cols), launch, h, h_in, y, w_post, cols, eps, scalar,
                       next, w_next, out16);
}

}  // namespace kernels
}  // namespace gemma4_t4
