// gemma4_t4 implementation part, CUDA backend: the workspace -- every device buffer a forward pass uses,
// named, with its shape and dtype -- the per-pass metadata layout, and the KV cache's size.
//
// R = LoadOptions::max_pass_rows (rows per pass), S = kMaxSeqs (sessions per pass), H = hidden, L = layers,
// D = PLE width, V = vocab.
#pragma once

#include <cuda_fp16.h>

#include <algorithm>

#include "../../../kernels/attention.cuh"
#include "../../../kernels/sample.cuh"
#include "device.hpp"
#include "weights.hpp"

namespace gemma4_t4 {
namespace detail {

constexpr int kMaxSeqs = 128;       // sessions per pass (and the largest decode-graph bucket, planner.hpp)
constexpr int kSplitBudget = 1024;  // rows x key-splits of decode-attention scratch
constexpr size_t kGemmPartFloats = size_t(4) << 20;  // the w4a16 GEMM's split-K partials (16 MiB; gemm_w4_splits)

// KV slots of a layer's cache in a session of max_ctx tokens. Sliding layers keep a ring of window + R slots:
// a pass writes its rows' K/V before attention reads them, so a pass never overwrites a key one of its own
// queries still needs. Full layers keep every position. The one formula for new_session and the accounting.
inline size_t kv_slots(const ModelConfig& c, const LayerConfig& lc, size_t max_ctx, int max_rows) {
  if (lc.type == LayerType::Sliding) return std::min(max_ctx, size_t(c.sliding_window) + size_t(max_rows));
  return max_ctx;
}

// Bytes of one K or V buffer as DeviceMemory allocates it (at least 256).
inline size_t kv_buffer_bytes(const LayerConfig& lc, size_t slots) {
  return std::max<size_t>(slots * lc.num_kv_heads * lc.head_dim * sizeof(half), 256);
}

// Per-pass metadata: one layout for the pinned host copy (filled by the planner) and the device copy (read
// by the kernels), so the two sides cannot disagree on an offset; the whole block is uploaded in one copy.
struct PassMeta {
  half** k = nullptr;          // [S * L] K cache of (session s, layer l) at s * L + l; null on KV-shared layers
  half** v = nullptr;          // [S * L] V cache, the same
  int32_t* ids = nullptr;      // [R] token id of each row
  int32_t* seq = nullptr;      // [R] session of each row (0 .. S-1, in pass order)
  int32_t* pos = nullptr;      // [R] position of each row
  int32_t* sel = nullptr;      // [R] rows whose logits are wanted, in order
  int32_t* sel_seq = nullptr;  // [R] seq of each selected row (sel order): the rows kept past kv_keep_layer
  int32_t* sel_pos = nullptr;  // [R] pos of each selected row
  int32_t* slots = nullptr;    // [S * L] KV slots of (session, layer)

