// gemma4_t4 kernels: per-head RMSNorm + RoPE, written to a contiguous buffer (queries) or into a
// session's KV cache (keys, values).
//
// For each (row r, head h): x = in[r, h*d : (h+1)*d] (fp32, matmul output)
//   x = x * (mean(x^2) + eps)^-0.5 * w          (w == nullptr: no weight, Gemma 4's v_norm)
//   rotate-half RoPE at position pos[r]: channel i pairs with i + d/2, angle pos * inv_freq[i];
//   inv_freq[i] == 0 leaves the pair alone (proportional RoPE's unrotated tail); inv_freq == nullptr: no RoPE.
// Destination: out[r, h, :] (fp16) when `out` is set, else the cache of the row's sequence:
//   cache[seq[r] * layers + layer] + (slot * heads + h) * d, slot = pos[r] % capacity[seq[r] * layers + layer]
//   (full layers have capacity >= every position, so the slot is the position; sliding layers use a ring).
// Block: max(32, d/2) threads, one channel pair each. sm_75 safe; static shared memory 132 B.
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

// Where K/V rows of a batch go: per (sequence, layer) cache bases and capacities. Device pointers.
struct KvTarget {
  half* const* base = nullptr;    // [seqs * layers] -> [capacity, heads, d] fp16
  const int* capacity = nullptr;  // [seqs * layers] slots
  const int* seq = nullptr;       // [rows] sequence of each row
  int layer = 0;
  int layers = 0;
};

static __global__ void head_norm_rope_kernel(const float* __restrict__ in, int ld_in, int heads, int d,
                                             const float* __restrict__ w, float eps, const float* __restrict__ inv_freq,
                                             const int* __restrict__ pos, half* __restrict__ out, KvTarget kv) {
  const int row = blockIdx.x, hh = blockIdx.y, half_d = d / 2;
  const int i = threadIdx.x;
  const bool active = i < half_d;
  const float* x = in + size_t(row) * ld_in + size_t(hh) * d;
  float a = active ? x[i] : 0.f, b = active ? x[i + half_d] : 0.f;
  const float r = rsqrtf(block_sum(a * a + b * b) / d + eps);
  if (!active) return;
  a *= r * (w ? w[i] : 1.f);
  b *= r * (w ? w[i + half_d] : 1.f);
  const int p = pos[row];
  if (inv_freq && inv_freq[i] != 0.f) {
    float s, c;
    sincosf(float(p) * inv_freq[i], &s, &c);
    const float a2 = a * c - b * s;
    b = b * c + a * s;
    a = a2;
  }
  half* dst;
  if (out) {
    dst = out + (size_t(row) * heads + hh) * d;
  } else {
    const int idx = kv.seq[row] * kv.layers + kv.layer;
    const int slot = p % kv.capacity[idx];
    dst = kv.base[idx] + (size_t(slot) * heads + hh) * d;
  }
  dst[i] = to_half_sat(a);
  dst[i + half_d] = to_half_sat(b);
}

inline cudaError_t launch_head_norm_rope(const float* in, int ld_in, int rows, int heads, int d, const float* w,
                                         float eps, const float* inv_freq, const int* pos, half* out,
                                         const KvTarget& kv, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = ((d / 2 + 31) / 32) * 32;
  head_norm_rope_kernel<<<dim3(rows, heads), threads, 0, stream>>>(in, ld_in, heads, d, w, eps, inv_freq, pos, out, kv);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace gemma4_t4
