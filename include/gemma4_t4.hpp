// gemma4_t4 v0.1.0 - Gemma 4 text inference from Hugging Face checkpoints; fast on Tesla T4, header-only
//
// ---- manual ----------------------------------------------------------------------------------------------
//
// WHAT IT IS
//   One C++17 header that loads Google's Gemma 4 text models (E2B, E4B, any dense Gemma 4) straight from
//   their Hugging Face directories -- the bf16 release and the QAT int4 `w4a16` (compressed-tensors
//   pack-quantized) release -- and runs them on a CPU reference backend anywhere and (when compiled by
//   nvcc) on NVIDIA GPUs from Turing (sm_75, Tesla T4) up.
//
// HOW TO USE IT (stb style)
//   In exactly ONE translation unit:
//       #define GEMMA4_T4_IMPLEMENTATION
//       #include "gemma4_t4.hpp"
//   Everywhere else just #include "gemma4_t4.hpp": the declaration part needs no CUDA headers.
//   Compile that one unit with nvcc for the CUDA backend, or with any C++17 compiler and
//   -DGEMMA4_T4_NO_CUDA for the CPU backend only. It needs nlohmann/json.hpp on the include path.
//   CMake users may link `gemma4_t4::impl` instead of writing that unit.
//
//   Load, open a session, feed tokens, read logits:
//       gemma4_t4::Engine engine;
//       gemma4_t4::LoadOptions opt;                      // backend Auto: CUDA when present, else CPU
//       if (auto st = gemma4_t4::Engine::load("/models/gemma-4-E2B-it", opt, &engine); !st) {
//           fprintf(stderr, "%s\n", st.message.c_str()); return 1;
//       }
//       gemma4_t4::Session session;
//       engine.create_session(&session);
//       std::vector<int32_t> prompt = {2, 105, 2364, 107, 9259, 106, 107, 105, 4368, 107};
//       std::vector<float> logits;                        // [vocab] after the call
//       engine.forward(session, prompt.data(), prompt.size(), gemma4_t4::Logits::Last, &logits);
//       int next = gemma4_t4::argmax(logits.data(), engine.config().vocab_size);
//
//   Text in, text out (a chat turn; examples/chat.cpp is the whole program):
//       gemma4_t4::Tokenizer tok;
//       gemma4_t4::Tokenizer::load("/models/gemma-4-E2B-it", &tok);   // its tokenizer.json
//       std::string text = gemma4_t4::format_chat({{"user", "Hello"}}); // "<bos><|turn>user\nHello..."
//       std::vector<int32_t> ids, out;
//       tok.encode(text, &ids);
//       gemma4_t4::GenerateOptions gen;                    // sampling defaults: generation_config.json's
//       gemma4_t4::Tokenizer::Streamer stream(tok);
//       gemma4_t4::generate(engine, session, ids, gen, [&](int32_t id) {
//           std::string piece; stream.put(id, &piece); fputs(piece.c_str(), stdout);
//           return true;                                   // false stops (e.g. on Ctrl-C)
//       }, &out);
//   The session keeps the conversation: the next turn passes only its new tokens.
//
// BATCHING
//   A Batch runs many sessions together (continuous batching): each step() is one forward pass that
//   carries a decode token of every generating session plus bounded chunks of the prompts of sessions that
//   just joined, then samples a token for each. Sessions join with add() -- each with its own prompt,
//   GenerateOptions and callback -- and leave when they finish; cancel() ends one between steps.
//       gemma4_t4::Batch batch(engine);                    // BatchOptions: max_sessions, prefill_rows
//       for (auto& r : requests) batch.add(&r.session, r.prompt, r.options, r.on_token, &r.id);
//       while (!batch.idle()) {
//           batch.step();                                  // add() / cancel() freely between steps
//           for (gemma4_t4::BatchResult& res : batch.take_finished()) ...  // tokens, timing, finish, status
//       }
//   Each session gets what generate() alone would give it (exactly on the CPU backend); a session whose
//   prompt is invalid or that reaches its context limit finishes alone with FinishReason::Error
//   (ContextOverflow) while the others go on.
//
// PREFIX REUSE
//   Many requests share a long prefix (a system prompt): compute it once in a session of its own, then start
//   each conversation from a copy of its KV instead of prefilling it again (examples/server.cpp's prefix cache):
//       engine.forward(shared, system_ids.data(), system_ids.size(), gemma4_t4::Logits::None, nullptr);
//       engine.copy_prefix(shared, session, system_ids.size());     // session now holds the system prompt
//       gemma4_t4::generate(engine, session, user_ids, gen, on_token, &out);  // feeds only the rest
//
// BENCHMARK
//   gemma4_t4::bench measures the machine and the loaded model: device report, memory bandwidth, decode bytes
//   per token and the ceiling they imply, and the sweep of the published T4 study, as a table, JSON, CSV or
//   SVG (bench/bench.cpp is the CLI):
//       gemma4_t4::bench::Report report;
//       gemma4_t4::bench::run(engine, gemma4_t4::bench::SweepOptions(), &report);
//       fputs(gemma4_t4::bench::to_table(report).c_str(), stdout);
//   bench::doctor(model_dir) checks a machine for a model (GPU, compute capability, memory, disk).
//   What it costs an application: every translation unit that includes this header reads the bench
//   declarations (gemma4_t4/bench/api.hpp, ~250 lines of plain structs and functions, standard library only);
//   the implementation unit compiles the bench parts (bench/doctor.hpp, measure.hpp, report.hpp: ~1,500
//   lines; about a sixth of a CPU-only implementation unit's compile time), which read /proc/meminfo and
//   /proc/cpuinfo, call statvfs, and with CUDA add one kernel, the stream read of kernels/stream.cuh. Nothing
//   runs until you call it. GEMMA4_T4_NO_BENCH leaves all of it out.
//
// CONFIGURATION MACROS
//   GEMMA4_T4_IMPLEMENTATION   compile the implementation in this translation unit
//   GEMMA4_T4_NO_CUDA          leave the CUDA backend out (implied when the compiler is not nvcc)
//   GEMMA4_T4_SENTENCEPIECE    load SentencePiece .model tokenizers too (link -lsentencepiece)
//   GEMMA4_T4_NO_BENCH         leave the built-in benchmark (gemma4_t4::bench) out: its declarations and, in the
//                              implementation unit, its code (define it there and wherever bench is not used)
//   GEMMA4_T4_SANITIZER_NVTX   for compute-sanitizer initcheck (`--nvtx yes`): mark cuBLAS outputs as
//                              initialised through the NVTX memory API (the tool does not see cuBLAS's stores)
//
// SUPPORTED CHECKPOINTS
//   config.json model_type `gemma4` (multimodal; text_config used, towers ignored) or `gemma4_text`;
//   weights in one model.safetensors or sharded with model.safetensors.index.json; tensor prefixes
//   `model.language_model.`, `model.`, `language_model.model.`; dtypes BF16, F16, F32 (F32 kept only
//   where exact); quantization_config compressed-tensors pack-quantized int4 symmetric group 32.
//   Refused with a message naming the reason: MoE blocks, other bit widths, asymmetric or act-order
//   quantization, unknown layer types or RoPE types, bidirectional attention.
//
// GPUS
//   CUDA: compute capability 7.5 (Turing) and newer; every kernel compiled for sm_75 uses only sm_75
//   features and at most 64 KiB of shared memory per block.
//
// LIMITS
//   Context per session: LoadOptions::max_context (default 8192), at most max_position_embeddings.
//   safetensors files are read as strictly as the reference implementation: headers of at most 100,000,000
//   bytes (detail::kMaxSafetensorsHeaderBytes), tensors covering the data section exactly.
//   Errors are returned as Status values; the library never exits, aborts or prints to stdout.
//
// FAULTS
//   GPU memory running out -- at load, in create_session, or for a buffer or CUDA graph a step builds on
//   first use -- is Code::OutOfMemory naming the buffer; what the call took is freed and sessions stay as
//   they were, so the engine goes on serving. An exception thrown by a callback of yours ends that one
//   generation with Code::CallbackError (a Batch keeps its other sessions). GenerateOptions::cancel stops a
//   generation from another thread. The checkpoint files stay mapped while the engine lives: deleting one
//   is harmless; one truncated meanwhile is Code::IoError before the next pass reads it (a truncation
//   racing with a pass can still fault the process: don't rewrite a checkpoint in use).
//
// THREAD SAFETY
//   An Engine is immutable after load: several threads may share it as long as each Session is used by
//   one thread at a time (the CUDA backend serialises forward passes internally). Engine::load, moves and
//   destruction must not race with other calls on that Engine. A Batch is driven by one thread (its
//   callbacks run on that thread, inside step()); several Batches may share an Engine. A Tokenizer is
//   immutable after load; format_chat is pure. GenerateOptions::cancel is the one thing another thread may
//   write while a call runs.
//
// HISTORY
//   0.1.0  loader (safetensors, config, bf16/f16/f32 and w4a16 weights), CPU reference backend, CUDA
//          backend (Turing-safe kernels, CUDA graphs, GPU sampling), batched forward, Engine::step,
//          generate(), tokenizer (tokenizer.json BPE; SentencePiece), Gemma 4 chat format, continuous
//          batching (Batch), built-in benchmark (bench::)
// -----------------------------------------------------------------------------------------------------------

