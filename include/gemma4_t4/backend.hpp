// gemma4_t4 implementation part: the interface every backend implements.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gemma4_t4 {
namespace detail {

// ---- allocation fault hook (testing) ----
// The state behind set_alloc_fault_hook / live_cuda_allocations (gemma4_t4.hpp; defined in engine.hpp with the
// other non-inline functions). The CUDA backend's allocations go through alloc_fault() first; `armed` keeps
// that to one atomic load while no hook is set.

struct AllocFaultHook {
  std::atomic<bool> armed{false};
  std::mutex mu;
  std::function<bool(size_t, const char*)> fn;
  std::atomic<size_t> live{0};  // cudaMalloc / cudaMallocHost blocks held (cuda/device.hpp counts them)
};

inline AllocFaultHook& alloc_fault_hook() {
  static AllocFaultHook h;
  return h;
}

// true: fail this allocation (the hook said so). The hook is copied out and called without the lock, so it
// may itself call into the library.
inline bool alloc_fault(size_t bytes, const char* what) {
  AllocFaultHook& h = alloc_fault_hook();
  if (!h.armed.load(std::memory_order_acquire)) return false;
  std::function<bool(size_t, const char*)> fn;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    fn = h.fn;
  }
  return fn && fn(bytes, what);
}

// A session's state inside one backend (its KV cache lives in the derived class).
struct BackendSession {
  virtual ~BackendSession() = default;
  size_t pos = 0;      // tokens in the cache
  size_t max_ctx = 0;  // tokens it can hold
};

// ---- prefix copies (BackendModel::copy_prefix) ----

// The first position of a prefix of n tokens that later tokens can still attend to in this layer's cache:
// 0 on full layers, n - window on sliding ones (their queries see keys in (pos - window, pos]).
inline size_t kv_prefix_start(const ModelConfig& cfg, const LayerConfig& lc, size_t n) {
  const size_t w = size_t(cfg.sliding_window);
  return lc.type == LayerType::Sliding && n > w ? n - w : 0;
}

// A cache of `capacity` slots keeps position j at slot j % capacity; after `pos` tokens it holds positions
// [pos - capacity, pos). Whether positions [lo, n) are all still there:
inline bool kv_holds(size_t capacity, size_t pos, size_t lo) { return pos <= capacity || pos - capacity <= lo; }

// Positions [lo, n) of a cache of src_cap slots copied to one of dst_cap slots, as contiguous runs:
// fn(src_slot, dst_slot, count) for each (at most 4 runs: each ring wraps at most once per pass over it,
// as n - lo <= both capacities).
template <typename F>
void for_each_slot_run(size_t lo, size_t n, size_t src_cap, size_t dst_cap, F&& fn) {
  for (size_t j = lo; j < n;) {
    const size_t s = j % src_cap, d = j % dst_cap;
    const size_t len = std::min(n - j, std::min(src_cap - s, dst_cap - d));
    fn(s, d, len);
    j += len;
  }
}

struct ForwardItem {
  BackendSession* session;
  const int32_t* tokens;
  size_t n;
};

struct SampleItem {
  SamplingOptions options;
  std::vector<int32_t> seen;  // sorted unique ids in the session (only filled when a penalty applies)
  uint64_t counter = 0;       // RNG counter: the position of the token being sampled
};

// K + V bytes one position costs over every layer that keeps its own cache (KV-shared layers read another's),
// at `element` bytes a value: each backend's BackendModel::kv_bytes_per_token.
inline size_t kv_bytes_per_position(const ModelConfig& cfg, size_t element) {
  size_t b = 0;
  for (const LayerConfig& lc : cfg.layers)
    if (!lc.kv_shared) b += 2 * size_t(lc.num_kv_heads) * size_t(lc.head_dim) * element;
  return b;
}

class BackendModel {
 public:
  virtual ~BackendModel() = default;
  virtual Backend kind() const = 0;
  virtual Status new_session(size_t max_ctx, std::unique_ptr<BackendSession>* out) const = 0;
  // Memory accounting (Engine::weight_bytes / kv_bytes_per_token / session_bytes): arithmetic over sizes known
  // since init, no allocation. weight_bytes: what the backend holds for the weights; kv_bytes_per_token: K + V
  // of every non-shared layer for one position; session_bytes: what new_session(max_ctx) allocates.
  virtual size_t weight_bytes() const = 0;
  virtual size_t kv_bytes_per_token() const = 0;
  virtual size_t session_bytes(size_t max_ctx) const = 0;
  // How decode steps run, in words (Engine::decode_path).
  virtual std::string decode_path() const { return "CPU reference (fp32)"; }
  // Engine::warm_up's plan: the prompt lengths (one session) and the decode row counts (that many sessions, one
  // token each) whose first pass pays one-time costs -- kernels loaded on first use, cuBLAS's first call per
  // shape, a decode graph's capture. None by default (the CPU backend has no such costs).
  struct WarmUp {
    std::vector<int> prompts, decode_rows;
  };
  virtual WarmUp warm_up_plan() const { return {}; }
  // Before each pass (Engine::forward_batch / step): IoError when a checkpoint file the pass would read in
  // place has shrunk since it was mapped (reading it would fault the process). The default, for backends
  // that read weights from the map at run time, checks every file.
  virtual Status check_files(const TensorStore& store) const { return store.check_sizes(); }
  // Items were validated by the Engine (ids in range, context not exceeded, sessions distinct). Appends
  // per item 1 (Last) or n (All) rows of logits. On error no session has advanced.
  virtual Status forward(const ForwardItem* items, size_t count, Logits which, std::vector<float>* logits) const = 0;
  // Engine::copy_prefix, validated there (both sessions this backend's and distinct, n <= src.pos,
  // n <= dst.max_ctx): dst gets src's K/V of positions [kv_prefix_start(layer, n), n) of every layer that is not
  // KV-shared, then dst.pos = n. InvalidArgument (dst untouched) when a ring of src no longer holds them.
  virtual Status copy_prefix(const BackendSession& src, BackendSession& dst, size_t n) const = 0;
  // forward + one sampled token per item. The default runs the CPU sampler over host logits.
  virtual Status step(const ForwardItem* items, size_t count, const SampleItem* samples, int32_t* next,
                      std::vector<float>* logits) const {
    std::vector<float> local;
    std::vector<float>& lg = logits ? *logits : local;
    GEMMA4_T4_TRY(forward(items, count, Logits::Last, &lg));
    const size_t V = lg.size() / count;
    std::vector<float> row(V);
    for (size_t i = 0; i < count; ++i) {
      std::copy_n(&lg[i * V], V, row.data());
      next[i] = sample_ref(row.data(), int(V), samples[i].options, samples[i].seen.data(), samples[i].seen.size(),
                           samples[i].counter);
    }
    return Status::ok();
  }
};

}  // namespace detail
}  // namespace gemma4_t4
