// gemma4_t4 kernel lab: what every dev/<kernel>.cu shares (llm.c's dev/cuda/common.h, for this project).
//
// A lab file holds numbered versions of one kernel (version 1 = the shipped kernel, called through its
// launcher in kernels/; higher numbers = experiments, written in the lab file), a host reference with the
// same arguments, and a main that validates every selected version against the reference and then times it.
// This header gives them: a CUDA check that exits, an owning device buffer that can poison itself, random
// fills on the device, the max-relative-error check, the stream read bandwidth (the bound the GB/s columns
// are printed against), a median-of-samples timer on cudaEvents and the command line's number lists; and
// lab_host.hpp's parallel_for (the host references).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lab_host.hpp"  // parallel_for

namespace lab {

// Exits with status 2 on a CUDA error: lab programs are tools, never library code.
inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, call, cudaGetErrorString(e));
  std::exit(2);
}
#define LAB_CHECK(call) ::lab::check((call), #call, __FILE__, __LINE__)

// ---- device buffers ----

// n elements of T on the device (at least one allocated, so an empty buffer still has an address).
template <typename T>
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t n) : n_(n) {
    LAB_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DevBuf() { cudaFree(p_); }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  // Every byte 0xFF: a NaN in fp32 and fp16, so an element a kernel did not write is visible.
  void poison() {
    if (n_) LAB_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T)));
  }
  std::vector<T> download(size_t count) const {
    std::vector<T> h(count);
    if (count) LAB_CHECK(cudaMemcpy(h.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<T> download() const { return download(n_); }
  void upload(const std::vector<T>& h) {
    if (!h.empty()) LAB_CHECK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// kernel<<<grid, block, 0, stream>>>(args...), or on dev/emu.hpp's CPU emulator when a lab program is built with it.
template <typename... P, typename... A>
inline void launch(void (*k)(P...), dim3 grid, dim3 block, cudaStream_t stream, A&&... args) {
#ifdef GEMMA4_T4_EMU
  (void)stream;
  emu::launch(k, grid, block, std::forward<A>(args)...);
#else
  // (clang-format takes the launch chevrons in a .cuh for three template closers)
  // clang-format off
  k<<<grid, block, 0, stream>>>(std::forward<A>(args)...);
  // clang-format on
#endif
  LAB_CHECK(cudaGetLastError());
}

// ---- random fills (on the device: full-size weights would take seconds to draw on the host) ----

// splitmix64 of (index, stream): independent uniform bits per element.
__host__ __device__ inline uint64_t mix64(uint64_t i, uint64_t stream) {
  uint64_t z = i + stream * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void uniform_kernel(T* p, size_t n, float lo, float hi, uint64_t stream) {
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float u = float(mix64(i, stream) >> 40) * (1.f / 16777216.f);  // [0, 1), 24 bits
    p[i] = T(lo + (hi - lo) * u);
  }
}

__global__ void bits_kernel(uint32_t* p, size_t n, uint64_t stream) {
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) p[i] = uint32_t(mix64(i, stream));
}

// p[i] uniform in [lo, hi) (fp16 values rounded to nearest), or random bits for uint32_t.
inline void fill_uniform(half* p, size_t n, float lo, float hi, uint64_t stream) {
  launch(uniform_kernel<half>, 512, 256, nullptr, p, n, lo, hi, stream);
}
inline void fill_uniform(float* p, size_t n, float lo, float hi, uint64_t stream) {
  launch(uniform_kernel<float>, 512, 256, nullptr, p, n, lo, hi, stream);
}
inline void fill_bits(uint32_t* p, size_t n, uint64_t stream) { launch(bits_kernel, 512, 256, nullptr, p, n, stream); }

// ---- validation ----

// One output of one launch against its reference: non-finite elements (the poison, or a real NaN / inf),
// max |got - ref| / max |ref|, and elements changed outside the output (filled in by the caller).
struct Error {
  size_t nonfinite = 0, stray = 0;
  double max_rel = 0;
  size_t worst = 0;  // element of the largest |got - ref|
};

inline Error max_rel_error(const std::vector<float>& got, const std::vector<double>& ref) {
  Error e;
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    if (!std::isfinite(got[i])) {
      ++e.nonfinite;
      continue;
    }
    const double d = std::fabs(double(got[i]) - ref[i]);
    if (d > max_err) max_err = d, e.worst = i;
  }
  e.max_rel = max_ref > 0 ? max_err / max_ref : max_err;
  return e;
}

// The largest error seen per output kind, and how many launches failed (printed, then the exit status).
struct Tally {
  std::string what;  // e.g. "y fp32"
  double tol = 0, max_rel = 0;
  int checks = 0, failures = 0;

  // Records one comparison; prints it when it fails (the first few only).
  bool add(const Error& e, const std::string& where) {
    ++checks;
    max_rel = std::max(max_rel, e.max_rel);
    const bool ok = e.nonfinite == 0 && e.stray == 0 && e.max_rel <= tol;
    if (!ok && ++failures <= 8)
      std::printf("  FAIL %s: %s: %zu non-finite, %zu changed outside, max rel err %.3g (tol %.3g) at element %zu\n",
                  what.c_str(), where.c_str(), e.nonfinite, e.stray, e.max_rel, tol, e.worst);
    return ok;
  }
};

// ---- the bound and the timer ----

__global__ void read_bandwidth_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t x = 0;
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint4 v = __ldg(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9E3779B9u) *sink = x;  // keeps the loads alive; practically never true
}

// Median of `samples` timings of `reps` back-to-back calls on `stream`, in microseconds per call (after 3
// warm-up calls). call(i) gets the call's index, to rotate over weight copies.
inline double median_us(const std::function<void(int)>& call, int reps, int samples, cudaStream_t stream) {
  cudaEvent_t t0, t1;
  LAB_CHECK(cudaEventCreate(&t0));
  LAB_CHECK(cudaEventCreate(&t1));
  int i = 0;
  for (; i < 3; ++i) call(i);
  std::vector<double> us;
  for (int s = 0; s < samples; ++s) {
    LAB_CHECK(cudaEventRecord(t0, stream));
    for (int r = 0; r < reps; ++r) call(i++);
    LAB_CHECK(cudaEventRecord(t1, stream));
    LAB_CHECK(cudaEventSynchronize(t1));
    float ms = 0.f;
    LAB_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    us.push_back(1e3 * double(ms) / reps);
  }
  LAB_CHECK(cudaGetLastError());
  LAB_CHECK(cudaEventDestroy(t0));
  LAB_CHECK(cudaEventDestroy(t1));
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

// GB/s of a read-only kernel over 1 GiB (median of 5): what a kernel streaming its inputs once can reach.
inline double stream_read_gbs(cudaStream_t stream) {
  const size_t bytes = size_t(1) << 30;
  DevBuf<uint4> buf(bytes / 16);
  DevBuf<uint32_t> sink(1);
  fill_bits(reinterpret_cast<uint32_t*>(buf.get()), bytes / 4, 7);
  int sms = 0;
  LAB_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double us =
      median_us([&](int) { launch(read_bandwidth_kernel, sms * 8, 512, stream, buf.get(), bytes / 16, sink.get()); }, 5,
                5, stream);
  return double(bytes) / us / 1e3;
}

// ---- command line ----

// "1,8,16" -> {1, 8, 16}; false on anything else.
inline bool parse_ints(const char* s, std::vector<int>* out) {
  out->clear();
  while (*s) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end == s || v < 0 || v > 1000000) return false;
    out->push_back(int(v));
    s = end;
    if (*s == ',')
      ++s;
    else if (*s)
      return false;
  }
  return !out->empty();
}

// The flags every lab program takes: VERSIONS (a list of 1..max_version), --reps N, --samples N,
// --validate-only. Returns true when argv[*i] was one of them (and moves *i past its value).
struct CommonArgs {
  std::vector<int> versions;
  int reps = 50, samples = 7;
  bool validate_only = false;

  bool take(int argc, char** argv, int* i, int max_version) {
    const std::string arg = argv[*i];
    std::vector<int> v;
    if ((arg == "--reps" || arg == "--samples") && *i + 1 < argc) {
      if (!parse_ints(argv[*i + 1], &v) || v.size() != 1 || v[0] < 1) return false;
      (arg == "--reps" ? reps : samples) = v[0];
      ++*i;
      return true;
    }
    if (arg == "--validate-only") return validate_only = true;
    if (arg[0] == '-' || !parse_ints(arg.c_str(), &v)) return false;
    for (int x : v)
      if (x < 1 || x > max_version) return false;
    versions = v;
    return true;
  }
};

}  // namespace lab
