// The GPU kernel tests' harness: REQUIRE_CUDA, cat(), an owning device array (Dev), a stream (Stream), random
// inputs (rand_f32, rand_f16), fp16 widening, the max-relative-error check, attention's caches on the device
// (DevKvCaches) and the Turing resource check, shared by test_kernels.cu and test_flash_attention.cu. Catch2
// assertions: include after catch.hpp.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
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

// Uniform in [lo, hi], never exactly zero.
inline std::vector<float> rand_f32(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    x = u(rng);
    if (x == 0.f) x = 0.5f * hi;
  }
  return v;
}

// The same, rounded to fp16 bits.
inline std::vector<uint16_t> rand_f16(std::mt19937& rng, size_t n, float lo, float hi) {
  std::vector<uint16_t> h(n);
  const std::vector<float> f = rand_f32(rng, n, lo, hi);
  for (size_t i = 0; i < n; ++i) {
    h[i] = gemma4_t4::detail::f32_to_f16(f[i]);
    if ((h[i] & 0x7fffu) == 0) h[i] = gemma4_t4::detail::f32_to_f16(0.5f * hi);
  }
  return h;
}

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

// Attention's K and V caches on the device, uploaded from fp16 bits, and the tables of their base pointers
// (AttnArgs::kbase / vbase).
struct DevKvCaches {
  std::vector<std::unique_ptr<Dev<half>>> kc, vc;  // [caches] -> [capacity, kv_heads, D] fp16
  std::unique_ptr<Dev<half*>> kb, vb;              // [caches] base pointers

  DevKvCaches(const std::vector<std::vector<uint16_t>>& k16, const std::vector<std::vector<uint16_t>>& v16) {
    REQUIRE(k16.size() == v16.size());
    std::vector<half*> kbase, vbase;
    for (size_t i = 0; i < k16.size(); ++i) {
      kc.push_back(std::make_unique<Dev<half>>(k16[i].size()));
      vc.push_back(std::make_unique<Dev<half>>(v16[i].size()));
      kc.back()->upload(k16[i]);
      vc.back()->upload(v16[i]);
      kbase.push_back(kc.back()->get());
      vbase.push_back(vc.back()->get());
    }
    kb = std::make_unique<Dev<half*>>(kbase.size());
    vb = std::make_unique<Dev<half*>>(vbase.size());
    kb->upload(kbase);
    vb->upload(vbase);
  }
};

// ---- resources ----

struct KernelUse {
  std::string name;
  const void* fn;
  int block;  // the largest block its launcher uses
};

// What a kernel's local memory means to a resource check: none allowed, or a warning.
enum class LocalMemory { kForbidden, kWarn };

// Prints each kernel's resources as compiled for this device (`title`: "kernel", ...) and checks that it would
// fit a Turing SM: shared memory, static shared memory, block size and registers per block.
inline void check_turing_limits(const char* title, const std::vector<KernelUse>& ks, LocalMemory local) {
  constexpr size_t kTuringSmem = 64 * 1024;        // per block, static + dynamic
  constexpr size_t kStaticSmem = 48 * 1024;        // static shared memory per block, any architecture
  constexpr long kTuringRegsPerBlock = 64 * 1024;  // 32-bit registers per block (and per SM) on sm_75
  int dev = 0;
  cudaDeviceProp prop;
  REQUIRE_CUDA(cudaGetDevice(&dev));
  REQUIRE_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("\n%s resources on %s (sm_%d%d; numbers are for the binary this device runs)\n", title, prop.name,
              prop.major, prop.minor);
  std::printf("%-32s %6s %5s %7s %9s %6s %7s %4s\n", "kernel", "block", "regs", "smem B", "dyn max B", "local",
              "maxthr", "bin");
  for (const KernelUse& k : ks) {
    cudaFuncAttributes attr;
    std::memset(&attr, 0, sizeof attr);
    INFO(k.name);
    REQUIRE_CUDA(cudaFuncGetAttributes(&attr, k.fn));
    std::printf("%-32s %6d %5d %7zu %9d %6zu %7d %4d\n", k.name.c_str(), k.block, attr.numRegs, attr.sharedSizeBytes,
                attr.maxDynamicSharedSizeBytes, attr.localSizeBytes, attr.maxThreadsPerBlock, attr.binaryVersion);
    CHECK(attr.sharedSizeBytes + size_t(attr.maxDynamicSharedSizeBytes) <= kTuringSmem);
    CHECK(attr.sharedSizeBytes <= kStaticSmem);
    CHECK(attr.maxThreadsPerBlock >= k.block);
    CHECK(long(attr.numRegs) * k.block <= kTuringRegsPerBlock);
    if (local == LocalMemory::kForbidden)
      CHECK(attr.localSizeBytes == 0);  // no local arrays, no register spills
    else if (attr.localSizeBytes > 0)
      WARN(k.name << " uses " << attr.localSizeBytes << " B of local memory (a local array or register spills)");
  }
  std::fflush(stdout);
}

}  // namespace gputest