#ifndef GEMMA4_T4_HPP
#define GEMMA4_T4_HPP

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#define GEMMA4_T4_VERSION_MAJOR 0
#define GEMMA4_T4_VERSION_MINOR 1
#define GEMMA4_T4_VERSION_PATCH 0
#define GEMMA4_T4_VERSION_STRING "0.1.0"

namespace gemma4_t4 {

// ---- status ----------------------------------------------------------------------------------------------

enum class Code {
  Ok = 0,
  InvalidArgument,  // the caller passed something out of range (token id, size, option)
  NotFound,         // a file or tensor that must exist does not
  IoError,          // open/stat/mmap failed
  FormatError,      // a file is malformed (safetensors header, JSON, shapes)
  Unsupported,      // well-formed but not something this library runs (MoE, 8-bit, ...)
  OutOfMemory,      // host or device allocation failed
  ContextOverflow,  // a session would pass its context limit
  BackendError,     // CUDA or another backend failed
  Cancelled,        // stopped on request (Batch::cancel, GenerateOptions::cancel, bench on_progress)
  CallbackError,    // a callback of the caller's threw; the message carries its what()
};

// The result of every fallible call. `message` says what failed and where (file, tensor, sizes).
struct Status {
  Code code = Code::Ok;
  std::string message;

