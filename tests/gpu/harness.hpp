// The GPU kernel tests' harness: REQUIRE_CUDA, cat(), an owning device array (Dev), a stream (Stream), fp16
// widening and the max-relative-error check, shared by test_kernels.cu and test_flash_attention.cu. Catch2
// assertions: include after catch.hpp.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "gemma4_t4/common.hpp"

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

// fp16 bits -> fp32.
inline std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = gemma4_t4::detail::f16_to_f32(h[i]);
  return f;
}

// Every element finite (the poison is NaN) and max |got - ref| / max |ref| <= tol.
inline void check_max_rel(const std::vector<float>& got, const std::vector<double>& ref, double tol,
                          const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t unwritten = 0, first_unwritten = 0, worst = 0;
  double max_ref = 0, worst_err = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    if (!std::isfinite(got[i])) {
      if (unwritten++ == 0) first_unwritten = i;
      continue;
    }
    const double e = std::fabs(double(got[i]) - ref[i]);
    if (e > worst_err) worst_err = e, worst = i;
  }
  const double rel = max_ref > 0 ? worst_err / max_ref : worst_err;
  INFO(what << ": " << unwritten << " of " << got.size() << " elements not written or not finite (first at "
            << first_unwritten << "); max |err| / max |ref| = " << rel << " (tolerance " << tol << "); worst element "
            << worst << ": got " << got[worst] << ", ref " << ref[worst]);
  REQUIRE(unwritten == 0);
  REQUIRE(rel <= tol);
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE_CUDA(cudaStreamCreate(&s)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { REQUIRE_CUDA(cudaStreamSynchronize(s)); }
};

}  // namespace gputest
