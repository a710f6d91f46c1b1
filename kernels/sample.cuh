// gemma4_t4 kernels: token sampling on the GPU, one block per row of logits, so a decode step sends only
// token ids over PCIe. Same algorithm as the CPU reference (include/gemma4_t4/sampler.hpp):
//   1. repetition penalty on the row's `seen` ids (x / p when x > 0, else x * p)
//   2. temperature <= 0 or top_k == 1: argmax (first on ties), one pass
//   3. thresholds on key(x) (key = order-preserving float -> u32 map), kept set = {key >= max threshold}:
//        min-p  key(m + T ln(min_p))
//        top-k  the k-th largest key: the largest K with count(key >= K) >= k
//        top-p  the largest K with sum_{key >= K} e^((x-m)/T) >= top_p * (mass of the set above), and > 0
//   4. u = uniform01(seed, counter) * Z; the first id (in id order) whose running kept mass passes u, or the
//      last kept id when rounding leaves u past the total.
// Passes over the row (V fp32 logits, 16-byte loads where the row allows them); Gemma's defaults take 2:
//   pass 1     the maximum m and each thread's largest key. With 0 < top_k <= 1024: L = the k-th largest of
//              the 1024 per-thread maxima (32 barrier counts), a lower bound of the k-th largest key: k
//              threads each hold a key >= L.
//   pass 2     candidates: every id with key >= L, appended to shared memory (warp-aggregated integer
//              atomics), usually ~k of them. If <= kSampleCand: sorted back into id order (bitonic), then
//              top-k among them (32 barrier counts), top-p (each candidate sums the mass at or above its key;
//              32 block sums above kSampleQuad candidates) and the draw (a block scan) touch only those.
//   passes 3-6 more than kSampleCand keys >= L (ties, clustered rows, top_k near 1024): pass 2 also built a
//              256-bin histogram of their top 8 key bits; a radix select (8-bit digits, MSB first) narrows
//              the k-th largest key's bucket, one histogram pass per digit, each collecting the keys above the
//              bucket's floor again, until <= kSampleCand of them: then as above.
//   full row   top_k <= 0 or > kSampleCand (top-k by the radix select, 4 histogram passes), or more than
//              kSampleCand keys tied at the top-k threshold: top-p by 1 + 32 block-wide mass sums, the draw
//              by a block scan over per-thread contiguous chunks (~2 more passes).
// Rows of V <= kSampleCand take every id as a candidate. Every sum is in a fixed order and every atomic is
// an integer one: the same logits and parameters give the same token on every run.
// 1024 threads per block, static shared memory ~18 KiB. sm_75 safe.
#pragma once

#include <climits>

#include "common.cuh"
#include "rng.cuh"

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
constexpr int kSampleCand = 1024;  // candidate capacity: one per thread
constexpr int kSampleQuad = 256;   // top-p by per-candidate suffix sums (O(n^2)) up to this many candidates

__device__ __forceinline__ uint32_t key_of(float v) { return detail::float_key(__float_as_uint(v)); }

// ---- row visitor ----

// f(v, i, stride, valid) for the row in steps that every lane of a warp takes together (f may vote): element c
// of v is x[i + c * stride], present where bit c of `valid` is set. 16-byte loads when the row is aligned,
// four scalar loads in flight otherwise.
template <typename F>
__device__ __forceinline__ void visit_sample_row(const float* x, int V, F&& f) {
  const int lane = threadIdx.x & 31, warp0 = threadIdx.x - lane;
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int n4 = V / 4;
    for (int j0 = warp0; j0 < n4; j0 += 4 * kSampleThreads) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int j = j0 + lane + u * kSampleThreads;
        v[u] = j < n4 ? x4[j] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int j = j0 + lane + u * kSampleThreads;
        f(v[u], 4 * j, 1, j < n4 ? 15u : 0u);
      }
    }
  } else {
    for (int i0 = warp0; i0 < V; i0 += 4 * kSampleThreads) {
      const int i = i0 + lane;
      float e[4];
      unsigned valid = 0;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool in = i + c * kSampleThreads < V;
        e[c] = in ? x[i + c * kSampleThreads] : 0.f;
        valid |= in ? 1u << c : 0u;
      }
      f(make_float4(e[0], e[1], e[2], e[3]), i, kSampleThreads, valid);
    }
  }
}