  Status() = default;
  Status(Code c, std::string m) : code(c), message(std::move(m)) {}
  static Status ok() { return Status(); }
  bool is_ok() const { return code == Code::Ok; }
  explicit operator bool() const { return code == Code::Ok; }
};

inline const char* code_name(Code code) {
  switch (code) {
    case Code::Ok: return "ok";
    case Code::InvalidArgument: return "invalid argument";
    case Code::NotFound: return "not found";
    case Code::IoError: return "I/O error";
    case Code::FormatError: return "format error";
    case Code::Unsupported: return "unsupported";
    case Code::OutOfMemory: return "out of memory";
    case Code::ContextOverflow: return "context overflow";
    case Code::BackendError: return "backend error";
    case Code::Cancelled: return "cancelled";
    case Code::CallbackError: return "callback error";
  }
  return "unknown";
}

// ---- model description -----------------------------------------------------------------------------------

enum class Backend { Auto, Cuda, Cpu };
enum class LayerType { Sliding, Full };
enum class WeightFormat { Bf16, F16, F32, W4A16 };  // how the checkpoint stores the decoder linears

// One decoder layer, resolved from config.json (plain data).
struct LayerConfig {
  LayerType type = LayerType::Sliding;
  int head_dim = 0;           // d: 256 sliding / 512 full on E2B
  int num_kv_heads = 0;       // K/V heads of this layer's projections
  int intermediate_size = 0;  // MLP width (doubled on KV-shared layers when use_double_wide_mlp)
  bool kv_shared = false;     // reads another layer's K/V cache instead of projecting its own
  int kv_source = 0;          // layer whose cache this layer attends over (== own index when not shared)
  bool k_eq_v = false;        // attention_k_eq_v on this layer: V comes from k_proj, no v_proj
  float rope_theta = 10000.f;
  int rope_pairs = 0;        // rotated channel pairs (< d/2 for partial/proportional RoPE)
  int rope_denominator = 0;  // inv_freq[k] = theta^(-2k / rope_denominator) / rope_factor
  float rope_factor = 1.f;
};

struct ModelConfig {
  std::string model_type;  // "gemma4" or "gemma4_text" as found in config.json
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int vocab_size = 0;
  int vocab_size_per_layer_input = 0;
  int hidden_size_per_layer_input = 0;  // PLE width D; 0 = no per-layer embeddings
  int sliding_window = 0;
  int num_kv_shared_layers = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float final_logit_softcapping = 0.f;  // 0 = none
  bool tie_word_embeddings = true;
  int bos_token_id = 2;
  int pad_token_id = 0;
  std::vector<int> eos_token_ids;
  WeightFormat weight_format = WeightFormat::Bf16;
  int quant_group_size = 0;  // 32 for w4a16
  std::vector<LayerConfig> layers;
};

// ---- engine and sessions ----------------------------------------------------------------------------------

// Where the per-layer-embedding table (262144 x 8960 bf16 = 4.7 GB on E2B) lives on the CUDA backend.
enum class PleLocation {
  Host,    // stays in the mapped file; the rows a step needs are gathered and uploaded (default)
  Device,  // copied to GPU memory as fp16
};

// How the LM head (the [vocab, hidden] matrix every decode step reads in full: 805 MB of fp16 on E2B, ~43% of
// the QAT checkpoint's decode bytes) is stored for the matmul. The token embedding keeps the checkpoint's
// values whatever this says (a tied head gets its own quantized copy next to it). Both backends implement
// every choice, with the same quantized values.
enum class LmHead {
  F16,   // the checkpoint's values (fp16 on CUDA, fp32 on the CPU)
  Int8,  // per-row symmetric int8: scale = max|w| / 127, q = round(w / scale); y = scale * (q . x)
  Int4,  // w4a16 layout, group 32: scale = fp16(max|w| / 7), q = round(w / scale) in [-8, 7]; w = fp16(q * scale)
};

// How the CUDA backend runs a decode pass (one token per session, up to 128 sessions per pass).
enum class DecodePath {
  Kernels,     // one kernel per operation (~11 per layer), replayed as a CUDA graph when cuda_graphs (default:
               // the faster one today, bench/RESULTS.md)
  Persistent,  // EXPERIMENTAL: the whole step as one persistent kernel (kernels/decode_step.cuh) where the model
               // and GPU allow it (Engine::decode_path() tells), else Kernels
};

// How the CUDA backend multiplies w4a16 weights in passes of more than 32 rows (batched decode of more than 32
// sessions, prefill). Ignored for fp16 checkpoints and on the CPU.
enum class W4Matmul {
  Dequant,     // each matrix dequantised to fp16 (into a workspace the size of the largest one), then cuBLAS
  TensorCore,  // kernels/gemm_w4.cuh, a tensor-core matmul reading the int4 weights directly, from a copy repacked
               // into its layout at load: costs as many bytes of GPU memory again as the w4a16 decoder weights
               // (int4 words + scales of every decoder linear, ~1 GB on E2B), and saves the dequantisation
               // workspace; slower than Dequant on prefill passes (hundreds of rows and more; bench/RESULTS.md)
  Auto,        // (default) TensorCore for passes of up to kW4AutoGemmRows rows (decode of 33..128 sessions),
               // Dequant for larger ones (prefill chunks): the GEMM-layout copy and the dequantisation workspace
               // both. Measured on the H200 (bench/RESULTS.md 2026-12-04 (b), (c)): ahead of Dequant at 48 and 64
               // sessions, and per matrix at 128 rows since the GEMM's tiles are chosen by shape
};
constexpr int kW4AutoGemmRows = 128;

struct LoadOptions {
  Backend backend = Backend::Auto;  // Auto: CUDA when compiled in and a GPU (sm_75+) is present
  int device = 0;                   // CUDA device ordinal
  size_t max_context = 8192;        // default context of new sessions (tokens)
  PleLocation ple = PleLocation::Host;
  LmHead lm_head = LmHead::F16;  // Int8 / Int4 read 1/2 / ~0.28 of the fp16 bytes per decode step
  DecodePath decode_path = DecodePath::Kernels;
  W4Matmul w4_matmul = W4Matmul::Auto;  // w4a16 passes of more than 32 rows (bench's --w4-matmul)
  // DecodePath::Persistent's knobs, for A/B runs and profiling (bench/quick_bench.cpp's --persistent-*).
  struct PersistentTuning {
    int blocks_per_sm = 1;    // 1, or 2: registers capped at 128 per thread (steps of <= 8 rows only)
    int prefetch_bytes = -1;  // weights a block pulls into L2 ahead of its items; -1: a share of half the L2
    // A file: after each step the per-instruction timing (kernels/decode_step.cuh's trace) is accumulated, and
    // when the engine closes a table of where the step's time went is written there (empty: no trace; a
    // traced step is slower: its trace is copied to the host each step).
    std::string trace;
  } persistent;
  bool cuda_graphs = true;  // DecodePath::Kernels: replay decode steps (<= 128 sessions; padded buckets) as graphs
  // sm_90+ GPUs running a build with sm_90+ code: let each kernel of a forward pass be scheduled while the
  // previous one finishes (programmatic dependent launch; kernels/common.cuh). Ignored elsewhere.
  bool programmatic_launch = true;
  // CUDA: rows of one forward pass (a prompt is prefilled in chunks of this many tokens), 64..16384. Every
  // chunk re-reads -- and for w4a16 dequantises -- all the weights, so larger chunks prefill long prompts
  // faster; the cost is workspace (~0.25 MB per row on E2B) and sliding-window KV slots (window + this many
  // per sliding layer and session).
  int max_pass_rows = 2048;
  // Called with 0..1 while loading, on the loading thread; may be empty. If it throws, the load stops
  // (Code::CallbackError with the exception's what(), nothing kept).
  std::function<void(float)> on_progress;
};

// Which logits Engine::forward returns.
enum class Logits {
  None,  // only advance the cache
  Last,  // [vocab] for the last fed token
  All,   // [n, vocab] for every fed token
};

// How the next token is chosen. The defaults are Gemma 4's generation_config.json (temperature 1.0,
// top_k 64, top_p 0.95). Filters keep every token whose logit is >= a threshold (ties included):
// repetition penalty first (HF semantics: a seen token's logit is divided by the penalty when positive,
// multiplied when negative), then temperature, then the top-k, min-p and top-p thresholds (the strictest
// wins); the token is drawn from the kept tokens' probabilities with a counter-based RNG keyed by (seed,
// session position), so a given seed reproduces on a given backend.
struct SamplingOptions {
  float temperature = 1.0f;         // <= 0: greedy (argmax, first on ties)
  int top_k = 64;                   // <= 0: off
  float top_p = 0.95f;              // >= 1: off
  float min_p = 0.0f;               // <= 0: off; keep p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; applies to every token already in the session
  uint64_t seed = 0;

