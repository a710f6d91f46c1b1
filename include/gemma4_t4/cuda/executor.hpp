// gemma4_t4 implementation part, CUDA backend: running a plan's passes -- decode passes as CUDA graphs,
// every other pass as direct launches -- and sampling the rows on the GPU.
//
// Everything that may allocate (a decode graph on first use, the repetition-penalty ids) happens in prepare()
// before the first pass writes a cache, so running out of memory leaves every session as it was (a failed
// pass after others could have overwritten ring slots still needed). The executor's state (graphs, the seen
// ids buffer, the PLE stager's halves) belongs to one forward at a time: the backend holds it under its mutex.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "layers.hpp"
#include "persistent.hpp"

namespace gemma4_t4 {
namespace detail {

class PassExecutor {
 public:
  PassExecutor() = default;
  PassExecutor(const PassExecutor&) = delete;
  PassExecutor& operator=(const PassExecutor&) = delete;
  ~PassExecutor() {
    for (auto& per_dst : graphs_)
      for (cudaGraphExec_t g : per_dst)
        if (g) cudaGraphExecDestroy(g);
    cuda_free(Mem::Device, seen_dev_);
  }

  Status init(const ModelConfig& c, const Weights& w, const DeviceWeights& dw, Workspace& ws, const LoadOptions& opt,
              cudaStream_t stream, cublasHandle_t blas, bool pdl, int device, int sms) {
    c_ = &c;
    dw_ = &dw;
    ws_ = &ws;
    opt_ = &opt;
    stream_ = stream;
    blas_ = blas;
    launch_ = kernels::Launch(stream, pdl);
    sms_ = sms;
    for (const LayerConfig& lc : c.layers) {  // prefill layers the tensor-core attention kernel takes
      const int group = c.num_heads / lc.num_kv_heads;
      if (kernels::flash_attention_supported(lc.head_dim, group)) flash_groups_ |= 1 << kernels::gqa_group_index(group);
    }
    if (c.hidden_size_per_layer_input > 0 && !dw.ple_table16)
      GEMMA4_T4_TRY(ple_.init(c, *w.ple_table, opt.max_pass_rows));
    persistent_why_ = PersistentDecoder::unsupported(c, dw, opt);
    if (persistent_why_.empty()) {
      persistent_ = std::make_unique<PersistentDecoder>();
      const Status st = persistent_->init(c, dw, ws, device, ple_.raw_type(), opt.persistent, stream);
      if (!st) {
        persistent_.reset();
        // the caller's options (LoadOptions::persistent) or memory: the load fails
        if (st.code == Code::OutOfMemory || st.code == Code::InvalidArgument || st.code == Code::IoError) return st;
        persistent_why_ = st.message;  // e.g. too little shared memory: the per-kernel path serves
      }
    }
    return Status::ok();
  }

  // How decode passes run, in words.
  std::string decode_path() const {
    if (persistent_)
      return "persistent kernel (" + std::to_string(persistent_->grid(1)) + " blocks, " +
             std::to_string(persistent_->blocks_per_sm()) + " per SM, <= " + std::to_string(persistent_->max_rows()) +
             " rows; larger batches: per-kernel)";
    std::string s = opt_->cuda_graphs ? "per-kernel, CUDA graphs" : "per-kernel";
    if (launch_.pdl) s += ", programmatic dependent launch";
    return s + " (persistent kernel not used: " + persistent_why_ + ")";
  }

  // Splits the items into passes and builds the graphs its decode passes will replay (logits to dev_out
  // when set, else to the host). seen: repetition-penalty ids the step will upload.
  Status prepare(const ForwardItem* items, size_t count, Logits which, float* dev_out, size_t seen, Plan* plan) {
    *plan = split_passes(items, count, opt_->max_pass_rows);
    int row = 0;  // dev_out row of each pass's first logits
    for (const Pass& pass : *plan) {
      if (const int g = graph_rows(pass, which, dev_out, row))
        GEMMA4_T4_TRY(build_graph(g, dev_out ? dev_out : ws_->logits));
      row += selected_rows(pass, which);
    }
    return ensure_seen(seen);
  }

  // Runs the passes (positions are advanced by the caller). Logit rows go to `logits` (host), or stay on the
  // GPU at dev_out[i * vocab] when dev_out is set.
  Status run(const Plan& plan, Logits which, std::vector<float>* logits, float* dev_out) {
    Run r{which, logits, dev_out};
    greedy_rows_ = 0;
    for (size_t p = 0; p < plan.size(); ++p) {
      if (plan[p].empty()) continue;
      const Pass* next = nullptr;
      for (size_t q = p + 1; q < plan.size() && !next; ++q)
        if (!plan[q].empty()) next = &plan[q];
      const Status st = run_pass(plan[p], next, &r);
      if (!st) {
        ple_.drain();
        return st;
      }
    }
    return Status::ok();
  }