  static size_t bytes(int max_rows, int layers) {
    return size_t(kMaxSeqs) * layers * (2 * sizeof(half*) + sizeof(int32_t)) + size_t(max_rows) * 6 * sizeof(int32_t);
  }
  // The arrays inside a block of bytes(max_rows, layers) bytes at `base` (host or device: the same offsets).
  static PassMeta at(void* base, int max_rows, int layers) {
    PassMeta m;
    const size_t sl = size_t(kMaxSeqs) * layers;
    m.k = static_cast<half**>(base);
    m.v = m.k + sl;
    m.ids = reinterpret_cast<int32_t*>(m.v + sl);
    m.seq = m.ids + max_rows;
    m.pos = m.seq + max_rows;
    m.sel = m.pos + max_rows;
    m.sel_seq = m.sel + max_rows;
    m.sel_pos = m.sel_seq + max_rows;
    m.slots = m.sel_pos + max_rows;
    return m;
  }
};

struct Workspace {
  int max_rows = 0;  // R
  // metadata
  uint8_t* meta_dev = nullptr;   // PassMeta::bytes(R, L), device
  uint8_t* meta_host = nullptr;  // the same, pinned
  PassMeta dev, host;            // views of the two
  int2* tiles = nullptr;         // [4][R] prefill attention tiles per folded group size (1, 2, 4, 8)
  int2* tiles_host = nullptr;    // pinned mirror
  // activations of a pass (R rows)
  float* h = nullptr;       // [R, H] fp32 residual stream
  half* x16 = nullptr;      // [R, wide] fp16 matmul input: a norm's output, attention output, GELU products
  half* q16 = nullptr;      // [R, heads * d] fp16 normalised, roped queries
  float* proj_a = nullptr;  // [R, wide] fp32: q_proj; o_proj; per_layer_input_gate (large passes);
                            // per_layer_model_projection; as fp16 [R, I], the fused gate/up GEMM's act (layers.hpp);
                            // with proj_b: the joint matmuls' [R, max_joint] (DevLayer::qkv, gate_up; large passes)
  float* proj_b = nullptr;  // [R, wide] fp32: k_proj (decode); up_proj (large passes of separate gate / up); in
                            // proj_a's allocation, after it
  float* proj_c = nullptr;  // [R, max(kv width, H)] fp32: v_proj; down_proj; per_layer_projection
  float* ple = nullptr;     // [R, L, D] fp32 per-layer inputs
  float* tok = nullptr;     // [R, L, D] fp32 the tokens' rows of the per-layer table (widened)
  // decode attention's split partials and the fused merge's arrival counters (zero between launches)
  float* part_o = nullptr;            // [kSplitBudget, heads, max d] fp32
  float* part_ml = nullptr;           // [kSplitBudget, heads, 2] fp32 (max, sum)
  unsigned* attn_counters = nullptr;  // [R, heads]: (row, KV head, head slice) of decode attention
  half* deq16 = nullptr;              // [largest w4a16 matrix or joint matmul] fp16: what large passes dequantise
  float* gemm_part = nullptr;         // [kGemmPartFloats] fp32: the w4a16 GEMM's split-K partial tiles (GEMM layout)
  // [gemv_part_sets, 32, H] fp32: a k-split decode GEMV's parts (layers.hpp project), the PLE branch's slices
  // (kernels::launch_ple_fused: D / 32 of them)
  float* gemv_parts = nullptr;
  int gemv_part_sets = 0;
  // the K / V a decode graph's padding rows write and read (planner.hpp fill_meta): one slot, every layer
  half* pad_k = nullptr;  // [max kv_heads * d] fp16
  half* pad_v = nullptr;  // [max kv_heads * d] fp16
  // decode (<= 32 rows: the GEMVs) and the head
  half* head16 = nullptr;   // [S, H] fp16 final norm of the selected rows (a decode bucket's at once)
  half* act16 = nullptr;    // [32, max(linear out, D)] fp16: the GEMV epilogues' output (GELU products)
  float* logits = nullptr;  // [32, V] fp32 logits of up to 32 selected rows (to the host)
  // sampling (Engine::step)
  float* samp_logits = nullptr;                  // [S, V] fp32
  kernels::SampleParams* samp_params = nullptr;  // [S]
  int* samp_out = nullptr;                       // [S] int32 sampled ids

