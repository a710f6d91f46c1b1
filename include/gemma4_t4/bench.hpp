// gemma4_t4 implementation part: the built-in benchmark (gemma4_t4::bench; declarations and field contracts in
// the public header).
//
// What is measured, and how
//   device_report  cudaGetDeviceProperties + cudaMemGetInfo; how the library's code runs from
//                  cudaFuncGetAttributes(kernels::stream_read_kernel) -- a kernel compiled in this translation
//                  unit with the same -gencode flags as every other kernel, so its binaryVersion / ptxVersion
//                  are the library's: binary == device cc and ptx == binary -> native SASS; binary == cc and
//                  ptx < cc -> the driver JIT-compiled PTX (a Turing-only build on a newer GPU); binary < cc ->
//                  SASS of an older, binary-compatible architecture.
//   bandwidth      GPU: kernels/stream.cuh over a 1 GiB buffer (8 blocks per SM x 512 threads), and a
//                  device-to-device cudaMemcpyAsync of one half of the buffer onto the other (bytes = read +
//                  write); CUDA events, one untimed pass, then the median of `repeats`. Host: T threads, each
//                  summing its contiguous share of a buffer it first touched itself (pages local to it), timed
//                  from the first thread's start to the last join; median of `repeats`.
//   ceiling        read GB/s * 1e9 / Engine::decode_bytes_per_token(): decode steps per second if a step cost
//                  only streaming the weights once. A batched step also reads the weights once, so the ceiling
//                  is per stream at every concurrency (KV reads make real steps slower still).
//   sweep          per cell (prompt P, concurrency C): C sessions of context P + tokens; an untimed warm-up
//                  (a min(P, 64)-token prompt for every session in one step, two decode steps: CUDA lazy
//                  loading, cuBLAS, graph capture for C rows), then per repeat: prompt ids drawn from the
//                  (cell, repeat) seed; each stream's prompt fed in its own Engine::step (prefill + first
//                  token) in stream order, its TTFT taken when that step returns; then tokens - 1 decode
//                  steps of all C streams, each timed. Sampling (SweepOptions::sampling, greedy by default) on
//                  the device (only ids cross PCIe), EOS ignored. ms per token = median over repeats of the
//                  median step time.
//   statistics     median: the mean of the two middle values for an even count; p90: nearest rank (the
//                  ceil(0.9 n)-th smallest).
//   T4 projection  per cell: ms per token on a T4 = decode bytes / 277 GB/s + the step's fixed cost, where
//                  fixed cost = this run's ms per token - decode bytes / this device's measured read bandwidth
//                  (the time a step spends beyond moving its weights: launches, waits, latency, sampling; it
//                  does not shrink on a slower GPU, while the bytes take 15x longer). Labelled "projection, not
//                  measured" wherever it appears, with this formula.
#pragma once

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#ifndef GEMMA4_T4_NO_CUDA
#include <cuda_runtime.h>

#include "../../kernels/stream.cuh"
#endif

namespace gemma4_t4 {
namespace detail {
namespace bench_impl {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr char kProjectionLabel[] = "projection, not measured";

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

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

inline const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : b == Backend::Cpu ? "cpu" : "auto"; }

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

inline std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char ch : s) o += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return o + "\"";
}

// ---- host facts ----

// /proc/meminfo MemTotal / MemAvailable; sysconf where that file is missing.
inline void host_memory(uint64_t* total, uint64_t* available) {
  *total = *available = 0;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") *total = kib * 1024;
    if (key == "MemAvailable:") *available = kib * 1024;
  }
  const long page = sysconf(_SC_PAGESIZE);
  if (*total == 0 && page > 0) {
    const long pages = sysconf(_SC_PHYS_PAGES);
    if (pages > 0) *total = uint64_t(pages) * uint64_t(page);
  }
#ifdef _SC_AVPHYS_PAGES
  if (*available == 0 && page > 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    if (pages > 0) *available = uint64_t(pages) * uint64_t(page);
  }
#endif
}

inline std::string host_cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, 10, "model name") != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? std::string() : line.substr(b);
  }
  return std::string();
}

inline bench::DeviceReport host_report(int device, const std::string& note) {
  bench::DeviceReport r;
  r.device = device;
  r.note = note;
  r.host_cpu = host_cpu_name();
  r.host_threads = int(std::thread::hardware_concurrency());
  return r;
}

// Bytes available to this user on the file system holding `path` (or its nearest existing parent).
inline uint64_t disk_free(const std::string& path) {
  std::filesystem::path p = path.empty() ? std::filesystem::path(".") : std::filesystem::path(path);
  for (int i = 0; i < 64; ++i) {
    struct statvfs st {};
    if (statvfs(p.c_str(), &st) == 0) return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  return 0;
}

// The checkpoint's model*.safetensors files at `path` (a directory, or one file).
inline uint64_t safetensors_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return fs::file_size(path, ec);
  uint64_t total = 0;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const std::string name = it->path().filename().string();
    if (name.rfind("model", 0) == 0 && it->path().extension() == ".safetensors" && it->is_regular_file(ec2))
      total += it->file_size(ec2);
  }
  return total;
}

// ---- prompts and seeds ----

// One seed per (cell, repeat): depends on nothing but these numbers, so every checkpoint gets the same.
inline uint64_t cell_seed(uint64_t seed, int prompt, int concurrency, int repeat) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ uint64_t(uint32_t(prompt)));
  h = splitmix64(h ^ (uint64_t(uint32_t(concurrency)) << 32));
  return splitmix64(h ^ uint64_t(uint32_t(repeat)) * 0xD1B54A32D192ED03ull);
}

// Stream b's prompt: <bos>, then ids uniform over [4, V) (past pad/eos/bos/unk), V the embeddable vocabulary.
inline void prompt_ids(uint64_t seed, int stream, int n, const ModelConfig& c, std::vector<int32_t>* out) {
  int V = c.vocab_size;
  if (c.hidden_size_per_layer_input > 0) V = std::min(V, c.vocab_size_per_layer_input);
  const int lo = V > 8 ? 4 : 0;
  const uint64_t span = uint64_t(std::max(V - lo, 1));
  const uint64_t s = splitmix64(seed ^ (uint64_t(uint32_t(stream)) * 0x9E3779B97F4A7C15ull));
  out->resize(size_t(n));
  for (int i = 0; i < n; ++i) (*out)[size_t(i)] = int32_t(lo + int(splitmix64(s + uint64_t(i)) % span));
  if (n > 0 && c.bos_token_id >= 0 && c.bos_token_id < V) (*out)[0] = c.bos_token_id;
}

// ---- bandwidth ----

inline Status host_bandwidth(const bench::BandwidthOptions& o, bench::Bandwidth* out) {
  const int T = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const uint64_t want = o.bytes ? o.bytes : (uint64_t(256) << 20);
  const size_t per = std::max<size_t>(size_t(want / 8 / uint64_t(T)) / 8 * 8, 8);  // words per thread, % 8
  const size_t n = per * size_t(T);
  std::unique_ptr<uint64_t[]> buf(new (std::nothrow) uint64_t[n]);
  if (!buf)
    return err(Code::OutOfMemory, "measure_bandwidth: cannot allocate ", human_bytes(double(n) * 8), " of host memory");
  std::vector<uint64_t> sums(size_t(T) * 8);  // one cache line per thread
  auto on_threads = [T](const std::function<void(int)>& fn) {
    std::vector<std::thread> pool;
    pool.reserve(size_t(T - 1));
    for (int t = 1; t < T; ++t) pool.emplace_back(fn, t);
    fn(0);
    for (auto& th : pool) th.join();
  };
  uint64_t* base = buf.get();
  on_threads([&](int t) {  // first touch by the thread that reads the pages later
    uint64_t* p = base + size_t(t) * per;
    for (size_t i = 0; i < per; ++i) p[i] = (size_t(t) * per + i) * 0x9E3779B97F4A7C15ull + 1;
  });
  auto pass = [&] {
    on_threads([&](int t) {
      const uint64_t* p = base + size_t(t) * per;
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = 0; i < per; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
      }
      sums[size_t(t) * 8] = a0 ^ a1 ^ a2 ^ a3;
    });
  };
  const int repeats = std::max(1, o.repeats);
  pass();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    pass();
    ms.push_back(ms_since(t0));
  }
  volatile uint64_t sink = 0;  // the sums are used, so the reads are too
  for (int t = 0; t < T; ++t) sink = sink ^ sums[size_t(t) * 8];
  const double med = std::max(median(ms), 1e-6);
  out->backend = Backend::Cpu;
  out->read_gbs = double(n) * 8.0 / (med * 1e-3) / 1e9;
  out->copy_gbs = 0;
  out->bytes = uint64_t(n) * 8;
  out->repeats = repeats;
  out->threads = T;
  out->method =
      strf("host memory read, %d threads summing %s, median of %d", T, human_bytes(double(n) * 8).c_str(), repeats);
  return Status::ok();
}

