// gemma4_t4 implementation part, CUDA backend: the Gemma 4 block as kernel launches (block.hpp's Ops), for
// one pass of `rows` rows whose metadata is on the device. Only kernel launches and cuBLAS calls: capturable
// into a CUDA graph.
//
// Passes of <= 32 rows ("decode") use the tensor-core GEMVs with fused epilogues (kernels/gemv.cuh); larger
// passes use cuBLAS (fp16 GEMM, fp32 accumulation; w4a16 dequantised to fp16 first) and the separate
// element-wise kernels. Per layer:
//   x16 = rmsnorm(h)                                  [rows, H] fp16 -- a launch of its own only in layer 0;
//                                                     later layers get it from the previous layer's last
//                                                     residual_norm (NextNorm::Norm, bit-identical)
//   q/k/v = x16 W^T                                   decode: ONE multi-matrix GEMV (fp32 proj_a/b/c); larger
//                                                     passes: ONE matmul over [Wq; Wk; Wv] (one allocation)
//   q -> norm + RoPE -> q16; k, v -> norm (+ RoPE) -> the session caches at their positions: ONE launch
//   att16 = attention(q16, caches)                    decode: split over keys (flash-decoding), merged by
//                                                     the last split block; passes with a prompt chunk:
//                                                     tiled flash attention on the tensor cores
//                                                     decode passes of <= 2 rows: the norms, RoPE and the
//                                                     cache write fold into the attention launch (heads
//                                                     mode, kernels/attention.cuh): ONE launch for both
//   h += norm(o_proj(att16)), x16 = pre_ff_norm(h)    one residual_norm
//   act16 = gelu_tanh(x16 Wg^T) * (x16 Wu^T)          decode: ONE GEMV with the GELU epilogue, fp16 out; w4a16
//                                                     passes of 33..256 rows: ONE int4 GEMM with it; other
//                                                     passes: ONE matmul over [Wg; Wu], then gelu_mul
//   h += norm(down(act16)) [, x16 = half(h)]          PLE only: the copy feeds the gate
//   PLE: act16 = gelu_tanh(x16 Wpg^T) * ple[l]        decode: ONE GEMV with the PLE epilogue; w4a16 passes of <= 16
//        h = (h + norm(ple_proj(act16))) * scalar,    rows: ONE launch for the gate and the projection (ple_fused:
//        x16 = next layer's input norm(h)             act in shared memory, 32-column slices the norm adds)
// The folding is the residual() / norm() / scale() contract below: residual() launches the projection and
// leaves its norm-and-add pending; the next norm() (or scale(), or finish()) launches it as one residual_norm
// with that norm (or the layer scalar) folded in. 10 decode launches per layer (11 in layer 0; +1 on full
// layers whose attention splits need the separate merge; 11 where the heads do not fold: passes of 3+ rows,
// and head dims or groups attention does not take); one fewer where the PLE branch is one launch (ple_fused).
// A pass that wants fewer rows' logits than it holds (a prompt chunk: its last row or none) goes on with those
// rows only, as a pass of their own, once the last layer that writes a cache has written it (keep_selected;
// block.hpp): on E2B the other rows stop after layer 14's K/V, before the KV-shared layers 15..34.
#pragma once

#include <cublas_v2.h>

#include <type_traits>

#include "../../../kernels/attention.cuh"
#include "../../../kernels/elementwise.cuh"
#include "../../../kernels/flash_attention.cuh"
#include "../../../kernels/gemm_w4.cuh"
#include "../../../kernels/gemv.cuh"
#include "../../../kernels/rmsnorm.cuh"
#include "../../../kernels/rope_kv.cuh"
#include "../sanitizer.hpp"
#include "planner.hpp"

namespace gemma4_t4 {
namespace detail {

// What one pass's layers need beyond the weights and the workspace.
struct LayerPass {
  int rows = 0;
  AttnPlan sliding, full;             // decode attention: key splits per row, head slices (planner's attention_plan)
  bool decode_only = false;           // one row per session: each row's own key is its only new one (late_keys)
  int flash_tiles[4] = {0, 0, 0, 0};  // prefill attention tiles per folded group size; 0: split kernel
  int sms = 1;                        // the GPU's SMs (the w4a16 GEMM's and the residual GEMVs' split-K)
  int gemm_rows = 0;  // passes of up to this many rows take the w4a16 GEMM where a linear has its layout (W4Matmul)
  kernels::Launch launch;
  // Past kv_keep_layer's K/V (block.hpp) only the selected rows go on: keep of them (0: the pass stops there), with
  // these attention plans; -1: every row (every row's logits are wanted).
  int keep = -1;
  AttnPlan keep_sliding, keep_full;
};

class LayerEncoder {
 public:
  LayerEncoder(const ModelConfig& c, const DeviceWeights& w, const Workspace& ws, cublasHandle_t blas,
               const LayerPass& pass)
      : c_(c), w_(w), ws_(ws), blas_(blas), p_(pass), ln_(pass.launch) {}

