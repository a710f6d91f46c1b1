// gemma4_t4 kernels: shared device helpers.
//
// Every kernel in kernels/ is compiled for sm_75 (Tesla T4) and up and uses only sm_75 features: no bf16
// arithmetic, no cp.async, at most 48 KiB of static shared memory per block. Launchers are
// `cudaError_t launch_<op>(..., cudaStream_t)`: they never allocate and report launch errors.
//
// Every launcher takes a Launch -- the stream, and whether to use programmatic dependent launch (PDL, sm_90+
// only) -- as its last argument; nothing about a launch is decided by hidden state. With Launch::pdl the
// kernel is launched with cudaLaunchAttributeProgrammaticStreamSerialization: it may then be scheduled while
// its predecessor in the stream is still running (a decode step is ~400 small dependent kernels, so the
// launch gap and the first loads' latency are most of its time). The contract every kernel here keeps:
// before pdl_enter() it writes nothing and reads only data no kernel of the last launch writes: constants of
// the forward pass (weights), and -- named where a kernel does it -- data the host or a kernel at least two
// launches back wrote (a pass's metadata, KV-cache rows of earlier positions, the step's PLE rows).
// pdl_enter() waits until the predecessor grid has completed and its writes are visible, then lets the next
// kernel start its own prologue. Since every kernel calls it before anything else a dependant could need, a
// kernel starts only after its predecessor has passed pdl_enter, i.e. after the launch before that completed:
// hence the two-launch rule (a launch without PDL or a memcpy completes before anything after it starts).
// Below sm_90 and outside PDL launches both are no-ops. The Turing-only build (compute_75 PTX JIT-compiled on a
// newer GPU) has no griddepcontrol, so the caller must not ask for PDL there: pdl_supported() tells, from the
// loaded code's PTX version.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "ktrace.cuh"

namespace gemma4_t4 {
namespace kernels {

constexpr float kHalfMax = 65504.f;

// A kernel's dynamic shared memory (the launch's size), 16-byte aligned, named `name`. On dev/emu.hpp's CPU
// emulator: one buffer that a block's threads share.
#ifdef GEMMA4_T4_EMU
#define GEMMA4_T4_DYNAMIC_SMEM(name) unsigned char* const name = ::emu::dynamic_smem()
#else
#define GEMMA4_T4_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// fp32 -> fp16 with saturation: Gemma activations can pass the fp16 range; inf would poison a whole row.
// NaN stays NaN (a real fault must stay visible downstream).
__device__ __forceinline__ half to_half_sat(float v) {
  return __float2half_rn(v != v ? v : fminf(fmaxf(v, -kHalfMax), kHalfMax));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (kMax false) or max (kMax true) over the block (blockDim.x a multiple of 32, <= 1024). Every thread gets
// the result. Each instantiation has its own shared scratch.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = kMax ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < int(blockDim.x >> 5) ? partial[lane] : (kMax ? -INFINITY : 0.f);
    s = kMax ? warp_max(s) : warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

// block_sum of N values per thread at once: v[n] for each n in the block-uniform mask `used` becomes the block's
// sum (the other values are left alone), each added in exactly block_sum's order -- its warp_sum, then a warp_sum
// of the warps' partials with zeros past the last warp -- so each result equals its own block_sum call bit for
// bit. That last step runs in every warp (the same 32 inputs, the same sum), so one barrier serves all N sums.
// NW: the block's warps (blockDim.x / 32); part: [NW][N] shared scratch, free on entry (one call per phase
// between barriers).
template <int N, int NW>
__device__ __forceinline__ void block_sums(float (&v)[N], float (&part)[NW][N], unsigned used) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int n = 0; n < N; ++n)
    if ((used >> n) & 1u) {
      v[n] = warp_sum(v[n]);
      if (lane == 0) part[warp][n] = v[n];
    }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < N; ++n)
    if ((used >> n) & 1u) v[n] = warp_sum(lane < NW ? part[lane][n] : 0.f);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// x[0] + x[ld] + ... + x[(parts - 1) ld], added in that order: a k-split's partial results (a GEMV's ksplit parts, an
// int4 GEMM's split-K tiles) summed as their reader must add them, the same float whichever kernel does it.
__device__ __forceinline__ float sum_parts(const float* x, int parts, size_t ld) {
  float v = x[0];
#pragma unroll 4
  for (int p = 1; p < parts; ++p) v += x[size_t(p) * ld];
  return v;
}

// 8 halves packed in 16 bytes -> floats
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const half2* h = reinterpret_cast<const half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

inline unsigned ceil_div(size_t a, size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Whether p is a multiple of `bytes` (a power of two): the condition of a vectorised load or store.
__host__ __device__ __forceinline__ bool is_aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#ifdef GEMMA4_T4_KTRACE
  ktrace_enter();
#endif
}

// L2 prefetch of a constant input (a weight line) before pdl_enter(); sm_90 builds only (without PDL there
// is nothing to overlap it with).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#else
  (void)p;
#endif
}

