// gemma4_t4 implementation part, CUDA backend: the BackendModel over the parts in this directory.
//
//   weights.hpp    the weights on the GPU (uploaded once, repacked where the kernels want it)
//   workspace.hpp  every buffer a pass uses, the per-pass metadata layout, the KV cache's size
//   planner.hpp    batches -> passes; a pass's metadata, attention splits and PLE rows
//   layers.hpp     the Gemma 4 block (block.hpp) as kernel launches for one pass
//   executor.hpp   running passes: decode passes by the persistent kernel (persistent.hpp) or as CUDA graphs,
//                  the rest as launches; GPU sampling
//
// Thread safety: the Engine's contract (an immutable Engine shared by threads, one thread per Session) holds
// because every forward pass runs under mu_, which guards the executor's state (graphs, staging halves).
#pragma once

#include <cublas_v2.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "executor.hpp"

namespace gemma4_t4 {
namespace detail {

class CudaBackend : public BackendModel {
 public:
  ~CudaBackend() override {
#ifdef GEMMA4_T4_KTRACE
    kernels::ktrace_close(ktrace_, stream_);  // development builds: kernels/ktrace.cuh
#endif
    exec_.reset();  // graphs before the handle and the stream
    if (blas_) cublasDestroy(blas_);
    if (blas_ws_) cuda_free(Mem::Device, blas_ws_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Backend kind() const override { return Backend::Cuda; }

  Status init(const ModelConfig& cfg, const Weights& w, const LoadOptions& opt, const std::string& where) {
    cfg_ = &cfg;
    ple_table_ = w.ple_table;
    opt_ = opt;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return err(Code::BackendError, where, ": no CUDA device is available (use Backend::Cpu or Auto)");
    }
    if (opt.device < 0 || opt.device >= n)
      return err(Code::InvalidArgument, where, ": CUDA device ", opt.device, " does not exist (", n, " present)");
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(opt.device), "cudaSetDevice");
    cudaDeviceProp prop;
    GEMMA4_T4_CUDA_TRY(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
    if (prop.major * 10 + prop.minor < 75)
      return err(Code::Unsupported, where, ": GPU '", prop.name, "' has compute capability ", prop.major, ".",
                 prop.minor, "; gemma4_t4 needs 7.5 (Turing) or newer");
    GEMMA4_T4_TRY(check_shapes(where));
    GEMMA4_T4_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
#ifdef GEMMA4_T4_KTRACE
    if (!kernels::ktrace_open(ktrace_, stream_))
      return err(Code::BackendError, where, ": GEMMA4_T4_KTRACE: cannot open the trace");
#endif
    if (alloc_fault(0, "cuBLAS handle"))
      return err(Code::OutOfMemory, where, ": cuBLAS handle: cublasCreate failed (allocation fault hook)");
    if (const cublasStatus_t bs = cublasCreate(&blas_); bs != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      return err(bs == CUBLAS_STATUS_ALLOC_FAILED ? Code::OutOfMemory : Code::BackendError, where,
                 ": cuBLAS handle: cublasCreate failed (status ", int(bs), ")");
    }
    cublasSetStream(blas_, stream_);
    // cuBLAS's workspace is ours (named, counted, under the fault hook), not one it allocates behind the
    // backend's accounting: NVIDIA's recommended size, 32 MiB on Hopper and later, 4 MiB before.
    const size_t blas_ws = prop.major >= 9 ? size_t(32) << 20 : size_t(4) << 20;
    GEMMA4_T4_TRY(cuda_alloc(Mem::Device, blas_ws, "cuBLAS workspace", &blas_ws_));
    if (const cublasStatus_t bs = cublasSetWorkspace(blas_, blas_ws_, blas_ws); bs != CUBLAS_STATUS_SUCCESS)
      return err(Code::BackendError, where, ": cuBLAS workspace: cublasSetWorkspace failed (status ", int(bs), ")");
    GEMMA4_T4_TRY(weights_.upload(cfg, w, opt_, stream_));
    GEMMA4_T4_TRY(ws_.alloc(cfg, weights_, opt.max_pass_rows, stream_));
    pdl_ = opt.programmatic_launch && kernels::pdl_supported(opt.device);
    (void)kernels::device_sms();  // the launch policies' SM count, asked now: not first inside a graph capture
    exec_ = std::make_unique<PassExecutor>();
    return exec_->init(cfg, w, weights_, ws_, opt_, stream_, blas_, pdl_, opt.device, prop.multiProcessorCount);
  }

  Status new_session(size_t max_ctx, std::unique_ptr<BackendSession>* out) const override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(opt_.device);
    auto s = std::make_unique<CudaSession>();
    s->max_ctx = max_ctx;
    const int L = cfg_->num_layers;
    s->k.assign(size_t(L), nullptr);
    s->v.assign(size_t(L), nullptr);
    s->slots.assign(size_t(L), 1);
    for (int l = 0; l < L; ++l) {
      const LayerConfig& lc = cfg_->layers[l];
      if (lc.kv_shared) continue;
      const size_t slots = kv_slots(*cfg_, lc, max_ctx, opt_.max_pass_rows);
      const size_t count = kv_buffer_bytes(lc, slots) / sizeof(half);
      const std::string what =
          "create_session: KV cache of layer " + std::to_string(l) + " (" + std::to_string(slots) + " slots)";
      GEMMA4_T4_TRY(s->mem.alloc(count, what, &s->k[l]));
      GEMMA4_T4_TRY(s->mem.alloc(count, what, &s->v[l]));
      s->slots[l] = int(slots);
    }
    *out = std::move(s);
    return Status::ok();
  }