  Status alloc(const ModelConfig& c, const DeviceWeights& w, int rows, cudaStream_t stream) {
    const int R = rows, H = c.hidden_size, L = c.num_layers, D = c.hidden_size_per_layer_input;
    max_rows = rows;
    int qw = 0, kvw = 0, dmax = 0;
    for (const auto& lc : c.layers) {
      qw = std::max(qw, c.num_heads * lc.head_dim);
      kvw = std::max(kvw, lc.num_kv_heads * lc.head_dim);
      dmax = std::max(dmax, lc.head_dim);
    }
    const int wide = std::max({w.max_out, w.max_in, qw, H, L * D});
    DeviceMemory& m = mem_;
    GEMMA4_T4_TRY(m.alloc(PassMeta::bytes(R, L), "workspace: metadata", &meta_dev));
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, PassMeta::bytes(R, L), "workspace: metadata (pinned)", &meta_host));
    dev = PassMeta::at(meta_dev, R, L);
    host = PassMeta::at(meta_host, R, L);
    GEMMA4_T4_TRY(m.alloc(size_t(R) * H, "workspace: residual", &h));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * wide, "workspace: x16", &x16));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * qw, "workspace: q16", &q16));
    // proj_a and proj_b: one allocation, proj_b 256-byte aligned; together they hold a joint matmul's [R, max_joint]
    const size_t ab = (size_t(R) * std::max(wide, (w.max_joint + 1) / 2) + 63) / 64 * 64;
    GEMMA4_T4_TRY(m.alloc(2 * ab, "workspace: projections A and B", &proj_a));
    proj_b = proj_a + ab;
    GEMMA4_T4_TRY(m.alloc(size_t(R) * std::max(kvw, H), "workspace: projections C", &proj_c));
    if (D > 0) {
      GEMMA4_T4_TRY(m.alloc(size_t(R) * L * D, "workspace: per-layer inputs", &ple));
      GEMMA4_T4_TRY(m.alloc(size_t(R) * L * D, "workspace: per-layer tokens", &tok));
    }
    GEMMA4_T4_TRY(m.alloc(size_t(kSplitBudget) * c.num_heads * dmax, "workspace: attention partials", &part_o));
    GEMMA4_T4_TRY(m.alloc(size_t(kSplitBudget) * c.num_heads * 2, "workspace: attention partials", &part_ml));
    GEMMA4_T4_TRY(m.alloc(size_t(R) * c.num_heads, "workspace: attention counters", &attn_counters));
    GEMMA4_T4_CUDA_TRY(cudaMemsetAsync(attn_counters, 0, size_t(R) * c.num_heads * sizeof(unsigned), stream),
                       "attention counters");
    if (w.max_deq) GEMMA4_T4_TRY(m.alloc(w.max_deq, "workspace: dequantised tile", &deq16));
    if (w.gemm_layout) GEMMA4_T4_TRY(m.alloc(kGemmPartFloats, "workspace: GEMM split-K partials", &gemm_part));
    gemv_part_sets = std::max(kernels::kGemvMaxSplit, kernels::ple_fused_parts(D));
    GEMMA4_T4_TRY(
        m.alloc(size_t(gemv_part_sets) * kernels::kGemvMaxRows * H, "workspace: GEMV split-K parts", &gemv_parts));
    GEMMA4_T4_TRY(m.alloc(size_t(kvw), "workspace: decode padding K", &pad_k));
    GEMMA4_T4_TRY(m.alloc(size_t(kvw), "workspace: decode padding V", &pad_v));
    GEMMA4_T4_TRY(m.alloc(size_t(std::max(kMaxSeqs, kernels::kGemvMaxRows)) * H, "workspace: head input", &head16));
    GEMMA4_T4_TRY(
        m.alloc(size_t(kernels::kGemvMaxRows) * std::max(w.max_out, D), "workspace: decode activations", &act16));
    GEMMA4_T4_TRY(m.alloc(size_t(kernels::kGemvMaxRows) * c.vocab_size, "workspace: logits", &logits));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs) * c.vocab_size, "workspace: sampling logits", &samp_logits));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs), "workspace: sampling parameters", &samp_params));
    GEMMA4_T4_TRY(m.alloc(size_t(kMaxSeqs), "workspace: sampled tokens", &samp_out));
    GEMMA4_T4_TRY(m.alloc(size_t(4) * R, "workspace: attention tiles", &tiles));
    GEMMA4_T4_TRY(
        cuda_alloc(Mem::Pinned, size_t(4) * R * sizeof(int2), "workspace: attention tiles (pinned)", &tiles_host));
    return Status::ok();
  }

  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    cuda_free(Mem::Pinned, meta_host);
    cuda_free(Mem::Pinned, tiles_host);
  }

  size_t bytes() const { return mem_.total(); }

 private:
  DeviceMemory mem_;
};

}  // namespace detail
}  // namespace gemma4_t4
