// gemma4_t4 implementation part: compute-sanitizer annotations of the CUDA backend (nvcc only). Standalone
// (CUDA runtime + NVTX headers), so tools/initcheck_cublas.cu checks this very code.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#ifdef GEMMA4_T4_SANITIZER_NVTX
#include <nvtx3/nvToolsExtMemCudaRt.h>
#endif

namespace gemma4_t4 {
namespace detail {

// compute-sanitizer initcheck does not track the stores of cuBLAS's kernels (tools/initcheck_cublas.cu shows
// it), so every read of a GEMM's output would be reported. With GEMMA4_T4_SANITIZER_NVTX the output range is
// marked initialised in stream order through the NVTX memory API (`compute-sanitizer --nvtx yes`); otherwise
// this is nothing.
inline void sanitizer_mark_initialized(const void* p, size_t bytes, cudaStream_t stream) {
#ifdef GEMMA4_T4_SANITIZER_NVTX
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("gemma4_t4");
  nvtxMemVirtualRangeDesc_t range;
  range.size = bytes;
  range.ptr = p;
  nvtxMemMarkInitializedBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.regionDescCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  nvtxMemCudaMarkInitialized(domain, stream, 0, &batch);
#else
  (void)p;
  (void)bytes;
  (void)stream;
#endif
}

}  // namespace detail
}  // namespace gemma4_t4
