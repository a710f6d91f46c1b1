// GPU suite entry point: without a CUDA device it says so and exits 77, which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "SKIPPED: no CUDA device is visible; the GPU suite (label gpu) did not run.\n");
    return 77;
  }
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  std::printf("GPU suite on %s (sm_%d%d, %d SMs), runtime %d, driver %d\n", p.name, p.major, p.minor,
              p.multiProcessorCount, rt, drv);
  return Catch::Session().run(argc, argv);
}