// ---- kernel ----

// logits [rows, V] fp32 (the penalty is applied in place), params [rows], seen: ids (params[r].seen_offset,
// seen_count), out [rows] int32 token ids. Grid: one block of kSampleThreads per row.
static __global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(float* __restrict__ logits, int V, const SampleParams* __restrict__ params,
                  const int* __restrict__ seen, int* __restrict__ out) {
  GEMMA4_T4_KTRACE_SCOPE(kKtSample, 0);
  pdl_enter();
  __shared__ float scan[kSampleThreads];  // full-row path: per-thread chunk masses, scanned
  __shared__ int cand[kSampleCand];       // candidate ids; sorted ascending before use
  __shared__ uint32_t ckey[kSampleCand];  // [n] keys of kept candidates (0 otherwise), id order
  __shared__ float cmass[kSampleCand];    // [n] their masses e^((x-m)/T) (0 otherwise)
  __shared__ int hist[256];               // radix select: keys in the bucket per next digit
  __shared__ float wsum[32];              // candidate draw: per-warp totals, scanned
  __shared__ int count;                   // keys >= lo this pass has seen
  __shared__ int pick, last;              // the drawn candidate (or id); the last kept candidate
  __shared__ int sel_digit, sel_above;    // radix select: the digit chosen, the keys >= L above its bucket
  __shared__ uint32_t pthr;               // top-p threshold from the per-candidate sums
  float* x = logits + size_t(blockIdx.x) * V;
  const SampleParams P = params[blockIdx.x];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
  const float T = P.temperature;
  const bool select = P.top_k > 0 && P.top_k < V;  // a top-k threshold
  // the candidate path: the top-k set fits in shared memory, or the whole row does
  const bool gather = V <= kSampleCand || (select && P.top_k <= kSampleCand);

  // ---- pass 1: row maximum, per-thread largest key ----
  float m = -INFINITY;
  uint32_t tmax = 0;  // key 0 is the least key: a thread without elements claims nothing
  visit_sample_row(x, V, [&](float4 v, int, int, unsigned valid) {
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if ((valid >> c) & 1u) {
        m = fmaxf(m, e[c]);
        tmax = max(tmax, key_of(e[c]));
      }
  });
  m = block_max(m);
  uint32_t thr = 0;
  if (P.min_p > 0.f) thr = max(thr, key_of(m + T * logf(P.min_p)));

  // ---- top-k: candidates (passes 2+) or the radix select alone ----
  uint32_t kthr = 0;  // top-k threshold (0: none)
  bool have = false;  // cand[0, n) holds every id with key >= lo
  int n = 0, shift = 32;
  uint32_t prefix = 0;  // the k-th largest key's top 32 - shift bits
  if (select || gather) {
    uint32_t lo_bound = 0;  // L: count(key >= L) >= k
    if (gather && select && V > kSampleCand && P.top_k <= kSampleThreads)
      for (int bit = 31; bit >= 0; --bit) {
        const uint32_t c = lo_bound | (1u << bit);
        if (__syncthreads_count(tmax >= c) >= P.top_k) lo_bound = c;
      }
    uint32_t lo = lo_bound;  // this pass collects keys >= lo and histograms the bucket's keys >= L
    int above = 0;           // keys >= L above the bucket (< k)
    for (;;) {
      const bool hist_on = select && shift > 0;
      if (tid < 256) hist[tid] = 0;
      if (tid == 0) count = 0;
      __syncthreads();
      visit_sample_row(x, V, [&](float4 v, int i, int stride, unsigned valid) {
        const float e[4] = {v.x, v.y, v.z, v.w};
        uint32_t k[4];
        bool in[4], any = false;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          k[c] = key_of(e[c]);
          in[c] = ((valid >> c) & 1u) && k[c] >= lo;
          any = any || in[c];
        }
        if (!__any_sync(0xffffffffu, any)) return;  // the common case: nothing here
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const unsigned b = __ballot_sync(0xffffffffu, in[c]);
          if (b == 0) continue;
          if (gather) {  // one atomic per warp; slots past kSampleCand only count
            const int first = __ffs(b) - 1;
            int base = 0;
            if (lane == first) base = atomicAdd(&count, __popc(b));
            base = __shfl_sync(0xffffffffu, base, first);
            const int slot = base + __popc(b & ((1u << lane) - 1u));
            if (in[c] && slot < kSampleCand) cand[slot] = i + c * stride;
          }
          if (hist_on) {  // one atomic per warp when its digits agree (ties, -inf rows), else one per key
            const bool h = in[c] && (shift == 32 || (k[c] >> shift) == prefix);
            const int d = int((k[c] >> (shift - 8)) & 255u);
            const unsigned hb = __ballot_sync(0xffffffffu, h);
            if (hb != 0) {
              const int first = __ffs(hb) - 1;
              const int d0 = __shfl_sync(0xffffffffu, d, first);
              if (__ballot_sync(0xffffffffu, h && d == d0) == hb) {
                if (lane == first) atomicAdd(&hist[d0], __popc(hb));
              } else if (h) {
                atomicAdd(&hist[d], 1);
              }
            }
          }
        }
      });
      __syncthreads();
      n = count;
      if (gather && n <= kSampleCand) {
        have = true;
        break;
      }
      if (!hist_on) break;  // shift == 0: prefix is the top-k threshold
      if (warp == 0) {      // the largest digit d with above + count(digit >= d) >= k; lane l looks at 8l..8l+7
        int h[8], s = 0;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          h[q] = hist[8 * lane + q];
          s += h[q];
        }
        int suffix = s;  // this lane's bins and every bin above
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int t = __shfl_down_sync(0xffffffffu, suffix, o);
          if (lane + o < 32) suffix += t;
        }
        int run = above + suffix - s, d = -1, ab = above;
