// gemma4_t4 kernels: a per-block timeline of the per-kernel decode path, for development builds only.
//
// Built in only with -DGEMMA4_T4_KTRACE (never by CMake; tools/prebuild.sh KTRACE=1 builds a quick_bench with it).
// Without the macro GEMMA4_T4_KTRACE_SCOPE expands to nothing and this file declares only the tags and global_ns.
//
// With it, every kernel that opens a GEMMA4_T4_KTRACE_SCOPE(tag) stamps, per block, the global timer (ns) when the
// block starts, when it first passes pdl_enter() (the predecessor grid has completed: the release) and when its
// last thread returns, and appends one KTraceRec to a ring buffer in device memory. The CUDA backend opens the ring
// when the environment names a file (GEMMA4_T4_KTRACE=FILE; GEMMA4_T4_KTRACE_CAP records, default 1M) and writes it
// when it closes (oldest record first). tools/ktrace.py groups the records into launches -- under PDL a launch's
// blocks pass pdl_enter only after every block of the launch before it has returned, so a new launch begins at
// the first release after the previous launch's last return -- and splits a decode step into, per launch:
//   gap   release - the previous launch's last return: what a kernel boundary costs on the critical path;
//   span  the last return - the release: the launch's own work after its wait.
// The stamps cost each block a barrier, a global atomic at its start (thread 0), two shared atomics per thread at its
// end and one 40-byte store: gpu_check.sh's ktrace step prints the untraced step beside the traced one.
// Tags: kind << 16 | variant (KTraceKind; the variant is the kernel's template arguments, kind-specific).
#pragma once

#ifdef GEMMA4_T4_KTRACE
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>
#endif