#ifndef GEMMA4_T4_NO_CUDA

// What cuda_bandwidth allocates, freed on every path.
struct CudaScratch {
  void* buf = nullptr;
  uint32_t* out = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  CudaScratch() = default;
  CudaScratch(const CudaScratch&) = delete;
  CudaScratch& operator=(const CudaScratch&) = delete;
  ~CudaScratch() {
    if (stream) cudaStreamSynchronize(stream);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    if (stream) cudaStreamDestroy(stream);
    if (out) cudaFree(out);
    if (buf) cudaFree(buf);
  }
};

inline Status cuda_bandwidth(int device, const bench::BandwidthOptions& o, bench::Bandwidth* out) {
  if (!cuda_usable(device))
    return err(Code::BackendError, "measure_bandwidth: CUDA device ", device,
               " is not usable (missing, or compute capability below 7.5)");
  GEMMA4_T4_CUDA_TRY(cudaSetDevice(device), "measure_bandwidth: cudaSetDevice");
  cudaDeviceProp p;
  GEMMA4_T4_CUDA_TRY(cudaGetDeviceProperties(&p, device), "measure_bandwidth: cudaGetDeviceProperties");
  uint64_t bytes = std::max<uint64_t>((o.bytes ? o.bytes : (uint64_t(1) << 30)) / 32 * 32, 32);
  const int blocks = std::max(1, p.multiProcessorCount * 8);
  CudaScratch s;
  // The default 1 GiB halves (down to 128 MiB, still far past any L2) when the GPU is nearly full -- a loaded
  // model on a 16 GB T4 -- and the method says so; a size the caller chose is used or refused.
  while (cudaMalloc(&s.buf, bytes) != cudaSuccess) {
    cudaGetLastError();
    s.buf = nullptr;
    if (o.bytes || bytes <= (uint64_t(128) << 20)) {
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return err(Code::OutOfMemory, "measure_bandwidth: cudaMalloc of ", human_bytes(double(bytes)), " failed (",
                 human_bytes(double(free_b)), " free); ask for fewer bytes (BandwidthOptions::bytes)");
    }
    bytes /= 2;
  }
  GEMMA4_T4_CUDA_TRY(cudaMalloc(&s.out, size_t(blocks) * sizeof(uint32_t)), "measure_bandwidth: cudaMalloc");
  GEMMA4_T4_CUDA_TRY(cudaMemset(s.buf, 0xA5, bytes), "measure_bandwidth: cudaMemset");
  GEMMA4_T4_CUDA_TRY(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "measure_bandwidth: stream");
  GEMMA4_T4_CUDA_TRY(cudaEventCreate(&s.a), "measure_bandwidth: event");
  GEMMA4_T4_CUDA_TRY(cudaEventCreate(&s.b), "measure_bandwidth: event");
  const int repeats = std::max(1, o.repeats);
  auto timed = [&](const std::function<cudaError_t()>& launch, const char* what, double* med_ms) -> Status {
    GEMMA4_T4_CUDA_TRY(launch(), what);  // untimed
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      GEMMA4_T4_CUDA_TRY(cudaEventRecord(s.a, s.stream), what);
      GEMMA4_T4_CUDA_TRY(launch(), what);
      GEMMA4_T4_CUDA_TRY(cudaEventRecord(s.b, s.stream), what);
      GEMMA4_T4_CUDA_TRY(cudaEventSynchronize(s.b), what);
      float t = 0;
      GEMMA4_T4_CUDA_TRY(cudaEventElapsedTime(&t, s.a, s.b), what);
      ms.push_back(double(t));
    }
    *med_ms = std::max(median(ms), 1e-6);
    return Status::ok();
  };
  double read_ms = 0, copy_ms = 0;
  const uint4* words = static_cast<const uint4*>(s.buf);
  GEMMA4_T4_TRY(timed([&] { return kernels::launch_stream_read(words, bytes / 16, s.out, blocks, s.stream); },
                      "measure_bandwidth: stream read", &read_ms));
  uint8_t* b8 = static_cast<uint8_t*>(s.buf);
  GEMMA4_T4_TRY(
      timed([&] { return cudaMemcpyAsync(b8 + bytes / 2, b8, bytes / 2, cudaMemcpyDeviceToDevice, s.stream); },
            "measure_bandwidth: device copy", &copy_ms));
  out->backend = Backend::Cuda;
  out->read_gbs = double(bytes) / (read_ms * 1e-3) / 1e9;
  out->copy_gbs = double(bytes) / (copy_ms * 1e-3) / 1e9;  // bytes/2 read + bytes/2 written
  out->bytes = bytes;
  out->repeats = repeats;
  out->threads = 0;
  out->method = strf(
      "device %d: read-only kernel over %s (%d blocks x %d threads); device-to-device copy, read + "
      "write bytes; CUDA events, median of %d%s",
      device, human_bytes(double(bytes)).c_str(), blocks, kernels::kStreamThreads, repeats,
      !o.bytes && bytes < (uint64_t(1) << 30) ? "; 1 GiB did not fit in free GPU memory" : "");
  return Status::ok();
}

inline bench::DeviceReport cuda_report(int device) {
  bench::DeviceReport r = host_report(device, "");
  cudaDriverGetVersion(&r.driver_version);
  cudaRuntimeGetVersion(&r.runtime_version);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    // In words a person can act on: the runtime says "insufficient driver" when there is none at all (then
    // cudaDriverGetVersion gives 0) as well as when it is too old.
    if (e == cudaErrorInsufficientDriver && r.driver_version == 0)
      r.note = "no CUDA device: no NVIDIA driver found (libcuda.so.1 is not installed, or not loadable)";
    else if (e == cudaErrorInsufficientDriver)
      r.note = strf(
          "no CUDA device: the NVIDIA driver (CUDA %s) is older than this build's CUDA runtime (%s); "
          "update the driver",
          cuda_version_string(r.driver_version).c_str(), cuda_version_string(r.runtime_version).c_str());
    else if (e == cudaErrorNoDevice || e == cudaSuccess)
      r.note = "no CUDA device: the NVIDIA driver finds no GPU";
    else
      r.note = strf("no CUDA device (%s: %s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return r;
  }
  if (device < 0 || device >= n) {
    r.note = strf("no CUDA device %d (%d present)", device, n);
    return r;
  }
  cudaDeviceProp p;
  const cudaError_t ep = cudaGetDeviceProperties(&p, device);
  if (ep != cudaSuccess) {
    cudaGetLastError();
    r.note = strf("no CUDA device: cudaGetDeviceProperties(%d) failed (%s)", device, cudaGetErrorString(ep));
    return r;
  }
  r.cuda = true;
  r.name = p.name;
  r.cc_major = p.major;
  r.cc_minor = p.minor;
  r.sm_count = p.multiProcessorCount;
  r.memory_total = p.totalGlobalMem;
  r.smem_per_block = p.sharedMemPerBlock;
  r.smem_per_block_optin = p.sharedMemPerBlockOptin;
  r.smem_per_sm = p.sharedMemPerMultiprocessor;
  r.l2_bytes = uint64_t(std::max(p.l2CacheSize, 0));
  if (cudaSetDevice(device) == cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) r.memory_free = free_b;
  }
  cudaGetLastError();
  cudaFuncAttributes a;
  const cudaError_t ea = cudaFuncGetAttributes(&a, kernels::stream_read_kernel);
  const int cc = p.major * 10 + p.minor;
  if (ea != cudaSuccess) {
    cudaGetLastError();
    r.code = strf("no code for sm_%d in this build (%s): add %d to GEMMA4_T4_CUDA_ARCHS", cc, cudaGetErrorName(ea), cc);
    return r;
  }
  r.kernel_binary_version = a.binaryVersion;
  r.kernel_ptx_version = a.ptxVersion;
  r.pdl = kernels::pdl_supported(device);
  if (a.binaryVersion == cc && a.ptxVersion < cc) {
    r.jit = true;
    r.code = strf("PTX compute_%d JIT-compiled for sm_%d", a.ptxVersion, cc);
  } else if (a.binaryVersion == cc) {
    r.code = strf("native SASS sm_%d", cc);
  } else {
    r.code = strf("SASS sm_%d (binary-compatible with sm_%d)", a.binaryVersion, cc);
  }
  return r;
}

