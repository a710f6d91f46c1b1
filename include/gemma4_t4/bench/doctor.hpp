// gemma4_t4 implementation part: the machine checks of the built-in benchmark -- bench::device_report and
// bench::doctor (declarations and field contracts in bench/api.hpp) -- and the host facts the sweep reports
// too (CPU, RAM). Included by gemma4_t4.hpp inside GEMMA4_T4_IMPLEMENTATION (unless GEMMA4_T4_NO_BENCH).
//
// How device_report knows how the library's code runs: cudaGetDeviceProperties + cudaMemGetInfo, then
// cudaFuncGetAttributes(kernels::stream_read_kernel) -- a kernel compiled in this translation unit with the same
// -gencode flags as every other kernel, so its binaryVersion / ptxVersion are the library's: binary == device cc
// and ptx == binary -> native SASS; binary == cc and ptx < cc -> the driver JIT-compiled PTX (a Turing-only
// build on a newer GPU); binary < cc -> SASS of an older, binary-compatible architecture.
// Host facts come from /proc/meminfo, /proc/cpuinfo and statvfs (free disk); doctor reads a checkpoint's
// config.json and safetensors headers only, never its tensors.
#pragma once

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common.hpp"

namespace gemma4_t4 {
namespace detail {
namespace bench_impl {

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

#ifndef GEMMA4_T4_NO_CUDA

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
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) == cudaSuccess) r.clock_mhz = khz / 1000;
  cudaGetLastError();
  r.fp16_tensor_tflops =
      double(r.sm_count) * r.clock_mhz * 1e6 * fp16_tensor_flops_per_clock(p.major * 10 + p.minor) / 1e12;
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

}  // namespace bench
}  // namespace gemma4_t4
