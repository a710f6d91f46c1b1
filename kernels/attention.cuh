// gemma4_t4 kernels: attention over a session's KV cache (decode and prefill rows alike), split over the
// sequence (flash-decoding) and merged by a second kernel.
//
// For row r (a query token at position p = pos[r] of sequence seq[r]) and query head h:
//   keys j in [lo, p] with lo = max(0, p - window + 1) on sliding layers (window > 0), 0 on full layers;
//   K/V row j of KV head g = h / (heads / kv_heads) lives at slot j % capacity of the (seq, layer) cache
//   (caches: [capacity, kv_heads, D] fp16; the K/V of the rows themselves were written before this runs);
//   out[r, h] = softmax_j(q . k_j) v_j     (Gemma 4: scaling 1.0, no soft-cap)
// Work split: grid (rows, kv_heads, splits); a block takes one KV head's `group` query heads (GQA 8:1 on
// E2B), so each K/V row is loaded once for all of them, and one contiguous range of keys. Keys go in tiles of
// 32: scores (one warp per key, 16-byte K loads), an online-softmax update, then P.V with each thread owning
// D / BLOCK output channels for every head. Partial (o, m, l) per split go to scratch; attention_merge
// combines them. Shared memory: group x D floats of q + group x 32 scores (<= 17 KiB at D = 512, G = 8).
// fp32 accumulation; sm_75 safe.
#pragma once

#include "common.cuh"

namespace gemma4_t4 {
namespace kernels {

struct AttnArgs {
  const half* q = nullptr;       // [rows, heads, D] fp16
  half* const* kbase = nullptr;  // [seqs * layers] caches
  half* const* vbase = nullptr;
  const int* capacity = nullptr;  // [seqs * layers]
  const int* seq = nullptr;       // [rows]
  const int* pos = nullptr;       // [rows]
  int layer = 0, layers = 0;      // table index of the layer whose cache is read (the KV source)
  int rows = 0, heads = 0, kv_heads = 0;
  int window = 0;            // sliding window; 0 = full attention
  int splits = 1;            // key ranges per row; each row splits its own keys evenly
  float* part_o = nullptr;   // [rows, heads, splits, D] fp32 scratch
  float* part_ml = nullptr;  // [rows, heads, splits, 2] fp32 scratch (max, sum)
  half* out = nullptr;       // [rows, heads * D] fp16
};

constexpr int kAttnTile = 32;

template <int D>
__host__ __device__ constexpr int attn_block() {
  return D >= 128 ? 128 : D;
}

template <int D, int G>
static __global__ void __launch_bounds__(attn_block<D>()) attention_split_kernel(AttnArgs a) {
  constexpr int BLOCK = attn_block<D>(), WARPS = BLOCK / 32, C = D / BLOCK;
  __shared__ float qs[G][D];
  __shared__ float ps[G][kAttnTile];
  __shared__ float m_s[G], l_s[G], scale_s[G];
  const int row = blockIdx.x, g = blockIdx.y, sp = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = a.heads / a.kv_heads;
  const int p = a.pos[row];
  const int lo = a.window > 0 ? max(0, p - a.window + 1) : 0;
  // this row's keys split evenly (in whole tiles) over the splits: the grid does not depend on positions,
  // so a captured CUDA graph stays valid as the sequences grow
  const int per_split = ((p - lo + 1 + a.splits - 1) / a.splits + kAttnTile - 1) / kAttnTile * kAttnTile;
  const int begin = lo + sp * per_split;
  const int end = min(p + 1, begin + per_split);
  const int idx = a.seq[row] * a.layers + a.layer;
  const half* K = a.kbase[idx];
  const half* V = a.vbase[idx];
  const int cap = a.capacity[idx];

  for (int i = tid; i < G * D; i += BLOCK) {
    const int h = i / D, c = i % D;
    qs[h][c] = h < group ? __half2float(a.q[(size_t(row) * a.heads + g * group + h) * D + c]) : 0.f;
  }
  if (tid < G) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  float acc[G][C];
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int k = 0; k < C; ++k) acc[h][k] = 0.f;
  __syncthreads();