#endif  // GEMMA4_T4_NO_CUDA

// GPU memory free now (CUDA), MemAvailable (CPU).
inline uint64_t free_memory(Backend backend, int device) {
#ifndef GEMMA4_T4_NO_CUDA
  if (backend == Backend::Cuda) {
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return free_b;
    cudaGetLastError();
    return 0;
  }
#else
  (void)device;
#endif
  (void)backend;
  uint64_t total = 0, avail = 0;
  host_memory(&total, &avail);
  return avail;
}

// ---- doctor ----

// Reads config.json and the safetensors headers at `dir` into *d (summary, decode bytes, GPU estimate).
inline Status inspect_model(const std::string& dir, bench::DoctorReport* d) {
  ModelConfig cfg;
  std::string text;
  const std::string cfg_path = path_join(dir, "config.json");
  GEMMA4_T4_TRY(read_text_file(cfg_path, &text));
  GEMMA4_T4_TRY(parse_config(text, cfg_path, &cfg));
  TensorStore store;
  GEMMA4_T4_TRY(store.open(dir));
  Weights w;
  WeightBinder binder(store, cfg, dir);
  GEMMA4_T4_TRY(binder.bind(&w));
  d->model_summary = model_summary(cfg);
  d->decode_bytes_per_token = w.decode_bytes();
  // GPU memory with the default LoadOptions (PLE table on the host), as CudaBackend allocates it, roughly:
  const double V = cfg.vocab_size, H = cfg.hidden_size, L = cfg.num_layers, D = cfg.hidden_size_per_layer_input;
  double weights = w.decode_bytes() + (w.lm_head != w.embed ? V * H * 2 : 0) + L * H * 4 * 8;
  double wide = std::max({H, L * D}), largest = 0, kv = 0, qw = 0, dmax = 0;
  auto see = [&](const LinearW& l) {
    wide = std::max({wide, double(l.out), double(l.in)});
    if (l.quantized()) largest = std::max(largest, double(l.out) * l.in * 2);
  };
  see(w.ple_model_proj);
  for (const LayerW& l : w.layers)
    for (const LinearW* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj}) see(*x);
  const double ctx = std::min(8192.0, double(cfg.max_position_embeddings));
  const double rows = LoadOptions().max_pass_rows;  // the CUDA backend's pass size at the default options
  for (const LayerConfig& lc : cfg.layers) {
    qw = std::max(qw, double(cfg.num_heads) * lc.head_dim);
    dmax = std::max(dmax, double(lc.head_dim));
    if (lc.kv_shared) continue;
    const double cap = lc.type == LayerType::Sliding ? std::min(ctx, double(cfg.sliding_window) + rows) : ctx;
    kv += 2 * cap * lc.num_kv_heads * lc.head_dim * 2;
  }
  const double workspace = rows * (wide * 14 + qw * 2 + L * D * 12 + H * 4) + 1024 * cfg.num_heads * (dmax + 2) * 4 +
                           largest + 80 * V * 4 + 512.0 * 1024 * 1024;  // + CUDA context / cuBLAS
  d->model_gpu_bytes = uint64_t(weights + workspace + kv);
  return Status::ok();
}

}  // namespace bench_impl
}  // namespace detail

// ---- public API ----

namespace bench {

DeviceReport device_report(int device) {
#ifdef GEMMA4_T4_NO_CUDA
  return detail::bench_impl::host_report(device,
                                         "no CUDA device: this build has no CUDA backend (compiled with "
                                         "GEMMA4_T4_NO_CUDA; compile the implementation with nvcc for one)");
#else
  return detail::bench_impl::cuda_report(device);
#endif
}

DoctorReport doctor(const std::string& model_path, int device) {
  using namespace detail::bench_impl;
  DoctorReport d;
  d.device = device_report(device);
  d.model_path = model_path;
  host_memory(&d.host_ram_total, &d.host_ram_available);
  d.disk_free = disk_free(model_path);
  std::vector<std::string>& warn = d.warnings;
  if (!d.device.cuda) {
    warn.push_back(d.device.note + "; the CPU reference backend would run the model (much slower)");
  } else {
    const int cc = d.device.cc_major * 10 + d.device.cc_minor;
    if (cc < 75)
      warn.push_back(
          strf("GPU '%s' has compute capability %d.%d; gemma4_t4 needs 7.5 (Turing) or newer, so the CPU "
               "backend would be used",
               d.device.name.c_str(), d.device.cc_major, d.device.cc_minor));
    if (d.device.kernel_binary_version == 0 && cc >= 75) warn.push_back("kernels: " + d.device.code);
    if (d.device.jit)
      warn.push_back(
          strf("kernels run as %s: each process pays the JIT at its first forward pass; add %d-real to "
               "GEMMA4_T4_CUDA_ARCHS for native code",
               d.device.code.c_str(), cc));
  }
  if (!model_path.empty()) {
    d.model_file_bytes = safetensors_bytes(model_path);
    Status st;
    try {
      st = inspect_model(model_path, &d);
    } catch (const std::exception& e) {
      st = detail::err(Code::BackendError, model_path, ": ", e.what());
    }
    d.model_ok = bool(st);
    if (!st) {
      d.model_summary = st.message;
      warn.push_back("model: " + st.message);
    } else if (d.device.cuda && d.device.memory_free && d.model_gpu_bytes > d.device.memory_free) {
      warn.push_back(
          strf("the model needs about %s of GPU memory (weights, workspace, one 8192-token session); %s "
               "free of %s",
               human_bytes(double(d.model_gpu_bytes)).c_str(), human_bytes(double(d.device.memory_free)).c_str(),
               human_bytes(double(d.device.memory_total)).c_str()));
    }
    if (d.model_ok && !d.device.cuda && d.host_ram_available && d.host_ram_available < d.model_file_bytes)
      warn.push_back(
          strf("the CPU backend reads the mapped checkpoint (%s) at every token, but only %s of host RAM is "
               "available: it will page from disk",
               human_bytes(double(d.model_file_bytes)).c_str(), human_bytes(double(d.host_ram_available)).c_str()));
  }
  if (d.host_ram_available && d.host_ram_available < (uint64_t(1) << 30))
    warn.push_back("only " + human_bytes(double(d.host_ram_available)) + " of host RAM available");
  if (d.disk_free < (uint64_t(1) << 30))
    warn.push_back("only " + human_bytes(double(d.disk_free)) + " free on the file system of '" +
                   (model_path.empty() ? std::string(".") : model_path) + "'");
  return d;
}

Status measure_bandwidth(Backend backend, int device, const BandwidthOptions& options, Bandwidth* out) {
  if (!out) return detail::err(Code::InvalidArgument, "measure_bandwidth: out is null");
  try {
#ifdef GEMMA4_T4_NO_CUDA
    (void)device;
    if (backend == Backend::Cuda)
      return detail::err(Code::Unsupported, "measure_bandwidth: this build has no CUDA backend");
    return detail::bench_impl::host_bandwidth(options, out);
#else
    if (backend == Backend::Auto) backend = detail::cuda_usable(device) ? Backend::Cuda : Backend::Cpu;
    if (backend == Backend::Cuda) return detail::bench_impl::cuda_bandwidth(device, options, out);
    return detail::bench_impl::host_bandwidth(options, out);
#endif
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, "measure_bandwidth: out of host memory");
  } catch (const std::exception& e) {
    return detail::err(Code::BackendError, "measure_bandwidth: ", e.what());
  }
}

}  // namespace bench

