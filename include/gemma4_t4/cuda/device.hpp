// gemma4_t4 implementation part, CUDA backend: errors, device checks and every allocation.
//
// Every cudaMalloc / cudaMallocHost of the backend goes through cuda_alloc (and back through cuda_free), so
// the fault hook (set_alloc_fault_hook) sees them all and live_cuda_allocations() counts them. A failure is
// OutOfMemory naming `what`, with the size asked and what the GPU has free.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

namespace gemma4_t4 {
namespace detail {

inline Status cuda_status(cudaError_t e, const std::string& what) {
  return err(Code::BackendError, what, ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

#define GEMMA4_T4_CUDA_TRY(expr, what)                   \
  do {                                                   \
    const cudaError_t e_ = (expr);                       \
    if (e_ != cudaSuccess) return cuda_status(e_, what); \
  } while (0)

inline bool cuda_usable(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return false;
  return p.major * 10 + p.minor >= 75;
}

inline double mib(size_t b) { return double(b) / (1024.0 * 1024.0); }

// ---- allocation ----

enum class Mem { Device, Pinned };  // cudaMalloc / cudaMallocHost

inline Status cuda_alloc(Mem kind, size_t bytes, const std::string& what, void** out) {
  const char* fn = kind == Mem::Device ? "cudaMalloc" : "cudaMallocHost";
  *out = nullptr;
  cudaError_t e = cudaErrorMemoryAllocation;
  if (!alloc_fault(bytes, what.c_str())) e = kind == Mem::Device ? cudaMalloc(out, bytes) : cudaMallocHost(out, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *out = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return err(Code::OutOfMemory, what, ": ", fn, " of ", mib(bytes), " MiB failed: ", cudaGetErrorName(e), " (",
               mib(free_b), " MiB free of ", mib(total_b), " MiB on the GPU)");
  }
  alloc_fault_hook().live.fetch_add(1, std::memory_order_acq_rel);
  return Status::ok();
}

inline void cuda_free(Mem kind, void* p) {
  if (!p) return;
  if (kind == Mem::Device)
    cudaFree(p);
  else
    cudaFreeHost(p);
  alloc_fault_hook().live.fetch_sub(1, std::memory_order_acq_rel);
}

// ---- load-time writes ----
// The engine's streams are cudaStreamNonBlocking: they do not wait for the legacy default stream. So nothing the
// backend writes before its passes goes there: cudaMemset of device memory returns before it runs, and cudaMemcpy
// from pageable memory before its DMA lands -- a pass on another stream could overtake either (seen: the PLE rows'
// zeroing landing after a first pass's upload, wrong logits under a second process on the GPU; bench/RESULTS.md
// 2026-12-05 (e)). These run on `stream` and return when the write is complete (tests/compile/no_legacy_stream.py
// keeps include/ and kernels/ free of the legacy-stream forms).
inline cudaError_t upload_now(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}
inline cudaError_t zero_now(void* dst, size_t bytes, cudaStream_t stream) {
  const cudaError_t e = cudaMemsetAsync(dst, 0, bytes, stream);
  return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
}

template <typename T>
Status cuda_alloc(Mem kind, size_t bytes, const std::string& what, T** out) {
  void* p = nullptr;
  GEMMA4_T4_TRY(cuda_alloc(kind, bytes, what, &p));
  *out = static_cast<T*>(p);
  return Status::ok();
}

// Owns device allocations; an allocation failure is an OutOfMemory Status with the sizes asked and free.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    for (void* p : ptrs_) cuda_free(Mem::Device, p);
  }
  template <typename T>
  Status alloc(size_t count, const std::string& what, T** out) {
    const size_t bytes = std::max<size_t>(count * sizeof(T), 256);
    void* p = nullptr;
    ptrs_.reserve(ptrs_.size() + 1);  // before the allocation: a bad_alloc here cannot leak it
    GEMMA4_T4_TRY(cuda_alloc(Mem::Device, bytes, what, &p));
    ptrs_.push_back(p);
    total_ += bytes;
    *out = static_cast<T*>(p);
    return Status::ok();
  }
  size_t total() const { return total_; }

 private:
  std::vector<void*> ptrs_;
  size_t total_ = 0;
};

}  // namespace detail
}  // namespace gemma4_t4