template <int>
__global__ void pdl_probe_kernel() {}

// Whether `device` runs this build's kernels as sm_90+ code, i.e. whether Launch::pdl may be set. The
// caller (the CUDA backend, at load) keeps the answer; nothing is cached here.
inline bool pdl_supported(int device) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp: no PDL on the CPU emulator
  (void)device;
  return false;
#else
  int major = 0, current = 0;
  cudaFuncAttributes fa{};
  const bool ok = cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  major >= 9 && cudaFuncGetAttributes(&fa, pdl_probe_kernel<0>) == cudaSuccess && fa.ptxVersion >= 90;
  cudaSetDevice(current);
  (void)cudaGetLastError();
  return ok;
#endif
}

// A value a launch policy asks the runtime for (an SM count, an occupancy), remembered per device: `known` holds
// value + 1 for each device (0: not asked yet); ask(device) gives the current device's value (>= 0; 0 on an
// error). 0 when the current device cannot be named; devices past the table are asked every time.
constexpr int kMemoDevices = 16;
template <class F>
inline int per_device_memo(std::atomic<int> (&known)[kMemoDevices], F&& ask) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev < 0 || dev >= kMemoDevices) return ask(dev);
  int v = known[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = ask(dev) + 1;
    known[dev].store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

// The current device's SM count (0 when it cannot be asked), asked once per device: launch policies that count a
// wave of blocks (gemv_halves) run per launch.
inline int device_sms() {
  static std::atomic<int> known[kMemoDevices];
  return per_device_memo(known, [](int dev) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) return sms;
    (void)cudaGetLastError();
    return 0;
  });
}

// How a kernel is launched. Implicit from a stream: a plain launch (tests and tools pass a stream).
struct Launch {
  cudaStream_t stream = nullptr;
  bool pdl = false;  // programmatic dependent launch: only where pdl_supported()
  Launch() = default;
  Launch(cudaStream_t s, bool p = false) : stream(s), pdl(p) {}  // NOLINT(google-explicit-constructor)
};

// A kernel launch with `smem` bytes of dynamic shared memory (the kernel's GEMMA4_T4_DYNAMIC_SMEM; above 48 KiB the
// caller raises cudaFuncAttributeMaxDynamicSharedMemorySize first).
template <typename... P, typename... A>
inline cudaError_t launch_kernel_smem(void (*k)(P...), dim3 grid, dim3 block, size_t smem, const Launch& launch,
                                      A&&... args) {
#ifdef GEMMA4_T4_EMU  // dev/emu.hpp: the kernel runs on the CPU emulator, now
  (void)launch;
  (void)smem;
  return emu::launch(k, grid, block, std::forward<A>(args)...);
#else
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = launch.stream;
  cfg.attrs = attr;
  cfg.numAttrs = launch.pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
  const cudaError_t last = cudaGetLastError();  // clears what the launch may have recorded
  return e != cudaSuccess ? e : last;
#endif
}

// Every kernel launch of kernels/ (no dynamic shared memory).
template <typename... P, typename... A>
inline cudaError_t launch_kernel(void (*k)(P...), dim3 grid, dim3 block, const Launch& launch, A&&... args) {
  return launch_kernel_smem(k, grid, block, 0, launch, std::forward<A>(args)...);
}

}  // namespace kernels
}  // namespace gemma4_t4