  Status forward(const ForwardItem* items, size_t count, Logits which, std::vector<float>* logits) const override {
    std::lock_guard<std::mutex> lock(mu_);
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(opt_.device), "cudaSetDevice");
    Plan plan;
    GEMMA4_T4_TRY(exec_->prepare(items, count, which, nullptr, 0, &plan));
    GEMMA4_T4_TRY(exec_->run(plan, which, logits, nullptr));
    for (size_t i = 0; i < count; ++i) items[i].session->pos += items[i].n;
    return Status::ok();
  }

  Status step(const ForwardItem* items, size_t count, const SampleItem* samples, int32_t* next,
              std::vector<float>* logits) const override {
    std::lock_guard<std::mutex> lock(mu_);
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(opt_.device), "cudaSetDevice");
    const int V = cfg_->vocab_size;
    // All that may allocate -- the chunks' CUDA graphs, the repetition-penalty ids -- before the first pass
    // writes a cache: running out of memory leaves every session as it was.
    std::vector<Plan> plans;  // per chunk of kMaxSeqs sessions
    for (size_t b0 = 0; b0 < count; b0 += kMaxSeqs) {
      const size_t k = std::min<size_t>(kMaxSeqs, count - b0);
      size_t nseen = 0;
      for (size_t i = 0; i < k; ++i) nseen += samples[b0 + i].seen.size();
      plans.emplace_back();
      GEMMA4_T4_TRY(exec_->prepare(items + b0, k, Logits::Last, ws_.samp_logits, nseen, &plans.back()));
    }
    // A chunk's last pass is not waited for before its sampling (PassExecutor::run_pass): on an error before sample()'s
    // synchronisation the stream is synchronised here, so no queued work still reads the host buffers the next call
    // rewrites.
    const auto chunk = [&](size_t b0) -> Status {
      const int k = int(std::min<size_t>(kMaxSeqs, count - b0));
      GEMMA4_T4_TRY(exec_->run(plans[b0 / kMaxSeqs], Logits::Last, nullptr, ws_.samp_logits));
      if (logits) {
        const size_t at = logits->size();
        logits->resize(at + size_t(k) * V);
        GEMMA4_T4_CUDA_TRY(
            cudaMemcpyAsync(logits->data() + at, ws_.samp_logits, size_t(k) * V * 4, cudaMemcpyDeviceToHost, stream_),
            "logits download");
      }
      return exec_->sample(samples + b0, k, next + b0);
    };
    for (size_t b0 = 0; b0 < count; b0 += kMaxSeqs) {
      const Status st = chunk(b0);
      if (!st) {
        (void)cudaStreamSynchronize(stream_);  // its own error, if any, is the one st already reports
        return st;
      }
    }
    for (size_t i = 0; i < count; ++i) items[i].session->pos += items[i].n;
    return Status::ok();
  }

