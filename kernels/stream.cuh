// gemma4_t4 kernels: stream_read, the memory-bandwidth probe of the built-in benchmark (gemma4_t4/bench/measure.hpp).
//
// A decode step streams every weight once, so the benchmark's ceiling is (bytes a read-only kernel moves per
// second) / (decode bytes per token). This is that kernel:
//   out[b] = XOR of the 32-bit words block b read        p: [n] uint4 (16 B each), out: [gridDim.x] uint32
// Threads walk p grid-stride with 16-byte read-only loads (__ldg: fully coalesced, one transaction per 16 B
// per thread), reduce in registers, then per warp with shuffles and per block in 128 B of static shared memory;
// one word per block is written, so the kernel moves n * 16 bytes in and ~nothing out. Every load feeds the
// result, so none can be elided (a probe whose loads the compiler drops measures nothing).
// Launch shape: any grid; the benchmark uses 8 blocks per SM x 512 threads, enough bytes in flight to saturate
// GDDR6 (T4) and HBM3e (H200) alike (the configuration bench/micro_bench.cu measures with).
// sm_75: plain loads, shuffles, static shared memory only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace gemma4_t4 {
namespace kernels {

constexpr int kStreamThreads = 512;  // threads per block of stream_read (a multiple of 32, <= 1024)

static __global__ void __launch_bounds__(kStreamThreads)
    stream_read_kernel(const uint4* __restrict__ p, size_t n, uint32_t* __restrict__ out) {
  pdl_enter();
  __shared__ uint32_t partial[kStreamThreads / 32];
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t r = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) r ^= partial[w];
    out[blockIdx.x] = r;
  }
}

// p: [n] uint4 in device memory; out: [blocks] uint32 (XOR them for the XOR of all of p). Never allocates.
inline cudaError_t launch_stream_read(const uint4* p, size_t n, uint32_t* out, int blocks, const Launch& launch) {
  if (blocks < 1 || !out || (n && !p)) return cudaErrorInvalidValue;
  return launch_kernel(stream_read_kernel, blocks, kStreamThreads, launch, p, n, out);
}

// The host reference: the XOR of all 32-bit words of p[n] (what the XOR of out[] must equal).
inline uint32_t stream_read_ref(const uint4* p, size_t n) {
  uint32_t acc = 0;
  for (size_t i = 0; i < n; ++i) acc ^= p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
  return acc;
}

}  // namespace kernels
}  // namespace gemma4_t4
