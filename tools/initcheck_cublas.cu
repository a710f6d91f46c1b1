// Does compute-sanitizer initcheck see what cuBLAS writes? A cublasGemmEx (fp16 in, fp32 out, the call the
// CUDA backend's prefill matmuls make, shapes of the tiny fixtures' PLE projection) into a fresh allocation,
// then a kernel that reads every output element. Under `compute-sanitizer --tool initcheck` a report here
// means the tool does not track the GEMM's stores (used by tools/gpu_check.sh sanitize to read the engine
// tests' initcheck reports). Exit status 0 whatever the tool says; prints the sum so nothing is optimised out.
// With --mark the output is then marked initialised by the backend's own helper (include/gemma4_t4/sanitizer.hpp,
// GEMMA4_T4_SANITIZER_NVTX; run with `compute-sanitizer --tool initcheck --nvtx yes`): no report expected.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#define GEMMA4_T4_SANITIZER_NVTX
#include "../include/gemma4_t4/sanitizer.hpp"

__global__ void read_all(const float* y, size_t n, float* sum) {
  float s = 0.f;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += y[i];
  atomicAdd(sum, s);
}

int main(int argc, char** argv) {
  const bool mark = argc > 1 && std::strcmp(argv[1], "--mark") == 0;
  const int rows = 20, in = 64, out = 7 * 32;  // n > 16 rows: the backend's cuBLAS path
  std::vector<__half> w(size_t(out) * in), x(size_t(rows) * in);
  for (size_t i = 0; i < w.size(); ++i) w[i] = __float2half(float(int(i % 13) - 6) * 0.01f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = __float2half(float(int(i % 7) - 3) * 0.1f);
  __half *dw = nullptr, *dx = nullptr;
  float *dy = nullptr, *dsum = nullptr;
  cudaMalloc(&dw, w.size() * 2);
  cudaMalloc(&dx, x.size() * 2);
  cudaMalloc(&dy, size_t(rows) * out * 4);
  cudaMalloc(&dsum, 4);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dsum, 0, 4);
  cublasHandle_t h;
  cublasCreate(&h);
  const float alpha = 1.f, beta = 0.f;
  const cublasStatus_t st =
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, dw, CUDA_R_16F, in, dx, CUDA_R_16F, in, &beta,
                   dy, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (mark) gemma4_t4::detail::sanitizer_mark_initialized(dy, size_t(rows) * out * 4, nullptr);
  read_all<<<1, 256>>>(dy, size_t(rows) * out, dsum);
  float sum = 0.f;
  cudaMemcpy(&sum, dsum, 4, cudaMemcpyDeviceToHost);
  std::printf("cublasGemmEx status %d, sum of outputs %g%s\n", int(st), double(sum),
              mark ? " (output marked initialised through NVTX)" : "");
  cublasDestroy(h);
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dsum);
  return 0;
}