namespace detail {
namespace bench_impl {

// Measures one cell into *cell (errors land in cell->error). Returns false when on_progress asked to stop or
// threw; a throw's message goes to *callback_error (the sweep ends as if cancelled, run() says CallbackError).
inline bool run_cell(const Engine& e, const bench::SweepOptions& o, size_t index, size_t ncells, bench::Cell* cell,
                     std::string* callback_error) {
  const ModelConfig& cfg = e.config();
  const int P = cell->prompt, C = cell->concurrency, N = cell->tokens;
  auto progress = [&](int repeat) {
    if (!o.on_progress) return true;
    bench::Progress p;
    p.cell = index;
    p.cells = ncells;
    p.prompt = P;
    p.concurrency = C;
    p.repeat = repeat;
    p.repeats = o.repeats;
    p.fraction = (double(index) + double(repeat) / o.repeats) / double(ncells);
    try {
      return o.on_progress(p);
    } catch (const std::exception& ex) {
      *callback_error = ex.what();
    } catch (...) {
      *callback_error = "an exception that is not a std::exception";
    }
    return false;
  };
  std::vector<Session> s(static_cast<size_t>(C));
  for (int b = 0; b < C; ++b) {
    const Status st = e.create_session(&s[size_t(b)], size_t(P) + size_t(N));
    if (!st) {
      cell->error = strf("session %d of %d: ", b + 1, C) + st.message;
      return progress(o.repeats);
    }
  }
  std::vector<int32_t> next(static_cast<size_t>(C)), feed(static_cast<size_t>(C));
  std::vector<SamplingOptions> sampling(static_cast<size_t>(C), o.sampling);
  for (int b = 0; b < C; ++b) sampling[size_t(b)].seed = o.sampling.seed + uint64_t(b);
  std::vector<BatchItem> items(static_cast<size_t>(C));
  auto decode_items = [&] {
    feed = next;
    for (int b = 0; b < C; ++b) items[size_t(b)] = BatchItem{&s[size_t(b)], &feed[size_t(b)], 1};
  };
  if (o.warmup) {
    const int wn = std::min(P, 64);
    std::vector<std::vector<int32_t>> wp(static_cast<size_t>(C));
    for (int b = 0; b < C; ++b) {
      prompt_ids(cell_seed(o.seed, P, C, -1), b, wn, cfg, &wp[size_t(b)]);
      items[size_t(b)] = BatchItem{&s[size_t(b)], wp[size_t(b)].data(), size_t(wn)};
    }
    Status st = e.step(items.data(), size_t(C), sampling.data(), next.data());
    for (int k = 0; k < 2 && st; ++k) {
      decode_items();
      st = e.step(items.data(), size_t(C), sampling.data(), next.data());
    }
    if (!st) {
      cell->error = "warm-up: " + st.message;
      return progress(o.repeats);
    }
  }
  std::vector<double> ttft, step_ms, prefill_rate;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(C));
  bool go_on = true;
  for (int r = 0; r < o.repeats; ++r) {
    if (!progress(r)) {
      go_on = false;
      break;
    }
    const uint64_t seed = cell_seed(o.seed, P, C, r);
    for (int b = 0; b < C; ++b) {
      prompt_ids(seed, b, P, cfg, &prompts[size_t(b)]);
      s[size_t(b)].reset();
    }
    std::vector<double> rep_ttft, rep_steps;
    const auto t0 = Clock::now();
    for (int b = 0; b < C; ++b) {
      const BatchItem it{&s[size_t(b)], prompts[size_t(b)].data(), size_t(P)};
      const Status st = e.step(&it, 1, &sampling[size_t(b)], &next[size_t(b)]);
      if (!st) {
        cell->error = strf("repeat %d, prefill of stream %d: ", r + 1, b + 1) + st.message;
        break;
      }
      rep_ttft.push_back(ms_since(t0));
    }
    if (!cell->ok()) break;
    const double prefill_ms = ms_since(t0);
    for (int k = 1; k < N; ++k) {
      decode_items();
      const auto t = Clock::now();
      const Status st = e.step(items.data(), size_t(C), sampling.data(), next.data());
      if (!st) {
        cell->error = strf("repeat %d, decode step %d: ", r + 1, k) + st.message;
        break;
      }
      rep_steps.push_back(ms_since(t));
    }
    if (!cell->ok()) break;
    cell->seeds.push_back(seed);
    ttft.insert(ttft.end(), rep_ttft.begin(), rep_ttft.end());
    step_ms.push_back(median(rep_steps));
    prefill_rate.push_back(double(P) * C / std::max(prefill_ms, 1e-6) * 1e3);
    ++cell->repeats;
  }
  if (cell->repeats > 0) {
    cell->ms_per_token = median(step_ms);
    cell->tok_s_per_stream = cell->ms_per_token > 0 ? 1e3 / cell->ms_per_token : 0;
    cell->tok_s_total = cell->tok_s_per_stream * C;
    cell->ttft_ms_median = median(ttft);
    cell->ttft_ms_p90 = percentile(ttft, 0.9);
    cell->prefill_tok_s = median(prefill_rate);
  }
  if (!go_on) {
    if (cell->ok())
      cell->error = strf("%s after %d of %d repeats", callback_error->empty() ? "cancelled" : "on_progress threw",
                         cell->repeats, o.repeats);
    return false;
  }
  return progress(o.repeats);
}

inline Json device_json(const bench::DeviceReport& d) {
  return Json{{"cuda", d.cuda},
              {"note", d.note},
              {"device", d.device},
              {"name", d.name},
              {"compute_capability", strf("%d.%d", d.cc_major, d.cc_minor)},
              {"sm_count", d.sm_count},
              {"memory_total", d.memory_total},
              {"memory_free", d.memory_free},
              {"smem_per_block", d.smem_per_block},
              {"smem_per_block_optin", d.smem_per_block_optin},
              {"smem_per_sm", d.smem_per_sm},
              {"l2_bytes", d.l2_bytes},
              {"kernel_binary_version", d.kernel_binary_version},
              {"kernel_ptx_version", d.kernel_ptx_version},
              {"jit", d.jit},
              {"pdl", d.pdl},
              {"code", d.code},
              {"driver_version", d.driver_version},
              {"runtime_version", d.runtime_version},
              {"host_cpu", d.host_cpu},
              {"host_threads", d.host_threads}};
}

inline Json bandwidth_json(const bench::Bandwidth& b) {
  return Json{{"backend", backend_name(b.backend)},
              {"read_gbs", b.read_gbs},
              {"copy_gbs", b.copy_gbs},
              {"bytes", b.bytes},
              {"repeats", b.repeats},
              {"threads", b.threads},
              {"method", b.method}};
}

// SweepOptions::sampling in words: "greedy", or the filters that are on.
inline std::string sampling_summary(const SamplingOptions& o) {
  if (o.temperature <= 0.f || o.top_k == 1) return "greedy";
  std::string s = strf("temperature %g", double(o.temperature));
  if (o.top_k > 0) s += strf(", top-k %d", o.top_k);
  if (o.top_p < 1.f) s += strf(", top-p %g", double(o.top_p));
  if (o.min_p > 0.f) s += strf(", min-p %g", double(o.min_p));
  if (o.repetition_penalty != 1.f) s += strf(", repetition penalty %g", double(o.repetition_penalty));
  return s;
}

// "512", or "3968*" when clamped (the * explained in the notes).
inline std::string prompt_label(const bench::Cell& c) {
  return std::to_string(c.prompt) + (c.prompt != c.requested_prompt ? "*" : "");
}

// A cell to quote the T4 projection's efficiency from: the first that succeeded (lowest concurrency of the
// first prompt, as asked).
inline const bench::Cell* reference_cell(const bench::Report& r) {
  for (const bench::Cell& c : r.cells)
    if (c.ok() && c.pct_of_ceiling > 0) return &c;
  return nullptr;
}

inline std::string projection_ceiling(const bench::Report& r) {
  return strf("T4 projection (%s): %.0f GB/s / %.4g GB per token = %.1f tok/s ceiling per stream", kProjectionLabel,
              r.t4_bandwidth_gbs, r.decode_bytes_per_token / 1e9, r.t4_ceiling_tok_s);
}

inline std::string projection_scaled(const bench::Report& r) {
  if (const bench::Cell* c = reference_cell(r))
    return strf(
        "ms per token = %.4g GB / %.0f GB/s + fixed %.3f ms (%.3f ms measured here - %.4g GB / %.0f GB/s; "
        "prompt %d, concurrency %d) = %.1f tok/s per stream on a T4",
        r.decode_bytes_per_token / 1e9, r.t4_bandwidth_gbs, c->fixed_ms, c->ms_per_token,
        r.decode_bytes_per_token / 1e9, r.bandwidth.read_gbs, c->prompt, c->concurrency, c->t4_tok_s_per_stream);
  return "no cell measured a step time to take the fixed cost from";
}

inline std::string projection_sentence(const bench::Report& r) {
  return projection_ceiling(r) + "; " + projection_scaled(r);
}

}  // namespace bench_impl
}  // namespace detail