  static SamplingOptions greedy() {
    SamplingOptions o;
    o.temperature = 0.f;
    return o;
  }
};

class Engine;
class Session;
namespace detail {
struct ForwardItem;  // the implementation's view of a BatchItem
}

// One session's share of a batched forward pass.
struct BatchItem {
  Session* session = nullptr;
  const int32_t* tokens = nullptr;
  size_t n = 0;
};

// One conversation: its KV cache and position. Owned by the caller; created by Engine::create_session and
// valid while that Engine lives. Movable, not copyable. Not thread-safe: one thread at a time.
class Session {
 public:
  Session();
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  bool valid() const;
  size_t position() const;     // tokens already in the cache
  size_t max_context() const;  // tokens it can hold
  void reset();                // forget the conversation, keep the memory

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend class Engine;
  friend class Batch;
};

class Engine {
 public:
  Engine();
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Loads a checkpoint directory (config.json + safetensors) into *out. On failure *out is untouched.
  static Status load(const std::string& dir, const LoadOptions& options, Engine* out);

  bool loaded() const;
  const ModelConfig& config() const;  // only valid when loaded()
  Backend backend() const;            // Cpu or Cuda once loaded
  // How decode steps run, in words (e.g. "persistent kernel (132 blocks, <= 16 rows; ...)", or the per-kernel
  // path and why the persistent kernel is not used): for logs and bench. Empty when not loaded.
  std::string decode_path() const;

  // A new, empty session with room for max_context tokens (0 = LoadOptions::max_context). Errors:
  // InvalidArgument, OutOfMemory naming the KV-cache buffer (what was allocated is freed); *out untouched.
  Status create_session(Session* out, size_t max_context = 0) const;

