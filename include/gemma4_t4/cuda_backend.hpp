// gemma4_t4 implementation part: the CUDA backend (compiled only by nvcc, without GEMMA4_T4_NO_CUDA).
//
// Load: every tensor is streamed from the mapped checkpoint through one bounded pinned staging buffer
// (kStagingBytes) to the GPU -- bf16/f32 -> fp16 with a range check, w4a16 words copied as they are
// (kernels/gemv.cuh documents why that is the kernel's layout) with bf16 scales -> fp16 -- and the pages
// just read are released (madvise), so host RSS stays near the staging size whatever the model size. The
// PLE table stays in the mapped file (rows gathered per step) unless LoadOptions::ple asks for the GPU; a
// prefill pass's rows are gathered by the host's threads and uploaded on a second stream, the next pass's
// while the GPU runs this one (stage_ple).
//
// Forward: the rows of all items (prefill chunks and decode tokens alike) go through each layer together,
// in passes of at most LoadOptions::max_pass_rows rows and kMaxSeqs sessions. "decode" below = a pass of <= 16 rows
// (kernels::kGemvMaxRows): tensor-core GEMVs with fused epilogues; larger passes use cuBLAS (fp16 GEMM,
// fp32 accumulation; w4a16 dequantised to fp16 first) and the separate element-wise kernels. Per layer:
//   x16 = rmsnorm(h)                                  [rows, H] fp16 -- a launch of its own only in layer 0;
//                                                     later layers get it from the previous layer's last
//                                                     residual_norm (NextNorm::Norm, bit-identical)
//   q/k/v = x16 W^T                                   decode: ONE multi-matrix GEMV (fp32 mmA/mmB/mmC)
//   q -> norm + RoPE -> q16; k, v -> norm (+ RoPE) -> the session caches at their positions: ONE launch
//   att16 = attention(q16, caches)                    decode: split over keys (flash-decoding), merged by
//                                                     the last split block (a second launch only when
//                                                     the splits are many: long max_context);
//                                                     passes with a prompt chunk: tiled flash attention
//                                                     on the tensor cores (mma.sync m16n8k8), D 64..512
//   h += norm(o_proj(att16)), x16 = pre_ff_norm(h)    one residual_norm
//   act16 = gelu_tanh(x16 Wg^T) * (x16 Wu^T)          decode: ONE GEMV with the GELU epilogue, fp16 out
//   h += norm(down(act16)) [, x16 = half(h)]          PLE only: the copy feeds the gate
//   PLE: act16 = gelu_tanh(x16 Wpg^T) * ple[l]        decode: ONE GEMV with the PLE epilogue
//        h = (h + norm(ple_proj(act16))) * scalar, x16 = next layer's input norm(h)
// Decode launches per layer (E2B, w4a16 or fp16): 11 (12 in layer 0; +1 on full layers whose splits
// need the separate merge) -- q/k/v GEMV, head norms, attention, o_proj, residual_norm, gate/up GEMV,
// down, residual_norm, PLE gate GEMV, ple_proj, residual_norm (was 20; KV-shared layers 16: their first
// two launches serve q only).
// Residual stream fp32 throughout.
// K/V are written before attention reads them, so sliding layers keep a ring of window + max_pass_rows slots:
// a pass never overwrites a key one of its own queries still needs. Positions advance only when every
// pass succeeded.
#pragma once

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "../../kernels/attention.cuh"
#include "../../kernels/elementwise.cuh"
#include "../../kernels/flash_attention.cuh"
#include "../../kernels/gemv.cuh"
#include "../../kernels/rmsnorm.cuh"
#include "../../kernels/rope_kv.cuh"
#include "../../kernels/sample.cuh"
#include "sanitizer.hpp"

namespace gemma4_t4 {
namespace detail {

inline Status cuda_status(cudaError_t e, const std::string& what) {
  return err(Code::BackendError, what, ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

#define GEMMA4_T4_CUDA_TRY(expr, what)                   \
  do {                                                   \
    const cudaError_t e_ = (expr);                       \
    if (e_ != cudaSuccess) return cuda_status(e_, what); \
  } while (0)

inline bool cuda_usable(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return false;
  return p.major * 10 + p.minor >= 75;
}

inline double mib(size_t b) { return double(b) / (1024.0 * 1024.0); }

// ---- allocation ----
// Every cudaMalloc / cudaMallocHost of the backend goes through cuda_alloc (and back through cuda_free), so
// the fault hook (set_alloc_fault_hook) sees them all and live_cuda_allocations() counts them. A failure is
// OutOfMemory naming `what`, with the size asked and what the GPU has free.

enum class Mem { Device, Pinned };  // cudaMalloc / cudaMallocHost

inline Status cuda_alloc(Mem kind, size_t bytes, const std::string& what, void** out) {
  const char* fn = kind == Mem::Device ? "cudaMalloc" : "cudaMallocHost";
  *out = nullptr;
  cudaError_t e = cudaErrorMemoryAllocation;
  if (!alloc_fault(bytes, what.c_str())) e = kind == Mem::Device ? cudaMalloc(out, bytes) : cudaMallocHost(out, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *out = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return err(Code::OutOfMemory, what, ": ", fn, " of ", mib(bytes), " MiB failed: ", cudaGetErrorName(e), " (",
               mib(free_b), " MiB free of ", mib(total_b), " MiB on the GPU)");
  }
  alloc_fault_hook().live.fetch_add(1, std::memory_order_acq_rel);
  return Status::ok();
}

inline void cuda_free(Mem kind, void* p) {
  if (!p) return;
  if (kind == Mem::Device)
    cudaFree(p);
  else
    cudaFreeHost(p);
  alloc_fault_hook().live.fetch_sub(1, std::memory_order_acq_rel);
}

template <typename T>
Status cuda_alloc(Mem kind, size_t bytes, const std::string& what, T** out) {
  void* p = nullptr;
  GEMMA4_T4_TRY(cuda_alloc(kind, bytes, what, &p));
  *out = static_cast<T*>(p);
  return Status::ok();
}

// Owns device allocations; an allocation failure is an OutOfMemory Status with the sizes asked and free.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    for (void* p : ptrs_) cuda_free(Mem::Device, p);
  }
  template <typename T>
  Status alloc(size_t count, const std::string& what, T** out) {
    const size_t bytes = std::max<size_t>(count * sizeof(T), 256);
    void* p = nullptr;
    ptrs_.reserve(ptrs_.size() + 1);  // before the allocation: a bad_alloc here cannot leak it
    GEMMA4_T4_TRY(cuda_alloc(Mem::Device, bytes, what, &p));
    ptrs_.push_back(p);
    total_ += bytes;
    *out = static_cast<T*>(p);
    return Status::ok();
  }
  size_t total() const { return total_; }

 private:
  std::vector<void*> ptrs_;
  size_t total_ = 0;
};

struct DevLinear {
  int out = 0, in = 0;
  half* w16 = nullptr;     // [out, in] fp16, or
  uint32_t* wq = nullptr;  // [out, in/8] packed int4
  half* s16 = nullptr;     // [out, in/32] fp16 scales
};

struct DevLayer {
  DevLinear q, k, v, o, gate, up, down, ple_gate, ple_proj;
  float *in_norm = nullptr, *post_attn = nullptr, *pre_ff = nullptr, *post_ff = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr, *post_ple = nullptr;
  float* inv_freq = nullptr;  // [d/2]
  float scalar = 1.f;
};

struct CudaSession : BackendSession {
  DeviceMemory mem;
  std::vector<half*> k, v;  // per layer ([capacity, kv_heads, d] fp16), null on KV-shared layers
  std::vector<int> capacity;
};

class CudaBackend : public BackendModel {
 public:
  static constexpr int kMaxSeqs = 64;        // sessions per pass
  static constexpr int kSplitBudget = 1024;  // rows x key-splits of attention scratch
  static constexpr size_t kStagingBytes = size_t(16) << 20;

  ~CudaBackend() override {
    for (auto& per_dst : graphs_)
      for (auto& g : per_dst)
        if (g.exec) cudaGraphExecDestroy(g.exec);
    if (blas_) cublasDestroy(blas_);
    for (cudaEvent_t e : ple_copied_)
      if (e) cudaEventDestroy(e);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    if (stream_) cudaStreamDestroy(stream_);
    cuda_free(Mem::Pinned, staging_);
    cuda_free(Mem::Pinned, meta_host_);
    cuda_free(Mem::Device, seen_dev_);
    cuda_free(Mem::Pinned, ple_host_);
    cuda_free(Mem::Pinned, tiles_host_);
  }