namespace bench {

Status run(const Engine& engine, const SweepOptions& o, Report* out) {
  using namespace detail::bench_impl;
  using detail::err;
  if (!out) return err(Code::InvalidArgument, "bench::run: out is null");
  if (!engine.loaded()) return err(Code::InvalidArgument, "bench::run: the engine is not loaded");
  if (o.prompts.empty() || o.concurrency.empty())
    return err(Code::InvalidArgument, "bench::run: SweepOptions::prompts and ::concurrency must not be empty");
  for (int p : o.prompts)
    if (p < 1) return err(Code::InvalidArgument, "bench::run: prompt length ", p, " must be >= 1");
  for (int c : o.concurrency)
    if (c < 1) return err(Code::InvalidArgument, "bench::run: concurrency ", c, " must be >= 1");
  if (o.tokens < 2)
    return err(Code::InvalidArgument, "bench::run: tokens ", o.tokens,
               " must be >= 2 (the first comes from the prefill; decode is timed from the second)");
  if (o.repeats < 1) return err(Code::InvalidArgument, "bench::run: repeats ", o.repeats, " must be >= 1");

  const ModelConfig& cfg = engine.config();
  const int device = engine.load_options().device;
  Report r;
  r.version = GEMMA4_T4_VERSION_STRING;
  r.timestamp = utc_now();
  r.label = o.label;
  r.sampling = sampling_summary(o.sampling);
  r.model = model_summary(cfg);
  r.backend = engine.backend();
  r.device =
      r.backend == Backend::Cuda ? device_report(device) : host_report(device, "CPU backend: host memory measured");
  if (o.measure_bandwidth) {
    const Status st = measure_bandwidth(r.backend, device, o.bandwidth_options, &r.bandwidth);
    if (!st) r.notes.push_back("bandwidth not measured (no ceiling): " + st.message);
  } else {
    r.bandwidth = o.bandwidth;
    r.notes.push_back("bandwidth given by the caller, not measured in this run");
  }
  r.decode_bytes_per_token = engine.decode_bytes_per_token();
  r.lm_head = engine.load_options().lm_head;
  if (r.bandwidth.read_gbs > 0 && r.decode_bytes_per_token > 0)
    r.ceiling_tok_s = r.bandwidth.read_gbs * 1e9 / r.decode_bytes_per_token;
  r.weight_bytes = engine.weight_bytes();
  r.kv_bytes_per_token = engine.kv_bytes_per_token();
  r.kv_budget_bytes = o.kv_budget_bytes ? o.kv_budget_bytes : free_memory(r.backend, device);
  r.kv_capacity_tokens = r.kv_bytes_per_token ? r.kv_budget_bytes / r.kv_bytes_per_token : 0;
  r.context_limit = size_t(std::max(cfg.max_position_embeddings, 0));
  if (o.max_context > 0 && o.max_context < r.context_limit) r.context_limit = o.max_context;
  r.prompts = o.prompts;
  r.concurrency = o.concurrency;
  r.tokens = o.tokens;
  r.repeats = o.repeats;
  r.seed = o.seed;
  r.t4_bandwidth_gbs = o.t4_bandwidth_gbs;
  if (r.decode_bytes_per_token > 0) r.t4_ceiling_tok_s = o.t4_bandwidth_gbs * 1e9 / r.decode_bytes_per_token;

  const std::string limit_why = o.max_context > 0 && o.max_context < size_t(cfg.max_position_embeddings)
                                    ? strf("SweepOptions::max_context %zu", o.max_context)
                                    : strf("the model's max_position_embeddings %d", cfg.max_position_embeddings);
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    const int p = o.prompts[i];
    int run_p = p;
    std::string error;
    if (size_t(p) + size_t(o.tokens) > r.context_limit) {
      if (o.clamp_prompts && r.context_limit > size_t(o.tokens)) {
        run_p = int(r.context_limit - size_t(o.tokens));
        r.notes.push_back(
            strf("prompt %d clamped to %d (marked *): %d + %d output tokens must fit in ", p, run_p, run_p, o.tokens) +
            limit_why);
      } else {
        error = strf("prompt %d + %d output tokens exceed ", p, o.tokens) + limit_why;
      }
    }
    for (int c : o.concurrency) {
      Cell cell;
      cell.requested_prompt = p;
      cell.prompt = run_p;
      cell.concurrency = c;
      cell.tokens = o.tokens;
      cell.error = error;
      if (r.kv_budget_bytes) {
        const size_t sb = engine.session_bytes(size_t(run_p) + size_t(o.tokens));
        cell.sessions_fit = sb ? r.kv_budget_bytes / sb : 0;
      }
      r.cells.push_back(cell);
    }
  }
  size_t max_ctx = 0;
  for (const Cell& c : r.cells) max_ctx = std::max(max_ctx, size_t(c.prompt) + size_t(c.tokens));
  if (r.backend == Backend::Cuda && max_ctx > engine.load_options().max_context)
    r.notes.push_back(
        strf("LoadOptions::max_context %zu < the largest context run (%zu): CUDA graphs split "
             "attention for %zu keys, so long-context decode may be slower than it could be",
             engine.load_options().max_context, max_ctx, engine.load_options().max_context));

  std::string callback_error;  // what on_progress threw, if it did
  for (size_t i = 0; i < r.cells.size(); ++i) {
    Cell& cell = r.cells[i];
    if (r.cancelled) {
      if (cell.ok()) cell.error = "not run: the sweep was cancelled";
      continue;
    }
    if (!cell.ok()) continue;
    bool go_on = true;
    try {
      go_on = run_cell(engine, o, i, r.cells.size(), &cell, &callback_error);
    } catch (const std::bad_alloc&) {
      cell.error = "out of host memory";
    } catch (const std::exception& e) {
      cell.error = std::string("unexpected error: ") + e.what();
    }
    if (cell.ok() || cell.repeats > 0) {
      if (r.ceiling_tok_s > 0) cell.pct_of_ceiling = cell.tok_s_per_stream / r.ceiling_tok_s * 100.0;
      if (r.bandwidth.read_gbs > 0 && r.decode_bytes_per_token > 0 && cell.ms_per_token > 0) {
        cell.fixed_ms = std::max(0.0, cell.ms_per_token - r.decode_bytes_per_token / (r.bandwidth.read_gbs * 1e6));
        cell.t4_tok_s_per_stream = 1e3 / (r.decode_bytes_per_token / (r.t4_bandwidth_gbs * 1e6) + cell.fixed_ms);
      }
      cell.t4_tok_s_total = cell.t4_tok_s_per_stream * cell.concurrency;
    }
    if (!go_on) r.cancelled = true;
  }
  const size_t done = size_t(std::count_if(r.cells.begin(), r.cells.end(), [](const Cell& c) { return c.ok(); }));
  const bool cancelled = r.cancelled;
  *out = std::move(r);
  if (!callback_error.empty())
    return err(Code::CallbackError, "bench::run: on_progress threw: ", callback_error, " (", done, " of ",
               out->cells.size(), " cells complete; the sweep stopped there)");
  if (cancelled)
    return err(Code::Cancelled, "bench::run: cancelled by on_progress (", done, " of ", out->cells.size(),
               " cells complete)");
  return Status::ok();
}

// ---- outputs ----