  // Feeds n tokens to the session (a prompt chunk when n > 1, a decode step when n == 1), appending them
  // to its cache. logits receives what `which` asks for: [vocab] or [n, vocab] fp32, row-major.
  // Errors (invalid token id, context overflow, OutOfMemory, IoError for a checkpoint file truncated since
  // load) leave the session as it was.
  Status forward(Session& session, const int32_t* tokens, size_t n, Logits which, std::vector<float>* logits) const;

  // Several sessions in one pass (each session at most once): their tokens are processed together, as
  // continuous batching does. logits rows are concatenated in item order: 1 row per item (Last) or n
  // (All). On error no session has advanced.
  Status forward_batch(const BatchItem* items, size_t count, Logits which, std::vector<float>* logits) const;

  // forward_batch with Logits::Last, then one token sampled per item (options[i], or greedy when options
  // is null) from its last position -- on the GPU with the CUDA backend, so only the token ids cross PCIe.
  // next: [count] token ids. logits (optional): the raw last-position logits, [count, vocab].
  Status step(const BatchItem* items, size_t count, const SamplingOptions* options, int32_t* next,
              std::vector<float>* logits = nullptr) const;

  // Prefix reuse (a long shared system prompt computed once, as a server's prefix cache does): makes `dst`
  // hold the first n tokens of `src` -- the K/V of those positions are copied (host memory on the CPU,
  // device-to-device on CUDA), dst's position becomes n and its repetition-penalty history src's first n
  // tokens; what dst held before is dropped, src is unchanged. Afterwards dst continues exactly as a session
  // that was fed those n tokens itself (bit for bit on the CPU backend; on CUDA the copied fp16 entries are
  // src's own, so up to how src's prefill was split into passes). The sessions may differ in max_context.
  // Sliding-window layers keep only the last R positions in a ring (CPU: R = sliding_window; CUDA:
  // R = sliding_window + LoadOptions::max_pass_rows; a session whose max_context is <= R keeps them all), and
  // dst needs src's positions [max(0, n - sliding_window), n) there: the copy is refused when src has moved on
  // too far, i.e. when src.position() - R > max(0, n - sliding_window). n == src.position() is always valid.
  // Errors (dst untouched): InvalidArgument -- engine not loaded, an invalid session or one of another engine,
  // src and dst the same session, n > src.position(), n > dst.max_context(), or the ring condition above;
  // BackendError (CUDA copy failed; dst then holds nothing: position 0). Not thread-safe for the two sessions.
  Status copy_prefix(const Session& src, Session& dst, size_t n) const;

  // Pays now, in scratch sessions, what the first requests of a server would otherwise pay (CUDA: kernels
  // loaded on first use, cuBLAS's first call per shape, the capture of every decode graph): one greedy step per
  // prompt length of the backend's plan (row counts from past the GEMVs up to LoadOptions::max_pass_rows) and a
  // decode step of every graph's row count up to max_sessions sessions (0: as many as a pass holds). Sessions
  // made before or after are unaffected: their results are those of an engine that did not warm up. The CPU
  // backend has nothing to warm (returns ok at once). Errors: InvalidArgument when not loaded; step()'s
  // (OutOfMemory naming the graph or buffer) -- the engine stays usable.
  Status warm_up(size_t max_sessions = 0) const;

  // Bytes of weights a decode step reads (every decoder linear + the LM head as LoadOptions::lm_head stores
  // it): the bandwidth roofline.
  double decode_bytes_per_token() const;

  // Memory accounting for capacity planning and bench:: (arithmetic over sizes known since load; 0 when not
  // loaded). weight_bytes: what the backend holds for the weights -- CUDA: the device memory allocated for
  // them (fp16 / packed int4 copies, norms, the PLE table with PleLocation::Device); CPU: the checkpoint
  // tensors it reads in place from the mapped files (nothing is copied).
  size_t weight_bytes() const;
  // KV-cache bytes one position costs while a session is within the sliding window: K + V of every layer
  // that is not KV-shared (fp16 on CUDA, fp32 on CPU). Past the window sliding layers stop growing.
  size_t kv_bytes_per_token() const;
  // KV-cache bytes create_session(out, max_context) allocates (device memory on CUDA, host on CPU);
  // max_context 0 = LoadOptions::max_context.
  size_t session_bytes(size_t max_context = 0) const;
  const LoadOptions& load_options() const;  // as passed to load(); only valid when loaded()

  struct Impl;

 private:
  Status bind_sessions(const BatchItem* items, size_t count, std::vector<detail::ForwardItem>* lowered) const;
  void record_history(const BatchItem* items, size_t count) const;
  std::unique_ptr<Impl> impl_;
  friend class Batch;
};

// Index of the largest value (the first one on ties); -1 when n == 0.
inline int argmax(const float* values, size_t n) {
  if (n == 0) return -1;
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<int>(best);
}

// ---- tokenizer -------------------------------------------------------------------------------------------

// Gemma's tokenizer: a Hugging Face tokenizer.json (BPE with byte fallback, run as the `tokenizers` library
// runs it; verified id for id against a reference implementation, see tests/data/tokenizer/README.md), or a
// SentencePiece tokenizer.model when the implementation is compiled with GEMMA4_T4_SENTENCEPIECE.
// Immutable after load: const methods may be called from several threads at once. Movable, not copyable.
class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // path: a tokenizer.json, a SentencePiece .model, or a directory holding either (tokenizer.json first).
  // Parts of tokenizer.json this library does not implement (regex patterns, other normalizer / pre-tokenizer
  // / decoder / model kinds) give Unsupported naming the part, never a silently different tokenization; a
  // file with "model", "model.vocab" or "model.merges" twice is a FormatError.
  // Errors: NotFound, IoError, FormatError, Unsupported. On failure *out is untouched.
  static Status load(const std::string& path, Tokenizer* out);