  // Engine::copy_prefix. Self-contained: it needs only the session layout (per non-shared layer l, K and V of
  // [slots[l], kv_heads, head_dim] fp16 with position j at slot j % slots[l]; kv_slots: sliding layers a ring of
  // min(max_ctx, window + max_pass_rows) slots, full layers max_ctx) and the stream the passes run on. Positions
  // [kv_prefix_start, n) of each layer are copied device-to-device on stream_ (ordered after every pass queued
  // there), at most 4 contiguous runs per buffer, then the stream is synchronised. A ring of src still holds them
  // while src.pos - slots <= kv_prefix_start (always when n == src.pos).
  Status copy_prefix(const BackendSession& src_base, BackendSession& dst_base, size_t n) const override {
    const auto& src = static_cast<const CudaSession&>(src_base);
    auto& dst = static_cast<CudaSession&>(dst_base);
    const int L = cfg_->num_layers;
    for (int l = 0; l < L; ++l) {
      const size_t lo = kv_prefix_start(*cfg_, cfg_->layers[l], n);
      if (src.k[l] && !kv_holds(size_t(src.slots[l]), src.pos, lo))
        return err(Code::InvalidArgument, "copy_prefix: layer ", l, " of the source session keeps its last ",
                   src.slots[l], " positions and is at ", src.pos, ": positions [", lo, ", ", n,
                   ") of the prefix have been overwritten");
    }
    std::lock_guard<std::mutex> lock(mu_);
    GEMMA4_T4_CUDA_TRY(cudaSetDevice(opt_.device), "cudaSetDevice");
    dst.pos = 0;  // until every copy is done
    for (int l = 0; l < L; ++l) {
      if (!src.k[l]) continue;
      const size_t row = size_t(cfg_->layers[l].num_kv_heads) * cfg_->layers[l].head_dim;  // halves per position
      cudaError_t e = cudaSuccess;
      for_each_slot_run(
          kv_prefix_start(*cfg_, cfg_->layers[l], n), n, size_t(src.slots[l]), size_t(dst.slots[l]),
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
  // cache as new_session sizes it (kv_slots, kv_buffer_bytes).
  size_t weight_bytes() const override { return weights_.bytes(); }
  // Only the PLE table is read from the mapped file after load, and only with PleLocation::Host.
  Status check_files(const TensorStore&) const override {
    return cfg_->hidden_size_per_layer_input > 0 && !weights_.ple_table16 ? check_mapped(*ple_table_) : Status::ok();
  }
  size_t kv_bytes_per_token() const override { return kv_bytes_per_position(*cfg_, sizeof(half)); }
  size_t session_bytes(size_t max_ctx) const override {
    size_t b = 0;
    for (const LayerConfig& lc : cfg_->layers)
      if (!lc.kv_shared) b += 2 * kv_buffer_bytes(lc, kv_slots(*cfg_, lc, max_ctx, opt_.max_pass_rows));
    return b;
  }

  std::string decode_path() const override { return exec_ ? exec_->decode_path() : std::string(); }

  // Prompts: passes of every power of two of rows from the GEMVs' 32 up, one row more, and 1.5x (cuBLAS and the
  // w4a16 GEMM choose their kernels by row count; an exact multiple of a tile can take another kernel than one
  // row more: measured, a first 512-row pass cost 10 ms more after a warm-up without it), up to a whole pass;
  // decode: every row count with a graph of its own (planner.hpp: 1..32, then the padded buckets).
  WarmUp warm_up_plan() const override {
    WarmUp w;
    for (int r = kernels::kGemvMaxRows; r < opt_.max_pass_rows; r *= 2)
      for (const int n : {r, r + 1, r + r / 2})
        if (n < opt_.max_pass_rows) w.prompts.push_back(n);
    w.prompts.push_back(opt_.max_pass_rows);
    for (int n = 1; n <= kernels::kGemvMaxRows; ++n) w.decode_rows.push_back(n);
    for (const int b : kDecodeBuckets) w.decode_rows.push_back(b);
    return w;
  }

 private:
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

  const ModelConfig* cfg_ = nullptr;
  const TensorInfo* ple_table_ = nullptr;
  LoadOptions opt_;
  bool pdl_ = false;  // LoadOptions::programmatic_launch, where the device and this build support it
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* blas_ws_ = nullptr;  // cuBLAS workspace (cublasSetWorkspace)
  DeviceWeights weights_;
  Workspace ws_;
  mutable std::mutex mu_;
  std::unique_ptr<PassExecutor> exec_;  // its state is guarded by mu_ (pointer: the const methods use it)
#ifdef GEMMA4_T4_KTRACE
  kernels::KTraceHost ktrace_;
#endif
};

}  // namespace detail
}  // namespace gemma4_t4