  // One token per row from the first `k` rows of ws.samp_logits (Engine::step's samples) into next[k]. Greedy
  // rows the persistent decode step has already picked (ws.samp_out) are only downloaded.
  Status sample(const SampleItem* samples, int k, int32_t* next) {
    bool picked = greedy_rows_ == k;
    for (int i = 0; i < k && picked; ++i) {
      const SamplingOptions& o = samples[i].options;
      picked = (o.temperature <= 0.f || o.top_k == 1) && o.repetition_penalty == 1.f;
    }
    if (picked) {
      GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(next, ws_->samp_out, size_t(k) * 4, cudaMemcpyDeviceToHost, stream_),
                         "token download");
      GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "sampling");
      return Status::ok();
    }
    std::vector<kernels::SampleParams> params(static_cast<size_t>(k));
    std::vector<int32_t> seen;
    for (int i = 0; i < k; ++i) {
      const SampleItem& si = samples[i];
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
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(ws_->samp_params, params.data(), params.size() * sizeof(params[0]),
                                       cudaMemcpyHostToDevice, stream_),
                       "sampling parameters");
    if (!seen.empty())
      GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(seen_dev_, seen.data(), seen.size() * 4, cudaMemcpyHostToDevice, stream_),
                         "seen ids");
    GEMMA4_T4_CUDA_TRY(kernels::launch_sample(ws_->samp_logits, k, c_->vocab_size, ws_->samp_params, seen_dev_,
                                              ws_->samp_out, launch_),
                       "sampling");
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(next, ws_->samp_out, size_t(k) * 4, cudaMemcpyDeviceToHost, stream_),
                       "token download");
    GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "sampling");
    return Status::ok();
  }

 private:
  struct Run {
    Logits which;
    std::vector<float>* logits;  // host destination, or
    float* dev_out;              // device destination
    int dev_row = 0;             // next row of dev_out
    int ple_buf = 0;             // the PLE stager's half holding (or about to hold) this pass's rows
    bool ple_ready = false;      // gathered and uploaded already, while the previous pass ran
  };

  // A decode pass the persistent kernel runs: logits to the host or to the start of ws.samp_logits.
  bool takes_persistent(const Pass& pass, Logits which, const float* dev_out, int dev_row) const {
    return persistent_ && is_decode_pass(pass, which) && int(pass.size()) <= persistent_->max_rows() &&
           (!dev_out || (dev_out == ws_->samp_logits && dev_row == 0));
  }

  // The rows of the CUDA graph a decode pass replays (planner.hpp decode_graph_rows; 0: none, e.g. the
  // persistent kernel takes it), captured for logits at the start of ws.logits / dev_out: only a pass whose
  // logits start there. Padded buckets (past 32 rows) only into ws.samp_logits (ws.logits holds 32 rows).
  int graph_rows(const Pass& pass, Logits which, const float* dev_out, int dev_row) const {
    if (!opt_->cuda_graphs || dev_row != 0 || !is_decode_pass(pass, which) ||
        takes_persistent(pass, which, dev_out, dev_row))
      return 0;
    const int rows = decode_graph_rows(int(pass.size()), ws_->max_rows);
    return rows <= kernels::kGemvMaxRows || dev_out == ws_->samp_logits ? rows : 0;
  }

  Status run_pass(const Pass& pass, const Pass* next, Run* r) {
    const ModelConfig& c = *c_;
    const int V = c.vocab_size;
    const bool persist = takes_persistent(pass, r->which, r->dev_out, r->dev_row);
    const int graph = graph_rows(pass, r->which, r->dev_out, r->dev_row);  // dev_row stays 0 without dev_out
    const PassShape sh = fill_meta(pass, r->which, c.num_layers, ws_->host, graph, ws_->pad_k, ws_->pad_v);
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(ws_->meta_dev, ws_->meta_host, PassMeta::bytes(ws_->max_rows, c.num_layers),
                                       cudaMemcpyHostToDevice, stream_),
                       "metadata upload");
    const bool host_ple = c.hidden_size_per_layer_input > 0 && !dw_->ple_table16;
    bool ple_async = r->ple_ready;
    if (host_ple && !r->ple_ready)  // PLE rows from the mapped file (host), before any kernel needs them
      GEMMA4_T4_TRY(ple_.stage(pass, r->which, r->ple_buf, stream_, &ple_async, graph));
    if (host_ple && !persist) GEMMA4_T4_TRY(ple_.widen(r->ple_buf, ple_async, sh.rows, ws_->tok, launch_));
    if (persist) {  // the whole step as one kernel: logits in samp_logits, greedy tokens in samp_out
      if (host_ple && ple_async) GEMMA4_T4_CUDA_TRY(ple_.wait(r->ple_buf, stream_), "PLE rows upload");
      GEMMA4_T4_TRY(persistent_->run(sh.rows, sh.max_pos, host_ple ? ple_.raw(r->ple_buf) : nullptr, sms_, stream_));
      if (r->dev_out) {
        r->dev_row += sh.rows;
        greedy_rows_ = sh.rows;
      } else {
        GEMMA4_T4_TRY(download(ws_->samp_logits, sh.rows, r->logits));
      }
    } else if (graph) {  // sh.rows == graph: the real rows, then the padding's
      float* dst = r->dev_out ? r->dev_out + size_t(r->dev_row) * V : ws_->logits;
      GEMMA4_T4_TRY(build_graph(graph, dst));  // built already by prepare()
      GEMMA4_T4_CUDA_TRY(cudaGraphLaunch(graph_for(graph, dst), stream_), "graph launch");
      GEMMA4_T4_TRY(deliver(int(pass.size()), r));
    } else {
      LayerPass lp;
      lp.rows = sh.rows;
      lp.sms = sms_;
      lp.gemm_rows = gemm_rows();
      lp.launch = launch_;
      lp.sliding = attention_plan(c, sms_, sh.rows, sh.max_pos + 1, c.sliding_window);
      lp.full = attention_plan(c, sms_, sh.rows, sh.max_pos + 1, 0);
      lp.decode_only = sh.rows == int(pass.size());  // one row per session: only its own key is new
      if (sh.selected < sh.rows) {                   // past the last cache write, the selected rows only (block.hpp)
        lp.keep = sh.selected;
        if (sh.selected > 0) {
          lp.keep_sliding = attention_plan(c, sms_, sh.selected, sh.max_pos + 1, c.sliding_window);
          lp.keep_full = attention_plan(c, sms_, sh.selected, sh.max_pos + 1, 0);
        }
      }
      // A pass holding a prompt chunk runs attention on the tensor cores (kernels/flash_attention.cuh): tile
      // tables for the group sizes the layers use; decode-only passes keep the split kernel.
      if (sh.rows > int(pass.size()))
        for (int gi = 0; gi < 4; ++gi) {
          if (!(flash_groups_ & (1 << gi))) continue;
          int2* th = ws_->tiles_host + size_t(gi) * ws_->max_rows;
          lp.flash_tiles[gi] =
              kernels::flash_attention_tiles(ws_->host.seq, ws_->host.pos, sh.rows, 1 << gi, th, ws_->max_rows);
          GEMMA4_T4_CUDA_TRY(
              cudaMemcpyAsync(ws_->tiles + size_t(gi) * ws_->max_rows, th, size_t(lp.flash_tiles[gi]) * sizeof(int2),
                              cudaMemcpyHostToDevice, stream_),
              "attention tiles upload");
        }
      LayerEncoder enc(c, *dw_, *ws_, blas_, lp);
      GEMMA4_T4_TRY(enc.encode());
      // LM head: to the host 32 selected rows at a time (ws.logits), to dev_out (a step's kMaxSeqs rows) at once
      const int chunk = r->dev_out ? kMaxSeqs : kernels::kGemvMaxRows;
      for (int b = 0; b < sh.selected; b += chunk) {
        const int k = std::min(chunk, sh.selected - b);
        GEMMA4_T4_TRY(enc.head(b, k, r->dev_out ? r->dev_out + size_t(r->dev_row) * V : ws_->logits));
        GEMMA4_T4_TRY(deliver(k, r));
      }
    }
    // A large next pass's rows go to the other half (this pass's widen may not have run yet), uploaded on the
    // copy stream while this pass runs.
    r->ple_ready = host_ple && next && PleStager::large(*next);
    if (r->ple_ready) {
      bool async = true;
      GEMMA4_T4_TRY(ple_.stage(*next, r->which, r->ple_buf ^ 1, stream_, &async,
                               graph_rows(*next, r->which, r->dev_out, r->dev_row)));
    }
    // A step's last pass into dev_out is not waited for: Engine::step's sample() queues the sampling behind it and
    // synchronises the stream, so its parameter upload, launch and token download follow the pass on the GPU without
    // a host wake-up between (CudaBackend::step synchronises on any error before that). Host buffers a pass reads are
    // rewritten only after a synchronisation. The persistent kernel's passes are waited for (check() reads its flag).
    if (persist || next || !r->dev_out) GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "forward pass");
    if (r->ple_ready) r->ple_buf ^= 1;
    if (persist) {
      const Status st = persistent_->check();
      if (!st) {  // the engine stays usable: later decode passes take the per-kernel path
        persistent_why_ = st.message;
        persistent_.reset();
        return st;
      }
    }
    return Status::ok();
  }

  // Passes of up to this many rows take the w4a16 GEMM (LoadOptions::w4_matmul).
  int gemm_rows() const {
    return opt_->w4_matmul == W4Matmul::TensorCore ? std::numeric_limits<int>::max()
           : opt_->w4_matmul == W4Matmul::Auto     ? kW4AutoGemmRows
                                                   : 0;
  }

  // k rows of logits just written: to the host (from ws.logits), or counted on the device.
  Status deliver(int k, Run* r) {
    if (r->dev_out) {
      r->dev_row += k;
      return Status::ok();
    }
    return download(ws_->logits, k, r->logits);
  }

  Status download(const float* src, int k, std::vector<float>* logits) {
    const size_t V = size_t(c_->vocab_size), at = logits->size();
    logits->resize(at + size_t(k) * V);
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(logits->data() + at, src, size_t(k) * V * 4, cudaMemcpyDeviceToHost, stream_),
                       "logits download");
    return Status::ok();
  }

  cudaGraphExec_t& graph_for(int rows, const float* dst) {
    return graphs_[dst == ws_->logits ? 0 : 1][decode_graph_index(rows)];
  }

  // The graph of a `rows`-row decode pass (decode_graph_rows' values) writing logits to dst (ws.logits or a
  // dev_out), captured and instantiated on first use. Splits fixed for the graph's life: sized for the longest
  // context a session may reach.
  Status build_graph(int rows, float* dst) {
    cudaGraphExec_t& exec = graph_for(rows, dst);
    if (exec) return Status::ok();
    const std::string what = "decode: CUDA graph for " + std::to_string(rows) + " rows" +
                             (rows > kernels::kGemvMaxRows ? " (a padded bucket)" : "");
    if (alloc_fault(0, what.c_str()))
      return err(Code::OutOfMemory, what, ": cudaGraphInstantiate failed (allocation fault hook)");
    LayerPass lp;
    lp.rows = rows;
    lp.sms = sms_;
    lp.gemm_rows = gemm_rows();
    lp.launch = launch_;
    lp.full = attention_plan(*c_, sms_, rows, int(opt_->max_context), 0);
    lp.sliding = attention_plan(*c_, sms_, rows, int(opt_->max_context), c_->sliding_window);
    lp.decode_only = true;
    cudaGraph_t graph = nullptr;
    GEMMA4_T4_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
    LayerEncoder enc(*c_, *dw_, *ws_, blas_, lp);
    Status st = enc.encode();
    if (st) st = enc.head(0, rows, dst);
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (!st) {
      if (graph) cudaGraphDestroy(graph);
      return st;
    }
    GEMMA4_T4_CUDA_TRY(e, "graph capture");
    const cudaError_t ei = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ei != cudaSuccess) {
      exec = nullptr;
      cudaGetLastError();
      if (ei == cudaErrorMemoryAllocation)
        return err(Code::OutOfMemory, what, ": cudaGraphInstantiate failed: out of GPU memory");
      return cuda_status(ei, what + ": cudaGraphInstantiate");
    }
    return Status::ok();
  }

  Status ensure_seen(size_t n) {
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

  const ModelConfig* c_ = nullptr;
  const DeviceWeights* dw_ = nullptr;
  Workspace* ws_ = nullptr;
  const LoadOptions* opt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  kernels::Launch launch_;
  int sms_ = 40;
  int flash_groups_ = 0;  // bit gi: some layer folds 2^gi query heads per KV head
  PleStager ple_;
  std::unique_ptr<PersistentDecoder> persistent_;  // null: the per-kernel path serves decode passes too
  std::string persistent_why_;                     // why it is null
  int greedy_rows_ = 0;  // rows of ws.samp_out the last run()'s persistent step filled with greedy tokens
  cudaGraphExec_t graphs_[2][kDecodeGraphs] = {};  // [to ws.logits / to a dev_out][decode_graph_index(rows)]
  int* seen_dev_ = nullptr;                        // repetition-penalty ids, grown on demand
  size_t seen_cap_ = 0;
};

}  // namespace detail
}  // namespace gemma4_t4