  bool loaded() const;
  size_t vocab_size() const;  // largest id + 1, added tokens included (262144 text tokens for Gemma 3 / 4)

  // UTF-8 text -> ids (*ids replaced). No BOS is added: the chat template writes "<bos>". Added tokens
  // ("<bos>", "<|turn>", "\n", ...) written in the text become their ids. Invalid UTF-8: InvalidArgument
  // naming the byte offset, *ids untouched.
  Status encode(std::string_view text, std::vector<int32_t>* ids) const;
  // ids -> UTF-8 text (*text replaced), special tokens included as their text. Byte tokens that do not form
  // valid UTF-8 become U+FFFD (one per maximal ill-formed subsequence). An id outside the vocabulary:
  // InvalidArgument naming it, *text untouched.
  Status decode(const int32_t* ids, size_t n, std::string* text) const;

  int32_t token_id(std::string_view piece) const;  // id of a token's text ("<|turn>", "▁world"); -1 if none
  // The token's text; "" for an unknown id. The first call makes a std::string of every token (Gemma's: ~8 MB,
  // ~0.04 s); the tokenizer itself keeps its texts in one block.
  const std::string& piece(int32_t id) const;
  // An added token marked special (<bos>, <eos>, <|turn>, ...); with a .model: control and unknown pieces.
  bool is_special(int32_t id) const;

  struct Impl;

  // Incremental decoding for generation: put() one id at a time, each call appending the text that became
  // final to *out_text; the concatenation of all appended text plus flush() equals decode() of all ids.
  // Appended text is always whole UTF-8 characters: the bytes of a character split over several byte
  // tokens are held back until it is complete; an ill-formed sequence becomes U+FFFD as soon as it is
  // known to be ill-formed, and an incomplete one at the next non-byte token or at flush(). Holds a pointer
  // to the tokenizer, which must outlive it. One thread at a time.
  class Streamer {
   public:
    explicit Streamer(const Tokenizer& tokenizer);
    Status put(int32_t id, std::string* out_text);  // unknown id: InvalidArgument, state unchanged
    void flush(std::string* out_text);              // end of stream: held-back bytes become U+FFFD
    void reset();                                   // start a new stream (held-back bytes dropped)

   private:
    void drain(bool final, std::string* out);
    void emit(std::string_view s, std::string* out);
    const Impl* impl_;
    std::string pending_;  // bytes of an incomplete character (at most 3)
    size_t count_ = 0;     // tokens put so far
    int stripped_ = 0;     // leading characters removed by a Strip decoder
    bool strip_done_ = false;
  };

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- chat format and generation defaults -------------------------------------------------------------------

// One chat message. role: "system" or "developer" (as the FIRST message: the system turn; later: a turn of
// that name, as the template writes it), "user", "assistant" or "model" (both written as the model's turn).
// Any other role is refused; "tool" too (tool calls / tool responses are not supported).
struct Message {
  std::string role;
  std::string content;  // UTF-8; trimmed of Unicode whitespace; on model turns thinking blocks are dropped
  // Optional thinking, re-sent as `<|channel>thought\n...<channel|>` only when the message comes after the
  // last user message (an agent turn still in progress); "" = none.
  std::string reasoning = {};
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with `<|turn>model\n` so the model answers next
  bool thinking = false;              // `<|think|>` at the top of the system turn (one is made if none)
  bool add_bos = true;                // start with the text "<bos>" (id 2): the tokenizer does not add it
};

// The prompt text Gemma 4's official chat template renders for these messages (byte for byte, tested
// against jinja2 renderings of the E2B template; see include/gemma4_t4/chat.hpp for its rules). Special
// tokens appear as their text ("<bos>", "<|turn>", ...) for the tokenizer to map. Thread-safe, pure.
// Errors: InvalidArgument for an unknown role, Unsupported for "tool"; *out is untouched on error.
Status format_chat(const std::vector<Message>& messages, const ChatOptions& options, std::string* out);
// The same; returns "" when the Status overload would fail.
std::string format_chat(const std::vector<Message>& messages, const ChatOptions& options = ChatOptions());

// Reads `dir`/generation_config.json (Hugging Face) into *defaults and *eos (either may be null): fields
// temperature, top_k, top_p, min_p, repetition_penalty and eos_token_id (an id or a list) where present and
// not null; `do_sample: false` sets temperature 0 (greedy). Absent fields keep the values already there; an
// absent file is not an error (Status ok, nothing changed). A malformed file or field -> FormatError naming
// the file and field, nothing changed.
Status load_generation_config(const std::string& dir, SamplingOptions* defaults, std::vector<int>* eos);

// ---- generation ------------------------------------------------------------------------------------------

// What one generate() call measured. Wall-clock milliseconds on the calling thread.
struct Timing {
  size_t prompt_tokens = 0;     // tokens fed before the first sampled token
  size_t generated_tokens = 0;  // tokens sampled (a stop token included)
  double ttft_ms = 0;           // call start -> first token sampled (prefill + first sample)
  double decode_ms = 0;         // first token -> last token sampled
  double prefill_tok_s() const { return ttft_ms > 0 ? prompt_tokens * 1e3 / ttft_ms : 0; }
  double decode_tok_s() const {
    return decode_ms > 0 && generated_tokens > 1 ? (generated_tokens - 1) * 1e3 / decode_ms : 0;
  }
};

struct GenerateOptions {
  SamplingOptions sampling;
  int max_new_tokens = 256;
  bool stop_at_eos = true;           // stop on the model's eos_token_id list (config.json: [1, 106] on Gemma 4)
  std::vector<int32_t> stop_tokens;  // more ids that end generation
  // Cancellation, the one field another thread may act through during a call: once *cancel is true,
  // generate() returns Code::Cancelled before its next step (a prompt is fed in one step and is not cut
  // short), and a Batch finishes the session with FinishReason::Cancelled at its next step(). Set it from
  // any thread (store(true)); the atomic must outlive the generate() call / the session's time in the Batch.
  // Null: not cancellable this way.
  const std::atomic<bool>* cancel = nullptr;
};

// Feeds `prompt` to the session (which keeps its cache: a later call continues the conversation), then
// samples up to max_new_tokens tokens one at a time. on_token (may be empty) sees every sampled token
// that is not a stop token; returning false stops. A stop token ends generation and is not fed to the
// session (the caller's next prompt starts with it, as the chat template writes "<turn|>"), nor appended to
// *out. Every other sampled token is fed before the next one is drawn, so after the call the session holds
// prompt + out. A call that ends early returns at once: errors (invalid ids, ContextOverflow when the
// session would pass its context, OutOfMemory, BackendError), Cancelled (options.cancel), CallbackError
// (on_token threw: the exception is caught, its what() is in the message, it does not propagate). Then *out
// keeps every token sampled so far and the session holds what was fed: nothing if the prompt's step did not
// complete, else the prompt and *out without its last token (position() says how much). out and timing may
// be null.
Status generate(const Engine& engine, Session& session, const std::vector<int32_t>& prompt,
                const GenerateOptions& options, const std::function<bool(int32_t token)>& on_token,
                std::vector<int32_t>* out, Timing* timing = nullptr);

// ---- continuous batching ----------------------------------------------------------------------------------

// How a session in a Batch ended.
enum class FinishReason {
  Stop,       // sampled a stop token (neither returned nor fed, as generate() does)
  Length,     // max_new_tokens sampled
  Callback,   // on_token returned false
  Cancelled,  // Batch::cancel, or GenerateOptions::cancel was set
  Error,      // BatchResult::status says what (InvalidArgument, ContextOverflow, OutOfMemory, CallbackError, ...)
};

inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Callback: return "callback";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "unknown";
}

