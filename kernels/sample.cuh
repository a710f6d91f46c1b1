// gemma4_t4 kernels: token sampling on the GPU, one block per row of logits, so a decode step sends only
// token ids over PCIe. Same algorithm as the CPU reference (include/gemma4_t4/sampler.hpp):
//   1. repetition penalty on the row's `seen` ids (x / p when x > 0, else x * p)
//   2. temperature <= 0 or top_k == 1: argmax (first on ties)
//   3. thresholds on x, kept set = {x >= max threshold} (ties kept):
//        min-p  m + T ln(min_p)
//        top-k  the k-th largest x: the largest key K with count(key(x) >= K) >= k, built bit by bit
//               (32 block-wide counts; key = order-preserving float -> u32 map)
//        top-p  the largest K with sum_{key(x) >= K} e^((x-m)/T) >= top_p * (mass of the set above)
//   4. u = uniform01(seed, counter) * Z; the first id (in id order) whose running kept mass passes u:
//      a block-wide exclusive scan over per-thread contiguous chunks finds the thread, which walks its chunk.
// 1024 threads per block, static shared memory ~4.3 KiB. sm_75 safe.
#pragma once

#include "common.cuh"
#include "../include/gemma4_t4/rng.hpp"

namespace gemma4_t4 {
namespace kernels {

struct SampleParams {
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  float penalty = 1.f;
  int seen_offset = 0, seen_count = 0;  // into the seen-ids array
  unsigned long long seed = 0, counter = 0;
};

constexpr int kSampleThreads = 1024;

__device__ __forceinline__ uint32_t key_of(float v) { return detail::float_key(__float_as_uint(v)); }

static __global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(float* __restrict__ logits, int V, const SampleParams* __restrict__ params,
                  const int* __restrict__ seen, int* __restrict__ out) {
  pdl_enter();
  __shared__ float scan[kSampleThreads];
  __shared__ int pick;
  float* x = logits + size_t(blockIdx.x) * V;
  const SampleParams P = params[blockIdx.x];
  const int tid = threadIdx.x;
  if (P.penalty != 1.f && P.penalty > 0.f)
    for (int i = tid; i < P.seen_count; i += kSampleThreads) {
      const int t = seen[P.seen_offset + i];
      const float v = x[t];
      x[t] = v > 0.f ? v / P.penalty : v * P.penalty;
    }
  __syncthreads();
  if (P.temperature <= 0.f || P.top_k == 1) {  // greedy: the first index holding the max, in one pass
    float best = -INFINITY;
    int bi = V;  // this thread's first index holding `best` (it visits its indices in increasing order); a row
                 // with nothing above -inf ends at V: index 0, as the reference's argmax
    const auto see = [&](float v, int i) {
      if (v > best) {
        best = v;
        bi = i;
      }
    };
    if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0) {  // 16-byte loads, 8 in flight
      const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 8
      for (int j = tid; j < V / 4; j += kSampleThreads) {
        const float4 v = x4[j];
        see(v.x, 4 * j);
        see(v.y, 4 * j + 1);
        see(v.z, 4 * j + 2);
        see(v.w, 4 * j + 3);
      }
    } else {
      for (int i = tid; i < V; i += kSampleThreads) see(x[i], i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // larger value, then smaller index
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) {
        best = ob;
        bi = oi;
      }
    }
    __shared__ float wbest[kSampleThreads / 32];
    __shared__ int wbi[kSampleThreads / 32];
    if ((tid & 31) == 0) {
      wbest[tid >> 5] = best;
      wbi[tid >> 5] = bi;
    }
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < kSampleThreads / 32; ++w)
        if (wbest[w] > best || (wbest[w] == best && wbi[w] < bi)) {
          best = wbest[w];
          bi = wbi[w];
        }
      out[blockIdx.x] = bi < V ? bi : 0;
    }
    return;
  }
  float m = -INFINITY;
  for (int i = tid; i < V; i += kSampleThreads) m = fmaxf(m, x[i]);
  m = block_max(m);
  if (tid == 0) pick = V;
  __syncthreads();
  const float T = P.temperature;
  uint32_t thr = 0;
  if (P.min_p > 0.f) thr = max(thr, key_of(m + T * logf(P.min_p)));
  if (P.top_k > 0 && P.top_k < V) {
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = prefix | (1u << bit);
      float c = 0.f;
      for (int i = tid; i < V; i += kSampleThreads) c += key_of(x[i]) >= cand ? 1.f : 0.f;
      if (block_sum(c) >= float(P.top_k)) prefix = cand;
    }
    thr = max(thr, prefix);
  }
  if (P.top_p < 1.f) {
    float z0 = 0.f;
    for (int i = tid; i < V; i += kSampleThreads)
      if (key_of(x[i]) >= thr) z0 += __expf((x[i] - m) / T);
    const float target = P.top_p * block_sum(z0);
    uint32_t prefix = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = prefix | (1u << bit);
      float z = 0.f;
      for (int i = tid; i < V; i += kSampleThreads)
        if (key_of(x[i]) >= cand) z += __expf((x[i] - m) / T);
      if (block_sum(z) >= target) prefix = cand;
    }
    thr = max(thr, prefix);
  }
  // kept mass of this thread's contiguous chunk, then an exclusive scan over the block
  const int chunk = (V + kSampleThreads - 1) / kSampleThreads;
  const int b = min(V, tid * chunk), e = min(V, b + chunk);
  float local = 0.f;
  for (int i = b; i < e; ++i)
    if (key_of(x[i]) >= thr) local += __expf((x[i] - m) / T);
  scan[tid] = local;
  __syncthreads();
  for (int off = 1; off < kSampleThreads; off <<= 1) {  // Hillis-Steele inclusive scan
    const float v = tid >= off ? scan[tid - off] : 0.f;
    __syncthreads();
    scan[tid] += v;
    __syncthreads();
  }
  const float total = scan[kSampleThreads - 1];
  const float u = float(detail::uniform01(P.seed, P.counter) * double(total));
  const float before = scan[tid] - local;
  if (local > 0.f && before <= u && u < scan[tid]) {
    float cum = before;
    int found = -1, last = -1;
    for (int i = b; i < e; ++i)
      if (key_of(x[i]) >= thr) {
        cum += __expf((x[i] - m) / T);
        last = i;
        if (cum > u) {
          found = i;
          break;
        }
      }
    atomicMin(&pick, found >= 0 ? found : last);
  }
  __syncthreads();
  const bool none = pick == V;  // u fell past the total through rounding: take the last kept id
  __syncthreads();
  if (none) {
    if (tid == 0) pick = -1;
    __syncthreads();
    int last = -1;
    for (int i = tid; i < V; i += kSampleThreads)
      if (key_of(x[i]) >= thr) last = i;
    if (last >= 0) atomicMax(&pick, last);
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = pick >= 0 && pick < V ? pick : 0;
}

inline cudaError_t launch_sample(float* logits, int rows, int V, const SampleParams* params, const int* seen, int* out,
                                 cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return launch_kernel(sample_kernel, rows, kSampleThreads, stream, logits, V, params, seen, out);
}

}  // namespace kernels
}  // namespace gemma4_t4
