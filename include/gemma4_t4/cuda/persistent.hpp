// gemma4_t4 implementation part, CUDA backend: the persistent decode executor -- a decode pass of 1..16 rows
// as one cooperative launch of kernels/decode_step.cuh, which walks an instruction list built here once, at
// load, from the block description (block.hpp): the same gemma4_layer() the CPU and the per-kernel paths
// run, with Ops that emit instructions instead of computing.
//
// Where the per-kernel path launches a residual_norm, this one folds the residual into the next instruction's
// x (StepX: every block with items builds its x rows in shared memory). Per layer: QKV GEMV, attention (head
// norms, RoPE and the KV write fused in), o_proj, gate/up + GELU, down, PLE gate + GELU, per_layer_projection:
// 7 instructions (E2B: 35 x 7 + 4 = 249 per step), each waiting on a counter, not a kernel boundary.
//
// Buffers (workspace rows reused; R >= 64): h ping-pong in ws.h rows [0, 16) and [16, 32), the residual
// branch's projection in rows [32, 48); q / k / v in ws.proj_a / b / c; attention out in ws.q16; GELU
// products in ws.act16 (MLP) and ws.x16 (PLE); the PLE projection in ws.tok, the per-layer inputs in ws.ple;
// logits in ws.samp_logits, greedy tokens in ws.samp_out. One program serves every row count (the kernel
// reads rows and the attention splits from its parameters).
#pragma once

#include <string>
#include <vector>

#include "../../../kernels/decode_step.cuh"
#include "planner.hpp"
#include "step_trace.hpp"

namespace gemma4_t4 {
namespace detail {

class PersistentDecoder {
 public:
  // Why this model / options / device cannot use it, or "" when it can.
  static std::string unsupported(const ModelConfig& c, const DeviceWeights& w, const LoadOptions& opt) {
    if (opt.decode_path != DecodePath::Persistent) return "LoadOptions::decode_path is Kernels";
    if (c.hidden_size > kernels::kStepChunks * 128 || c.hidden_size % 128 != 0)
      return "hidden_size " + std::to_string(c.hidden_size) + " (the persistent kernel takes multiples of 128 up to " +
             std::to_string(kernels::kStepChunks * 128) + ")";
    if (w.lm8 || w.lm4) return "a quantized LM head (LoadOptions::lm_head)";
    if (!w.layers.empty() && !w.layers[0].q.wq)
      return "fp16 weights (their persistent step disagrees with the per-kernel path on models with KV-shared, "
             "double-wide layers: open, tests/gpu/test_persistent.cpp)";
    int group = 0;
    for (const LayerConfig& lc : c.layers) {
      if (lc.head_dim != 256 && lc.head_dim != 512) return "head_dim " + std::to_string(lc.head_dim);
      const int g = c.num_heads / lc.num_kv_heads;
      if (group && g != group) return "layers with different GQA groups";
      group = g;
    }
    if (kernels::gqa_group_pad(group) != 8) return "a GQA group of " + std::to_string(group) + " (instantiated: 5..8)";
    if (c.hidden_size_per_layer_input % 8 != 0) return "hidden_size_per_layer_input % 8 != 0";
    return "";
  }

