// gemma4_t4 declaration part: gemma4_t4::bench, the built-in benchmark. Included by gemma4_t4.hpp at the end of
// its declarations (unless GEMMA4_T4_NO_BENCH), after the types it names; like them it needs no CUDA headers and
// nothing but the standard library. The implementation parts: bench/doctor.hpp (device_report, doctor),
// bench/measure.hpp (measure_bandwidth, run, lm_head_fidelity), bench/report.hpp (the writers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gemma4_t4 {

// ---- benchmark ----------------------------------------------------------------------------------------------

// The built-in benchmark: what the device is, how fast its memory streams, what a decode step must read
// (the ceiling tok/s = bandwidth / decode bytes per token), and the sweep of the published T4 study (prompts
// 512 and 4096 x concurrency 1/4/8/16, 128 output tokens, 3 repeats), as a table, JSON, CSV and an SVG plot,
// with a T4 projection labelled "projection, not measured". bench/bench.cpp is the command line,
// examples/bench_embed.cpp an application calling it; include/gemma4_t4/bench/measure.hpp says how each number is
// measured. Functions here keep no state; numbers measured while other work runs on the device come out lower.
namespace bench {

// What the GPU is -- or, without one, why not. Sizes in bytes; versions as CUDA writes them (12040 = 12.4).
struct DeviceReport {
  bool cuda = false;  // true: a CUDA device answered and the GPU fields below describe it
  std::string note;   // when !cuda: why ("no CUDA device: ...", this build has no CUDA backend, ...)
  int device = 0;     // the CUDA ordinal asked about
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  int clock_mhz = 0;  // peak SM clock (cudaDevAttrClockRate)
  // Dense fp16 tensor-core peak with fp32 accumulation, TFLOP/s: sm_count x clock x FLOP per clock per SM for the
  // architecture (sm_75 1024: T4 65; sm_80 2048: A100 312; sm_86/87/89 1024, the data-center parts -- GeForce
  // halves it with fp32 accumulation; sm_90 4096: H100/H200 989 at 1830 MHz); 0 where the table has no entry.
  double fp16_tensor_tflops = 0;
  uint64_t memory_total = 0, memory_free = 0;  // global memory; free as cudaMemGetInfo says now
  uint64_t smem_per_block = 0;                 // shared memory per block without opting in
  uint64_t smem_per_block_optin = 0;           // per block with cudaFuncAttributeMaxDynamicSharedMemorySize
  uint64_t smem_per_sm = 0;
  uint64_t l2_bytes = 0;
  // How this library's kernels run on the device, from cudaFuncGetAttributes of one of them: binary_version
  // is the SASS architecture loaded (90 = sm_90), ptx_version the PTX architecture it came from. jit: the
  // build has no SASS for this GPU, so the driver JIT-compiled the PTX (binary == device cc, ptx < binary).
  int kernel_binary_version = 0, kernel_ptx_version = 0;
  bool jit = false;
  // Programmatic dependent launch (sm_90+ device running sm_90+ code; LoadOptions::programmatic_launch).
  bool pdl = false;
  std::string code;  // in words: "native SASS sm_90", "PTX compute_75 JIT-compiled for sm_90", ...
  int driver_version = 0, runtime_version = 0;
  std::string host_cpu;  // /proc/cpuinfo "model name" ("" when unknown)
  int host_threads = 0;  // std::thread::hardware_concurrency()
};

// Never fails: problems go to note. With a GPU it makes `device` current on this thread (cudaSetDevice).
DeviceReport device_report(int device = 0);

// device_report plus the host and the checkpoint: is this machine fit to run the model at model_path?
struct DoctorReport {
  DeviceReport device;
  uint64_t host_ram_total = 0, host_ram_available = 0;  // /proc/meminfo MemTotal / MemAvailable
  std::string model_path;                               // as given ("" = no model checks)
  bool model_ok = false;          // config.json and the safetensors headers describe a Gemma 4 text model
  std::string model_summary;      // "7 layers, hidden 64, vocab 512, bf16", or why it does not load
  uint64_t model_file_bytes = 0;  // the model*.safetensors files at model_path
  uint64_t model_gpu_bytes = 0;   // estimate: weights + workspace + one 8192-token session, default LoadOptions
  double decode_bytes_per_token = 0;
  uint64_t disk_free = 0;             // statvfs: bytes available to this user on model_path's file system
  std::vector<std::string> warnings;  // empty: nothing found wrong
};

// Never fails (problems are warnings): no CUDA device, compute capability < 7.5, kernels running as JIT-ed
// PTX, less free GPU memory than the checkpoint needs, a checkpoint that does not load, little host RAM for
// the CPU backend, little free disk. Reads only headers: cheap even for a full-size checkpoint.
DoctorReport doctor(const std::string& model_path, int device = 0);

// Memory bandwidth: the ceiling a decode step (which streams every weight once) is held against.
struct BandwidthOptions {
  uint64_t bytes = 0;  // buffer read per pass; 0: 1 GiB on a GPU (halved to >= 128 MiB if full), 256 MiB host
  int repeats = 10;    // timed passes after one untimed; the median is reported
  int threads = 0;     // host measurement: threads reading (0: hardware_concurrency)
};

struct Bandwidth {
  Backend backend = Backend::Cpu;  // Cuda: device memory; Cpu: host memory
  double read_gbs = 0;             // read-only stream, GB/s (1e9 B/s), median of the repeats
  double copy_gbs = 0;             // Cuda: device-to-device cudaMemcpy, (read + write) B/s / 1e9; 0 on the host
  uint64_t bytes = 0;              // bytes read per pass
  int repeats = 0;
  int threads = 0;     // host threads (Cpu)
  std::string method;  // in words, for reports
};

// Backend::Cuda (or Auto with a usable GPU): a read-only kernel over `bytes` of device memory and a
// device-to-device copy, timed with CUDA events. Backend::Cpu (or Auto without one): `threads` threads each
// summing their share of a host buffer. Errors: OutOfMemory (the buffer), BackendError, Unsupported (Cuda in a
// CPU-only build). Takes a few seconds at most; allocates and frees its buffers.
Status measure_bandwidth(Backend backend, int device, const BandwidthOptions& options, Bandwidth* out);

// Where a sweep is; passed to SweepOptions::on_progress before each timed repeat and after each cell.
struct Progress {
  size_t cell = 0, cells = 0;  // index of the cell (prompt, concurrency), number of cells
  int prompt = 0, concurrency = 0;
  int repeat = 0, repeats = 0;  // the repeat about to start; == repeats once the cell is done
  double fraction = 0;          // of the sweep done, 0..1
};

struct SweepOptions {
  std::vector<int> prompts = {512, 4096};        // prompt tokens per stream
  std::vector<int> concurrency = {1, 4, 8, 16};  // streams decoded together
  int tokens = 128;  // output tokens per stream, EOS ignored (>= 2: the first comes from the prefill)
  int repeats = 3;
  // Base seed: each (cell, repeat) gets splitmix64 of (seed, prompt, concurrency, repeat), and the prompt ids
  // come from that seed alone, so two checkpoints with the same vocabulary see the same prompts.
  uint64_t seed = 20250101;
  // A cell whose prompt + tokens pass the context limit (max_position_embeddings, or max_context when > 0)
  // gets its prompt shortened to fit, with a note; false: the cell fails instead.
  bool clamp_prompts = true;
  size_t max_context = 0;
  bool warmup = true;  // Engine::warm_up before the cells (CUDA), and an untimed short pass per cell first (CUDA
                       // lazy loading, cuBLAS, graph capture)
  // How each output token is chosen (greedy by default; SamplingOptions() = Gemma 4's generation_config:
  // temperature 1, top-k 64, top-p 0.95). Every stream uses it with its own seed (sampling.seed + stream).
  SamplingOptions sampling = SamplingOptions::greedy();
  // KV capacity is reported at this budget; 0: GPU memory free after load (CUDA) / MemAvailable (CPU).
  uint64_t kv_budget_bytes = 0;
  bool measure_bandwidth = true;  // false: take `bandwidth` as given (measured once for several checkpoints)
  BandwidthOptions bandwidth_options;
  Bandwidth bandwidth;
  double t4_bandwidth_gbs = 277;  // the T4 projection's bandwidth (T4: 320 GB/s peak, ~277 GB/s streamed)
  double t4_tensor_tflops = 65;   // the T4 TTFT projection's fp16 tensor-core peak (T4: 65 TFLOP/s)
  std::string label;              // names the checkpoint in every output (e.g. its directory)
  // May be empty; returning false cancels the sweep; throwing stops it too (run() returns CallbackError).
  std::function<bool(const Progress&)> on_progress;
};

// One (prompt, concurrency) cell. Times are wall-clock ms on the calling thread around Engine::step calls,
// which return only when the device is done. Prompts are prefilled one after another in stream order (one
// step per stream: prompt + first token), then all streams decode together, one token each per step.
struct Cell {
  int prompt = 0;            // prompt tokens per stream, as run
  int requested_prompt = 0;  // as asked (larger when clamped)
  int concurrency = 0;
  int tokens = 0;                  // output tokens per stream
  int repeats = 0;                 // timed repeats completed
  std::vector<uint64_t> seeds;     // per repeat
  double ms_per_token = 0;         // median over repeats of the median decode step time
  double tok_s_per_stream = 0;     // 1000 / ms_per_token
  double tok_s_total = 0;          // concurrency * tok_s_per_stream
  double ttft_ms_median = 0;       // over streams x repeats: repeat start -> that stream's first token
  double ttft_ms_p90 = 0;          //   (so it includes waiting for the streams prefilled before it)
  double prefill_tok_s = 0;        // prompt tokens / prefill time (median over repeats)
  double pct_of_ceiling = 0;       // tok_s_per_stream / Report::ceiling_tok_s * 100
  uint64_t sessions_fit = 0;       // sessions of this context (prompt + tokens) that fit in the KV budget
  double fixed_ms = 0;             // ms_per_token - decode bytes / measured read bandwidth (>= 0)
  double t4_tok_s_per_stream = 0;  // T4 projection, NOT measured: 1000 / (decode bytes / T4 bandwidth + fixed_ms)
  double t4_tok_s_total = 0;       // T4 projection, NOT measured: concurrency * t4_tok_s_per_stream
  double prefill_flops = 0;        // one stream's prompt: bench::prefill_flops(config, prompt)
  // T4 projection, NOT measured (concurrency-1 cells on a GPU whose fp16 tensor peak is known): ttft_ms_median
  // x DeviceReport::fp16_tensor_tflops / t4_tensor_tflops -- the prompt at the fraction of the tensor-core peak
  // this GPU reached (prefill_flops / TTFT), on a T4's peak; 0 otherwise
  double t4_ttft_ms = 0;
  std::string error;  // non-empty: what went wrong (numbers from completed repeats, if any)
  bool ok() const { return error.empty(); }
};

struct Report {
  std::string version;           // library version
  std::string timestamp;         // UTC, ISO 8601
  std::string label;             // SweepOptions::label
  std::string model;             // "7 layers, hidden 64, vocab 512, bf16"
  LmHead lm_head = LmHead::F16;  // the engine's LoadOptions::lm_head
  Backend backend = Backend::Cpu;
  DeviceReport device;  // the GPU measured (Cuda), or the host (Cpu)
  Bandwidth bandwidth;
  double decode_bytes_per_token = 0;  // Engine::decode_bytes_per_token
  double ceiling_tok_s = 0;           // bandwidth.read_gbs * 1e9 / decode_bytes_per_token (per stream)
  uint64_t weight_bytes = 0;          // Engine::weight_bytes
  uint64_t kv_budget_bytes = 0;
  uint64_t kv_bytes_per_token = 0;  // Engine::kv_bytes_per_token
  uint64_t kv_capacity_tokens = 0;  // kv_budget_bytes / kv_bytes_per_token (every layer caching every token)
  size_t context_limit = 0;         // prompt + tokens must fit in this
  std::vector<int> prompts, concurrency;
  int tokens = 0, repeats = 0;
  uint64_t seed = 0;
  std::string sampling;            // SweepOptions::sampling in words ("greedy", "temperature 1, top-k 64, ...")
  std::vector<std::string> notes;  // clamped prompts, bandwidth failures, ...
  std::vector<Cell> cells;         // prompts outer, concurrency inner, in the order asked
  double t4_bandwidth_gbs = 0;     // T4 projection, NOT measured
  double t4_ceiling_tok_s = 0;     //   t4_bandwidth_gbs * 1e9 / decode_bytes_per_token
  double t4_tensor_tflops = 0;     // T4 TTFT projection, NOT measured: SweepOptions::t4_tensor_tflops
  bool cancelled = false;
};

// FLOPs of prefilling one prompt of `prompt` tokens, the matmuls only (norms and element-wise work uncounted):
// every decoder linear and the PLE model projection at 2 x in x out per token; attention at 4 x heads x head_dim
// per (query, key) pair (q.k and p.v) over the keys each query sees (every earlier one on full layers, the last
// sliding_window on sliding ones); the LM head for the last token only (a prefill returns one row of logits), and
// so everything past the last layer's K/V that a cache holds (block.hpp kv_keep_layer: from E2B's layer 14's
// attention on) for the last token only.
double prefill_flops(const ModelConfig& config, int prompt);

// The T4 TTFT projection of a cell (Cell::t4_ttft_ms, which run() fills with it): ttft_ms_median x
// report.device.fp16_tensor_tflops / report.t4_tensor_tflops for a concurrency-1 cell of a CUDA report whose
// device peak is known; 0 otherwise. A projection, not a measurement.
double t4_ttft_ms(const Report& report, const Cell& cell);

// Runs the sweep on a loaded engine. A cell that fails (out of memory, context) carries its error and the
// sweep goes on. Returns ok with *out filled; InvalidArgument (nothing run) for an unloaded engine or
// empty/non-positive options; Cancelled, with *out holding what was measured, when on_progress returned false;
// CallbackError (likewise, the message carrying the exception's what()) when on_progress threw.
// Uses the engine from this thread only; don't run other work on the engine meanwhile.
Status run(const Engine& engine, const SweepOptions& options, Report* out);

// How far a quantized LM head (LoadOptions::lm_head) moves the logits from the checkpoint's head: random
// token sequences (ids uniform in the vocabulary, `sequence` tokens each, `positions` in all) fed to two
// engines loaded from one directory -- `options` with lm_head F16, and with `head` -- comparing the soft-capped
// logits of every position.
struct HeadFidelityOptions {
  LmHead head = LmHead::Int8;
  int positions = 4096;
  int sequence = 512;  // tokens per session (<= the model's context)
  uint64_t seed = 20250101;
};

struct HeadFidelity {
  LmHead head = LmHead::Int8;
  size_t positions = 0;
  double max_abs_error = 0;                       // max |q - f| over every position and vocabulary entry
  double mean_abs_error = 0;                      // mean |q - f| over the same
  double max_rel_error = 0;                       // max over positions of max |q - f| / max |f|
  double top1 = 0;                                // fraction of positions whose argmax agrees
  double top5 = 0;                                // mean fraction of f's top-5 ids that are in q's top-5
  double decode_bytes_f16 = 0, decode_bytes = 0;  // Engine::decode_bytes_per_token of the two engines
  double load_ms = 0;                             // Engine::load of the quantized engine
};

// Loads both engines (device memory for two copies of the model on CUDA), runs, frees them. InvalidArgument
// for head F16 or non-positive sizes; load and forward errors as they come.
Status lm_head_fidelity(const std::string& dir, const LoadOptions& options, const HeadFidelityOptions& fidelity,
                        HeadFidelity* out);

// Outputs. The T4 projection is labelled "projection, not measured" in each of them.
std::string to_text(const DeviceReport& device);
std::string to_text(const Bandwidth& bandwidth);
std::string to_text(const DoctorReport& doctor);
std::string to_table(const Report& report);  // aligned text: header lines, the cells, the T4 projection
std::string to_json(const DeviceReport& device);
std::string to_json(const Bandwidth& bandwidth);
std::string to_json(const DoctorReport& doctor);
std::string to_text(const HeadFidelity& fidelity);
std::string to_json(const HeadFidelity& fidelity);
// {"schema": "gemma4_t4.bench/1", version, timestamp, label, model, backend, device{...}, bandwidth{...},
//  decode_bytes_per_token, lm_head, ceiling_tok_s, weight_bytes, kv{budget_bytes, bytes_per_token, capacity_tokens},
//  context_limit, options{prompts, concurrency, tokens, repeats, seed}, notes[], cells[{prompt,
//  requested_prompt, concurrency, tokens, repeats, seeds, ms_per_token, tok_s_per_stream, tok_s_total,
//  ttft_ms_median, ttft_ms_p90, prefill_tok_s, pct_of_ceiling, sessions_fit, prefill_flops, error}],
//  t4_projection{label, description, bandwidth_gbs, ceiling_tok_s, tensor_tflops, ttft_description,
//  cells[{prompt, concurrency, fixed_ms, tok_s_per_stream, tok_s_total, ttft_ms}]}, cancelled}
// (device{} carries clock_mhz and fp16_tensor_tflops beside the fields of DeviceReport.)
std::string to_json(const Report& report);
// Header + one line per cell: prompt, requested_prompt, concurrency, tokens, repeats, ms_per_token,
// tok_s_per_stream, tok_s_total, ttft_ms_median, ttft_ms_p90, prefill_tok_s, pct_of_ceiling, ceiling_tok_s,
// sessions_fit, weight_bytes, kv_bytes_per_token, t4_projected_tok_s_per_stream, t4_projected_tok_s_total,
// t4_projected_ttft_ms (0 where there is none), t4_note ("projection, not measured"), error.
std::string to_csv(const Report& report);
// Two panels (tok/s per stream, tok/s total) vs concurrency, one polyline per prompt length in each, the
// ceiling dashed, the T4 projection dotted and labelled. Self-contained SVG 1.1.
std::string to_svg(const Report& report);
// Writes text to path (replacing it). IoError naming the path on failure.
Status write_file(const std::string& path, const std::string& text);
// Now, UTC, ISO 8601 to the second ("2026-12-03T19:04:44Z"): Report::timestamp's format, for reports of your own.
std::string utc_timestamp();

}  // namespace bench

}  // namespace gemma4_t4
