// gemma4_t4 implementation part: what the parts of the built-in benchmark (bench/doctor.hpp, bench/measure.hpp,
// bench/report.hpp) share: the clock, statistics, number formatting and, with CUDA, the stream-read kernel
// (kernels/stream.cuh: the bandwidth measurement runs it, device_report asks how it was compiled). Included
// by those parts inside GEMMA4_T4_IMPLEMENTATION (unless GEMMA4_T4_NO_BENCH); not a public header.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifndef GEMMA4_T4_NO_CUDA
#include <cuda_runtime.h>

#include "../../../kernels/stream.cuh"
#endif

namespace gemma4_t4 {
namespace detail {
namespace bench_impl {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr char kProjectionLabel[] = "projection, not measured";

// Dense fp16 tensor-core FLOP per clock per SM with fp32 accumulation, by compute capability (see
// DeviceReport::fp16_tensor_tflops); 0 for architectures not listed.
inline int fp16_tensor_flops_per_clock(int cc) {
  switch (cc) {
    case 75: return 1024;
    case 80: return 2048;
    case 86:
    case 87:
    case 89: return 1024;
    case 90: return 4096;
    default: return 0;
  }
}

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// ---- statistics and formatting ----

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Nearest rank: the ceil(q n)-th smallest value.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = size_t(std::ceil(q * double(v.size())));
  rank = std::min(std::max<size_t>(rank, 1), v.size());
  return v[rank - 1];
}

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string
strf(const char* format, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, format);
  const int n = std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  if (n < 0) return std::string();
  if (size_t(n) < sizeof buf) return std::string(buf, size_t(n));
  std::string s(size_t(n) + 1, '\0');
  va_start(ap, format);
  std::vsnprintf(&s[0], s.size(), format, ap);
  va_end(ap);
  s.resize(size_t(n));
  return s;
}

inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return u == 0 ? strf("%.0f B", b) : strf("%.2f %s", b, units[u]);
}

inline std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

inline std::string cuda_version_string(int v) { return v ? strf("%d.%d", v / 1000, (v % 1000) / 10) : "none"; }
inline const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Bf16: return "bf16";
    case WeightFormat::F16: return "f16";
    case WeightFormat::F32: return "f32";
    case WeightFormat::W4A16: return "w4a16";
  }
  return "unknown";
}

inline std::string model_summary(const ModelConfig& c) {
  return strf("%d layers, hidden %d, vocab %d, %s", c.num_layers, c.hidden_size, c.vocab_size,
              format_name(c.weight_format));
}

}  // namespace bench_impl
}  // namespace detail

namespace bench {

std::string utc_timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace bench
}  // namespace gemma4_t4