  // Embedding and per-layer inputs, every layer, the last residual. ple rows in ws.tok when the table is on
  // the host (widened by the planner's stager), gathered here when it is on the GPU.
  Status encode() {
    const int H = c_.hidden_size, L = c_.num_layers, D = c_.hidden_size_per_layer_input, rows = p_.rows;
    GEMMA4_T4_CUDA_TRY(kernels::launch_embed(w_.embed16, ws_.dev.ids, rows, H, float(std::sqrt(double(H))), ws_.h, ln_),
                       "embed");
    if (D > 0) {
      if (w_.ple_table16)
        GEMMA4_T4_CUDA_TRY(kernels::launch_embed(w_.ple_table16, ws_.dev.ids, rows, L * D, 1.f, ws_.tok, ln_),
                           "PLE rows");
      GEMMA4_T4_CUDA_TRY(kernels::launch_to_half(ws_.h, size_t(rows) * H, ws_.x16, ln_), "PLE input");
      GEMMA4_T4_TRY(mm(w_.ple_model_proj, ws_.x16, ws_.proj_a, "per_layer_model_projection"));
      GEMMA4_T4_CUDA_TRY(kernels::launch_ple_combine(ws_.proj_a, ws_.tok, w_.ple_norm, rows, L, D,
                                                     float(1.0 / std::sqrt(double(H))), float(std::sqrt(double(D))),
                                                     float(1.0 / std::sqrt(2.0)), c_.rms_norm_eps, ws_.ple, ln_),
                         "PLE combine");
    }
    GEMMA4_T4_TRY(gemma4_layers(*this, c_));
    return flush(kernels::NextNorm::None, nullptr);  // the head normalises the selected rows itself
  }

  // rmsnorm + LM head + soft-cap for selected rows [first, first + k) (k <= kMaxSeqs) into dst [k, vocab]. The
  // GEMV up to 32 rows; more: the fp16 head in one cuBLAS GEMM (read once), a quantized head 32 rows at a time.
  Status head(int first, int k, float* dst) const {
    const int H = c_.hidden_size, V = c_.vocab_size;
    if (k > kMaxSeqs) return err(Code::InvalidArgument, "LM head: ", k, " rows at once (at most ", kMaxSeqs, ")");
    const float* h = sel_ ? ws_.h : ws_.h + size_t(first) * H;  // keep_selected kept the selected rows, in order
    GEMMA4_T4_CUDA_TRY(kernels::launch_rmsnorm(h, H, sel_ ? sel_ + first : nullptr, w_.final_norm, k, H,
                                               c_.rms_norm_eps, ws_.head16, ln_),
                       "final norm");
    if (w_.lm16 && k > kernels::kGemvMaxRows)  // the fp16 head read once for every row
      GEMMA4_T4_TRY(gemm16(w_.lm16, V, H, ws_.head16, k, dst, "LM head"));
    else
      GEMMA4_T4_TRY(head_gemv(k, dst));
    GEMMA4_T4_CUDA_TRY(kernels::launch_softcap(dst, size_t(k) * V, c_.final_logit_softcapping, ln_), "softcap");
    return Status::ok();
  }

  // The head's GEMVs over head16's first k rows, 32 at a time.
  Status head_gemv(int k, float* dst) const {
    const int H = c_.hidden_size, V = c_.vocab_size;
    for (int b = 0; b < k; b += kernels::kGemvMaxRows) {
      const int n = std::min(kernels::kGemvMaxRows, k - b);
      const half* x = ws_.head16 + size_t(b) * H;
      float* y = dst + size_t(b) * V;
      if (w_.lm8)
        GEMMA4_T4_CUDA_TRY(kernels::launch_gemv_w8(w_.lm8, w_.lm8_scale, x, n, V, H, y, V, ln_), "LM head (int8)");
      else if (w_.lm4)
        GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(nullptr, w_.lm4, w_.lm4_scale, x, n, V, H, y, V, ln_),
                           "LM head (int4)");
      else
        GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(w_.lm16, nullptr, nullptr, x, n, V, H, y, V, ln_), "LM head");
    }
    return Status::ok();
  }

  // ---- the block's steps (block.hpp) ----

