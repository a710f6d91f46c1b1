// micro_bench: the kernels of one Gemma 4 E2B step, one at a time, against measured ceilings.
//
//   micro_bench [--quick | --attention]
//
// Ceilings first: stream bandwidth (a read-only kernel over 1 GiB) and copy bandwidth (cudaMemcpy device to
// device, bytes read + written), medians of repeats. Then, at E2B shapes:
//   - decode GEMVs (fp16 and w4a16 weights) for 1, 8 and 16 rows, and the fp16 LM head: GB/s of weight bytes;
//   - prefill projections for a 512-row chunk: cuBLAS on fp16 weights, and for w4a16 the dequantise-to-fp16
//     + cuBLAS path split into its two parts: TFLOP/s, and the dequantisation's share of the time;
//   - decode attention (1 row) at 512, 4096 and 32768 keys, sliding (head dim 256, window 512) and full
//     (head dim 512): GB/s of the K/V bytes the row must read, at the backend's split count and at half and
//     twice it; then 16 rows of 16 sessions at staggered positions (batched decode); then 8..128 sessions of 576
//     positions by split count (`--attention`: the ceilings and this sweep only);
//   - prefill attention for a 512-row chunk (rows at positions 0..511 and 3584..4095), the tensor-core flash
//     kernel next to the CUDA-core split kernel: TFLOP/s of the unmasked QK^T and PV work.
// Weights rotate over enough copies to exceed the L2 cache, so GEMV numbers are DRAM numbers.
// Timing: CUDA events around `reps` launches, median of 5; fill by a hash kernel (random, never zeros).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../kernels/attention.cuh"
#include "../kernels/flash_attention.cuh"
#include "../kernels/gemv.cuh"

using namespace gemma4_t4::kernels;

#define CK(x)                                                                                  \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

__device__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint32_t h = uint32_t(i) * 0x9E3779B1u ^ uint32_t(i >> 32) * 0x85EBCA77u ^ seed;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  h *= 0x297A2D39u;
  return h ^ (h >> 15);
}

// halves uniform in [-scale, scale)
__global__ void fill_half(half* p, size_t n, float scale, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2half((hash32(i, seed) * (1.f / 4294967296.f) * 2.f - 1.f) * scale);
}
__global__ void fill_u32(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = hash32(i, seed);
}
__global__ void read_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads; practically never taken
}

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

void fill(half* p, size_t n, float scale, uint32_t seed) {
  fill_half<<<1024, 256>>>(p, n, scale, seed);
  CK(cudaGetLastError());
}
void fill(uint32_t* p, size_t n, uint32_t seed) {
  fill_u32<<<1024, 256>>>(p, n, seed);
  CK(cudaGetLastError());
}

// Median over 5 timings of `reps` calls, in microseconds per call.
double time_us(const std::function<void(int)>& call, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) call(i);
  std::vector<double> t;
  for (int k = 0; k < 5; ++k) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) call(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3 / reps);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[2];
}

struct Shape {
  const char* name;
  int out, in;
};

// E2B (35 layers; sliding layers head dim 256, full layers 512; 8 query heads, 1 KV head; MLP 6144, 12288 on
// the KV-shared layers 15..34; PLE 35 x 256).
const Shape kShapes[] = {
    {"q sliding", 2048, 1536},  {"q full", 4096, 1536},         {"k/v sliding", 256, 1536},
    {"k full", 512, 1536},      {"o sliding", 1536, 2048},      {"o full", 1536, 4096},
    {"gate/up", 6144, 1536},    {"gate/up wide", 12288, 1536},  {"down", 1536, 6144},
    {"down wide", 1536, 12288}, {"PLE model proj", 8960, 1536}, {"PLE gate", 256, 1536},
    {"PLE proj", 1536, 256},
};

// Decode-attention arguments for one layer (table index 0 of 1) over the row tables seq / pos / capacity; the caches
// (kbase, vbase) are the caller's to set.
AttnArgs attn_args(const half* q, const int* seq, const int* pos, const int* capacity, int rows, int heads, int kvh,
                   int window, int splits, float* part_o, float* part_ml, half* out, unsigned* counters) {
  AttnArgs a;
  a.q = q;
  a.capacity = capacity;
  a.seq = seq;
  a.pos = pos;
  a.layer = 0;
  a.layers = 1;
  a.rows = rows;
  a.heads = heads;
  a.kv_heads = kvh;
  a.window = window;
  a.splits = splits;
  a.part_o = part_o;
  a.part_ml = part_ml;
  a.out = out;
  a.counters = counters;
  return a;
}