  Backend kind() const override { return Backend::Cuda; }

  Status init(const ModelConfig& cfg, const Weights& w, const LoadOptions& opt, const std::string& where) {
    cfg_ = &cfg;
    w_ = &w;
    opt_ = opt;
    device_ = opt.device;
    use_graphs_ = opt.cuda_graphs;
    use_pdl_ = opt.programmatic_launch;
    max_rows_ = opt.max_pass_rows;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return err(Code::BackendError, where, ": no CUDA device is available (use Backend::Cpu or Auto)");
    }
    if (device_ < 0 || device_ >= n)
      return err(Code::InvalidArgument, where, ": CUDA device ", device_, " does not exist (", n, " present)");
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    cudaDeviceProp prop;
    GEMMA4_T4_CUDA_TRY(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    if (prop.major * 10 + prop.minor < 75)
      return err(Code::Unsupported, where, ": GPU '", prop.name, "' has compute capability ", prop.major, ".",
                 prop.minor, "; gemma4_t4 needs 7.5 (Turing) or newer");
    GEMMA4_T4_TRY(check_shapes(where));
    for (const LayerConfig& lc : cfg.layers) {  // prefill layers the tensor-core attention kernel takes
      const int group = cfg.num_heads / lc.num_kv_heads;
      if (kernels::flash_attention_supported(lc.head_dim, group))
        flash_groups_ |= 1 << (group <= 1 ? 0 : group <= 2 ? 1 : group <= 4 ? 2 : 3);
    }
    GEMMA4_T4_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (alloc_fault(0, "cuBLAS handle"))
      return err(Code::OutOfMemory, where, ": cuBLAS handle: cublasCreate failed (allocation fault hook)");
    if (const cublasStatus_t bs = cublasCreate(&blas_); bs != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      return err(bs == CUBLAS_STATUS_ALLOC_FAILED ? Code::OutOfMemory : Code::BackendError, where,
                 ": cuBLAS handle: cublasCreate failed (status ", int(bs), ")");
    }
    cublasSetStream(blas_, stream_);
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, kStagingBytes, "load: staging buffer", &staging_));
    GEMMA4_T4_TRY(upload_weights(where));
    return alloc_workspace();
  }

  Status new_session(size_t max_ctx, std::unique_ptr<BackendSession>* out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    auto s = std::make_unique<CudaSession>();
    s->max_ctx = max_ctx;
    const int L = cfg_->num_layers;
    s->k.assign(size_t(L), nullptr);
    s->v.assign(size_t(L), nullptr);
    s->capacity.assign(size_t(L), 1);
    for (int l = 0; l < L; ++l) {
      const LayerConfig& lc = cfg_->layers[l];
      if (lc.kv_shared) continue;
      size_t cap = max_ctx;
      if (lc.type == LayerType::Sliding) cap = std::min(cap, size_t(cfg_->sliding_window) + max_rows_);
      const size_t count = cap * size_t(lc.num_kv_heads) * lc.head_dim;
      const std::string what =
          "create_session: KV cache of layer " + std::to_string(l) + " (" + std::to_string(cap) + " slots)";
      GEMMA4_T4_TRY(s->mem.alloc(count, what, &s->k[l]));
      GEMMA4_T4_TRY(s->mem.alloc(count, what, &s->v[l]));
      s->capacity[l] = int(cap);
    }
    *out = std::move(s);
    return Status::ok();
  }

  Status forward(const ForwardItem* items, size_t count, Logits which, std::vector<float>* logits) const override {
    std::lock_guard<std::mutex> lock(mu_);
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    const kernels::PdlScope pdl(use_pdl_);  // after cudaSetDevice: decided for device_
    Plan plan;
    GEMMA4_T4_TRY(plan_passes(items, count, which, nullptr, &plan));
    GEMMA4_T4_TRY(run(plan, which, logits, nullptr));
    for (size_t i = 0; i < count; ++i) items[i].session->pos += items[i].n;
    return Status::ok();
  }