namespace gemma4_t4 {
namespace kernels {

// The GPU's global timer in ns (this timeline's stamps, and the persistent decode step's: kernels/decode_step.cuh).
#ifdef GEMMA4_T4_EMU
__device__ __forceinline__ unsigned long long global_ns() { return 0; }
#else
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
#endif

enum KTraceKind : unsigned {
  kKtGemv = 1,          // gemv_kernel: NT * 100 + WL * 10 + epilogue
  kKtGemvHalves = 2,    // gemv_halves_kernel: WL * 10 + epilogue
  kKtPleFused = 3,      // ple_fused_kernel: NT * 100 + WL * 10 + halves
  kKtResNorm = 4,       // residual_norm(_vec)_kernel: chunks per thread (0: scalar)
  kKtRmsNorm = 5,       // rmsnorm(_vec)_kernel: 1 vectorised
  kKtAttnSplit = 6,     // attention_split_kernel: D * 10 + G
  kKtAttnHeads = 7,     // attention_heads_kernel: D * 10 + G
  kKtAttnMerge = 8,     // attention_merge_kernel
  kKtHeadNorm = 9,      // head_norm_rope_kernel
  kKtSoftcap = 10,      // softcap_kernel
  kKtSample = 11,       // sample kernels
  kKtEmbed = 12,        // embed_kernel
  kKtGemmW4 = 13,       // gemm_w4 kernels: 0 plain, 1 x, 2 x glu, 3 reduce
  kKtElementwise = 14,  // widen, to_half, gather_rows, gelu_mul, ple_combine, ple_gate: 1..6
  kKtArgmax = 15,       // argmax_rows_kernel
};

#ifdef GEMMA4_T4_KTRACE

struct KTraceRec {
  unsigned long long tag_grid;  // tag << 32 | blocks in the grid
  unsigned long long sm_block;  // SM id << 32 | linear block index
  unsigned long long start, enter, end;
};

struct KTraceBuf {
  KTraceRec* rec = nullptr;
  unsigned long long cap = 0;
  unsigned long long* next = nullptr;
};

static __device__ KTraceBuf g_ktrace;

struct KTraceShared {
  unsigned long long start, enter, end, slot;
  unsigned done;
};

__device__ __forceinline__ KTraceShared& ktrace_shared() {
  __shared__ KTraceShared s;
  return s;
}

// pdl_enter()'s stamp: the first warp through it sets the release.
__device__ __forceinline__ void ktrace_enter() {
  if ((threadIdx.x & 31u) == 0) atomicCAS(&ktrace_shared().enter, 0ull, global_ns());
}

struct KTraceScope {
  unsigned tag;
  unsigned long long slot = 0;  // thread 0: the record's index, taken at the start (its latency hides in the block's
                                // work; the end pays only shared atomics and one store)
  __device__ explicit KTraceScope(unsigned t) : tag(t) {
    KTraceShared& s = ktrace_shared();
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0) {
      if (g_ktrace.rec) slot = atomicAdd(g_ktrace.next, 1ull);
      s.start = global_ns();
      s.enter = 0;
      s.end = 0;
      s.done = 0;
    }
    __syncthreads();
  }
  __device__ ~KTraceScope() {
    KTraceShared& s = ktrace_shared();
    const unsigned long long t = global_ns();
    if (threadIdx.x + threadIdx.y + threadIdx.z == 0) s.slot = slot;
    atomicMax(&s.end, t);
    __threadfence_block();
    if (atomicAdd(&s.done, 1u) != blockDim.x * blockDim.y * blockDim.z - 1) return;
    const KTraceBuf b = g_ktrace;  // the last thread of the block writes the record
    if (!b.rec || b.cap == 0) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    const unsigned long long grid = gridDim.x * gridDim.y * gridDim.z;
    const unsigned long long blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    KTraceRec r;
    r.tag_grid = (static_cast<unsigned long long>(tag) << 32) | grid;
    r.sm_block = (static_cast<unsigned long long>(sm) << 32) | blk;
    r.start = s.start;
    r.enter = s.enter ? s.enter : s.start;
    r.end = atomicAdd(&s.end, 0ull);
    b.rec[atomicAdd(&s.slot, 0ull) % b.cap] = r;
  }
};

#define GEMMA4_T4_KTRACE_SCOPE(kind, variant) \
  ::gemma4_t4::kernels::KTraceScope ktrace_scope_((unsigned(kind) << 16) | unsigned(variant))

// Host side (the CUDA backend, in the translation unit that holds the kernels).
struct KTraceHost {
  KTraceRec* rec = nullptr;
  unsigned long long* next = nullptr;
  unsigned long long cap = 0;
  std::FILE* file = nullptr;
};

// Opens the ring when GEMMA4_T4_KTRACE names a file; false with a message on stderr when that fails. stream: the
// backend's (every copy here is ordered on it).
inline bool ktrace_open(KTraceHost& h, cudaStream_t stream) {
  const char* path = std::getenv("GEMMA4_T4_KTRACE");
  if (!path || !*path) return true;
  const char* cap = std::getenv("GEMMA4_T4_KTRACE_CAP");
  h.cap = cap ? std::strtoull(cap, nullptr, 10) : (1ull << 20);
  const auto fail = [&]() {  // releases what it took: nothing for ktrace_close to write
    std::fprintf(stderr, "ktrace: cannot open %s with %llu records\n", path, h.cap);
    if (h.file) std::fclose(h.file);
    cudaFree(h.rec);
    cudaFree(h.next);
    h = KTraceHost();
    return false;
  };
  h.file = std::fopen(path, "wb");
  if (!h.file || h.cap == 0 || cudaMalloc(&h.rec, h.cap * sizeof(KTraceRec)) != cudaSuccess ||
      cudaMalloc(&h.next, sizeof(unsigned long long)) != cudaSuccess ||
      cudaMemsetAsync(h.next, 0, sizeof(unsigned long long), stream) != cudaSuccess)
    return fail();
  KTraceBuf b;
  b.rec = h.rec;
  b.cap = h.cap;
  b.next = h.next;
  if (cudaMemcpyToSymbolAsync(g_ktrace, &b, sizeof(b), 0, cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return fail();
  std::fprintf(stderr, "ktrace: recording the last %llu blocks into %s\n", h.cap, path);
  return true;
}

// Writes the ring, oldest record first: u64 count, u64 cap, then min(count, cap) records.
inline void ktrace_close(KTraceHost& h, cudaStream_t stream) {
  if (!h.file) return;
  unsigned long long n = 0;
  std::vector<KTraceRec> all(size_t(h.cap));
  cudaMemcpyAsync(&n, h.next, sizeof(n), cudaMemcpyDeviceToHost, stream);
  cudaMemcpyAsync(all.data(), h.rec, size_t(h.cap) * sizeof(KTraceRec), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  const unsigned long long kept = n < h.cap ? n : h.cap, first = n < h.cap ? 0 : n % h.cap;
  std::fwrite(&n, sizeof(n), 1, h.file);
  std::fwrite(&h.cap, sizeof(h.cap), 1, h.file);
  for (unsigned long long i = 0; i < kept; ++i)
    std::fwrite(&all[size_t((first + i) % h.cap)], sizeof(KTraceRec), 1, h.file);
  std::fclose(h.file);
  h.file = nullptr;
  KTraceBuf none;
  cudaMemcpyToSymbolAsync(g_ktrace, &none, sizeof(none), 0, cudaMemcpyHostToDevice, stream);
  cudaStreamSynchronize(stream);
  cudaFree(h.rec);
  cudaFree(h.next);
  std::fprintf(stderr, "ktrace: %llu blocks recorded, %llu written\n", n, kept);
}

#else

#define GEMMA4_T4_KTRACE_SCOPE(kind, variant) ((void)0)

#endif

}  // namespace kernels
}  // namespace gemma4_t4
