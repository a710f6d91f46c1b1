// gemma4_t4 kernels: RMSNorm family (fp32 residual stream in, fp16 matmul input out).
//
// Gemma 4 RMSNorm: y = x * (mean(x^2) + eps)^-0.5 * w   (w multiplies directly; no 1 + w), in fp32.
//
// rmsnorm:        out16[r] = half(norm(x[src(r)]) * w)  x: fp32, row stride ldx; src(r) = row_index[r] or r
// residual_norm:  h[r] = (h[r] + norm(y[r]) * w_post) * scalar         h: [rows, cols] fp32 residual
//                 then, by `next`: out16[r] = half(norm(h[r]) * w_next)  (NextNorm::Norm)
//                                   out16[r] = half(h[r])                (NextNorm::Copy, PLE gate input)
//                                   nothing                              (NextNorm::None)
// NextNorm::Norm computes norm(h[r]) exactly as rmsnorm_kernel would on the updated row (same block size,
// same per-thread order, same reduction), so the CUDA backend folds every layer's input rmsnorm but the
// first into the previous layer's last residual_norm bit for bit (tested in tests/gpu/test_kernels.cu).
// One block per row; any cols. sm_75: plain loads, block reductions in static shared memory (132 B).
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

enum class NextNorm { None, Norm, Copy };

static __global__ void rmsnorm_kernel(const float* __restrict__ x, int ldx, const int* __restrict__ row_index,
                                      const float* __restrict__ w, int cols, float eps, half* __restrict__ out16) {
  const float* xr = x + size_t(row_index ? row_index[blockIdx.x] : blockIdx.x) * ldx;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  half* o = out16 + size_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = to_half_sat(xr[c] * r * w[c]);
}

static __global__ void residual_norm_kernel(float* __restrict__ h, const float* __restrict__ y,
                                            const float* __restrict__ w_post, int cols, float eps, float scalar,
                                            NextNorm next, const float* __restrict__ w_next, half* __restrict__ out16) {
  float* hr = h + size_t(blockIdx.x) * cols;
  const float* yr = y + size_t(blockIdx.x) * cols;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += yr[c] * yr[c];
  const float r = rsqrtf(block_sum(ss) / cols + eps);
  float hs = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = (hr[c] + yr[c] * r * w_post[c]) * scalar;
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

inline int norm_threads(int cols) { return cols >= 1024 ? 256 : (cols >= 256 ? 128 : 32); }

inline cudaError_t launch_rmsnorm(const float* x, int ldx, const int* row_index, const float* w, int rows, int cols,
                                  float eps, half* out16, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  rmsnorm_kernel<<<rows, norm_threads(cols), 0, stream>>>(x, ldx, row_index, w, cols, eps, out16);
  return cudaGetLastError();
}

inline cudaError_t launch_residual_norm(float* h, const float* y, const float* w_post, int rows, int cols, float eps,
                                        float scalar, NextNorm next, const float* w_next, half* out16,
                                        cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  residual_norm_kernel<<<rows, norm_threads(cols), 0, stream>>>(h, y, w_post, cols, eps, scalar, next, w_next, out16);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace gemma4_t4