std::string to_text(const DeviceReport& d) {
  using namespace detail::bench_impl;
  std::string s;
  if (d.cuda) {
    s += strf("CUDA device %d: %s\n", d.device, d.name.c_str());
    s += strf("  compute capability %d.%d, %d SMs, memory %s (%s free), L2 %s\n", d.cc_major, d.cc_minor, d.sm_count,
              human_bytes(double(d.memory_total)).c_str(), human_bytes(double(d.memory_free)).c_str(),
              human_bytes(double(d.l2_bytes)).c_str());
    s += strf("  shared memory: %s per block, %s opt-in per block, %s per SM\n",
              human_bytes(double(d.smem_per_block)).c_str(), human_bytes(double(d.smem_per_block_optin)).c_str(),
              human_bytes(double(d.smem_per_sm)).c_str());
    s += strf("  library code: %s (kernel binary %d, PTX %d); programmatic dependent launch: %s\n", d.code.c_str(),
              d.kernel_binary_version, d.kernel_ptx_version, d.pdl ? "yes" : "no (needs sm_90+ code)");
  } else {
    s += d.note + "\n";
  }
  if (d.driver_version || d.runtime_version)
    s += strf("  CUDA driver %s, runtime %s\n", cuda_version_string(d.driver_version).c_str(),
              cuda_version_string(d.runtime_version).c_str());
  s += strf("  host: %s, %d threads\n", d.host_cpu.empty() ? "unknown CPU" : d.host_cpu.c_str(), d.host_threads);
  return s;
}

std::string to_text(const Bandwidth& b) {
  using namespace detail::bench_impl;
  if (b.backend == Backend::Cuda)
    return strf("stream read %.1f GB/s, copy %.1f GB/s (%s)\n", b.read_gbs, b.copy_gbs, b.method.c_str());
  return strf("host read %.1f GB/s (%s)\n", b.read_gbs, b.method.c_str());
}

std::string to_text(const DoctorReport& d) {
  using namespace detail::bench_impl;
  std::string s = "gemma4_t4 " GEMMA4_T4_VERSION_STRING " doctor\n";
  s += to_text(d.device);
  s += strf("host RAM: %s available of %s\n", human_bytes(double(d.host_ram_available)).c_str(),
            human_bytes(double(d.host_ram_total)).c_str());
  if (!d.model_path.empty()) {
    s += "model " + d.model_path + ": " + (d.model_ok ? d.model_summary : std::string("does not load")) + "\n";
    if (d.model_ok)
      s += strf("  safetensors %s; decode reads %.4g GB per token; GPU memory needed about %s\n",
                human_bytes(double(d.model_file_bytes)).c_str(), d.decode_bytes_per_token / 1e9,
                human_bytes(double(d.model_gpu_bytes)).c_str());
  }
  s += "free disk: " + human_bytes(double(d.disk_free)) + "\n";
  if (d.warnings.empty()) s += "no problems found\n";
  for (const std::string& w : d.warnings) s += "warning: " + w + "\n";
  return s;
}

std::string to_table(const Report& r) {
  using namespace detail::bench_impl;
  std::string s = strf("gemma4_t4 %s benchmark, %s\n", r.version.c_str(), r.timestamp.c_str());
  s += "checkpoint  " + (r.label.empty() ? std::string() : r.label + ": ") + r.model + "\n";
  if (r.backend == Backend::Cuda)
    s += strf("backend     CUDA device %d: %s, cc %d.%d, %d SMs, %s, %s\n", r.device.device, r.device.name.c_str(),
              r.device.cc_major, r.device.cc_minor, r.device.sm_count,
              human_bytes(double(r.device.memory_total)).c_str(), r.device.code.c_str());
  else
    s += strf("backend     CPU: %s, %d threads\n",
              r.device.host_cpu.empty() ? "unknown CPU" : r.device.host_cpu.c_str(), r.device.host_threads);
  s += "bandwidth   " + (r.bandwidth.read_gbs > 0 ? to_text(r.bandwidth) : std::string("not measured\n"));
  s += strf(
      "decode      %.4g GB per token (LM head %s) -> ceiling %.1f tok/s per stream (read bandwidth / bytes "
      "per token)\n",
      r.decode_bytes_per_token / 1e9, detail::lm_head_name(r.lm_head), r.ceiling_tok_s);
  s += strf("memory      weights %s; KV %s per token; budget %s -> %s tokens\n",
            human_bytes(double(r.weight_bytes)).c_str(), human_bytes(double(r.kv_bytes_per_token)).c_str(),
            human_bytes(double(r.kv_budget_bytes)).c_str(), with_commas(r.kv_capacity_tokens).c_str());
  s += strf("sweep       %d output tokens per stream (EOS ignored), repeats %d, seed %llu, context limit %zu\n",
            r.tokens, r.repeats, static_cast<unsigned long long>(r.seed), r.context_limit);
  s += "sampling    " + r.sampling + "\n";
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  s += "\n";
  // Columns as wide as their widest entry; a failed cell shows its error after the first two.
  std::vector<std::vector<std::string>> rows = {{"prompt", "streams", "tok/s/stream", "tok/s total", "ms/token",
                                                 "TTFT p50 ms", "TTFT p90 ms", "prefill tok/s", "% ceiling",
                                                 "sessions fit"}};
  for (const Cell& c : r.cells) {
    std::vector<std::string> cols = {prompt_label(c), std::to_string(c.concurrency)};
    if (c.repeats > 0)
      cols.insert(cols.end(),
                  {strf("%.1f", c.tok_s_per_stream), strf("%.1f", c.tok_s_total), strf("%.3f", c.ms_per_token),
                   strf("%.1f", c.ttft_ms_median), strf("%.1f", c.ttft_ms_p90), strf("%.0f", c.prefill_tok_s),
                   strf("%.1f", c.pct_of_ceiling), with_commas(c.sessions_fit)});
    rows.push_back(cols);
  }
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  auto line = [&](const std::vector<std::string>& cols) {
    std::string l;
    for (size_t i = 0; i < cols.size(); ++i) l += (i ? "  " : "") + std::string(w[i] - cols[i].size(), ' ') + cols[i];
    return l;
  };
  std::vector<std::string> rule;
  for (size_t x : w) rule.push_back(std::string(x, '-'));
  s += line(rows[0]) + "\n" + line(rule) + "\n";
  for (size_t i = 0; i < r.cells.size(); ++i)
    s += line(rows[i + 1]) + (r.cells[i].ok() ? std::string() : "  error: " + r.cells[i].error) + "\n";
  s += "\n" + projection_sentence(r) + ".\n";
  if (r.t4_ceiling_tok_s > 0) {
    s +=
        strf("%6s  %7s  %12s  %11s   (T4, %s)\n", "prompt", "streams", "tok/s/stream", "tok/s total", kProjectionLabel);
    for (const Cell& c : r.cells)
      if (c.repeats > 0)
        s += strf("%6s  %7d  %12.1f  %11.1f\n", prompt_label(c).c_str(), c.concurrency, c.t4_tok_s_per_stream,
                  c.t4_tok_s_total);
  }
  if (r.cancelled) s += "the sweep was cancelled: cells marked 'not run' were not measured\n";
  return s;
}

std::string to_json(const DeviceReport& d) { return detail::bench_impl::device_json(d).dump(2) + "\n"; }

std::string to_json(const Bandwidth& b) { return detail::bench_impl::bandwidth_json(b).dump(2) + "\n"; }

std::string to_json(const DoctorReport& d) {
  using Json = detail::bench_impl::Json;
  Json j = {{"schema", "gemma4_t4.doctor/1"},
            {"version", GEMMA4_T4_VERSION_STRING},
            {"device", detail::bench_impl::device_json(d.device)},
            {"host_ram_total", d.host_ram_total},
            {"host_ram_available", d.host_ram_available},
            {"model_path", d.model_path},
            {"model_ok", d.model_ok},
            {"model_summary", d.model_summary},
            {"model_file_bytes", d.model_file_bytes},
            {"model_gpu_bytes", d.model_gpu_bytes},
            {"decode_bytes_per_token", d.decode_bytes_per_token},
            {"disk_free", d.disk_free},
            {"warnings", d.warnings}};
  return j.dump(2) + "\n";
}