  Status step(const ForwardItem* items, size_t count, const SampleItem* samples, int32_t* next,
              std::vector<float>* logits) const override {
    std::lock_guard<std::mutex> lock(mu_);
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    const kernels::PdlScope pdl(use_pdl_);  // after cudaSetDevice: decided for device_
    const int V = cfg_->vocab_size;
    // All that may allocate -- the chunks' CUDA graphs, the repetition-penalty ids -- before the first pass
    // writes a cache: running out of memory leaves every session as it was.
    std::vector<Plan> plans;  // per chunk of kMaxSeqs sessions
    size_t max_seen = 0;
    for (size_t b0 = 0; b0 < count; b0 += kMaxSeqs) {
      const size_t k = std::min<size_t>(kMaxSeqs, count - b0);
      plans.emplace_back();
      GEMMA4_T4_TRY(plan_passes(items + b0, k, Logits::Last, samp_logits_, &plans.back()));
      size_t nseen = 0;
      for (size_t i = 0; i < k; ++i) nseen += samples[b0 + i].seen.size();
      max_seen = std::max(max_seen, nseen);
    }
    GEMMA4_T4_TRY(ensure_seen(max_seen));
    for (size_t b0 = 0; b0 < count; b0 += kMaxSeqs) {
      const int k = int(std::min<size_t>(kMaxSeqs, count - b0));
      GEMMA4_T4_TRY(run(plans[b0 / kMaxSeqs], Logits::Last, nullptr, samp_logits_));
      if (logits) {
        const size_t at = logits->size();
        logits->resize(at + size_t(k) * V);
        GEMMA4_T4_CUDA_TRY(
            cudaMemcpyAsync(logits->data() + at, samp_logits_, size_t(k) * V * 4, cudaMemcpyDeviceToHost, stream_),
            "logits download");
      }
      size_t nseen = 0;
      for (int i = 0; i < k; ++i) nseen += samples[b0 + i].seen.size();
      std::vector<kernels::SampleParams> params(static_cast<size_t>(k));
      std::vector<int32_t> seen;
      seen.reserve(nseen);
      for (int i = 0; i < k; ++i) {
        const SampleItem& si = samples[b0 + i];
        kernels::SampleParams& p = params[size_t(i)];
        p.temperature = si.options.temperature;
        p.top_k = si.options.top_k;
        p.top_p = si.options.top_p;
        p.min_p = si.options.min_p;
        p.penalty = si.options.repetition_penalty;
        p.seen_offset = int(seen.size());
        p.seen_count = int(si.seen.size());
        p.seed = si.options.seed;
        p.counter = si.counter;
        seen.insert(seen.end(), si.seen.begin(), si.seen.end());
      }
      GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(samp_params_, params.data(), params.size() * sizeof(params[0]),
                                         cudaMemcpyHostToDevice, stream_),
                         "sampling parameters");
      if (nseen)
        GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(seen_dev_, seen.data(), nseen * 4, cudaMemcpyHostToDevice, stream_),
                           "seen ids");
      GEMMA4_T4_CUDA_TRY(kernels::launch_sample(samp_logits_, k, V, samp_params_, seen_dev_, samp_out_, stream_),
                         "sampling");
      GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(next + b0, samp_out_, size_t(k) * 4, cudaMemcpyDeviceToHost, stream_),
                         "token download");
      GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "sampling");
    }
    for (size_t i = 0; i < count; ++i) items[i].session->pos += items[i].n;
    return Status::ok();
  }

  // Engine::copy_prefix. Self-contained on purpose: it needs only the session layout above (per non-shared layer
  // l, K and V of [capacity[l], kv_heads, head_dim] fp16 with position j at slot j % capacity[l]; sliding layers
  // a ring of min(max_ctx, window + max_rows_) slots, full layers max_ctx slots) and the stream the passes run
  // on. Positions [kv_prefix_start, n) of each layer are copied device-to-device on stream_ (ordered after every
  // pass already queued there), at most 4 contiguous runs per buffer, then the stream is synchronised. A ring of
  // src still holds them while src.pos - capacity <= kv_prefix_start (always when n == src.pos).
  Status copy_prefix(const BackendSession& src_base, BackendSession& dst_base, size_t n) const override {
    const auto& src = static_cast<const CudaSession&>(src_base);
    auto& dst = static_cast<CudaSession&>(dst_base);
    const int L = cfg_->num_layers;
    for (int l = 0; l < L; ++l) {
      const size_t lo = kv_prefix_start(*cfg_, cfg_->layers[l], n);
      if (src.k[l] && !kv_holds(size_t(src.capacity[l]), src.pos, lo))
        return err(Code::InvalidArgument, "copy_prefix: layer ", l, " of the source session keeps its last ",
                   src.capacity[l], " positions and is at ", src.pos, ": positions [", lo, ", ", n,
                   ") of the prefix have been overwritten");
    }
    std::lock_guard<std::mutex> lock(mu_);
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(device_), "cudaSetDevice");
    dst.pos = 0;  // until every copy is done
    for (int l = 0; l < L; ++l) {
      if (!src.k[l]) continue;
      const size_t row = size_t(cfg_->layers[l].num_kv_heads) * cfg_->layers[l].head_dim;  // halves per position
      cudaError_t e = cudaSuccess;
      for_each_slot_run(
          kv_prefix_start(*cfg_, cfg_->layers[l], n), n, size_t(src.capacity[l]), size_t(dst.capacity[l]),
          [&](size_t s, size_t d, size_t len) {
            const size_t bytes = len * row * sizeof(half);
            if (e == cudaSuccess)
              e = cudaMemcpyAsync(dst.k[l] + d * row, src.k[l] + s * row, bytes, cudaMemcpyDeviceToDevice, stream_);
            if (e == cudaSuccess)
              e = cudaMemcpyAsync(dst.v[l] + d * row, src.v[l] + s * row, bytes, cudaMemcpyDeviceToDevice, stream_);
          });
      GEMMA4_T4_CUDA_TRY(e, "copy_prefix: KV of layer " + std::to_string(l));
    }
    GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "copy_prefix");
    dst.pos = n;
    return Status::ok();
  }

  // Memory accounting (Engine::weight_bytes etc.): the device allocations made for the weights, and the KV
  // cache as new_session sizes it (keep the two in step): fp16 K and V per non-shared layer, sliding layers
  // capped at window + max_rows_ slots, each buffer at least DeviceMemory's 256 bytes.
  size_t weight_bytes() const override { return weights_mem_.total(); }
  // Only the PLE table is read from the mapped file after load, and only with PleLocation::Host.
  Status check_files(const TensorStore&) const override {
    return w_->ple_table && !ple_table16_ ? check_mapped(*w_->ple_table) : Status::ok();
  }
  size_t kv_bytes_per_token() const override {
    size_t b = 0;
    for (const LayerConfig& lc : cfg_->layers)
      if (!lc.kv_shared) b += 2 * size_t(lc.num_kv_heads) * lc.head_dim * sizeof(half);
    return b;
  }
  size_t session_bytes(size_t max_ctx) const override {
    size_t b = 0;
    for (const LayerConfig& lc : cfg_->layers) {
      if (lc.kv_shared) continue;
      size_t cap = max_ctx;
      if (lc.type == LayerType::Sliding) cap = std::min(cap, size_t(cfg_->sliding_window) + max_rows_);
      b += 2 * std::max<size_t>(cap * lc.num_kv_heads * lc.head_dim * sizeof(half), 256);
    }
    return b;
  }

 private:
  struct Segment {
    CudaSession* s;
    const int32_t* tokens;
    size_t pos;  // position of tokens[0]
    int n;
    bool last;  // holds the item's final token
  };
  using Plan = std::vector<std::vector<Segment>>;  // passes of <= max_rows_ rows and <= kMaxSeqs sessions

  // Splits the items into passes (each item's tokens in order) and builds the CUDA graphs its decode passes
  // will replay: what may allocate, done before run() writes any cache, so that running out of memory leaves
  // every session as it was (a failed pass after others could have overwritten ring slots still needed).
  Status plan_passes(const ForwardItem* items, size_t count, Logits which, float* dev_out, Plan* plan) const {
    plan->assign(1, {});
    int rows = 0;
    for (size_t i = 0; i < count; ++i) {
      size_t done = 0;
      while (done < items[i].n) {
        if (rows == max_rows_ || int(plan->back().size()) == kMaxSeqs) {
          plan->emplace_back();
          rows = 0;
        }
        const size_t take = std::min(items[i].n - done, size_t(max_rows_ - rows));
        plan->back().push_back(Segment{&static_cast<CudaSession&>(*items[i].session), items[i].tokens + done,
                                       items[i].session->pos + done, int(take), done + take == items[i].n});
        rows += int(take);
        done += take;
      }
    }
    int row = 0;  // dev_out row of each pass's first logits
    for (const auto& pass : *plan) {
      if (replays_graph(pass, which, row)) GEMMA4_T4_TRY(build_graph(int(pass.size()), dev_out ? dev_out : logits_));
      row += selected_rows(pass, which);
    }
    return Status::ok();
  }

  // Runs a plan's passes (positions are advanced by the caller). Logit rows go to `logits` (host), or stay on
  // the GPU at dev_out[i * vocab] when dev_out is set.
  // With the PLE table on the host, the rows of the next pass are gathered (into the other half of ple_host_)
  // while the GPU runs this one.
  Status run(const Plan& plan, Logits which, std::vector<float>* logits, float* dev_out) const {
    dev_row_ = 0;
    PleStage stage;
    for (size_t p = 0; p < plan.size(); ++p) {
      if (plan[p].empty()) continue;
      const std::vector<Segment>* next = nullptr;
      for (size_t q = p + 1; q < plan.size() && !next; ++q)
        if (!plan[q].empty()) next = &plan[q];
      const Status st = run_pass(plan[p], next, &stage, which, logits, dev_out);
      if (!st) {  // no upload of a pass that will not run may still be reading ple_host_ when the next call writes it
        if (copy_stream_) cudaStreamSynchronize(copy_stream_);
        return st;
      }
    }
    return Status::ok();
  }

  // A decode pass -- one token per session, every row's logits wanted, <= 16 rows -- replays a CUDA graph per
  // row count, captured for logits at the start of logits_ / dev_out: only a pass whose logits start there.
  bool replays_graph(const std::vector<Segment>& segs, Logits which, int dev_row) const {
    if (!use_graphs_ || which == Logits::None || dev_row != 0 || segs.empty() ||
        int(segs.size()) > kernels::kGemvMaxRows)
      return false;
    for (const Segment& g : segs)
      if (g.n != 1 || (which == Logits::Last && !g.last)) return false;
    return true;
  }

  static int selected_rows(const std::vector<Segment>& segs, Logits which) {
    int n = 0;
    for (const Segment& g : segs) n += which == Logits::All ? g.n : which == Logits::Last && g.last ? 1 : 0;
    return n;
  }

  Status ensure_seen(size_t n) const {
    if (n <= seen_cap_) return Status::ok();
    cuda_free(Mem::Device, seen_dev_);
    seen_dev_ = nullptr;
    seen_cap_ = 0;
    const size_t want = std::max(n, size_t(4096));
    GEMMA4_T4_TRY(
        cuda_alloc(Mem::Device, want * 4, "step: repetition-penalty ids (" + std::to_string(want) + ")", &seen_dev_));
    seen_cap_ = want;
    return Status::ok();
  }

  Status check_shapes(const std::string& where) const {
    const ModelConfig& c = *cfg_;
    if (c.hidden_size % 8 != 0)
      return err(Code::Unsupported, where, ": CUDA backend needs hidden_size % 8 == 0 (got ", c.hidden_size, ")");
    if (c.hidden_size_per_layer_input % 8 != 0)
      return err(Code::Unsupported, where, ": CUDA backend needs hidden_size_per_layer_input % 8 == 0");
    for (int l = 0; l < c.num_layers; ++l) {
      const LayerConfig& lc = c.layers[l];
      if (!kernels::attention_supported(lc.head_dim, c.num_heads / lc.num_kv_heads))
        return err(Code::Unsupported, where, ": layer ", l, ": head_dim ", lc.head_dim, " with ",
                   c.num_heads / lc.num_kv_heads,
                   " query heads per KV head is not supported by the CUDA attention kernels (head dims 32..512, <= 8)");
      if (lc.intermediate_size % 8 != 0)
        return err(Code::Unsupported, where, ": layer ", l, ": intermediate_size % 8 != 0");
    }
    return Status::ok();
  }

  // ---- load ----

  Status progress(size_t done_bytes) {
    if (opt_.on_progress && total_upload_ > 0)
      opt_.on_progress(0.02f + 0.96f * float(double(done_bytes) / total_upload_));
    return Status::ok();
  }

  static void release_pages(const TensorInfo& t) {
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t b = (uintptr_t(t.data) + page - 1) & ~(page - 1);
    const uintptr_t e = (uintptr_t(t.data) + t.nbytes) & ~(page - 1);
    if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  }

  // elements [first, first + count) of a float tensor -> fp16 on the device, through the staging buffer.
  Status upload_f16(const TensorInfo& t, size_t first, size_t count, half* dst) {
    const size_t chunk = kStagingBytes / sizeof(uint16_t);
    uint16_t* st = static_cast<uint16_t*>(staging_);
    for (size_t off = 0; off < count; off += chunk) {
      const size_t m = std::min(chunk, count - off);
      GEMMA4_T4_TRY(check_mapped(t));  // the file may have shrunk since it was mapped (reading would SIGBUS)
      for (size_t i = 0; i < m; ++i) {
        const float v = load_float(t, first + off + i);
        if (!(std::fabs(v) <= kernels::kHalfMax))
          return err(Code::Unsupported, "tensor '", t.name, "' element ", first + off + i, " = ", v,
                     " is outside the fp16 range (+-65504) the CUDA backend stores weights in");
        st[i] = f32_to_f16(v);
      }
      GEMMA4_T4_CUDA_TRY(cudaMemcpy(dst + off, st, m * 2, cudaMemcpyHostToDevice), "upload of '" + t.name + "'");
      uploaded_ += m * 2;
      progress(uploaded_);
    }
    return Status::ok();
  }

  Status upload_raw(const TensorInfo& t, void* dst) {
    for (size_t off = 0; off < t.nbytes; off += kStagingBytes) {
      const size_t m = std::min(kStagingBytes, t.nbytes - off);
      GEMMA4_T4_TRY(check_mapped(t));
      std::memcpy(staging_, t.data + off, m);
      GEMMA4_T4_CUDA_TRY(cudaMemcpy(static_cast<uint8_t*>(dst) + off, staging_, m, cudaMemcpyHostToDevice),
                         "upload of '" + t.name + "'");
      uploaded_ += m;
      progress(uploaded_);
    }
    return Status::ok();
  }

  Status vec_f32(const TensorInfo* t, float** out) {
    std::vector<float> v(static_cast<size_t>(t->numel()));
    GEMMA4_T4_TRY(check_mapped(*t));
    load_floats(*t, 0, v.size(), v.data());
    GEMMA4_T4_TRY(weights_mem_.alloc(v.size(), "weights: '" + t->name + "'", out));
    GEMMA4_T4_CUDA_TRY(cudaMemcpy(*out, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload of '" + t->name + "'");
    return Status::ok();
  }

  Status linear(const LinearW& w, DevLinear* d) {
    d->out = w.out;
    d->in = w.in;
    if (!w.out) return Status::ok();
    const std::string what = "weights: '" + w.name + "'";
    if (w.quantized()) {
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(w.out) * (w.in / 8), what, &d->wq));
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(w.out) * (w.in / 32), what, &d->s16));
      GEMMA4_T4_TRY(upload_raw(*w.packed, d->wq));
      GEMMA4_T4_TRY(upload_f16(*w.scale, 0, size_t(w.scale->numel()), d->s16));
      release_pages(*w.packed);
      max_deq_ = std::max(max_deq_, size_t(w.out) * w.in);
    } else {
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(w.out) * w.in, what, &d->w16));
      GEMMA4_T4_TRY(upload_f16(*w.dense, 0, size_t(w.out) * w.in, d->w16));
      release_pages(*w.dense);
    }
    max_in_ = std::max(max_in_, w.in);
    max_out_ = std::max(max_out_, w.out);
    return Status::ok();
  }

  // LoadOptions::lm_head: a quantized copy of the fp16 head, built on the GPU (kernels/gemv.cuh).
  Status quantize_head() {
    const int V = cfg_->vocab_size, H = cfg_->hidden_size;
    if (opt_.lm_head == LmHead::Int8) {
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(V) * H, "weights: int8 LM head", &lm8_));
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(V), "weights: int8 LM head scales", &lm8_scale_));
      GEMMA4_T4_CUDA_TRY(kernels::launch_quantize_int8(lm16_, V, H, lm8_, lm8_scale_, stream_), "LM head int8");
    } else if (opt_.lm_head == LmHead::Int4) {
      if (H % 32 != 0)
        return err(Code::Unsupported, "LmHead::Int4 needs hidden_size % 32 == 0 (hidden_size = ", H, ")");
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(V) * H / 8, "weights: int4 LM head", &lm4_));
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(V) * H / 32, "weights: int4 LM head scales", &lm4_scale_));
      GEMMA4_T4_CUDA_TRY(kernels::launch_quantize_int4(lm16_, V, H, lm4_, lm4_scale_, stream_), "LM head int4");
    }
    GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "LM head quantization");
    return Status::ok();
  }

  Status upload_weights(const std::string& where) {
    (void)where;
    const ModelConfig& c = *cfg_;
    const int H = c.hidden_size, L = c.num_layers, D = c.hidden_size_per_layer_input;
    total_upload_ = w_->decode_bytes() + double(c.vocab_size) * H * 2;
    if (D > 0 && opt_.ple == PleLocation::Device) total_upload_ += double(w_->ple_table->numel()) * 2;
    GEMMA4_T4_TRY(weights_mem_.alloc(size_t(c.vocab_size) * H, "weights: embed_tokens", &embed16_));
    GEMMA4_T4_TRY(upload_f16(*w_->embed, 0, size_t(c.vocab_size) * H, embed16_));
    lm16_ = embed16_;
    if (w_->lm_head != w_->embed) {
      GEMMA4_T4_TRY(weights_mem_.alloc(size_t(c.vocab_size) * H, "weights: lm_head", &lm16_));
      GEMMA4_T4_TRY(upload_f16(*w_->lm_head, 0, size_t(c.vocab_size) * H, lm16_));
      release_pages(*w_->lm_head);
    }
    release_pages(*w_->embed);
    GEMMA4_T4_TRY(quantize_head());
    GEMMA4_T4_TRY(vec_f32(w_->final_norm, &final_norm_));
    if (D > 0) {
      GEMMA4_T4_TRY(linear(w_->ple_model_proj, &ple_model_proj_));
      GEMMA4_T4_TRY(vec_f32(w_->ple_proj_norm, &ple_norm_));
      if (opt_.ple == PleLocation::Device) {
        const size_t count = size_t(w_->ple_table->numel());
        GEMMA4_T4_TRY(weights_mem_.alloc(count, "weights: embed_tokens_per_layer", &ple_table16_));
        GEMMA4_T4_TRY(upload_f16(*w_->ple_table, 0, count, ple_table16_));
        release_pages(*w_->ple_table);
      }
    }
    layers_.resize(size_t(L));
    for (int l = 0; l < L; ++l) {
      const LayerW& lw = w_->layers[l];
      DevLayer& d = layers_[l];
      for (auto pr : {std::make_pair(&lw.q, &d.q), std::make_pair(&lw.k, &d.k), std::make_pair(&lw.v, &d.v),
                      std::make_pair(&lw.o, &d.o), std::make_pair(&lw.gate, &d.gate), std::make_pair(&lw.up, &d.up),
                      std::make_pair(&lw.down, &d.down), std::make_pair(&lw.ple_gate, &d.ple_gate),
                      std::make_pair(&lw.ple_proj, &d.ple_proj)})
        GEMMA4_T4_TRY(linear(*pr.first, pr.second));
      GEMMA4_T4_TRY(vec_f32(lw.input_layernorm, &d.in_norm));
      GEMMA4_T4_TRY(vec_f32(lw.post_attention_layernorm, &d.post_attn));
      GEMMA4_T4_TRY(vec_f32(lw.pre_feedforward_layernorm, &d.pre_ff));
      GEMMA4_T4_TRY(vec_f32(lw.post_feedforward_layernorm, &d.post_ff));
      GEMMA4_T4_TRY(vec_f32(lw.q_norm, &d.q_norm));
      if (lw.k_norm) GEMMA4_T4_TRY(vec_f32(lw.k_norm, &d.k_norm));
      if (lw.post_per_layer_input_norm) GEMMA4_T4_TRY(vec_f32(lw.post_per_layer_input_norm, &d.post_ple));
      GEMMA4_T4_TRY(check_mapped(*lw.layer_scalar));
      d.scalar = load_float(*lw.layer_scalar, 0);
      const std::vector<float> f = rope_inv_freq(c.layers[l]);
      GEMMA4_T4_TRY(weights_mem_.alloc(f.size(), "rope table", &d.inv_freq));
      GEMMA4_T4_CUDA_TRY(cudaMemcpy(d.inv_freq, f.data(), f.size() * 4, cudaMemcpyHostToDevice), "rope table");
    }
    return Status::ok();
  }

  // ---- workspace ----

  Status alloc_workspace() {
    const ModelConfig& c = *cfg_;
    const int R = max_rows_, H = c.hidden_size, L = c.num_layers, D = c.hidden_size_per_layer_input;
    int qw = 0, kvw = 0, dmax = 0;
    for (const auto& lc : c.layers) {
      qw = std::max(qw, c.num_heads * lc.head_dim);
      kvw = std::max(kvw, lc.num_kv_heads * lc.head_dim);
      dmax = std::max(dmax, lc.head_dim);
    }
    const int wide = std::max({max_out_, max_in_, qw, H, L * D});
    DeviceMemory& m = work_mem_;
    GEMMA4_T4_TRY(m.alloc(size_t(R) * 4 + size_t(kMaxSeqs) * L * 3 + 16, "workspace: metadata", &meta_i32_));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs) * L * 2, "workspace: cache table", &kv_ptrs_));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * H, "workspace: residual", &h_));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * wide, "workspace: x16", &x16_));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * qw, "workspace: q16", &q16_));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * wide, "workspace: mm A", &mmA_));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * wide, "workspace: mm B", &mmB_));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * std::max(kvw, H), "workspace: mm C", &mmC_));
    if (D > 0) {
      GEMMA4_T4_TRY(m.alloc(size_t(R) * L * D, "workspace: per-layer inputs", &ple_));
      GEMMA4_T4_TRY(m.alloc(size_t(R) * L * D, "workspace: per-layer tokens", &tok_));
      if (!ple_table16_) {  // the rows as stored (bf16 / fp16 / fp32), gathered on the host, widened on the GPU
        GEMMA4_T4_TRY(m.alloc(2 * ple_pass_bytes(), "workspace: PLE rows (raw, 2 passes)", &ple_raw_));
        GEMMA4_T4_TRY(
            cuda_alloc(Mem::Pinned, 2 * ple_pass_bytes(), "workspace: PLE rows (pinned, 2 passes)", &ple_host_));
        GEMMA4_T4_CUDA_TRY(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                           "cudaStreamCreate (copies)");
        for (cudaEvent_t& e : ple_copied_)
          GEMMA4_T4_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      }
    }
    GEMMA4_T4_TRY(m.alloc(size_t(kSplitBudget) * c.num_heads * dmax, "workspace: attention partials", &part_o_));
    GEMMA4_T4_TRY(m.alloc(size_t(kSplitBudget) * c.num_heads * 2, "workspace: attention partials", &part_ml_));
    {  // fused split merge: one arrival counter per (row, KV head), zero between launches (kernels/attention.cuh)
      int kvmax = 1;
      for (const auto& lc : c.layers) kvmax = std::max(kvmax, lc.num_kv_heads);
      const size_t n = size_t(R) * kvmax;
      GEMMA4_T4_TRY(m.alloc(n, "workspace: attention counters", &attn_counters_));
      GEMMA4_T4_CUDA_TRY(cudaMemsetAsync(attn_counters_, 0, n * sizeof(unsigned), stream_), "attention counters");
    }
    if (max_deq_) GEMMA4_T4_TRY(m.alloc(max_deq_, "workspace: dequantised tile", &deq16_));
    GEMMA4_T4_TRY(m.alloc(size_t(kernels::kGemvMaxRows) * H, "workspace: head input", &head16_));
    GEMMA4_T4_TRY(
        m.alloc(size_t(kernels::kGemvMaxRows) * std::max(max_out_, D), "workspace: decode activations", &act16_));
    GEMMA4_T4_TRY(m.alloc(size_t(kernels::kGemvMaxRows) * c.vocab_size, "workspace: logits", &logits_));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs) * c.vocab_size, "workspace: sampling logits", &samp_logits_));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs), "workspace: sampling parameters", &samp_params_));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs), "workspace: sampled tokens", &samp_out_));
    // prefill attention tile tables, one per folded group size (1, 2, 4, 8 query heads per KV head)
    GEMMA4_T4_TRY(m.alloc(size_t(4) * max_rows_, "workspace: attention tiles", &tiles_));
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, size_t(4) * max_rows_ * sizeof(int2), "workspace: attention tiles (pinned)",
                             &tiles_host_));
    meta_bytes_ = meta_int_bytes() + size_t(kMaxSeqs) * L * 2 * sizeof(void*);
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, meta_bytes_, "workspace: metadata (pinned)", &meta_host_));
    return Status::ok();
  }

  // ---- one pass ----

  Status mm(const DevLinear& w, const half* x, int n, float* y, const char* what) const {
    if (n <= kernels::kGemvMaxRows) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(w.w16, w.wq, w.s16, x, n, w.out, w.in, y, w.out, stream_), what);
      return Status::ok();
    }
    const half* W = w.w16;
    if (!W) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_dequant_w4(w.wq, w.s16, w.out, w.in, deq16_, stream_), what);
      W = deq16_;
    }
    const float alpha = 1.f, beta = 0.f;
    const cublasStatus_t st =
        cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, w.out, n, w.in, &alpha, W, CUDA_R_16F, w.in, x, CUDA_R_16F, w.in,
                     &beta, y, CUDA_R_32F, w.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      return err(Code::BackendError, what, ": cublasGemmEx failed (status ", int(st), ")");
    sanitizer_mark_initialized(y, size_t(n) * w.out * sizeof(float), stream_);
    return Status::ok();
  }

  static kernels::GemvMat gemv_mat(const DevLinear& w, float* y) {
    kernels::GemvMat m;
    m.w16 = w.w16;
    m.wq = w.wq;
    m.s = w.s16;
    m.out = w.out;
    m.y = y;  // [n, out] fp32
    m.ldy = w.out;
    return m;
  }

  static bool same_layout(const DevLinear& a, const DevLinear& b) { return (a.w16 == nullptr) == (b.w16 == nullptr); }

  // y_i = x W_i^T for `count` (<= 3) matrices sharing x: one GEMV launch for <= 16 rows when they share
  // a layout and `in`, else one mm() each.
  Status mm_multi(const DevLinear* const* ws, float* const* ys, int count, const half* x, int n,
                  const char* what) const {
    bool one = n <= kernels::kGemvMaxRows;
    for (int i = 1; i < count; ++i) one = one && same_layout(*ws[i], *ws[0]) && ws[i]->in == ws[0]->in;
    if (one) {
      kernels::GemvMat m[kernels::kGemvMaxMats];
      for (int i = 0; i < count; ++i) m[i] = gemv_mat(*ws[i], ys[i]);
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv_multi(m, count, x, n, ws[0]->in, stream_), what);
      return Status::ok();
    }
    for (int i = 0; i < count; ++i) GEMMA4_T4_TRY(mm(*ws[i], x, n, ys[i], what));
    return Status::ok();
  }

  struct PleStage {
    int buf = 0;         // the half of ple_host_ / ple_raw_ that holds (or will hold) this pass's rows
    bool ready = false;  // gathered and uploaded (on copy_stream_) already, while the previous pass ran
  };

  static bool large_ple_pass(const std::vector<Segment>& segs) {  // more rows than a decode step
    size_t rows = 0;
    for (const Segment& g : segs) rows += size_t(g.n);
    return rows > size_t(kernels::kGemvMaxRows);
  }

  // Brings the PLE rows of a pass's tokens, as stored, from the mapped table to half `buf` of ple_raw_, through
  // half `buf` of ple_host_: 17.5 KB per token on E2B, so a 2048-row prefill pass moves 36 MB. Decode steps:
  // one memcpy per row and an upload on stream_. Larger passes: gathered by the host's threads (parallel_for),
  // uploaded on copy_stream_, then ple_copied_[buf] is recorded (stream_ waits for it before the widen).
  // (Measured on the H200 host: gathering in two chunks, the first uploaded while the second is gathered,
  // took longer than one: each chunk pays the thread start-ups.)
  Status stage_ple(const std::vector<Segment>& segs, int buf, bool* async) const {
    const size_t row = ple_row_bytes();
    uint8_t* host = ple_host_ + size_t(buf) * ple_pass_bytes();
    uint8_t* dev = ple_raw_ + size_t(buf) * ple_pass_bytes();
    const uint8_t* table = w_->ple_table->data;
    std::vector<int32_t> ids;
    ids.reserve(size_t(max_rows_));
    for (const Segment& g : segs) ids.insert(ids.end(), g.tokens, g.tokens + g.n);
    auto copy = [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) std::memcpy(host + r * row, table + size_t(ids[r]) * row, row);
    };
    *async = large_ple_pass(segs);
    if (!*async) {  // not worth a thread or a second stream
      copy(0, ids.size());
      GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(dev, host, ids.size() * row, cudaMemcpyHostToDevice, stream_),
                         "PLE rows upload");
      return Status::ok();
    }
    parallel_for(ids.size(), double(ids.size() * row), copy);
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(dev, host, ids.size() * row, cudaMemcpyHostToDevice, copy_stream_),
                       "PLE rows upload");
    GEMMA4_T4_CUDA_TRY(cudaEventRecord(ple_copied_[buf], copy_stream_), "PLE rows upload");
    return Status::ok();
  }

  Status run_pass(const std::vector<Segment>& segs, const std::vector<Segment>* next, PleStage* stage, Logits which,
                  std::vector<float>* logits, float* dev_out) const {
    const ModelConfig& c = *cfg_;
    const int L = c.num_layers, D = c.hidden_size_per_layer_input, V = c.vocab_size;
    // Host metadata: ids, seq, pos per row; rows that want logits; cache table per (seq, layer).
    int32_t* mi = static_cast<int32_t*>(meta_host_);
    int32_t *ids = mi, *seq = mi + max_rows_, *pos = mi + 2 * max_rows_, *sel = mi + 3 * max_rows_;
    int32_t* cap = mi + 4 * max_rows_;
    half** ptrs = reinterpret_cast<half**>(static_cast<uint8_t*>(meta_host_) + meta_int_bytes());
    int rows = 0, nsel = 0, max_pos = 0;
    for (size_t s = 0; s < segs.size(); ++s) {
      const Segment& g = segs[s];
      for (int t = 0; t < g.n; ++t) {
        ids[rows] = g.tokens[t];
        seq[rows] = int(s);
        pos[rows] = int(g.pos + t);
        max_pos = std::max(max_pos, pos[rows]);
        if (which == Logits::All || (which == Logits::Last && g.last && t == g.n - 1)) sel[nsel++] = rows;
        ++rows;
      }
      for (int l = 0; l < L; ++l) {
        cap[s * L + l] = g.s->capacity[l];
        ptrs[s * L + l] = g.s->k[l];
        ptrs[size_t(kMaxSeqs) * L + s * L + l] = g.s->v[l];
      }
    }
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(meta_i32_, meta_host_, meta_int_bytes(), cudaMemcpyHostToDevice, stream_),
                       "metadata upload");
    GEMMA4_T4_CUDA_TRY(
        cudaMemcpyAsync(kv_ptrs_, ptrs, size_t(kMaxSeqs) * L * 2 * sizeof(void*), cudaMemcpyHostToDevice, stream_),
        "metadata upload");
    const bool host_ple = D > 0 && !ple_table16_;
    if (host_ple) {  // PLE rows from the mapped file (host), before any kernel needs them
      // Copied as stored and widened to fp32 on the GPU; converting element by element on the host cost ~10 ms
      // per 512-row prefill pass.
      const size_t LD = size_t(L) * D;
      bool async = stage->ready;
      if (!stage->ready) GEMMA4_T4_TRY(stage_ple(segs, stage->buf, &async));
      if (async) GEMMA4_T4_CUDA_TRY(cudaStreamWaitEvent(stream_, ple_copied_[stage->buf], 0), "PLE rows upload");
      const DType t = w_->ple_table->dtype;
      const kernels::RawFloat rt = t == DType::BF16  ? kernels::RawFloat::BF16
                                   : t == DType::F16 ? kernels::RawFloat::F16
                                                     : kernels::RawFloat::F32;
      GEMMA4_T4_CUDA_TRY(
          kernels::launch_widen(ple_raw_ + size_t(stage->buf) * ple_pass_bytes(), rt, size_t(rows) * LD, tok_, stream_),
          "PLE rows widen");
    }
    // Decode passes (one token per session, every row selected, <= 16 rows) replay a CUDA graph per batch size.
    if (replays_graph(segs, which, dev_out ? dev_row_ : 0)) {
      float* dst = dev_out ? dev_out + size_t(dev_row_) * V : logits_;
      GEMMA4_T4_TRY(replay_decode(rows, dst));
      if (dev_out)
        dev_row_ += rows;
      else
        GEMMA4_T4_TRY(download(rows, logits));
    } else {
      // A pass holding a prompt chunk runs attention on the tensor cores (kernels/flash_attention.cuh): tile
      // tables for the group sizes the layers use; decode-only passes keep the split kernel.
      const bool prefill = rows > int(segs.size());
      for (int gi = 0; gi < 4; ++gi) {
        flash_tiles_[gi] = 0;
        if (!prefill || !(flash_groups_ & (1 << gi))) continue;
        int2* th = tiles_host_ + size_t(gi) * max_rows_;
        flash_tiles_[gi] = kernels::flash_attention_tiles(seq, pos, rows, 1 << gi, th, max_rows_);
        GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(tiles_ + size_t(gi) * max_rows_, th, size_t(flash_tiles_[gi]) * sizeof(int2),
                                           cudaMemcpyHostToDevice, stream_),
                           "attention tiles upload");
      }
      Status st = encode_layers(rows, attention_splits(rows, max_pos + 1, c.sliding_window),
                                attention_splits(rows, max_pos + 1, 0));
      for (int& t : flash_tiles_) t = 0;  // graph captures and later passes use the split kernel
      GEMMA4_T4_TRY(st);
      for (int b = 0; b < nsel; b += kernels::kGemvMaxRows) {  // LM head for the selected rows, 16 at a time
        const int k = std::min(kernels::kGemvMaxRows, nsel - b);
        float* dst = dev_out ? dev_out + size_t(dev_row_) * V : logits_;
        GEMMA4_T4_TRY(encode_head(b, k, dst));
        if (dev_out)
          dev_row_ += k;
        else
          GEMMA4_T4_TRY(download(k, logits));
      }
    }
    // A large next pass's rows go to the other halves (this pass's widen may not have run yet), uploaded on
    // copy_stream_ while this pass runs.
    stage->ready = host_ple && next && large_ple_pass(*next);
    if (stage->ready) {
      bool async = true;
      GEMMA4_T4_TRY(stage_ple(*next, stage->buf ^ 1, &async));
    }
    GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "forward pass");
    if (stage->ready) stage->buf ^= 1;
    return Status::ok();
  }

  size_t meta_int_bytes() const { return (size_t(max_rows_) * 4 + size_t(kMaxSeqs) * cfg_->num_layers * 3 + 16) * 4; }

  Status download(int k, std::vector<float>* logits) const {
    const size_t V = size_t(cfg_->vocab_size), at = logits->size();
    logits->resize(at + size_t(k) * V);
    GEMMA4_T4_CUDA_TRY(
        cudaMemcpyAsync(logits->data() + at, logits_, size_t(k) * V * 4, cudaMemcpyDeviceToHost, stream_),
        "logits download");
    return Status::ok();
  }

  // Key ranges per row for the layers of this window (0 = full): kernels::attention_splits_for -- about one
  // 32-key tile per block while the grid fits the GPU's SMs about twice, a count the fused merge takes where
  // that costs at most twice the tiles per block, bounded by the partials' scratch (kSplitBudget).
  int attention_splits(int rows, int max_keys, int window) const {
    const int keys = window ? std::min(window, max_keys) : max_keys;
    int group = 1, hd = 0, kvh = 0;  // the layers this count serves (sliding iff window > 0); all if none
    for (int pass = 0; pass < 2 && hd == 0; ++pass)
      for (const LayerConfig& lc : cfg_->layers)
        if (pass == 1 || (lc.type == LayerType::Sliding) == (window > 0)) {
          group = std::max(group, cfg_->num_heads / lc.num_kv_heads);
          hd = std::max(hd, lc.head_dim);
          kvh = kvh ? std::min(kvh, lc.num_kv_heads) : lc.num_kv_heads;
        }
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_) != cudaSuccess) {
      cudaGetLastError();
      sms = 40;  // a T4
    }
    return kernels::attention_splits_for(rows, kvh, group, hd, keys, sms, kSplitBudget);
  }

  // The graph of a `rows`-row decode pass writing logits to dst (logits_ or dev_out), captured and
  // instantiated on first use (plan_passes). Splits fixed for the graph's life: sized for the longest context
  // a session may reach.
  Status build_graph(int rows, float* dst) const {
    Graph& g = graphs_[dst == logits_ ? 0 : 1][rows];
    if (g.exec) return Status::ok();
    const std::string what = "decode: CUDA graph for " + std::to_string(rows) + " rows";
    if (alloc_fault(0, what.c_str()))
      return err(Code::OutOfMemory, what, ": cudaGraphInstantiate failed (allocation fault hook)");
    const int full = attention_splits(rows, int(opt_.max_context), 0);
    const int sliding = attention_splits(rows, int(opt_.max_context), cfg_->sliding_window);
    cudaGraph_t graph = nullptr;
    GEMMA4_T4_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
    Status st = encode_layers(rows, sliding, full);
    if (st) st = encode_head(0, rows, dst);
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (!st) {
      if (graph) cudaGraphDestroy(graph);
      return st;
    }
    GEMMA4_T4_CUDA_TRY(e, "graph capture");
    const cudaError_t ei = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ei != cudaSuccess) {
      g.exec = nullptr;
      cudaGetLastError();
      if (ei == cudaErrorMemoryAllocation)
        return err(Code::OutOfMemory, what, ": cudaGraphInstantiate failed: out of GPU memory");
      return cuda_status(ei, what + ": cudaGraphInstantiate");
    }
    return Status::ok();
  }

  Status replay_decode(int rows, float* dst) const {
    GEMMA4_T4_TRY(build_graph(rows, dst));  // built already by plan_passes
    GEMMA4_T4_CUDA_TRY(cudaGraphLaunch(graphs_[dst == logits_ ? 0 : 1][rows].exec, stream_), "graph launch");
    return Status::ok();
  }

  // rmsnorm + LM head + soft-cap for selected rows [first, first + k) into dst [k, vocab].
  Status encode_head(int first, int k, float* dst) const {
    const ModelConfig& c = *cfg_;
    const int H = c.hidden_size, V = c.vocab_size;
    const int* d_sel = meta_i32_ + 3 * max_rows_;
    GEMMA4_T4_CUDA_TRY(
        kernels::launch_rmsnorm(h_, H, d_sel + first, final_norm_, k, H, c.rms_norm_eps, head16_, stream_),
        "final norm");
    if (lm8_)
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv_w8(lm8_, lm8_scale_, head16_, k, V, H, dst, V, stream_),
                         "LM head (int8)");
    else if (lm4_)
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(nullptr, lm4_, lm4_scale_, head16_, k, V, H, dst, V, stream_),
                         "LM head (int4)");
    else
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(lm16_, nullptr, nullptr, head16_, k, V, H, dst, V, stream_), "LM head");
    GEMMA4_T4_CUDA_TRY(kernels::launch_softcap(dst, size_t(k) * V, c.final_logit_softcapping, stream_), "softcap");
    return Status::ok();
  }

  // Everything from the embedding to the last layer's residual, for `rows` rows whose metadata is on the
  // device. Only kernel launches and cuBLAS calls: capturable.
  Status encode_layers(int rows, int sliding_splits, int full_splits) const {
    const ModelConfig& c = *cfg_;
    const int H = c.hidden_size, L = c.num_layers, D = c.hidden_size_per_layer_input, nh = c.num_heads;
    const float eps = c.rms_norm_eps;
    const int *d_ids = meta_i32_, *d_seq = meta_i32_ + max_rows_, *d_pos = meta_i32_ + 2 * max_rows_,
              *d_cap = meta_i32_ + 4 * max_rows_;
    half* const* d_k = kv_ptrs_;
    half* const* d_v = kv_ptrs_ + size_t(kMaxSeqs) * L;

    GEMMA4_T4_CUDA_TRY(kernels::launch_embed(embed16_, d_ids, rows, H, float(std::sqrt(double(H))), h_, stream_),
                       "embed");
    if (D > 0) {
      if (ple_table16_)
        GEMMA4_T4_CUDA_TRY(kernels::launch_embed(ple_table16_, d_ids, rows, L * D, 1.f, tok_, stream_), "PLE rows");
      GEMMA4_T4_CUDA_TRY(kernels::launch_to_half(h_, size_t(rows) * H, x16_, stream_), "PLE input");
      GEMMA4_T4_TRY(mm(ple_model_proj_, x16_, rows, mmA_, "per_layer_model_projection"));
      GEMMA4_T4_CUDA_TRY(
          kernels::launch_ple_combine(mmA_, tok_, ple_norm_, rows, L, D, float(1.0 / std::sqrt(double(H))),
                                      float(std::sqrt(double(D))), float(1.0 / std::sqrt(2.0)), eps, ple_, stream_),
          "PLE combine");
    }

    const bool decode = rows <= kernels::kGemvMaxRows;  // GEMVs with fused epilogues; else cuBLAS
    for (int l = 0; l < L; ++l) {
      const LayerConfig& lc = c.layers[l];
      const DevLayer& d = layers_[l];
      const int hd = lc.head_dim, kvh = lc.num_kv_heads;
      // Next layer's input norm: folded into this layer's last residual_norm (NextNorm::Norm).
      const float* next_norm = l + 1 < L ? layers_[l + 1].in_norm : nullptr;
      const kernels::NextNorm next = next_norm ? kernels::NextNorm::Norm : kernels::NextNorm::None;
      // attention; x16_ = input norm of h (the previous layer's last residual_norm wrote it for l > 0)
      if (l == 0)
        GEMMA4_T4_CUDA_TRY(kernels::launch_rmsnorm(h_, H, nullptr, d.in_norm, rows, H, eps, x16_, stream_),
                           "input norm");
      const float* vsrc = mmB_;  // k_eq_v: V is the raw k_proj output
      if (lc.kv_shared) {
        GEMMA4_T4_TRY(mm(d.q, x16_, rows, mmA_, "q_proj"));
      } else {
        const DevLinear* ws[3] = {&d.q, &d.k, &d.v};
        float* const ys[3] = {mmA_, mmB_, mmC_};
        if (!lc.k_eq_v) vsrc = mmC_;
        GEMMA4_T4_TRY(mm_multi(ws, ys, lc.k_eq_v ? 2 : 3, x16_, rows, "q/k/v_proj"));
      }
      kernels::HeadNormTarget hn[3];  // q -> q16_; k, v -> the caches (one launch)
      hn[0].in = mmA_;
      hn[0].ld_in = nh * hd;
      hn[0].heads = nh;
      hn[0].w = d.q_norm;
      hn[0].inv_freq = d.inv_freq;
      hn[0].out = q16_;
      if (!lc.kv_shared) {
        kernels::KvTarget kt;
        kt.capacity = d_cap;
        kt.seq = d_seq;
        kt.layer = l;
        kt.layers = L;
        hn[1].in = mmB_;
        hn[1].ld_in = kvh * hd;
        hn[1].heads = kvh;
        hn[1].w = d.k_norm;
        hn[1].inv_freq = d.inv_freq;
        hn[1].kv = kt;
        hn[1].kv.base = d_k;
        hn[2].in = vsrc;
        hn[2].ld_in = kvh * hd;
        hn[2].heads = kvh;  // no weight, no RoPE
        hn[2].kv = kt;
        hn[2].kv.base = d_v;
      }
      GEMMA4_T4_CUDA_TRY(kernels::launch_head_norm_rope_multi(hn, lc.kv_shared ? 1 : 3, rows, hd, eps, d_pos, stream_),
                         "q/k/v norm + RoPE");
      kernels::AttnArgs a;
      a.q = q16_;
      a.kbase = d_k;
      a.vbase = d_v;
      a.capacity = d_cap;
      a.seq = d_seq;
      a.pos = d_pos;
      a.layer = lc.kv_source;
      a.layers = L;
      a.rows = rows;
      a.heads = nh;
      a.kv_heads = kvh;
      a.window = lc.type == LayerType::Sliding ? c.sliding_window : 0;
      a.splits = a.window ? sliding_splits : full_splits;
      a.part_o = part_o_;
      a.part_ml = part_ml_;
      a.out = x16_;
      a.counters = attn_counters_;
      const int group = nh / kvh, gi = group <= 1 ? 0 : group <= 2 ? 1 : group <= 4 ? 2 : 3;
      if (flash_tiles_[gi] > 0 && kernels::flash_attention_supported(hd, group))
        GEMMA4_T4_CUDA_TRY(
            kernels::launch_flash_attention(a, tiles_ + size_t(gi) * max_rows_, flash_tiles_[gi], hd, stream_),
            "attention (flash)");
      else
        GEMMA4_T4_CUDA_TRY(kernels::launch_attention(a, hd, stream_), "attention");
      GEMMA4_T4_TRY(mm(d.o, x16_, rows, mmA_, "o_proj"));
      GEMMA4_T4_CUDA_TRY(kernels::launch_residual_norm(h_, mmA_, d.post_attn, rows, H, eps, 1.f,
                                                       kernels::NextNorm::Norm, d.pre_ff, x16_, stream_),
                         "post-attention norm");
      // MLP: x16_ = pre_ff norm(h); decode: one GEMV for gate + up + GELU into act16_
      const half* act = x16_;  // down_proj input
      if (decode && same_layout(d.gate, d.up)) {
        GEMMA4_T4_CUDA_TRY(kernels::launch_gemv_gelu_mul(gemv_mat(d.gate, nullptr), gemv_mat(d.up, nullptr), x16_, rows,
                                                         H, act16_, lc.intermediate_size, stream_),
                           "gate/up_proj + GELU");
        act = act16_;
      } else {
        GEMMA4_T4_TRY(mm(d.gate, x16_, rows, mmA_, "gate_proj"));
        GEMMA4_T4_TRY(mm(d.up, x16_, rows, mmB_, "up_proj"));
        GEMMA4_T4_CUDA_TRY(kernels::launch_gelu_mul(mmA_, mmB_, size_t(rows) * lc.intermediate_size, x16_, stream_),
                           "gelu");
      }
      GEMMA4_T4_TRY(mm(d.down, act, rows, mmC_, "down_proj"));
      if (D > 0) {
        GEMMA4_T4_CUDA_TRY(kernels::launch_residual_norm(h_, mmC_, d.post_ff, rows, H, eps, 1.f,
                                                         kernels::NextNorm::Copy, nullptr, x16_, stream_),
                           "post-MLP norm");
        const half* gated = x16_;  // per_layer_projection input
        if (decode) {
          GEMMA4_T4_CUDA_TRY(
              kernels::launch_gemv_gelu_ple(gemv_mat(d.ple_gate, nullptr), x16_, rows, H, ple_, L, l, act16_, stream_),
              "per_layer_input_gate + GELU");
          gated = act16_;
        } else {
          GEMMA4_T4_TRY(mm(d.ple_gate, x16_, rows, mmA_, "per_layer_input_gate"));
          GEMMA4_T4_CUDA_TRY(kernels::launch_ple_gate(mmA_, ple_, rows, L, D, l, x16_, stream_), "PLE gate");
        }
        GEMMA4_T4_TRY(mm(d.ple_proj, gated, rows, mmC_, "per_layer_projection"));
        GEMMA4_T4_CUDA_TRY(
            kernels::launch_residual_norm(h_, mmC_, d.post_ple, rows, H, eps, d.scalar, next, next_norm, x16_, stream_),
            "PLE norm");
      } else {
        GEMMA4_T4_CUDA_TRY(
            kernels::launch_residual_norm(h_, mmC_, d.post_ff, rows, H, eps, d.scalar, next, next_norm, x16_, stream_),
            "post-MLP norm");
      }
    }
    return Status::ok();
  }

  struct Graph {
    cudaGraphExec_t exec = nullptr;
  };

  const ModelConfig* cfg_ = nullptr;
  const Weights* w_ = nullptr;
  LoadOptions opt_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* staging_ = nullptr;
  double total_upload_ = 0;
  size_t uploaded_ = 0;
  mutable std::mutex mu_;

  DeviceMemory weights_mem_, work_mem_;
  half *embed16_ = nullptr, *lm16_ = nullptr, *ple_table16_ = nullptr;
  int8_t* lm8_ = nullptr;  // LmHead::Int8: [V, H] + row scales
  float* lm8_scale_ = nullptr;
  uint32_t* lm4_ = nullptr;  // LmHead::Int4: [V, H / 8] packed + [V, H / 32] fp16 scales
  half* lm4_scale_ = nullptr;
  float *final_norm_ = nullptr, *ple_norm_ = nullptr;
  DevLinear ple_model_proj_;
  std::vector<DevLayer> layers_;
  int max_in_ = 0, max_out_ = 0;
  size_t max_deq_ = 0;

  // workspace ([rows, ...] buffers hold max_rows_ rows)
  int* meta_i32_ = nullptr;
  int2* tiles_ = nullptr;                      // [4][max_rows_] prefill attention tiles by folded group (1, 2, 4, 8)
  int2* tiles_host_ = nullptr;                 // pinned mirror
  mutable int flash_tiles_[4] = {0, 0, 0, 0};  // tiles per table in the current pass; 0: split kernel
  int flash_groups_ = 0;                       // bit gi: some layer folds 2^gi query heads per KV head
  half** kv_ptrs_ = nullptr;
  float* h_ = nullptr;  // [R, H] residual stream
  half *x16_ = nullptr, *q16_ = nullptr;
  float *mmA_ = nullptr, *mmB_ = nullptr, *mmC_ = nullptr;
  float *ple_ = nullptr, *tok_ = nullptr;
  uint8_t* ple_raw_ = nullptr;          // 2 x [R, L*D] PLE rows as the checkpoint stores them (PleLocation::Host)
  uint8_t* ple_host_ = nullptr;         // pinned mirror: the rows gathered for ple_raw_ (this pass, the next)
  cudaStream_t copy_stream_ = nullptr;  // their uploads (with the PLE table on the host)
  cudaEvent_t ple_copied_[2] = {};      // recorded on copy_stream_ after a half's upload
  size_t ple_elem_bytes() const { return w_->ple_table->dtype == DType::F32 ? 4 : 2; }
  size_t ple_row_bytes() const {
    return size_t(cfg_->num_layers) * cfg_->hidden_size_per_layer_input * ple_elem_bytes();
  }
  size_t ple_pass_bytes() const { return size_t(max_rows_) * ple_row_bytes(); }
  float *part_o_ = nullptr, *part_ml_ = nullptr;
  unsigned* attn_counters_ = nullptr;  // [max_rows_, max kv_heads] attention arrival counters, zero between launches
  half* deq16_ = nullptr;
  half* head16_ = nullptr;
  half* act16_ = nullptr;    // [16, I or D] fp16: decode GEMV epilogue output (gate/up GELU, PLE gate)
  float* logits_ = nullptr;  // [16, V]
  void* meta_host_ = nullptr;
  size_t meta_bytes_ = 0;
  float* samp_logits_ = nullptr;                  // [kMaxSeqs, V]
  kernels::SampleParams* samp_params_ = nullptr;  // [kMaxSeqs]
  int* samp_out_ = nullptr;                       // [kMaxSeqs]
  mutable int* seen_dev_ = nullptr;               // repetition-penalty ids, grown on demand
  mutable size_t seen_cap_ = 0;
  mutable int dev_row_ = 0;  // next row of dev_out in run()
  bool use_graphs_ = true;
  bool use_pdl_ = true;                                 // LoadOptions::programmatic_launch
  int max_rows_ = 2048;                                 // rows per pass (LoadOptions::max_pass_rows)
  mutable Graph graphs_[2][kernels::kGemvMaxRows + 1];  // [to host logits / to device logits][rows]
};

}  // namespace detail
}  // namespace gemma4_t4