  for (int t0 = begin; t0 < end; t0 += kAttnTile) {
    const int nt = min(kAttnTile, end - t0);
    for (int jj = warp; jj < nt; jj += WARPS) {
      const int slot = (t0 + jj) % cap;
      const uint4* kr = reinterpret_cast<const uint4*>(K + (size_t(slot) * a.kv_heads + g) * D);
      float part[G];
#pragma unroll
      for (int h = 0; h < G; ++h) part[h] = 0.f;
      for (int c8 = lane; c8 < D / 8; c8 += 32) {
        float kf[8];
        unpack8(kr[c8], kf);
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
          for (int k = 0; k < 8; ++k) part[h] = fmaf(qs[h][c8 * 8 + k], kf[k], part[h]);
      }
#pragma unroll
      for (int h = 0; h < G; ++h) {
        const float s = warp_sum(part[h]);
        if (lane == 0) ps[h][jj] = s;
      }
    }
    __syncthreads();
    if (tid < group) {
      const float mo = m_s[tid];
      float mx = mo;
      for (int jj = 0; jj < nt; ++jj) mx = fmaxf(mx, ps[tid][jj]);
      const float sc = mo == -INFINITY ? 0.f : __expf(mo - mx);
      float sum = 0.f;
      for (int jj = 0; jj < nt; ++jj) {
        const float e = __expf(ps[tid][jj] - mx);
        ps[tid][jj] = e;
        sum += e;
      }
      l_s[tid] = l_s[tid] * sc + sum;
      m_s[tid] = mx;
      scale_s[tid] = sc;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int k = 0; k < C; ++k) acc[h][k] *= h < group ? scale_s[h] : 0.f;
    for (int jj = 0; jj < nt; ++jj) {
      const int slot = (t0 + jj) % cap;
      const half* vr = V + (size_t(slot) * a.kv_heads + g) * D;
#pragma unroll
      for (int k = 0; k < C; ++k) {
        const float v = __half2float(vr[tid + k * BLOCK]);
#pragma unroll
        for (int h = 0; h < G; ++h) acc[h][k] = fmaf(ps[h][jj], v, acc[h][k]);
      }
    }
    __syncthreads();  // ps, scale_s are rewritten by the next tile
  }

#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h >= group) break;
    const size_t base = (size_t(row) * a.heads + g * group + h) * a.splits + sp;
#pragma unroll
    for (int k = 0; k < C; ++k) a.part_o[base * D + tid + k * BLOCK] = acc[h][k];
    if (tid == 0) {
      a.part_ml[base * 2] = m_s[h];
      a.part_ml[base * 2 + 1] = l_s[h];
    }
  }
}

// out[r, h, c] = sum_s o_s[c] e^(m_s - M) / sum_s l_s e^(m_s - M). Grid (rows, heads), D threads.
template <int D>
static __global__ void attention_merge_kernel(AttnArgs a) {
  const int row = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  const size_t base = (size_t(row) * a.heads + h) * a.splits;
  float M = -INFINITY;
  for (int s = 0; s < a.splits; ++s) M = fmaxf(M, a.part_ml[(base + s) * 2]);
  float L = 0.f, o = 0.f;
  for (int s = 0; s < a.splits; ++s) {
    const float m = a.part_ml[(base + s) * 2];
    if (m == -INFINITY) continue;  // an empty split
    const float w = __expf(m - M);
    L += a.part_ml[(base + s) * 2 + 1] * w;
    o += a.part_o[(base + s) * D + c] * w;
  }
  a.out[(size_t(row) * a.heads + h) * D + c] = to_half_sat(L > 0.f ? o / L : 0.f);
}

template <int D>
inline cudaError_t launch_attention_d(const AttnArgs& a, int group, cudaStream_t stream) {
  const dim3 grid(a.rows, a.kv_heads, a.splits);
  if (group <= 1)
    attention_split_kernel<D, 1><<<grid, attn_block<D>(), 0, stream>>>(a);
  else if (group <= 2)
    attention_split_kernel<D, 2><<<grid, attn_block<D>(), 0, stream>>>(a);
  else if (group <= 4)
    attention_split_kernel<D, 4><<<grid, attn_block<D>(), 0, stream>>>(a);
  else if (group <= 8)
    attention_split_kernel<D, 8><<<grid, attn_block<D>(), 0, stream>>>(a);
  else
    return cudaErrorInvalidValue;
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  attention_merge_kernel<D><<<dim3(a.rows, a.heads), D, 0, stream>>>(a);
  return cudaGetLastError();
}

// Head dims 32..512 (powers of two), up to 8 query heads per KV head.
inline bool attention_supported(int d, int group) {
  return (d == 32 || d == 64 || d == 128 || d == 256 || d == 512) && group >= 1 && group <= 8;
}

inline cudaError_t launch_attention(const AttnArgs& a, int head_dim, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.splits < 1) return cudaErrorInvalidValue;
  const int group = a.heads / a.kv_heads;
  switch (head_dim) {
    case 32: return launch_attention_d<32>(a, group, stream);
    case 64: return launch_attention_d<64>(a, group, stream);
    case 128: return launch_attention_d<128>(a, group, stream);
    case 256: return launch_attention_d<256>(a, group, stream);
    case 512: return launch_attention_d<512>(a, group, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace gemma4_t4
