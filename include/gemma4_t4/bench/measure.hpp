// gemma4_t4 implementation part: the measurements of the built-in benchmark -- bench::measure_bandwidth,
// the sweep bench::run and bench::lm_head_fidelity (declarations and field contracts in bench/api.hpp).
// Included by gemma4_t4.hpp inside GEMMA4_T4_IMPLEMENTATION (unless GEMMA4_T4_NO_BENCH).
//
// What is measured, and how
//   bandwidth      GPU: kernels/stream.cuh over a 1 GiB buffer (8 blocks per SM x 512 threads), and a
//                  device-to-device cudaMemcpyAsync of one half of the buffer onto the other (bytes = read +
//                  write); CUDA events, one untimed pass, then the median of `repeats`. Host: T threads, each
//                  summing its contiguous share of a buffer it first touched itself (pages local to it), timed
//                  from the first thread's start to the last join; median of `repeats`.
//   ceiling        read GB/s * 1e9 / Engine::decode_bytes_per_token(): decode steps per second if a step cost
//                  only streaming the weights once. A batched step also reads the weights once, so the ceiling
//                  is per stream at every concurrency (KV reads make real steps slower still).
//   sweep          before the cells, Engine::warm_up (the passes whose first run loads kernels or captures a
//                  graph; CUDA only), so that no cell's first prompt pays them (the first cell's TTFT did, by
//                  up to ~100 ms on the H200, since a 64-row warm-up loads no 512-row kernel);
//                  per cell (prompt P, concurrency C): C sessions of context P + tokens; an untimed warm-up
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
//                  TTFT, concurrency-1 cells on a GPU: the prompt's FLOPs (prefill_flops) at the fraction of its
//                  fp16 tensor-core peak this GPU reached, on a T4's 65 TFLOP/s: TTFT x this peak / 65. Memory-
//                  bound parts of a prefill scale about alike (H200 / T4: 16.5x peak, 15.7x bandwidth).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "doctor.hpp"

namespace gemma4_t4 {
namespace detail {
namespace bench_impl {

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
  GEMMA4_T4_CUDA_TRY(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "measure_bandwidth: stream");
  // on the stream that reads it (a legacy-stream cudaMemset would not be ordered before the non-blocking stream)
  GEMMA4_T4_CUDA_TRY(cudaMemsetAsync(s.buf, 0xA5, bytes, s.stream), "measure_bandwidth: cudaMemset");
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

#endif  // GEMMA4_T4_NO_CUDA

// Measures one cell into *cell (errors land in cell->error). Returns false when on_progress asked to stop or
// threw; a throw's message goes to *callback_error (the sweep ends as if cancelled, run() says CallbackError).
inline bool run_cell(const Engine& e, const bench::SweepOptions& o, size_t index, size_t ncells, bench::Cell* cell,
                     std::string* callback_error) {
  const ModelConfig& cfg = e.config();
  const int P = cell->prompt, C = cell->concurrency, N = cell->tokens;
  auto progress = [&](int repeat) {
    if (!o.on_progress) return true;
    const double fraction = (double(index) + double(repeat) / o.repeats) / double(ncells);
    try {
      return o.on_progress(bench::Progress{index, ncells, P, C, repeat, o.repeats, fraction});
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

}  // namespace bench_impl
}  // namespace detail

namespace bench {

double t4_ttft_ms(const Report& r, const Cell& c) {
  if (r.backend != Backend::Cuda || c.concurrency != 1 || c.ttft_ms_median <= 0 || r.device.fp16_tensor_tflops <= 0 ||
      r.t4_tensor_tflops <= 0)
    return 0;
  return c.ttft_ms_median * r.device.fp16_tensor_tflops / r.t4_tensor_tflops;
}

double prefill_flops(const ModelConfig& c, int prompt) {
  if (prompt <= 0) return 0;
  const double H = c.hidden_size, P = prompt, D = c.hidden_size_per_layer_input, L = c.num_layers;
  const int keep = detail::kv_keep_layer(c);
  double flops = 2.0 * H * L * D * P;  // per_layer_model_projection (when D > 0)
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerConfig& lc = c.layers[size_t(l)];
    const double q = double(c.num_heads) * lc.head_dim, kv = double(lc.num_kv_heads) * lc.head_dim;
    const double kv_out = lc.kv_shared ? 0 : (lc.k_eq_v ? kv : 2 * kv);
    const double qkv = 2.0 * H * (q + kv_out);
    double rest = 2.0 * q * H;                   // o
    rest += 3 * 2.0 * H * lc.intermediate_size;  // gate, up, down
    rest += 2 * 2.0 * H * D;                     // per_layer_input_gate, per_layer_projection
    // keys seen by the queries at positions 0 .. P-1: p + 1 each, capped at the window on sliding layers
    const double w = lc.type == LayerType::Sliding && c.sliding_window > 0 ? c.sliding_window : P;
    const double m = std::min(w, P);
    const double pairs = m * (m + 1) / 2 + (P - m) * w, last = m;  // every query's keys, the last query's
    if (l < keep)
      flops += (qkv + rest) * P + 4.0 * q * pairs;
    else  // past kv_keep_layer's K/V (block.hpp): the last token only
      flops += (l == keep ? qkv * P : qkv) + rest + 4.0 * q * last;
  }
  return flops + 2.0 * H * c.vocab_size;
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
  r.timestamp = utc_timestamp();
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
  r.t4_tensor_tflops = o.t4_tensor_tflops;

  if (o.warmup && r.backend == Backend::Cuda) {
    const auto t0 = Clock::now();
    const int most = *std::max_element(o.concurrency.begin(), o.concurrency.end());
    const Status st = engine.warm_up(size_t(most));
    r.notes.push_back(st ? strf("Engine::warm_up(%d) before the cells: %.0f ms", most, ms_since(t0))
                         : "Engine::warm_up failed (the cells' own warm-ups remain): " + st.message);
  }
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
      cell.prefill_flops = bench::prefill_flops(cfg, cell.prompt);
      cell.t4_ttft_ms = bench::t4_ttft_ms(r, cell);
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

}  // namespace bench
}  // namespace gemma4_t4