  // After layer l's K/V (block.hpp kv_keep_layer): the selected rows of h, of the per-layer inputs and of layer l's
  // queries become rows 0..keep-1 (h through proj_c, free between a layer's heads and its attention; the inputs into
  // tok, free after encode()'s PLE combine; q16 through x16, the attention's output buffer), and the pass goes on
  // with their metadata and attention plans (split kernel, no flash tiles: one row per session from here).
  Status keep_selected(int l, bool* go) {
    *go = p_.keep != 0;
    if (p_.keep < 0 || !*go) return Status::ok();
    const int H = c_.hidden_size, LD = c_.num_layers * c_.hidden_size_per_layer_input, k = p_.keep;
    const int QW = c_.num_heads * c_.layers[l].head_dim;
    GEMMA4_T4_CUDA_TRY(kernels::launch_gather_rows(ws_.h, H, ws_.dev.sel, k, H, ws_.proj_c, H, ln_), "kept rows");
    GEMMA4_T4_CUDA_TRY(kernels::launch_gather_rows<float>(ws_.proj_c, H, nullptr, k, H, ws_.h, H, ln_), "kept rows");
    GEMMA4_T4_CUDA_TRY(kernels::launch_gather_rows(ws_.q16, QW, ws_.dev.sel, k, QW, ws_.x16, QW, ln_), "kept rows");
    GEMMA4_T4_CUDA_TRY(kernels::launch_gather_rows<half>(ws_.x16, QW, nullptr, k, QW, ws_.q16, QW, ln_), "kept rows");
    if (LD > 0) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_gather_rows(ws_.ple, LD, ws_.dev.sel, k, LD, ws_.tok, LD, ln_),
                         "kept per-layer inputs");
      ple_ = ws_.tok;
    }
    seq_ = ws_.dev.sel_seq;
    pos_ = ws_.dev.sel_pos;
    sel_ = nullptr;
    p_.rows = k;
    p_.sliding = p_.keep_sliding;
    p_.full = p_.keep_full;
    p_.decode_only = false;
    for (int& t : p_.flash_tiles) t = 0;
    p_.keep = -1;
    return Status::ok();
  }

  Status norm(int l, Norm which) {
    const float* w = which == Norm::Input    ? w_.layers[l].in_norm
                     : which == Norm::PreMlp ? w_.layers[l].pre_ff
                                             : nullptr;
    if (pending_.y) return flush(w ? kernels::NextNorm::Norm : kernels::NextNorm::Copy, w);
    // layer 0's input: nothing to fold into
    GEMMA4_T4_CUDA_TRY(kernels::launch_rmsnorm(ws_.h, c_.hidden_size, nullptr, w, p_.rows, c_.hidden_size,
                                               c_.rms_norm_eps, ws_.x16, ln_),
                       "input norm");
    return Status::ok();
  }

  Status qkv(int l) {
    const LayerConfig& lc = c_.layers[l];
    const DevLayer& d = w_.layers[l];
    const int qw = c_.num_heads * lc.head_dim, kvw = lc.num_kv_heads * lc.head_dim;
    qkv_ = Qkv{ws_.proj_a, ws_.proj_b, lc.k_eq_v ? ws_.proj_b : ws_.proj_c, qw, kvw};
    Parts r;
    if (lc.kv_shared) {
      GEMMA4_T4_TRY(mm_parts(d.q, ws_.x16, ws_.proj_a, "q_proj", &r));
      qkv_ = Qkv{r.y, nullptr, nullptr, qw, kvw, r.n, r.ld};
      return Status::ok();
    }
    if (p_.rows > kernels::kGemvMaxRows && d.qkv.out) {  // one matmul: [n, q | k | v] in proj_a and proj_b's memory
      GEMMA4_T4_TRY(mm_parts(d.qkv, ws_.x16, ws_.proj_a, "q/k/v_proj", &r));
      qkv_ = Qkv{r.y, r.y + qw, r.y + qw + (lc.k_eq_v ? 0 : kvw), d.qkv.out, d.qkv.out, r.n, r.ld};
      return Status::ok();
    }
    const DevLinear* mats[3] = {&d.q, &d.k, &d.v};
    float* const ys[3] = {ws_.proj_a, ws_.proj_b, ws_.proj_c};
    return mm_multi(mats, ys, lc.k_eq_v ? 2 : 3, ws_.x16, "q/k/v_proj");
  }

  // q -> q16; k, v -> the caches (one launch). k_eq_v: V is the raw k_proj output. Where they fold into the
  // attention launch (heads_fold), nothing here: attend(l) launches both.
  Status heads(int l) {
    if (heads_fold(l)) {
      folded_ = l;
      return Status::ok();
    }
    const LayerConfig& lc = c_.layers[l];
    const DevLayer& d = w_.layers[l];
    const int hd = lc.head_dim, kvh = lc.num_kv_heads;
    kernels::HeadNormTarget hn[3];
    hn[0].in = qkv_.q;
    hn[0].ld_in = qkv_.ld_q;
    hn[0].heads = c_.num_heads;
    hn[0].w = d.q_norm;
    hn[0].inv_freq = d.inv_freq;
    hn[0].out = ws_.q16;
    if (!lc.kv_shared) {
      kernels::KvTarget kt;
      kt.capacity = ws_.dev.slots;
      kt.seq = seq_;
      kt.layer = l;
      kt.layers = c_.num_layers;
      hn[1].in = qkv_.k;
      hn[1].ld_in = qkv_.ld_kv;
      hn[1].heads = kvh;
      hn[1].w = d.k_norm;
      hn[1].inv_freq = d.inv_freq;
      hn[1].kv = kt;
      hn[1].kv.base = ws_.dev.k;
      hn[2].in = qkv_.v;
      hn[2].ld_in = qkv_.ld_kv;
      hn[2].heads = kvh;  // no weight, no RoPE
      hn[2].kv = kt;
      hn[2].kv.base = ws_.dev.v;
    }
    GEMMA4_T4_CUDA_TRY(kernels::launch_head_norm_rope_multi(hn, lc.kv_shared ? 1 : 3, p_.rows, hd, c_.rms_norm_eps,
                                                            pos_, ln_, qkv_.parts, qkv_.part_ld),
                       "q/k/v norm + RoPE");
    return Status::ok();
  }

  Status attend(int l) {
    const LayerConfig& lc = c_.layers[l];
    const bool fold = folded_ == l;
    folded_ = -1;
    kernels::AttnArgs a;
    a.q = ws_.q16;
    a.kbase = ws_.dev.k;
    a.vbase = ws_.dev.v;
    a.capacity = ws_.dev.slots;
    a.seq = seq_;
    a.pos = pos_;
    a.layer = lc.kv_source;
    a.layers = c_.num_layers;
    a.rows = p_.rows;
    a.heads = c_.num_heads;
    a.kv_heads = lc.num_kv_heads;
    a.window = lc.type == LayerType::Sliding ? c_.sliding_window : 0;
    const AttnPlan& plan = a.window ? p_.sliding : p_.full;
    a.splits = plan.splits;
    a.head_split = plan.head_split;
    a.late_keys = p_.decode_only ? (lc.kv_shared ? 0 : 1) : -1;
    a.part_o = ws_.part_o;
    a.part_ml = ws_.part_ml;
    a.out = ws_.x16;
    a.counters = ws_.attn_counters;
    const int group = c_.num_heads / lc.num_kv_heads, gi = kernels::gqa_group_index(group);
    if (fold) {  // q, k and v where qkv() left them: the GEMV's packed rows (heads_fold's passes are decode passes)
      const DevLayer& d = w_.layers[l];
      kernels::AttnHeads hn;
      hn.q = qkv_.q;
      hn.q_w = d.q_norm;
      hn.inv_freq = d.inv_freq;
      if (!lc.kv_shared) {
        hn.k = qkv_.k;
        hn.v = qkv_.v;
        hn.k_w = d.k_norm;
      }
      hn.eps = c_.rms_norm_eps;
      GEMMA4_T4_CUDA_TRY(kernels::launch_attention_heads(a, hn, lc.head_dim, ln_), "q/k/v norm + RoPE + attention");
    } else if (flash(l)) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_flash_attention(a, ws_.tiles + size_t(gi) * ws_.max_rows, p_.flash_tiles[gi],
                                                         lc.head_dim, ln_),
                         "attention (flash)");
    } else {
      GEMMA4_T4_CUDA_TRY(kernels::launch_attention(a, lc.head_dim, ln_), "attention");
    }
    return Status::ok();
  }

  // Mlp: act = gelu(gate x) * up x; Ple: act = gelu(ple_gate x) * ple[l]. Decode: one GEMV with the epilogue,
  // into act16; w4a16 passes of the GEMM's 33..256 rows (Mlp): one int4 GEMM launch with the GELU epilogue
  // (kernels::launch_gemm_w4_glu); other passes: one matmul over gate and up where they are stored as one
  // (DevLayer::gate_up), then the element-wise kernel into x16.
  Status gate(int l, Branch b) {
    const DevLayer& d = w_.layers[l];
    const bool decode = p_.rows <= kernels::kGemvMaxRows;
    if (b == Branch::Mlp) {
      if (decode && same_layout(d.gate, d.up)) {
        GEMMA4_T4_CUDA_TRY(
            kernels::launch_gemv_gelu_mul(gemv_mat(d.gate, nullptr), gemv_mat(d.up, nullptr), ws_.x16, p_.rows,
                                          c_.hidden_size, ws_.act16, c_.layers[l].intermediate_size, ln_),
            "gate/up_proj + GELU");
        act_ = ws_.act16;
        return Status::ok();
      }
      const int n = p_.rows, I = c_.layers[l].intermediate_size;
      if (d.gate.wp && d.up.wp && n <= p_.gemm_rows && n <= kGluMaxRows) {
        // the w4a16 GEMM's rows: gate, up and the GELU product in one launch, the act as fp16 in proj_a's memory
        half* act = reinterpret_cast<half*>(ws_.proj_a);
        kernels::GemmW4GluArgs a;
        a.x = ws_.x16, a.ldx = c_.hidden_size, a.m = n, a.n = I, a.k = c_.hidden_size;
        a.wp[0] = d.gate.wp, a.sp[0] = d.gate.sp, a.wp[1] = d.up.wp, a.sp[1] = d.up.sp;
        a.out = act, a.ld16 = I;
        GEMMA4_T4_CUDA_TRY(kernels::launch_gemm_w4_glu(a, ln_), "gate/up_proj + GELU");
        act_ = act;
        return Status::ok();
      }
      // one matmul over gate and up ([n, 2 I], gate's outputs then up's in every row), then the GELU product. Through
      // cuBLAS its outputs are fp16: half the bytes of fp32 to write, and to read again for the product (prefill's
      // gelu_mul was 10% of a 4096-token TTFT, bench/RESULTS.md 2026-12-03 (d)); values past fp16 are clamped there
      if (d.gate_up.out)
        return via_cublas(d.gate_up) ? gate_up_joint(d.gate_up, reinterpret_cast<half*>(ws_.proj_a), I)
                                     : gate_up_joint(d.gate_up, ws_.proj_a, I);
      GEMMA4_T4_TRY(mm(d.gate, ws_.x16, ws_.proj_a, "gate_proj"));
      GEMMA4_T4_TRY(mm(d.up, ws_.x16, ws_.proj_b, "up_proj"));
      GEMMA4_T4_CUDA_TRY(kernels::launch_gelu_mul(ws_.proj_a, ws_.proj_b,
                                                  size_t(p_.rows) * c_.layers[l].intermediate_size, ws_.x16, ln_),
                         "gelu");
      act_ = ws_.x16;
      return Status::ok();
    }
    const int L = c_.num_layers, D = c_.hidden_size_per_layer_input;
    if (decode && ple_fused(d)) {  // the gate and the projection in one launch, its parts left to residual()
      GEMMA4_T4_CUDA_TRY(kernels::launch_ple_fused(gemv_mat(d.ple_gate, nullptr), gemv_mat(d.ple_proj, nullptr),
                                                   ws_.x16, p_.rows, c_.hidden_size, ple_, L, l, ws_.gemv_parts,
                                                   size_t(kernels::kGemvMaxRows) * c_.hidden_size, ln_),
                         "per_layer_input_gate + GELU + per_layer_projection");
      ple_parts_ = kernels::ple_fused_parts(D);
      return Status::ok();
    }
    if (decode) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv_gelu_ple(gemv_mat(d.ple_gate, nullptr), ws_.x16, p_.rows, c_.hidden_size,
                                                       ple_, L, l, ws_.act16, ln_),
                         "per_layer_input_gate + GELU");
      act_ = ws_.act16;
      return Status::ok();
    }
    Parts r;
    GEMMA4_T4_TRY(mm_parts(d.ple_gate, ws_.x16, ws_.proj_a, "per_layer_input_gate", &r));
    GEMMA4_T4_CUDA_TRY(kernels::launch_ple_gate(r.y, ple_, p_.rows, L, D, l, ws_.x16, ln_, r.n, r.ld), "PLE gate");
    act_ = ws_.x16;
    return Status::ok();
  }

  // y = proj(input); h += norm(y) is left pending for the next norm() (or scale()) to fold.
  Status residual(int l, Branch b) {
    const DevLayer& d = w_.layers[l];
    if (b == Branch::Attention) return project(d.o, ws_.x16, ws_.proj_a, "o_proj", d.post_attn, "post-attention norm");
    if (b == Branch::Mlp) return project(d.down, act_, ws_.proj_c, "down_proj", d.post_ff, "post-MLP norm");
    if (ple_parts_ > 0) {  // gate(Ple) launched the projection too (ple_fused): its slices' parts
      const size_t ld = size_t(kernels::kGemvMaxRows) * c_.hidden_size;
      pending_ = Pending{ws_.gemv_parts, d.post_ple, 1.f, "PLE norm", ple_parts_, ld};
      ple_parts_ = 0;
      return Status::ok();
    }
    return project(d.ple_proj, act_, ws_.proj_c, "per_layer_projection", d.post_ple, "PLE norm");
  }

  // h *= scalar: folded into the pending residual (residual_norm computes (h + norm(y) w) * scalar).
  Status scale(int l) {
    if (!pending_.y) return err(Code::BackendError, "CUDA layer encoder: layer ", l, " scales without a residual");
    pending_.scalar = w_.layers[l].scalar;
    return Status::ok();
  }

 private:
  // Where qkv() left q, k and v ([rows, ld] fp32 each; v is k's with k_eq_v) for heads().
  struct Qkv {
    const float *q = nullptr, *k = nullptr, *v = nullptr;
    int ld_q = 0, ld_kv = 0;
    // a split-K GEMM's partial tiles (mm_parts): q, k and v each the sum of `parts` arrays, part_ld floats apart
    int parts = 1;
    size_t part_ld = 0;
  };

  struct Pending {
    const float* y = nullptr;  // [rows, H] fp32 projection output
    const float* w = nullptr;  // [H] its norm's weight
    float scalar = 1.f;
    const char* what = "";
    int parts = 1;  // a k-split GEMV's parts to add (y .. y + (parts - 1) part_ld)
    size_t part_ld = 0;
  };

  // y = x W^T of a residual projection, its norm-and-add left pending. A decode GEMV whose row tiles leave the GPU
  // short of blocks (o_proj, down_proj: 96 on an H200's 132 SMs) splits its k-tiles over blocks
  // (kernels::gemv_store_splits): the parts go to ws.gemv_parts, and the residual norm adds them in part order. So
  // does a split-K int4 GEMM (o_proj, down_proj at 33..256 rows): its partial tiles stay in ws.gemm_part for the
  // residual norm to add in split order, the sums its reduce kernel would have made (one launch fewer).
  Status project(const DevLinear& w, const half* x, float* y, const char* what, const float* norm_w,
                 const char* norm_what) {
    const int n = p_.rows, H = c_.hidden_size;
    const int parts =
        n <= kernels::kGemvMaxRows && w.out == H
            ? kernels::gemv_store_splits(w.out, w.in, w.w16 ? kernels::kGemvF16 : kernels::kGemvW4, p_.sms)
            : 1;
    if (parts > 1) {
      const size_t ld = size_t(kernels::kGemvMaxRows) * H;
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(w.w16, w.wq, w.s16, x, n, w.out, w.in, ws_.gemv_parts, H, ln_, parts, ld),
                         what);
      pending_ = Pending{ws_.gemv_parts, norm_w, 1.f, norm_what, parts, ld};
      return Status::ok();
    }
    Parts r;
    GEMMA4_T4_TRY(mm_parts(w, x, y, what, &r));
    pending_ = Pending{r.y, norm_w, 1.f, norm_what, r.n, r.ld};
    return Status::ok();
  }

  // The pending residual as one residual_norm, with the next norm (into x16) folded in.
  Status flush(kernels::NextNorm next, const float* w_next) {
    if (!pending_.y) return Status::ok();
    const Pending p = pending_;
    pending_ = Pending();
    GEMMA4_T4_CUDA_TRY(kernels::launch_residual_norm(ws_.h, p.y, p.w, p_.rows, c_.hidden_size, c_.rms_norm_eps,
                                                     p.scalar, next, w_next, ws_.x16, ln_, p.parts, p.part_ld),
                       p.what);
    return Status::ok();
  }

  // Whether layer l's attention runs as flash attention (passes with a prompt chunk, tile tables uploaded).
  bool flash(int l) const {
    const LayerConfig& lc = c_.layers[l];
    const int group = c_.num_heads / lc.num_kv_heads;
    return p_.flash_tiles[kernels::gqa_group_index(group)] > 0 &&
           kernels::flash_attention_supported(lc.head_dim, group);
  }

  // Whether layer l's head norms + RoPE + KV write fold into its attention launch (kernels::launch_attention_heads,
  // bit-identical to heads() then attend()): decode passes (one row per session, each row's own key the only new
  // one: late_keys) that keep every row (keep_selected comes between the two) of <= kHeadsFoldRows rows, on the
  // split kernel, for head dims and groups it takes; a layer with a cache of its own writes the cache it reads.
  // Measured (H200, E2B w4a16, bench/RESULTS.md 2026-12-05): folded at every decode pass up to 32 rows, +2.9% at one
  // session but -2.6% at 8 and -5.3% at 16, where each attention block's own q/k norms and RoPE cost more than the
  // launch they save; past 32 rows a pass may be a bucket whose padding rows share one cache slot, and the heads mode
  // needs one writer per slot.
  static constexpr int kHeadsFoldRows = 2;
  bool heads_fold(int l) const {
    const LayerConfig& lc = c_.layers[l];
    return p_.decode_only && p_.keep < 0 && p_.rows <= kHeadsFoldRows && qkv_.parts == 1 && !flash(l) &&
           kernels::attention_supported(lc.head_dim, c_.num_heads / lc.num_kv_heads) &&
           (lc.kv_shared || lc.kv_source == l);
  }

  // Whether a decode pass's PLE branch runs as one launch (kernels::launch_ple_fused): passes of <= 16 rows with
  // w4a16 weights, the gate [D, H] and the projection [H, D] in one layout, D in its slices, and ws.gemv_parts holding
  // D / 32 parts. Measured (H100, E2B, quick_bench, bench/RESULTS.md 2026-12-06 (c)): w4a16 +2.1 / +2.7 / +3.0% at 1 /
  // 8 / 16 sessions (3 rounds; +1.0 / +0.8 / +1.6% in another lease), none at 32 (the two-halves form); fp16 weights
  // lose 1-2.5% at 1..32 sessions (a block's slice of the gate is 96 KiB of fp16 against 27 KiB of int4), so they keep
  // the two launches.
  static constexpr int kPleFusedRows = 16;
  bool ple_fused(const DevLayer& d) const {
    const int D = c_.hidden_size_per_layer_input, H = c_.hidden_size;
    return p_.rows <= kPleFusedRows && d.ple_gate.wq && d.ple_proj.wq && kernels::ple_fused_shape(D) &&
           kernels::ple_fused_parts(D) <= ws_.gemv_part_sets && d.ple_gate.out == D && d.ple_gate.in == H &&
           d.ple_proj.out == H && d.ple_proj.in == D;
  }

  static constexpr int kGluMaxRows = 256;  // the fused gate/up GEMM's rows (its 64-row tile's range, gemm_w4.cuh)

  static bool same_layout(const DevLinear& a, const DevLinear& b) { return (a.w16 == nullptr) == (b.w16 == nullptr); }

  // Whether mm() runs w through cuBLAS in this pass: past the GEMV's rows, unless the w4a16 GEMM takes it.
  bool via_cublas(const DevLinear& w) const {
    return p_.rows > kernels::kGemvMaxRows && !(w.wp && p_.rows <= p_.gemm_rows);
  }

  // The joint gate/up matmul into gu ([n, 2 I]: fp16 through cuBLAS, where via_cublas; fp32 through mm() otherwise),
  // then the GELU product into x16.
  template <typename T>
  Status gate_up_joint(const DevLinear& w, T* gu, int I) {
    if constexpr (std::is_same<T, half>::value)
      GEMMA4_T4_TRY(mm_cublas(w, ws_.x16, gu, "gate/up_proj"));
    else
      GEMMA4_T4_TRY(mm(w, ws_.x16, gu, "gate/up_proj"));
    GEMMA4_T4_CUDA_TRY(kernels::launch_gelu_mul_rows(gu, gu + I, size_t(2) * I, p_.rows, I, ws_.x16, ln_), "gelu");
    act_ = ws_.x16;
    return Status::ok();
  }

  // y = x W^T for the pass's rows: the GEMV for <= 32 rows, else the w4a16 GEMM (W4Matmul::TensorCore) or cuBLAS
  // (w4a16 dequantised first).
  Status mm(const DevLinear& w, const half* x, float* y, const char* what) const {
    const int n = p_.rows;
    if (n <= kernels::kGemvMaxRows) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv(w.w16, w.wq, w.s16, x, n, w.out, w.in, y, w.out, ln_), what);
      return Status::ok();
    }
    if (!via_cublas(w)) {  // W4Matmul: the int4 weights straight into the tensor cores (gemm_w4.cuh)
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemm_w4(gemm_w4_args(w, x, y), ln_), what);
      return Status::ok();
    }
    return mm_cublas(w, x, y, what);
  }

  // Where mm_parts left a product: y, or the sum of n arrays at y + p ld (a split-K int4 GEMM's partial tiles).
  struct Parts {
    float* y = nullptr;
    int n = 1;
    size_t ld = 0;
  };

  // mm() for a consumer that adds a split-K int4 GEMM's partial tiles itself, in split order (residual_norm,
  // head_norm_rope, ple_gate: the sums the GEMM's reduce kernel would have written, one launch fewer): the tiles stay
  // in ws.gemm_part ([splits][rows][w.out]); any other product goes to y as mm() writes it.
  Status mm_parts(const DevLinear& w, const half* x, float* y, const char* what, Parts* out) const {
    if (p_.rows > kernels::kGemvMaxRows && !via_cublas(w)) {
      kernels::GemmW4Args a = gemm_w4_args(w, x, y);
      a.keep_parts = a.splits > 1;
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemm_w4(a, ln_), what);
      *out = a.keep_parts ? Parts{ws_.gemm_part, a.splits, size_t(p_.rows) * size_t(w.out)} : Parts{y};
      return Status::ok();
    }
    *out = Parts{y};
    return mm(w, x, y, what);
  }

  // The int4 GEMM's arguments for y [rows, w.out] = x W^T, split-K by the shape (partials in ws.gemm_part).
  kernels::GemmW4Args gemm_w4_args(const DevLinear& w, const half* x, float* y) const {
    kernels::GemmW4Args a;
    a.x = x, a.ldx = w.in, a.m = p_.rows, a.n = w.out, a.k = w.in;
    a.wp = w.wp, a.sp = w.sp;
    a.y = y, a.ldy = w.out;
    a.splits = kernels::gemm_w4_splits(p_.rows, w.out, w.in, p_.sms, ws_.gemm_part ? kGemmPartFloats : 0);
    a.part = ws_.gemm_part;
    return a;
  }

  // y = x W^T through cuBLAS (w4a16 dequantised to fp16 first), y fp32 or fp16.
  template <typename T>
  Status mm_cublas(const DevLinear& w, const half* x, T* y, const char* what) const {
    const half* W = w.w16;
    if (!W) {
      GEMMA4_T4_CUDA_TRY(kernels::launch_dequant_w4(w.wq, w.s16, w.out, w.in, ws_.deq16, ln_), what);
      W = ws_.deq16;
    }
    return gemm16(W, w.out, w.in, x, p_.rows, y, what);
  }

  // y [n, out] = x [n, in] W^T, W [out, in] fp16 (rows of x and y packed): one cuBLAS GEMM, fp32 compute; y fp32,
  // or fp16 (rounded once from the fp32 sums; past the fp16 range: +-inf).
  template <typename T>
  Status gemm16(const half* W, int out, int in, const half* x, int n, T* y, const char* what) const {
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "fp32 or fp16 outputs");
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType yt = std::is_same<T, half>::value ? CUDA_R_16F : CUDA_R_32F;
    const cublasStatus_t st = cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, W, CUDA_R_16F, in, x,
                                           CUDA_R_16F, in, &beta, y, yt, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      return err(Code::BackendError, what, ": cublasGemmEx failed (status ", int(st), ")");
    sanitizer_mark_initialized(y, size_t(n) * out * sizeof(T), ln_.stream);
    return Status::ok();
  }

  // y_i = x W_i^T for `count` (<= 3) matrices sharing x: one GEMV launch for <= 32 rows when they share a
  // layout and `in`, else one mm() each.
  Status mm_multi(const DevLinear* const* mats, float* const* ys, int count, const half* x, const char* what) const {
    bool one = p_.rows <= kernels::kGemvMaxRows;
    for (int i = 1; i < count; ++i) one = one && same_layout(*mats[i], *mats[0]) && mats[i]->in == mats[0]->in;
    if (one) {
      kernels::GemvMat m[kernels::kGemvMaxMats];
      for (int i = 0; i < count; ++i) m[i] = gemv_mat(*mats[i], ys[i]);
      GEMMA4_T4_CUDA_TRY(kernels::launch_gemv_multi(m, count, x, p_.rows, mats[0]->in, ln_), what);
      return Status::ok();
    }
    for (int i = 0; i < count; ++i) GEMMA4_T4_TRY(mm(*mats[i], x, ys[i], what));
    return Status::ok();
  }

  const ModelConfig& c_;
  const DeviceWeights& w_;
  const Workspace& ws_;
  cublasHandle_t blas_;
  LayerPass p_;  // a copy: keep_selected changes its rows
  const kernels::Launch ln_;
  // the rows' metadata and per-layer inputs: the pass's, then the kept rows' (keep_selected)
  const int32_t* seq_ = ws_.dev.seq;  // [rows]
  const int32_t* pos_ = ws_.dev.pos;  // [rows]
  const int32_t* sel_ = ws_.dev.sel;  // [selected] the head's rows of h; null: rows 0.. in order
  const float* ple_ = ws_.ple;        // [rows, L, D] fp32
  Pending pending_;
  Qkv qkv_;
  const half* act_ = nullptr;  // the gate's output: act16 (GEMV epilogue) or x16 (element-wise kernel)
  int folded_ = -1;            // the layer whose heads(l) left its norms to attend(l) (heads_fold), or -1
  int ple_parts_ = 0;          // > 0: gate(Ple) left the PLE projection in this many parts (ple_fused)
};

}  // namespace detail
}  // namespace gemma4_t4