// Batched decode attention as a many-session decode step runs it: `rows` sessions of 576 positions (a 512-token
// prompt and 64 steps; positions staggered by up to 7), each with caches of its own (1,024 slots), by split count:
// the planner's (planner.hpp attention_plan: its head slices too, marked *), then others around it. Sessions rotate
// over enough copies to exceed the L2 cache three times, as in a step whose 35 layers read different caches. GB/s:
// the K/V bytes the rows must read.
void batched_attention_sweep(const cudaDeviceProp& prop) {
  const int heads = 8, kvh = 1, cap = 1024, sms = prop.multiProcessorCount;
  std::printf("\nbatched decode attention by split count, us per launch (GB/s); * = the planner's count\n");
  std::printf("%-20s %5s %6s %3s %6s  %s\n", "layer", "rows", "keys", "hs", "blocks", "splits: us (GB/s)");
  const size_t pool_bytes = size_t(3) << 29;  // 1.5 GiB of caches
  half* pool = dev_alloc<half>(pool_bytes / sizeof(half));
  fill(pool, pool_bytes / sizeof(half), 0.5f, 21);
  constexpr int kMaxRowSplits = 4096;  // rows x splits the scratch holds
  float* part_o = dev_alloc<float>(size_t(kMaxRowSplits) * heads * 512);
  float* part_ml = dev_alloc<float>(size_t(kMaxRowSplits) * heads * 2);
  unsigned* counters = dev_alloc<unsigned>(1024 * 8);
  CK(cudaMemset(counters, 0, 1024 * 8 * sizeof(unsigned)));
  half* q = dev_alloc<half>(size_t(128) * heads * 512);
  fill(q, size_t(128) * heads * 512, 1.f, 22);
  half* out = dev_alloc<half>(size_t(128) * heads * 512);
  int* meta = dev_alloc<int>(3 * 128);                   // seq, pos, capacity
  half** ptrs = dev_alloc<half*>(size_t(64) * 2 * 128);  // [copy][K rows, V rows]
  for (int D : {256, 512}) {
    const int window = D == 256 ? 512 : 0;
    const size_t cache = size_t(cap) * kvh * D;  // halves per K or V cache
    const int sessions = int(pool_bytes / sizeof(half) / (2 * cache));
    for (int rows : {8, 16, 32, 48, 64, 128}) {
      std::vector<int> hmeta(3 * 128, 0);
      double bytes = 0;
      int max_keys = 0;
      for (int r = 0; r < rows; ++r) {
        const int p = 575 - r % 8, keys = window ? std::min(window, p + 1) : p + 1;
        hmeta[r] = r;
        hmeta[128 + r] = p;
        hmeta[256 + r] = cap;
        bytes += 2.0 * keys * kvh * D * 2;
        max_keys = std::max(max_keys, keys);
      }
      const int copies = std::min(64, std::max(2, std::min(sessions / rows, int(3.0 * prop.l2CacheSize / bytes) + 1)));
      std::vector<half*> hp(size_t(copies) * 2 * 128);
      for (int c = 0; c < copies; ++c)
        for (int r = 0; r < rows; ++r) {
          const size_t s = size_t(c) * rows + r;
          hp[size_t(c) * 256 + r] = pool + 2 * cache * s;
          hp[size_t(c) * 256 + 128 + r] = pool + 2 * cache * s + cache;
        }
      CK(cudaMemcpy(meta, hmeta.data(), hmeta.size() * sizeof(int), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ptrs, hp.data(), hp.size() * sizeof(half*), cudaMemcpyHostToDevice));
      const int hs = attention_head_split_for(rows, kvh, heads / kvh, max_keys, sms);
      const int per_sm = attention_blocks_per_sm(D, heads / kvh / hs);
      const int policy = attention_splits_for(rows, kvh, heads / kvh, D, max_keys, sms, 1024, hs, per_sm);
      std::printf("%-20s %5d %6d %3d %6d ", window ? "sliding D=256 w=512" : "full D=512", rows, max_keys, hs,
                  rows * kvh * hs * policy);
      std::vector<int> counts = {policy};
      for (int sp : {policy / 2, policy - 1, policy + 1, policy * 2, policy * 4})
        if (sp >= 1 && sp * rows <= kMaxRowSplits && sp <= kAttnMaxSplits &&
            std::find(counts.begin(), counts.end(), sp) == counts.end())
          counts.push_back(sp);
      std::sort(counts.begin(), counts.end());
      for (int sp : counts) {
        AttnArgs a =
            attn_args(q, meta, meta + 128, meta + 256, rows, heads, kvh, window, sp, part_o, part_ml, out, counters);
        a.head_split = hs;
        const double us = time_us(
            [&](int i) {
              AttnArgs b = a;
              b.kbase = ptrs + size_t(i % copies) * 256;
              b.vbase = b.kbase + 128;
              CK(launch_attention(b, D, 0));
            },
            4 * copies);
        std::printf(" %3d%s %6.1f (%4.0f)", sp, sp == policy ? "*" : ":", us, bytes / us / 1e3);
      }
      std::printf("\n");
    }
  }
  CK(cudaFree(pool));
  CK(cudaFree(part_o));
  CK(cudaFree(part_ml));
  CK(cudaFree(counters));
  CK(cudaFree(q));
  CK(cudaFree(out));
  CK(cudaFree(meta));
  CK(cudaFree(ptrs));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool attention_only = argc > 1 && std::strcmp(argv[1], "--attention") == 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  const size_t l2 = size_t(prop.l2CacheSize);

  // ---- ceilings
  const size_t big = size_t(1) << 30;
  uint4* buf = dev_alloc<uint4>(big / 16 * 2);
  uint32_t* sink = dev_alloc<uint32_t>(1);
  fill(reinterpret_cast<uint32_t*>(buf), big / 4 * 2, 1);
  const double read_us =
      time_us([&](int) { read_kernel<<<prop.multiProcessorCount * 8, 512>>>(buf, big / 16, sink); }, 5);
  const double copy_us =
      time_us([&](int) { CK(cudaMemcpyAsync(buf + big / 16, buf, big, cudaMemcpyDeviceToDevice)); }, 5);
  const double stream_gbs = big / read_us / 1e3, copy_gbs = 2.0 * big / copy_us / 1e3;
  std::printf("stream read %.0f GB/s, copy %.0f GB/s (read + write), 1 GiB, median of 5\n\n", stream_gbs, copy_gbs);
  CK(cudaFree(buf));
  if (attention_only) {
    batched_attention_sweep(prop);
    return 0;
  }

  // ---- decode GEMVs
  const int max_rows = 16;
  half* x = dev_alloc<half>(size_t(4096) * 12288);
  fill(x, size_t(4096) * 12288, 1.f, 2);
  float* y = dev_alloc<float>(size_t(4096) * 262144 / 8);
  const int row_set[] = {1, 8, 16};
  std::printf("decode GEMV (weights from DRAM: rotated over copies > L2)\n");
  std::printf("%-16s %6s %6s | %-26s | %-26s\n", "matrix", "out", "in", "fp16 us (GB/s) n=1/8/16",
              "w4a16 us (GB/s) n=1/8/16");
  for (const Shape& s : kShapes) {
    const size_t w16_bytes = size_t(s.out) * s.in * 2, w4_bytes = size_t(s.out) * s.in / 2 + size_t(s.out) * s.in / 16;
    const int c16 = int(std::max<size_t>(1, 3 * l2 / w16_bytes + 1)),
              c4 = int(std::max<size_t>(1, 3 * l2 / w4_bytes + 1));
    half* w16 = dev_alloc<half>(size_t(s.out) * s.in * c16);
    uint32_t* wq = dev_alloc<uint32_t>(size_t(s.out) * s.in / 8 * c4);
    half* sc = dev_alloc<half>(size_t(s.out) * s.in / 32 * c4);
    fill(w16, size_t(s.out) * s.in * c16, 0.05f, 3);
    fill(wq, size_t(s.out) * s.in / 8 * c4, 4);
    fill(sc, size_t(s.out) * s.in / 32 * c4, 0.01f, 5);
    std::printf("%-16s %6d %6d |", s.name, s.out, s.in);
    for (int n : row_set) {
      const double us = time_us(
          [&](int i) {
            CK(launch_gemv(w16 + size_t(i % c16) * s.out * s.in, nullptr, nullptr, x, n, s.out, s.in, y, s.out, 0));
          },
          50);
      std::printf(" %5.1f(%4.0f)", us, w16_bytes / us / 1e3);
    }
    std::printf(" |");
    for (int n : row_set) {
      const double us = time_us(
          [&](int i) {
            CK(launch_gemv(nullptr, wq + size_t(i % c4) * s.out * s.in / 8, sc + size_t(i % c4) * s.out * s.in / 32, x,
                           n, s.out, s.in, y, s.out, 0));
          },
          50);
      std::printf(" %5.1f(%4.0f)", us, w4_bytes / us / 1e3);
    }
    std::printf("\n");
    CK(cudaFree(w16));
    CK(cudaFree(wq));
    CK(cudaFree(sc));
  }
  {  // LM head: 262144 x 1536 fp16, larger than L2 on its own
    const int V = 262144, H = 1536;
    half* lm = dev_alloc<half>(size_t(V) * H);
    fill(lm, size_t(V) * H, 0.05f, 6);
    std::printf("%-16s %6d %6d |", "LM head (fp16)", V, H);
    for (int n : row_set) {
      const double us = time_us([&](int) { CK(launch_gemv(lm, nullptr, nullptr, x, n, V, H, y, V, 0)); }, 10);
      std::printf(" %5.1f(%4.0f)", us, size_t(V) * H * 2 / us / 1e3);
    }
    std::printf("   (%.0f%% of stream read at n=1 is the target >= 85%%)\n",
                100.0 *
                    (size_t(V) * H * 2 /
                     time_us([&](int) { CK(launch_gemv(lm, nullptr, nullptr, x, 1, V, H, y, V, 0)); }, 10) / 1e3) /
                    stream_gbs);
    CK(cudaFree(lm));
  }
  (void)max_rows;

  // ---- prefill projections: 512-row chunk
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  const int M = 512;
  std::printf("\nprefill projections, %d rows: cuBLAS fp16 (fp32 accumulate); w4a16 = dequantise + cuBLAS\n", M);
  std::printf("%-16s | %10s %8s | %10s %10s %8s %10s\n", "matrix", "fp16 us", "TFLOP/s", "deq us", "gemm us", "TFLOP/s",
              "deq share");
  half* deq = dev_alloc<half>(size_t(12288) * 1536);
  double tot_deq = 0, tot_gemm = 0;
  for (const Shape& s : kShapes) {
    half* w16 = dev_alloc<half>(size_t(s.out) * s.in);
    uint32_t* wq = dev_alloc<uint32_t>(size_t(s.out) * s.in / 8);
    half* sc = dev_alloc<half>(size_t(s.out) * s.in / 32);
    fill(w16, size_t(s.out) * s.in, 0.05f, 7);
    fill(wq, size_t(s.out) * s.in / 8, 8);
    fill(sc, size_t(s.out) * s.in / 32, 0.01f, 9);
    const float alpha = 1.f, beta = 0.f;
    auto gemm = [&](const half* W) {
      if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.out, M, s.in, &alpha, W, CUDA_R_16F, s.in, x, CUDA_R_16F, s.in,
                       &beta, y, CUDA_R_32F, s.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx failed\n");
        std::exit(1);
      }
    };
    const double flops = 2.0 * M * s.out * s.in;
    const double g_us = time_us([&](int) { gemm(w16); }, 20);
    const double d_us = time_us([&](int) { CK(launch_dequant_w4(wq, sc, s.out, s.in, deq, 0)); }, 20);
    const double gq_us = time_us([&](int) { gemm(deq); }, 20);
    tot_deq += d_us;
    tot_gemm += gq_us;
    std::printf("%-16s | %10.1f %8.1f | %10.1f %10.1f %8.1f %9.0f%%\n", s.name, g_us, flops / g_us / 1e6, d_us, gq_us,
                flops / (d_us + gq_us) / 1e6, 100 * d_us / (d_us + gq_us));
    CK(cudaFree(w16));
    CK(cudaFree(wq));
    CK(cudaFree(sc));
  }
  std::printf("w4a16 prefill over these shapes: dequantisation %.0f%% of dequant + GEMM time\n",
              100 * tot_deq / (tot_deq + tot_gemm));
  CK(cudaFree(deq));
  cublasDestroy(blas);

  // ---- attention
  const int heads = 8, kvh = 1;
  const int ctx_set[] = {512, 4096, 32768};
  std::printf("\ndecode attention, 1 row, %d query heads / %d KV head (GB/s of the K/V bytes the row reads)\n", heads,
              kvh);
  std::printf("%-22s %8s %8s %10s %8s  %s\n", "layer", "keys", "splits", "us", "GB/s",
              "merge (* = the policy's splits)");
  const size_t cache_elems = size_t(32768 + 1024) * kvh * 512;
  half *kc = dev_alloc<half>(cache_elems), *vc = dev_alloc<half>(cache_elems);
  fill(kc, cache_elems, 0.5f, 10);
  fill(vc, cache_elems, 1.f, 11);
  half** kv_ptrs = dev_alloc<half*>(2);
  int* meta = dev_alloc<int>(3 * 1024 + 1);
  float* part_o = dev_alloc<float>(size_t(1024) * heads * 512);
  float* part_ml = dev_alloc<float>(size_t(1024) * heads * 2);
  unsigned* counters = dev_alloc<unsigned>(1024);  // [rows, kv_heads] fused-merge arrival counters, zeroed once
  CK(cudaMemset(counters, 0, 1024 * sizeof(unsigned)));
  half* q = dev_alloc<half>(size_t(512) * heads * 512);
  half* out = dev_alloc<half>(size_t(512) * heads * 512);
  fill(q, size_t(512) * heads * 512, 1.f, 12);
  CK(cudaMemcpy(kv_ptrs, &kc, sizeof(half*), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(kv_ptrs + 1, &vc, sizeof(half*), cudaMemcpyHostToDevice));
  auto set_meta = [&](int rows, int first_pos, int capacity) {
    std::vector<int> h(3 * 1024 + 1, 0);
    for (int r = 0; r < rows; ++r) h[1024 + r] = first_pos + r;  // seq 0 for all; positions
    h[3 * 1024] = capacity;
    CK(cudaMemcpy(meta, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
  };
  auto args = [&](int rows, int window, int splits) {
    AttnArgs a = attn_args(q, meta, meta + 1024, meta + 3 * 1024, rows, heads, kvh, window, splits, part_o, part_ml,
                           out, counters);
    a.kbase = kv_ptrs;
    a.vbase = kv_ptrs + 1;
    return a;
  };
  // the backend's split policy (cuda_backend.hpp attention_splits -> attention_splits_for)
  auto splits_for = [&](int rows, int keys, int D) {
    return attention_splits_for(rows, kvh, heads / kvh, D, keys, prop.multiProcessorCount, 1024);
  };
  // launches per call: 1 when the merge fuses into the split kernel (or one split), else split + merge
  auto merge_mode = [&](int splits, int D) {
    return splits == 1 ? "1 split" : splits <= attention_fused_splits(heads / kvh, D) ? "fused" : "2 launches";
  };
  for (int D : {256, 512}) {
    const int window = D == 256 ? 512 : 0;
    for (int ctx : ctx_set) {
      if (quick && ctx > 4096) continue;
      const int keys = window ? std::min(window, ctx) : ctx;
      const int cap = window ? window + 512 : ctx;
      set_meta(1, ctx - 1, cap);
      const int policy = splits_for(1, keys, D);
      // the policy's count, then half and twice it: data for tuning attention_splits_for / kAttnFusedFloats
      for (const int sp : {policy, policy / 2, policy * 2}) {
        if (sp < 1 || sp > kAttnMaxSplits || (quick && sp != policy)) continue;
        const AttnArgs a = args(1, window, sp);
        const double us = time_us([&](int) { CK(launch_attention(a, D, 0)); }, 50);
        std::printf("%-22s %8d %8d %10.1f %8.0f  %s%s\n", D == 256 ? "sliding D=256 w=512" : "full D=512", keys, sp, us,
                    2.0 * keys * kvh * D * 2 / us / 1e3, merge_mode(sp, D), sp == policy ? " *" : "");
      }
    }
  }
  {
    // Batched decode: 16 rows of 16 sessions (own caches), positions staggered ctx - 1 - 37 r.
    constexpr int kRows = 16, kCtx = 4096;
    std::printf("\nbatched decode attention, %d rows (sessions at positions %d..%d)\n", kRows,
                kCtx - 1 - 37 * (kRows - 1), kCtx - 1);
    std::printf("%-22s %8s %8s %10s %8s  %s\n", "layer", "keys/row", "splits", "us", "GB/s", "merge");
    const size_t per_seq = size_t(kCtx) * kvh * 512;  // halves per cache (the larger of the two layers)
    half *bk = dev_alloc<half>(per_seq * kRows), *bv = dev_alloc<half>(per_seq * kRows);
    fill(bk, per_seq * kRows, 0.5f, 13);
    fill(bv, per_seq * kRows, 1.f, 14);
    half** bptr = dev_alloc<half*>(2 * kRows);
    int* bmeta = dev_alloc<int>(3 * kRows);  // seq, pos, capacity
    std::vector<half*> hptr(2 * kRows);
    std::vector<int> hmeta(3 * kRows);
    for (int r = 0; r < kRows; ++r) {
      hptr[r] = bk + per_seq * r;
      hptr[kRows + r] = bv + per_seq * r;
      hmeta[r] = r;
      hmeta[kRows + r] = kCtx - 1 - 37 * r;
    }
    CK(cudaMemcpy(bptr, hptr.data(), hptr.size() * sizeof(half*), cudaMemcpyHostToDevice));
    for (int D : {256, 512}) {
      const int window = D == 256 ? 512 : 0;
      for (int r = 0; r < kRows; ++r) hmeta[2 * kRows + r] = window ? window + 512 : kCtx;
      CK(cudaMemcpy(bmeta, hmeta.data(), hmeta.size() * sizeof(int), cudaMemcpyHostToDevice));
      AttnArgs a = args(kRows, window, 1);
      a.kbase = bptr;
      a.vbase = bptr + kRows;
      a.seq = bmeta;
      a.pos = bmeta + kRows;
      a.capacity = bmeta + 2 * kRows;
      double bytes = 0;
      for (int r = 0; r < kRows; ++r) {
        const int p = hmeta[kRows + r];
        bytes += 2.0 * (window ? std::min(window, p + 1) : p + 1) * kvh * D * 2;
      }
      a.splits = splits_for(kRows, window ? window : kCtx, D);
      const double us = time_us([&](int) { CK(launch_attention(a, D, 0)); }, 20);
      std::printf("%-22s %8d %8d %10.1f %8.0f  %s\n", D == 256 ? "sliding D=256 w=512" : "full D=512",
                  window ? window : kCtx, a.splits, us, bytes / us / 1e3, merge_mode(a.splits, D));
    }
    CK(cudaFree(bk));
    CK(cudaFree(bv));
    CK(cudaFree(bptr));
    CK(cudaFree(bmeta));
  }
  if (!quick) batched_attention_sweep(prop);
  std::printf("\nprefill attention, 512-row chunk (causal; TFLOP/s of QK^T + PV over the unmasked keys)\n");
  std::printf("%-22s %10s %10s %8s\n", "layer", "positions", "us", "TFLOP/s");
  for (int D : {256, 512}) {
    const int window = D == 256 ? 512 : 0;
    for (int first : {0, 3584}) {
      const int rows = 512, cap = window ? window + 512 : 4096;
      set_meta(rows, first, cap);
      double flops = 0;
      for (int r = 0; r < rows; ++r) {
        const int p = first + r, lo = window ? std::max(0, p - window + 1) : 0;
        flops += 4.0 * heads * D * (p - lo + 1);
      }
      const AttnArgs a = args(rows, window, splits_for(rows, window ? window : first + rows, D));
      const double us = time_us([&](int) { CK(launch_attention(a, D, 0)); }, 5);
      std::vector<int> hseq(rows, 0), hpos(rows);
      for (int r = 0; r < rows; ++r) hpos[r] = first + r;
      std::vector<int2> htiles(rows);
      const int nt = flash_attention_tiles(hseq.data(), hpos.data(), rows, heads / kvh, htiles.data(), rows);
      int2* tiles = dev_alloc<int2>(size_t(rows));
      CK(cudaMemcpy(tiles, htiles.data(), size_t(nt) * sizeof(int2), cudaMemcpyHostToDevice));
      const double fus = time_us([&](int) { CK(launch_flash_attention(a, tiles, nt, D, 0)); }, 5);
      CK(cudaFree(tiles));
      std::printf("%-22s %4d..%-5d %10.1f %8.2f  split kernel (CUDA cores)\n",
                  D == 256 ? "sliding D=256 w=512" : "full D=512", first, first + rows - 1, us, flops / us / 1e6);
      std::printf("%-22s %4d..%-5d %10.1f %8.2f  flash kernel (mma.sync m16n8k8)\n", "", first, first + rows - 1, fus,
                  flops / fus / 1e6);
    }
  }
  std::printf("\nmicro_bench done\n");
  return 0;
}