  // The program and the launch shape. ple_type: how the PLE table's rows are stored (PleLocation::Host); stream:
  // the program's upload (the one run() takes, or any: the upload is complete when init returns).
  Status init(const ModelConfig& c, const DeviceWeights& w, Workspace& ws, int device, kernels::RawFloat ple_type,
              const LoadOptions::PersistentTuning& tune, cudaStream_t stream) {
    c_ = &c;
    w_ = &w;
    ws_ = &ws;
    ple_type_ = ple_type;
    if (tune.blocks_per_sm != 1 && tune.blocks_per_sm != 2)
      return err(Code::InvalidArgument, "LoadOptions::persistent.blocks_per_sm ", tune.blocks_per_sm, " (1 or 2)");
    mb_ = tune.blocks_per_sm;
    int sms = 0, smem_optin = 0;
    GEMMA4_T4_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "device attributes");
    GEMMA4_T4_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                       "device attributes");
    int l2 = 0;
    GEMMA4_T4_CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "device attributes");
    for (int nt = 0; nt < (mb_ == 2 ? 1 : 2); ++nt) {  // two blocks per SM: the 8-row instantiation alone
      const void* fn = reinterpret_cast<const void*>(kernel(nt + 1));
      const size_t smem = smem_bytes(nt + 1);
      if (smem > size_t(smem_optin)) {
        if (nt == 0) return err(Code::Unsupported, "persistent decode: ", smem, " B of shared memory per block");
        max_rows_ = kernels::kStepMaxRows / 2;
        break;
      }
      GEMMA4_T4_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                         "persistent decode: shared memory");
      int per_sm = 0;
      GEMMA4_T4_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kernels::kStepThreads, smem),
                         "persistent decode: occupancy");
      if (per_sm < 1) return err(Code::Unsupported, "persistent decode: the kernel does not fit an SM");
      grid_[nt] = std::min(per_sm, mb_) * sms;
      max_rows_ = (nt + 1) * 8;
    }
    // L2 prefetch ahead of a block's items: a share of half the L2 (T4: ~50 KB per block, H200: ~190 KB).
    prefetch_bytes_ =
        tune.prefetch_bytes >= 0 ? tune.prefetch_bytes : std::max(16 << 10, l2 / 2 / std::max(grid_[0], 1));
    GEMMA4_T4_TRY(build(stream));
    if (!tune.trace.empty()) GEMMA4_T4_TRY(trace_.init(mem_, tune.trace, count_, std::max(grid_[0], grid_[1])));
    return Status::ok();
  }

  int max_rows() const { return max_rows_; }
  int blocks_per_sm() const { return mb_; }
  int grid(int rows) const { return grid_[rows <= 8 ? 0 : 1]; }

  // One decode step of `rows` rows whose metadata is on the device (ws.dev) and whose PLE rows are at
  // ple_rows (as stored; null with the table on the GPU): logits into ws.samp_logits, greedy tokens into
  // ws.samp_out.
  Status run(int rows, int max_pos, const void* ple_rows, int sms, cudaStream_t stream) {
    const ModelConfig& c = *c_;
    GEMMA4_T4_CUDA_TRY(cudaMemsetAsync(best_, 0, counter_bytes_, stream), "persistent decode: counters");
    kernels::StepParams p;
    p.prog = prog_;
    p.count = count_;
    p.rows = rows;
    p.splits_sliding = splits(rows, max_pos + 1, c.sliding_window, sms);
    p.splits_full = splits(rows, max_pos + 1, 0, sms);
    p.ids = ws_->dev.ids;
    p.pos = ws_->dev.pos;
    p.seq = ws_->dev.seq;
    p.slots = ws_->dev.slots;
    p.kbase = ws_->dev.k;
    p.vbase = ws_->dev.v;
    p.layers = c.num_layers;
    p.done = done_;
    p.fault = fault_;
    p.best = best_;
    p.tokens = ws_->samp_out;
    p.eps = c.rms_norm_eps;
    p.prefetch_bytes = prefetch_bytes_;
    p.ple_rows = ple_rows;
    const int nt = rows <= 8 ? 1 : 2;
    if (trace_.dev) {
      GEMMA4_T4_CUDA_TRY(cudaMemsetAsync(trace_.dev, 0, trace_.bytes(), stream), "persistent decode: trace");
      p.trace = trace_.dev;
      trace_.grid = grid_[nt - 1];
    }
    void* args[] = {&p};
    GEMMA4_T4_CUDA_TRY(cudaLaunchCooperativeKernel(kernel(nt), dim3(unsigned(grid_[nt - 1])),
                                                   dim3(kernels::kStepThreads), args, smem_bytes(nt), stream),
                       "persistent decode step");
    GEMMA4_T4_CUDA_TRY(cudaMemcpyAsync(fault_host_, fault_, sizeof(unsigned), cudaMemcpyDeviceToHost, stream),
                       "persistent decode step");
    return Status::ok();
  }

  // After the stream has synchronised: whether the last run() gave up waiting (kernels::kStepWaitNs).
  Status check() {
    if (trace_.dev && *fault_host_ == 0) GEMMA4_T4_TRY(trace_.add());
    if (*fault_host_ == 0) return Status::ok();
    return err(Code::BackendError, "persistent decode step: a block waited more than ", kernels::kStepWaitNs / 1000000,
               " ms before instruction ", *fault_host_ - 1, " of ", count_,
               " (results void; decode passes now take the per-kernel path)");
  }

  // The block's steps (block.hpp), as instructions. A decode step wants every row's logits: keep_selected keeps
  // them all.
  Status keep_selected(int, bool* go) {
    *go = true;
    return Status::ok();
  }

  Status norm(int l, Norm which) {
    const DevLayer& d = w_->layers[l];
    next_x_ = take_x(which == Norm::Input ? d.in_norm : which == Norm::PreMlp ? d.pre_ff : nullptr);
    return Status::ok();
  }

  Status qkv(int l) {
    const LayerConfig& lc = c_->layers[l];
    const DevLayer& d = w_->layers[l];
    kernels::GemvArgs a;
    a.mat[0] = gemv_mat(d.q, ws_->proj_a);
    a.count = 1;
    if (!lc.kv_shared) {
      a.mat[1] = gemv_mat(d.k, ws_->proj_b);
      a.count = 2;
      if (!lc.k_eq_v) {
        a.mat[2] = gemv_mat(d.v, ws_->proj_c);
        a.count = 3;
      }
    }
    return gemv(a, a.count, kernels::GemvEpilogue::Store, d.q.in, next_x_, "q/k/v_proj");
  }

  Status heads(int) { return Status::ok(); }  // fused into attend()

  Status attend(int l) {
    const ModelConfig& c = *c_;
    const LayerConfig& lc = c.layers[l];
    const DevLayer& d = w_->layers[l];
    kernels::StepInstr ins;
    ins.op = kernels::StepOp::Attention;
    ins.head_dim = lc.head_dim;
    kernels::StepAttn& s = ins.attn;
    kernels::AttnArgs& a = s.a;
    a.kbase = ws_->dev.k;
    a.vbase = ws_->dev.v;
    a.capacity = ws_->dev.slots;
    a.seq = ws_->dev.seq;
    a.pos = ws_->dev.pos;
    a.layer = lc.kv_source;
    a.layers = c.num_layers;
    a.heads = c.num_heads;
    a.kv_heads = lc.num_kv_heads;
    a.window = lc.type == LayerType::Sliding ? c.sliding_window : 0;
    a.part_o = ws_->part_o;
    a.part_ml = ws_->part_ml;
    a.out = ws_->q16;
    a.counters = tickets_ + size_t(l) * kernels::kStepMaxRows * kv_heads_max_;
    s.q = ws_->proj_a;
    s.q_w = d.q_norm;
    s.inv_freq = d.inv_freq;
    if (!lc.kv_shared) {
      s.k = ws_->proj_b;
      s.v = lc.k_eq_v ? ws_->proj_b : ws_->proj_c;
      s.k_w = d.k_norm;
      s.own_layer = l;
    }
    prog_host_.push_back(ins);
    labels_.push_back(std::string("attention, ") + (a.window > 0 ? "sliding" : "full") +
                      (lc.kv_shared ? ", KV-shared" : ""));
    return Status::ok();
  }

  Status gate(int l, Branch b) {
    const DevLayer& d = w_->layers[l];
    kernels::GemvArgs a;
    if (b == Branch::Mlp) {
      a.mat[0] = gemv_mat(d.gate, nullptr);
      a.mat[1] = gemv_mat(d.up, nullptr);
      a.out16 = ws_->act16;
      a.ld16 = d.gate.out;
      return gemv(a, 2, kernels::GemvEpilogue::GeluMul, d.gate.in, next_x_, "gate/up_proj");
    }
    const int L = c_->num_layers, D = c_->hidden_size_per_layer_input;
    a.mat[0] = gemv_mat(d.ple_gate, nullptr);
    a.out16 = ws_->x16;
    a.ld16 = D;
    a.ple = ws_->ple;
    a.ple_ld = L * D;
    a.ple_off = l * D;
    return gemv(a, 1, kernels::GemvEpilogue::GeluPle, d.ple_gate.in, next_x_, "per_layer_input_gate");
  }

  Status residual(int l, Branch b) {
    const DevLayer& d = w_->layers[l];
    const DevLinear& w = b == Branch::Attention ? d.o : b == Branch::Mlp ? d.down : d.ple_proj;
    const half* x = b == Branch::Attention ? ws_->q16 : b == Branch::Mlp ? ws_->act16 : ws_->x16;
    kernels::GemvArgs a;
    a.mat[0] = gemv_mat(w, y_res_);
    a.x = x;
    kernels::StepX from_buffer;  // build = 0: x = a.x
    GEMMA4_T4_TRY(gemv(a, 1, kernels::GemvEpilogue::Store, w.in, from_buffer, "residual projection"));
    pending_y_ = y_res_;
    pending_w_ = b == Branch::Attention ? d.post_attn : b == Branch::Mlp ? d.post_ff : d.post_ple;
    pending_scalar_ = 1.f;
    return Status::ok();
  }

  Status scale(int l) {
    pending_scalar_ = w_->layers[l].scalar;
    return Status::ok();
  }

  PersistentDecoder() = default;
  ~PersistentDecoder() {
    trace_.write(labels_);
    cuda_free(Mem::Pinned, fault_host_);
  }
  PersistentDecoder(const PersistentDecoder&) = delete;
  PersistentDecoder& operator=(const PersistentDecoder&) = delete;

 private:
  // The instantiations: 8-row tiles (rows <= 8 / <= 16) of w4a16 bodies with GQA groups padded to 8 (E2B's;
  // unsupported() refuses the rest until an instantiation for them is worth its compile time).
  using StepKernel = void (*)(kernels::StepParams);
  StepKernel kernel(int nt) const {
    using kernels::decode_step_kernel;
    if (mb_ == 2) return &decode_step_kernel<1, kernels::kGemvW4, 8, 2>;
    return nt == 1 ? &decode_step_kernel<1, kernels::kGemvW4, 8> : &decode_step_kernel<2, kernels::kGemvW4, 8>;
  }
  size_t smem_bytes(int nt) const {
    const int H = c_->hidden_size;
    return nt == 1 ? kernels::decode_step_smem<1, 8>(H) : kernels::decode_step_smem<2, 8>(H);
  }

  // Key splits of one attention instruction: as many 32-key tiles per block as the kernel's grid fills,
  // never more than the fused merge takes (one pass over the splits' partials by the last block).
  int splits(int rows, int keys, int window, int sms) const {
    const int s = attention_splits(*c_, sms, rows, keys, window);
    int hd = 0, group = 1;
    for (const LayerConfig& lc : c_->layers)
      if ((lc.type == LayerType::Sliding) == (window > 0)) {
        hd = std::max(hd, lc.head_dim);
        group = std::max(group, c_->num_heads / lc.num_kv_heads);
      }
    return std::max(1, std::min(s, kernels::attention_fused_splits(group, hd ? hd : 512)));
  }

  // The x of the next Gemv: the residual stream with the pending branch folded in, then the norm `w` (null:
  // a copy). h moves to the other ping-pong buffer when a branch is folded.
  kernels::StepX take_x(const float* w) {
    kernels::StepX x;
    x.build = 1;
    x.w = w;
    if (!h_valid_) {  // the first x of the step: h = the token's embedding row
      x.embed = w_->embed16;
      x.embed_scale = float(std::sqrt(double(c_->hidden_size)));
      x.h_out = h_[0];
      h_cur_ = 0;
      h_valid_ = true;
      return x;
    }
    x.h_in = h_[h_cur_];
    if (pending_y_) {
      x.y = pending_y_;
      x.w_post = pending_w_;
      x.scalar = pending_scalar_;
      x.h_out = h_[h_cur_ ^ 1];
      h_cur_ ^= 1;
      pending_y_ = nullptr;
    }
    return x;
  }

  Status gemv(kernels::GemvArgs a, int nmats, kernels::GemvEpilogue e, int in, const kernels::StepX& x,
              const char* what) {
    a.n = kernels::kStepMaxRows;  // the shape checks; the kernel sets the launch's rows
    a.in = in;
    a.ldx = in + 8;
    unsigned blocks = 0;
    if (kernels::gemv_plan(a, nmats, e, !x.build, &blocks) != cudaSuccess || blocks == 0)
      return err(Code::Unsupported, "persistent decode: ", what, " (in ", in, ", out ", a.mat[0].out,
                 ") is not a shape the decode GEMV takes");
    if (x.build && in != c_->hidden_size)
      return err(Code::BackendError, "persistent decode: ", what, " builds x rows of ", in, " != hidden_size");
    kernels::StepInstr ins;
    ins.op = kernels::StepOp::Gemv;
    ins.items = int(blocks);
    ins.epilogue = e;
    ins.gemv = a;
    ins.x = x;
    prog_host_.push_back(ins);
    labels_.push_back(what);
    return Status::ok();
  }

  Status build(cudaStream_t stream) {
    const ModelConfig& c = *c_;
    const int H = c.hidden_size, L = c.num_layers, D = c.hidden_size_per_layer_input, V = c.vocab_size;
    kv_heads_max_ = 1;
    for (const LayerConfig& lc : c.layers) kv_heads_max_ = std::max(kv_heads_max_, lc.num_kv_heads);
    // Counters, zeroed before each step: best_ [16] u64, fault_, tickets_ [L][16][kv heads], done_
    // [instructions] (at most 2 + 7 L + 2).
    const size_t tickets = size_t(L) * kernels::kStepMaxRows * kv_heads_max_, max_count = size_t(8) * L + 8;
    counter_bytes_ = 16 * sizeof(unsigned long long) + (1 + tickets + max_count) * sizeof(unsigned);
    uint8_t* counters = nullptr;
    GEMMA4_T4_TRY(mem_.alloc(counter_bytes_, "persistent decode: counters", &counters));
    best_ = reinterpret_cast<unsigned long long*>(counters);
    fault_ = reinterpret_cast<unsigned*>(counters + 16 * sizeof(unsigned long long));
    tickets_ = fault_ + 1;
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, sizeof(unsigned), "persistent decode: fault flag", &fault_host_));
    *fault_host_ = 0;
    done_ = tickets_ + tickets;
    h_[0] = ws_->h;
    h_[1] = ws_->h + size_t(kernels::kStepMaxRows) * H;
    y_res_ = ws_->h + size_t(2) * kernels::kStepMaxRows * H;
    prog_host_.clear();
    labels_.clear();
    h_valid_ = false;
    pending_y_ = nullptr;
    if (D > 0) {  // per-layer inputs: projection of the embedding (x = half(h)), then the combine
      kernels::GemvArgs a;
      a.mat[0] = gemv_mat(w_->ple_model_proj, ws_->tok);
      GEMMA4_T4_TRY(gemv(a, 1, kernels::GemvEpilogue::Store, H, take_x(nullptr), "per_layer_model_projection"));
      kernels::StepInstr ins;
      ins.op = kernels::StepOp::PleCombine;
      ins.ple.proj = ws_->tok;
      ins.ple.table16 = w_->ple_table16;
      ins.ple.tok_type = ple_type_;
      ins.ple.w = w_->ple_norm;
      ins.ple.pscale = float(1.0 / std::sqrt(double(H)));
      ins.ple.tscale = float(std::sqrt(double(D)));
      ins.ple.mix = float(1.0 / std::sqrt(2.0));
      ins.ple.ple = ws_->ple;
      ins.ple.L = L;
      ins.ple.D = D;
      prog_host_.push_back(ins);
      labels_.push_back("PLE combine");
    }
    GEMMA4_T4_TRY(gemma4_layers(*this, c));
    {  // LM head: final norm of the folded residual, soft-capped logits, each row's argmax
      kernels::GemvArgs a;
      a.mat[0] = gemv_mat(DevLinear{V, H, w_->lm16, nullptr, nullptr}, ws_->samp_logits);
      a.softcap = c.final_logit_softcapping;
      GEMMA4_T4_TRY(gemv(a, 1, kernels::GemvEpilogue::Head, H, take_x(w_->final_norm), "LM head"));
      kernels::StepInstr ins;
      ins.op = kernels::StepOp::Tokens;
      ins.items = 1;
      prog_host_.push_back(ins);
      labels_.push_back("tokens");
    }
    count_ = int(prog_host_.size());
    if (size_t(count_) > max_count)
      return err(Code::BackendError, "persistent decode: ", count_, " instructions (counters for ", max_count, ")");
    GEMMA4_T4_TRY(mem_.alloc(prog_host_.size(), "persistent decode: program", &prog_));
    GEMMA4_T4_CUDA_TRY(upload_now(prog_, prog_host_.data(), prog_host_.size() * sizeof(kernels::StepInstr), stream),
                       "persistent decode: program upload");
    return Status::ok();
  }

  const ModelConfig* c_ = nullptr;
  const DeviceWeights* w_ = nullptr;
  Workspace* ws_ = nullptr;
  kernels::RawFloat ple_type_ = kernels::RawFloat::BF16;
  int grid_[2] = {0, 0};  // blocks for rows <= 8 / <= 16
  int mb_ = 1;            // blocks per SM (LoadOptions::PersistentTuning)
  int max_rows_ = 0;
  int prefetch_bytes_ = 0;
  int kv_heads_max_ = 1;
  DeviceMemory mem_;
  kernels::StepInstr* prog_ = nullptr;  // [count_] device copy of prog_host_
  int count_ = 0;
  std::vector<kernels::StepInstr> prog_host_;
  std::vector<std::string> labels_;  // [count_] what each instruction computes (the trace's rows)
  StepTrace trace_;
  size_t counter_bytes_ = 0;            // best_ + done_ + tickets_, zeroed before each step
  unsigned long long* best_ = nullptr;  // [16] packed argmax keys
  unsigned* done_ = nullptr;            // [count_] finished items per instruction
  unsigned* fault_ = nullptr;           // kernels::StepParams::fault
  unsigned* fault_host_ = nullptr;      // pinned copy, read after the stream synchronises
  unsigned* tickets_ = nullptr;         // [L][16][kv heads] attention merge tickets
  // program building (take_x / residual)
  float* h_[2] = {nullptr, nullptr};  // [16, H] fp32 ping-pong residual stream
  float* y_res_ = nullptr;            // [16, H] fp32 the residual branch's projection
  int h_cur_ = 0;
  bool h_valid_ = false;
  const float* pending_y_ = nullptr;
  const float* pending_w_ = nullptr;
  float pending_scalar_ = 1.f;
  kernels::StepX next_x_;
};

}  // namespace detail
}  // namespace gemma4_t4