std::string to_json(const Report& r) {
  using namespace detail::bench_impl;
  Json cells = Json::array(), t4cells = Json::array();
  for (const Cell& c : r.cells) {
    cells.push_back(Json{{"prompt", c.prompt},
                         {"requested_prompt", c.requested_prompt},
                         {"concurrency", c.concurrency},
                         {"tokens", c.tokens},
                         {"repeats", c.repeats},
                         {"seeds", c.seeds},
                         {"ms_per_token", c.ms_per_token},
                         {"tok_s_per_stream", c.tok_s_per_stream},
                         {"tok_s_total", c.tok_s_total},
                         {"ttft_ms_median", c.ttft_ms_median},
                         {"ttft_ms_p90", c.ttft_ms_p90},
                         {"prefill_tok_s", c.prefill_tok_s},
                         {"pct_of_ceiling", c.pct_of_ceiling},
                         {"sessions_fit", c.sessions_fit},
                         {"error", c.error}});
    t4cells.push_back(Json{{"prompt", c.prompt},
                           {"concurrency", c.concurrency},
                           {"fixed_ms", c.fixed_ms},
                           {"tok_s_per_stream", c.t4_tok_s_per_stream},
                           {"tok_s_total", c.t4_tok_s_total}});
  }
  Json j = {{"schema", "gemma4_t4.bench/1"},
            {"version", r.version},
            {"timestamp", r.timestamp},
            {"label", r.label},
            {"model", r.model},
            {"backend", backend_name(r.backend)},
            {"device", device_json(r.device)},
            {"bandwidth", bandwidth_json(r.bandwidth)},
            {"decode_bytes_per_token", r.decode_bytes_per_token},
            {"lm_head", detail::lm_head_name(r.lm_head)},
            {"ceiling_tok_s", r.ceiling_tok_s},
            {"weight_bytes", r.weight_bytes},
            {"kv",
             {{"budget_bytes", r.kv_budget_bytes},
              {"bytes_per_token", r.kv_bytes_per_token},
              {"capacity_tokens", r.kv_capacity_tokens}}},
            {"context_limit", r.context_limit},
            {"options",
             {{"prompts", r.prompts},
              {"concurrency", r.concurrency},
              {"tokens", r.tokens},
              {"repeats", r.repeats},
              {"seed", r.seed},
              {"sampling", r.sampling}}},
            {"notes", r.notes},
            {"cells", cells},
            {"t4_projection",
             {{"label", kProjectionLabel},
              {"description", projection_sentence(r)},
              {"bandwidth_gbs", r.t4_bandwidth_gbs},
              {"ceiling_tok_s", r.t4_ceiling_tok_s},
              {"cells", t4cells}}},
            {"cancelled", r.cancelled}};
  return j.dump(2) + "\n";
}

std::string to_csv(const Report& r) {
  using namespace detail::bench_impl;
  std::string s =
      "prompt,requested_prompt,concurrency,tokens,repeats,ms_per_token,tok_s_per_stream,tok_s_total,ttft_ms_median,"
      "ttft_ms_p90,prefill_tok_s,pct_of_ceiling,ceiling_tok_s,sessions_fit,weight_bytes,kv_bytes_per_token,"
      "t4_projected_tok_s_per_stream,t4_projected_tok_s_total,t4_note,error\n";
  for (const Cell& c : r.cells) {
    s += strf("%d,%d,%d,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%llu,%llu,%llu,%.6g,%.6g,", c.prompt,
              c.requested_prompt, c.concurrency, c.tokens, c.repeats, c.ms_per_token, c.tok_s_per_stream, c.tok_s_total,
              c.ttft_ms_median, c.ttft_ms_p90, c.prefill_tok_s, c.pct_of_ceiling, r.ceiling_tok_s,
              static_cast<unsigned long long>(c.sessions_fit), static_cast<unsigned long long>(r.weight_bytes),
              static_cast<unsigned long long>(r.kv_bytes_per_token), c.t4_tok_s_per_stream, c.t4_tok_s_total);
    s += csv_field(kProjectionLabel) + "," + csv_field(c.error) + "\n";
  }
  return s;
}

std::string to_svg(const Report& r) {
  using namespace detail::bench_impl;
  const double W = 960, H = 530, top = 100, ph = 300, pw = 380;
  const double px[2] = {80, 540};  // left edge of each panel
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  std::vector<int> xs = r.concurrency;  // the x categories, ascending, evenly spaced
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  auto xpos = [&](int panel, int c) {
    const size_t i = size_t(std::lower_bound(xs.begin(), xs.end(), c) - xs.begin());
    return xs.size() < 2 ? px[panel] + pw / 2 : px[panel] + 20 + (pw - 40) * double(i) / double(xs.size() - 1);
  };
  auto value = [](const Cell& c, int panel) { return panel == 0 ? c.tok_s_per_stream : c.tok_s_total; };
  auto text = [](double x, double y, const char* anchor, const char* attrs, const std::string& t) {
    return strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>%s</text>\n", x, y, anchor, attrs,
                xml_escape(t).c_str());
  };
  // the legend's name of each requested prompt (clamped ones say so)
  std::vector<std::string> names;
  for (int p : r.prompts) {
    int shown = p;
    for (const Cell& c : r.cells)
      if (c.requested_prompt == p) shown = c.prompt;
    names.push_back(shown == p ? strf("prompt %d", p) : strf("prompt %d (clamped from %d)", shown, p));
  }

  std::string s = strf(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f "
      "%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H, W, H);
  s += strf("<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
  s += text(W / 2, 24, "middle", " font-size=\"15\"",
            "gemma4_t4 " + r.version + " - " + (r.label.empty() ? r.model : r.label + " (" + r.model + ")"));
  const std::string runs =
      strf("%d output tokens, %d repeat%s, %s", r.tokens, r.repeats, r.repeats == 1 ? "" : "s", r.timestamp.c_str());
  s += text(W / 2, 44, "middle", " fill=\"#444\"",
            r.backend == Backend::Cuda ? strf("CUDA %s, %s; ", r.device.name.c_str(), r.device.code.c_str()) + runs
                                       : strf("CPU backend, %d threads; ", r.device.host_threads) + runs);
  {  // legend: one row above the panels
    double width = 0;
    for (const std::string& n : names) width += 34 + 7 * double(n.size()) + 18;
    double x = W / 2 - width / 2;
    for (size_t i = 0; i < names.size(); ++i) {
      s += strf("<line x1=\"%.1f\" y1=\"66\" x2=\"%.1f\" y2=\"66\" stroke=\"%s\" stroke-width=\"2\"/>\n", x, x + 26,
                colors[i % 6]);
      s += text(x + 32, 70, "start", "", names[i]);
      x += 34 + 7 * double(names[i].size()) + 18;
    }
  }
  for (int panel = 0; panel < 2; ++panel) {
    const double x0 = px[panel], y0 = top;
    double ymax = panel == 0 ? r.ceiling_tok_s : r.ceiling_tok_s * (xs.empty() ? 1 : xs.front());
    for (const Cell& c : r.cells)
      if (c.repeats > 0) ymax = std::max(ymax, value(c, panel));
    if (!(ymax > 0)) ymax = 1;
    const double raw = ymax * 1.08 / 5, mag = std::pow(10.0, std::floor(std::log10(raw))), norm = raw / mag;
    const double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
    const double top_v = std::ceil(ymax * 1.08 / step) * step;
    auto ypos = [&](double v) { return y0 + ph - ph * v / top_v; };
    const std::string clip = strf("clip%d", panel);
    s += strf("<clipPath id=\"%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
              clip.c_str(), x0, y0, pw, ph);
    s += strf("<g class=\"panel\" data-panel=\"%s\">\n", panel == 0 ? "per-stream" : "total");
    s += text(x0 + pw / 2, y0 - 8, "middle", " font-size=\"13\"",
              panel == 0 ? "tok/s per stream" : "tok/s total (all streams)");
    for (double v = 0; v <= top_v * 1.0001; v += step) {
      s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", x0, ypos(v), x0 + pw,
                ypos(v));
      s += text(x0 - 6, ypos(v) + 4, "end", "", strf("%.6g", v));
    }
    s += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", x0, y0,
              pw, ph);
    for (int c : xs) s += text(xpos(panel, c), y0 + ph + 16, "middle", "", std::to_string(c));
    s += text(x0 + pw / 2, y0 + ph + 34, "middle", "", "concurrency (streams)");
    if (r.ceiling_tok_s > 0) {  // the ceiling: flat per stream; in total, concurrency times it
      std::string d = strf("M%.1f %.1f L%.1f %.1f", x0, ypos(r.ceiling_tok_s), x0 + pw, ypos(r.ceiling_tok_s));
      if (panel == 1) {
        d.clear();
        for (size_t i = 0; i < xs.size(); ++i)
          d += strf("%s%.1f %.1f ", i ? "L" : "M", xpos(panel, xs[i]), ypos(r.ceiling_tok_s * xs[i]));
      }
      s += strf(
          "<path class=\"ceiling\" d=\"%s\" fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" "
          "stroke-dasharray=\"7 5\" clip-path=\"url(#%s)\"/>\n",
          d.c_str(), clip.c_str());
      if (panel == 0)
        s += text(x0 + pw - 4, ypos(r.ceiling_tok_s) - 4, "end", " fill=\"#555\"",
                  strf("ceiling %.1f tok/s (bandwidth / bytes per token)", r.ceiling_tok_s));
    }
    if (panel == 0 && r.t4_ceiling_tok_s > 0 && r.t4_ceiling_tok_s <= top_v) {
      s += strf(
          "<line class=\"t4\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#b8860b\" "
          "stroke-dasharray=\"2 3\"/>\n",
          x0, ypos(r.t4_ceiling_tok_s), x0 + pw, ypos(r.t4_ceiling_tok_s));
      s += text(x0 + pw - 4, ypos(r.t4_ceiling_tok_s) - 4, "end", " fill=\"#b8860b\"",
                strf("T4 ceiling %.1f tok/s (%s)", r.t4_ceiling_tok_s, kProjectionLabel));
    }
    for (size_t pi = 0; pi < r.prompts.size(); ++pi) {
      const char* color = colors[pi % 6];
      std::string pts, dots;
      for (const Cell& c : r.cells) {
        if (c.requested_prompt != r.prompts[pi] || c.repeats == 0) continue;
        const double x = xpos(panel, c.concurrency), y = ypos(value(c, panel));
        pts += strf("%s%.1f,%.1f", pts.empty() ? "" : " ", x, y);
        dots += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, color);
      }
      s += strf(
          "<polyline class=\"series\" data-prompt=\"%d\" points=\"%s\" fill=\"none\" stroke=\"%s\" "
          "stroke-width=\"2\"/>\n",
          r.prompts[pi], pts.c_str(), color);
      s += dots;
    }
    s += "</g>\n";
  }
  const double fy = top + ph + 62;
  s += text(W / 2, fy, "middle", " class=\"projection\" fill=\"#b8860b\"", projection_ceiling(r));
  s += text(W / 2, fy + 18, "middle", " class=\"projection\" fill=\"#b8860b\"", projection_scaled(r));
  s += text(W / 2, fy + 40, "middle", " fill=\"#444\"",
            strf("decode reads %.4g GB per token; measured bandwidth %.1f GB/s; dashed: measured ceiling; dotted: T4 "
                 "ceiling (%s)",
                 r.decode_bytes_per_token / 1e9, r.bandwidth.read_gbs, kProjectionLabel));
  s += "</svg>\n";
  return s;
}