struct BatchOptions {
  int max_sessions = 16;   // sessions generating at once; later add()s wait their turn in order (< 1: 1)
  int prefill_rows = 256;  // prompt tokens fed per step, all joining sessions together (< 1: 1)
  // Joining sessions whose prompts one step feeds, in join order (0: as many as prefill_rows holds, the last
  // one's prompt cut to fill it). A session's first token comes at the end of the step that feeds the end of
  // its prompt, so prompts packed into one step all wait for the whole step: 1 reads prompts one at a time,
  // each first token after its own rows only, as prompts prefilled one by one (bench::run) get theirs. When
  // set, a step's prompt rows come before its decode rows (a pass of prompt rows stays whole).
  int prefill_sessions = 0;
  // While a joining session has prompt rows left, steps read prompts only and the generating sessions wait for
  // their next token (prefill first, as vLLM schedules without chunked prefill): each first token comes as
  // early as when prompts are prefilled one after another before any decoding (bench::run's order), at the cost
  // of the running sessions' time between tokens. false: decode rows ride in every step.
  bool prefill_priority = false;
};

// What one Batch::step() fed (Batch::last_step): for a server's metrics and for tests of the scheduling.
struct BatchStep {
  size_t prompt_sessions = 0;  // sessions fed prompt rows
  size_t prompt_rows = 0;      // prompt tokens fed
  size_t decode_rows = 0;      // sampled tokens fed back (one per generating session)
};

// What one session of a Batch produced: generate()'s *out, *timing and Status, and why it ended.
struct BatchResult {
  uint64_t id = 0;              // as add() returned it
  Session* session = nullptr;   // as passed to add(); the batch no longer uses it
  std::vector<int32_t> tokens;  // every sampled token that is not a stop token
  Timing timing;                // as generate() measures it, the clock starting at add()
  FinishReason finish = FinishReason::Error;
  Status status;  // ok for Stop / Length / Callback; Code::Cancelled for Cancelled; the error for Error
};

