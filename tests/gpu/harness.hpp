// The GPU kernel tests' harness: REQUIRE_CUDA, cat(), an owning device array (Dev) and a stream (Stream),
// shared by test_kernels.cu and test_flash_attention.cu. Catch2 assertions: include after catch.hpp.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace gputest {

#define REQUIRE_CUDA(call)                                                                  \
  do {                                                                                      \
    const cudaError_t e_ = (call);                                                          \
    INFO(#call << " -> " << cudaGetErrorName(e_) << " (" << cudaGetErrorString(e_) << ")"); \
    REQUIRE(e_ == cudaSuccess);                                                             \
  } while (0)

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// Owning device array of n elements of T. Every transfer finishes before the call returns, so a kernel on
// any stream (blocking or not, per-thread default stream or not) sees the uploaded / poisoned contents.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) { REQUIRE_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), bytes())); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }

  T* get() const { return p_; }
  size_t size() const { return n_; }

  template <typename H>
  void upload(const std::vector<H>& h) {
    static_assert(sizeof(H) == sizeof(T), "host and device element sizes differ");
    REQUIRE(h.size() == n_);
    REQUIRE_CUDA(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    REQUIRE_CUDA(cudaDeviceSynchronize());
  }
  template <typename H>
  std::vector<H> download() const {
    static_assert(sizeof(H) == sizeof(T), "host and device element sizes differ");
    std::vector<H> h(n_);
    REQUIRE_CUDA(cudaDeviceSynchronize());
    REQUIRE_CUDA(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() {
    REQUIRE_CUDA(cudaMemset(p_, 0xFF, bytes()));
    REQUIRE_CUDA(cudaDeviceSynchronize());
  }

 private:
  size_t bytes() const { return std::max<size_t>(n_, 1) * sizeof(T); }
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE_CUDA(cudaStreamCreate(&s)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { REQUIRE_CUDA(cudaStreamSynchronize(s)); }
};

}  // namespace gputest