// ---- quantized LM head fidelity ----

Status lm_head_fidelity(const std::string& dir, const LoadOptions& options, const HeadFidelityOptions& o,
                        HeadFidelity* out) {
  using namespace detail::bench_impl;
  if (!out) return detail::err(Code::InvalidArgument, "lm_head_fidelity: out is null");
  if (o.head == LmHead::F16) return detail::err(Code::InvalidArgument, "lm_head_fidelity: head must be Int8 or Int4");
  if (o.positions < 1 || o.sequence < 1)
    return detail::err(Code::InvalidArgument, "lm_head_fidelity: positions and sequence must be >= 1");
  LoadOptions fo = options, qo = options;
  fo.lm_head = LmHead::F16;
  qo.lm_head = o.head;
  fo.max_context = qo.max_context = size_t(o.sequence);
  Engine f, q;
  GEMMA4_T4_TRY(Engine::load(dir, fo, &f));
  const Clock::time_point t0 = Clock::now();
  GEMMA4_T4_TRY(Engine::load(dir, qo, &q));
  HeadFidelity r;
  r.head = o.head;
  r.load_ms = ms_since(t0);
  r.decode_bytes_f16 = f.decode_bytes_per_token();
  r.decode_bytes = q.decode_bytes_per_token();
  const size_t V = size_t(f.config().vocab_size), chunk = 64;
  double sum_abs = 0;
  double top5_sum = 0;
  size_t top1 = 0;
  std::vector<float> lf, lq;
  std::vector<int32_t> ids;
  std::vector<size_t> order(V);
  auto top5 = [&order, V](const float* x, size_t* t) {  // ids of the 5 largest, ties to the lower id
    for (size_t i = 0; i < V; ++i) order[i] = i;
    const size_t k = std::min<size_t>(5, V);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(k), order.end(),
                      [x](size_t a, size_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (size_t i = 0; i < 5; ++i) t[i] = i < k ? order[i] : V;
  };
  for (int seq = 0; int(r.positions) < o.positions; ++seq) {
    const int n = std::min(o.sequence, o.positions - int(r.positions));
    prompt_ids(o.seed, seq, n, f.config(), &ids);
    Session sf, sq;
    GEMMA4_T4_TRY(f.create_session(&sf));
    GEMMA4_T4_TRY(q.create_session(&sq));
    for (size_t b = 0; b < size_t(n); b += chunk) {
      const size_t m = std::min(chunk, size_t(n) - b);
      lf.clear();
      lq.clear();
      GEMMA4_T4_TRY(f.forward(sf, &ids[b], m, Logits::All, &lf));
      GEMMA4_T4_TRY(q.forward(sq, &ids[b], m, Logits::All, &lq));
      for (size_t row = 0; row < m; ++row) {
        const float* x = &lf[row * V];
        const float* y = &lq[row * V];
        double emax = 0, fmax = 0;
        for (size_t i = 0; i < V; ++i) {
          const double e = std::fabs(double(y[i]) - x[i]);
          emax = std::max(emax, e);
          fmax = std::max(fmax, double(std::fabs(x[i])));
          sum_abs += e;
        }
        r.max_abs_error = std::max(r.max_abs_error, emax);
        if (fmax > 0) r.max_rel_error = std::max(r.max_rel_error, emax / fmax);
        size_t tf[5], tq[5];
        top5(x, tf);
        top5(y, tq);
        top1 += tf[0] == tq[0];
        int hit = 0;
        for (size_t i : tf)
          for (size_t j : tq) hit += i == j && i < V;
        top5_sum += hit / double(std::min<size_t>(5, V));
        ++r.positions;
      }
    }
  }
  r.mean_abs_error = sum_abs / (double(r.positions) * double(V));
  r.top1 = double(top1) / double(r.positions);
  r.top5 = top5_sum / double(r.positions);
  *out = r;
  return Status::ok();
}

std::string to_text(const HeadFidelity& h) {
  using namespace detail::bench_impl;
  return strf(
      "LM head %s vs f16 over %zu positions: max |dlogit| %.4g, mean %.3g, max relative %.3g; top-1 agreement "
      "%.2f%%, top-5 overlap %.2f%%; decode bytes/token %s -> %s (%.1f%% fewer)\n",
      detail::lm_head_name(h.head), h.positions, h.max_abs_error, h.mean_abs_error, h.max_rel_error, h.top1 * 100,
      h.top5 * 100, human_bytes(h.decode_bytes_f16).c_str(), human_bytes(h.decode_bytes).c_str(),
      h.decode_bytes_f16 > 0 ? 100.0 * (1.0 - h.decode_bytes / h.decode_bytes_f16) : 0.0);
}

std::string to_json(const HeadFidelity& h) {
  using Json = detail::bench_impl::Json;
  Json j = {{"schema", "gemma4_t4.lm_head_fidelity/1"},
            {"head", detail::lm_head_name(h.head)},
            {"positions", h.positions},
            {"max_abs_error", h.max_abs_error},
            {"mean_abs_error", h.mean_abs_error},
            {"max_rel_error", h.max_rel_error},
            {"top1_agreement", h.top1},
            {"top5_overlap", h.top5},
            {"decode_bytes_f16", h.decode_bytes_f16},
            {"decode_bytes", h.decode_bytes},
            {"load_ms", h.load_ms}};
  return j.dump(2) + "\n";
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return detail::err(Code::IoError, path, ": cannot open for writing (", std::strerror(errno), ")");
  f.write(text.data(), std::streamsize(text.size()));
  f.close();
  if (!f) return detail::err(Code::IoError, path, ": write failed (", std::strerror(errno), ")");
  return Status::ok();
}

}  // namespace bench
}  // namespace gemma4_t4