// Runs generate() for many sessions at once: each step() is one Engine::step over every running session --
// a decode token from each session that is generating and prompt chunks of the sessions that joined
// (at most BatchOptions::prefill_rows prompt tokens per step, so decoding sessions keep getting one token a
// step while a long prompt is read). Sessions join with add() and leave when they finish, between steps.
// Per session the tokens, the session's final contents and the Status are what generate() would give with
// the same prompt and options (greedy and seeded sampling alike: exactly on the CPU backend; on CUDA up to
// fp16 rounding of the batched kernels), with two differences: a prompt that is invalid (empty, ids outside
// the vocabulary, longer than the session's room) or a session that reaches its context limit ends only
// that session, with FinishReason::Error; and when max_new_tokens or the callback ends a session, its last
// token is fed in the next step (generate() feeds it before returning), so its result comes a step later.
// Not thread-safe: one thread drives a Batch (add, cancel, step, take_finished); on_token runs on that
// thread inside step() and may call add() and cancel(), not step(). An on_token that throws finishes its own
// session (FinishReason::Error, Code::CallbackError with the exception's what(); its tokens include the one
// it was shown, the session holds what was fed, as after cancel()); the exception does not leave step() and
// the other sessions go on. From other threads, GenerateOptions::cancel. Several Batches may share an Engine.
// The engine must outlive the batch, at the same address. Movable, not copyable. Destroying a Batch drops
// its unfinished sessions (they keep what was fed).
class Batch {
 public:
  explicit Batch(const Engine& engine, const BatchOptions& options = BatchOptions());
  ~Batch();
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Queues a session to generate from `prompt` (appended to what the session holds) with its own options
  // and callback (may be empty; as generate()'s on_token: sees each non-stop token, false stops). The
  // session is the batch's until it finishes (its result appears in take_finished()): don't use, move or
  // destroy it before. *id (may be null) identifies it. InvalidArgument, with nothing queued, when the
  // engine is not loaded, the session is invalid, of another engine or already in this batch, or
  // max_new_tokens < 0. A prompt generate() would refuse is not an add() error: the session finishes at
  // once with FinishReason::Error.
  Status add(Session* session, std::vector<int32_t> prompt, const GenerateOptions& options,
             std::function<bool(int32_t token)> on_token, uint64_t* id = nullptr);

  // Ends a waiting or running session now: FinishReason::Cancelled; its tokens are those sampled so far,
  // and the session holds what was fed (position() says how much; the last sampled token is not fed).
  // false when no unfinished session has that id.
  bool cancel(uint64_t id);

  // One forward pass over the running sessions (waiting ones join first, up to max_sessions), then one
  // token sampled for each session that is generating. Does nothing when idle(). A failed pass (a backend
  // error) finishes the sessions in it with FinishReason::Error and returns that Status; the others stay.
  Status step();

  bool idle() const;            // no session waiting or running: step() has nothing to do
  size_t size() const;          // unfinished sessions in the batch, waiting or running
  BatchStep last_step() const;  // what the last step() fed (all zero before the first, or when it fed nothing)

  // The results of the sessions that finished since the last call, in the order they finished.
  std::vector<BatchResult> take_finished();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- testing hooks ------------------------------------------------------------------------------------------

// For fault-injection tests, not for applications: process-wide state, the only global the library has.
namespace detail {
// The CUDA backend asks `hook` before every device or pinned host allocation it makes -- weights, workspace,
// staging, KV caches, buffers grown during a step -- and before creating its cuBLAS handle and instantiating a
// CUDA graph. true: that allocation fails as a failed cudaMalloc does (Code::OutOfMemory naming `what`). bytes:
// the size asked (0 where the CUDA runtime sizes it: graphs, cuBLAS). An empty function removes the hook;
// without one the check is one atomic load. The hook runs on the allocating thread, outside the library's
// locks, possibly on several threads at once. No effect on the CPU backend.
void set_alloc_fault_hook(std::function<bool(size_t bytes, const char* what)> hook);
// cudaMalloc / cudaMallocHost blocks the CUDA backend holds now, over every engine and session of the
// process (0 in a CPU-only build): leak tests compare it before and after.
size_t live_cuda_allocations();
}  // namespace detail

}  // namespace gemma4_t4

#ifndef GEMMA4_T4_NO_BENCH
#include "gemma4_t4/bench/api.hpp"  // gemma4_t4::bench: the built-in benchmark
#endif

#endif  // GEMMA4_T4_HPP

// ---- implementation ---------------------------------------------------------------------------------------
#ifdef GEMMA4_T4_IMPLEMENTATION
#ifndef GEMMA4_T4_IMPLEMENTATION_DONE
#define GEMMA4_T4_IMPLEMENTATION_DONE
#if !defined(__CUDACC__) && !defined(GEMMA4_T4_NO_CUDA) && !defined(GEMMA4_T4_EMU)  // GEMMA4_T4_EMU: dev/emu.hpp
#define GEMMA4_T4_NO_CUDA
#endif
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"
#include "gemma4_t4/config.hpp"
#include "gemma4_t4/tokenizer.hpp"
#include "gemma4_t4/chat.hpp"
#include "gemma4_t4/weights.hpp"
#include "../kernels/rng.cuh"
#include "gemma4_t4/sampler.hpp"
#include "gemma4_t4/threads.hpp"
#include "gemma4_t4/backend.hpp"
#include "gemma4_t4/block.hpp"
#include "gemma4_t4/cpu_backend.hpp"
#ifndef GEMMA4_T4_NO_CUDA
#include "gemma4_t4/cuda/backend.hpp"
#endif
#include "gemma4_t4/engine.hpp"
#include "gemma4_t4/generate.hpp"
#include "gemma4_t4/batch.hpp"
#ifndef GEMMA4_T4_NO_BENCH
#include "gemma4_t4/bench/doctor.hpp"
#include "gemma4_t4/bench/measure.hpp"
#include "gemma4_t4/bench/report.hpp"
#endif
#endif  // GEMMA4_T4_IMPLEMENTATION_DONE
#endif  // GEMMA4_T4_IMPLEMENTATION