#pragma unroll
        for (int q = 7; q >= 0; --q) {
          if (d < 0 && run + h[q] >= P.top_k) {
            d = 8 * lane + q;
            ab = run;
          }
          run += h[q];
        }
        const unsigned b = __ballot_sync(0xffffffffu, d >= 0);  // never empty: count(key >= lo) >= k
        if (lane == (b != 0 ? 31 - __clz(int(b)) : 0)) {
          sel_digit = d < 0 ? 0 : d;
          sel_above = ab;
        }
      }
      __syncthreads();
      prefix = shift == 32 ? uint32_t(sel_digit) : (prefix << 8) | uint32_t(sel_digit);
      above = sel_above;
      shift -= 8;
      lo = max(lo_bound, prefix << shift);
      if (shift == 0 && !gather) break;
    }
    if (!have && select) kthr = prefix;  // shift == 0
  }

  // ---- candidate path: n <= kSampleCand ids, thread t holds the t-th in id order ----
  if (have) {
    const int p2 = n <= 1 ? 1 : 1 << (32 - __clz(n - 1));  // bitonic sort of cand[0, p2), padded with INT_MAX
    if (tid >= n && tid < p2) cand[tid] = INT_MAX;
    __syncthreads();
    for (int k = 2; k <= p2; k <<= 1)
      for (int j = k >> 1; j > 0; j >>= 1) {
        const int l = tid ^ j;
        if (l > tid && tid < p2) {
          const int a = cand[tid], b = cand[l];
          if ((a > b) == ((tid & k) == 0)) {
            cand[tid] = b;
            cand[l] = a;
          }
        }
        __syncthreads();
      }
    const bool has = tid < n;
    const int id = has ? cand[tid] : 0;
    const float v = has ? x[id] : 0.f;
    const uint32_t key = key_of(v);
    if (select) {  // the k-th largest key lies in the bucket, and the candidates hold every key >= lo
      uint32_t K = shift == 32 ? 0u : prefix << shift;
      for (int bit = shift - 1; bit >= 0; --bit) {
        const uint32_t c = K | (1u << bit);
        if (__syncthreads_count(has && key >= c) >= P.top_k) K = c;
      }
      kthr = K;
    }
    thr = max(thr, kthr);
    const bool kept = has && key >= thr;
    const float mass = kept ? __expf((v - m) / T) : 0.f;
    if (P.top_p < 1.f) {
      const float target = P.top_p * block_sum(mass);
      uint32_t pk = 0;
      if (n <= kSampleQuad) {  // each kept candidate sums the mass at or above its key, in id order
        ckey[tid] = kept ? key : 0u;
        cmass[tid] = mass;
        if (tid == 0) pthr = 0;
        __syncthreads();
        if (kept) {
          float z = 0.f;
#pragma unroll 4
          for (int i = 0; i < n; ++i) z += ckey[i] >= key ? cmass[i] : 0.f;
          if (z >= target && z > 0.f) atomicMax(&pthr, key);
        }
        __syncthreads();
        pk = pthr;
      } else {
        for (int bit = 31; bit >= 0; --bit) {
          const uint32_t c = pk | (1u << bit);
          const float z = block_sum((kept && key >= c) ? mass : 0.f);
          if (z >= target && z > 0.f) pk = c;  // z > 0: top_p <= 0 keeps the top key, not nothing
        }
      }
      thr = max(thr, pk);
    }
    const bool keep = kept && key >= thr;
    const float w = keep ? mass : 0.f;
    float incl = w;  // inclusive scan of w over the block, in id order
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    if (lane == 31) wsum[warp] = incl;
    if (tid == 0) {
      pick = INT_MAX;
      last = -1;
    }
    __syncthreads();
    if (warp == 0) {
      float s = wsum[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float t = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += t;
      }
      wsum[lane] = s;
    }
    __syncthreads();
    if (warp > 0) incl += wsum[warp - 1];
    const float total = wsum[31];
    const float u = float(detail::uniform01(P.seed, P.counter) * double(total));
    if (keep && w > 0.f && incl > u) atomicMin(&pick, tid);
    if (keep) atomicMax(&last, tid);
    __syncthreads();
    if (tid == 0) out[blockIdx.x] = pick != INT_MAX ? cand[pick] : last >= 0 ? cand[last] : 0;
    return;
  }

  // ---- full-row path ----
  thr = max(thr, kthr);
  if (tid == 0) pick = V;
  __syncthreads();
  if (P.top_p < 1.f) {
    float z0 = 0.f;
    for (int i = tid; i < V; i += kSampleThreads)
      if (key_of(x[i]) >= thr) z0 += __expf((x[i] - m) / T);
    const float target = P.top_p * block_sum(z0);
    uint32_t pk = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t c = pk | (1u << bit);
      float z = 0.f;
      for (int i = tid; i < V; i += kSampleThreads)
        if (key_of(x[i]) >= c) z += __expf((x[i] - m) / T);
      z = block_sum(z);
      if (z >= target && z > 0.f) pk = c;  // z > 0: top_p <= 0 keeps the top key, not nothing
    }
    thr = max(thr, pk);
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
    int found = -1, last_i = -1;
    for (int i = b; i < e; ++i)
      if (key_of(x[i]) >= thr) {
        cum += __expf((x[i] - m) / T);
        last_i = i;
        if (cum > u) {
          found = i;
          break;
        }
      }
    atomicMin(&pick, found >= 0 ? found : last_i);
  }
  __syncthreads();
  const bool none = pick == V;  // u fell past the total through rounding: take the last kept id
  __syncthreads();
  if (none) {
    if (tid == 0) pick = -1;
    __syncthreads();
    int last_i = -1;
    for (int i = tid; i < V; i += kSampleThreads)
      if (key_of(x[i]) >= thr) last_i = i;
    if (last_i >= 0) atomicMax(&pick, last_i);
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = pick >= 0 && pick < V ? pick : 0;
}

inline cudaError_t launch_sample(float* logits, int rows, int V, const SampleParams* params, const int* seen, int* out,
                                 const Launch& launch) {
  if (rows <= 0) return cudaSuccess;
  return launch_kernel(sample_kernel, rows, kSampleThreads, launch, logits, V, params, seen, out);
}

}  // namespace kernels
}  // namespace gemma4_t4
