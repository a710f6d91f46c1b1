// gemma4_t4 implementation part, CUDA backend: the weights on the GPU, uploaded once at load.
//
// Every tensor is streamed from the mapped checkpoint through one bounded pinned staging buffer
// (kStagingBytes) to the GPU -- bf16/f32 -> fp16 with a range check, w4a16 words copied as they are
// (kernels/gemv.cuh documents why that is the kernel's layout) with bf16 scales -> fp16 -- and the pages just
// read are released (madvise), so host RSS stays near the staging size whatever the model size. The PLE table
// stays in the mapped file (rows gathered per pass, cuda/planner.hpp) unless LoadOptions::ple asks for the GPU.
#pragma once

#include <cuda_fp16.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "../../../kernels/gemm_w4.cuh"
#include "../../../kernels/gemv.cuh"
#include "device.hpp"

namespace gemma4_t4 {
namespace detail {

struct DevLinear {
  int out = 0, in = 0;
  half* w16 = nullptr;     // [out, in] fp16, or
  uint32_t* wq = nullptr;  // [out, in/8] packed int4, in the GEMV word order (kernels/mma.cuh w4_gemv_word)
  half* s16 = nullptr;     // [out, in/32] fp16 scales
  // W4Matmul::TensorCore: the same weights in kernels/gemm_w4.cuh's GEMM layout (repacked at load), for passes of
  // more than 32 rows; null otherwise (and when out % 32 != 0: those take the dequantise path).
  uint32_t* wp = nullptr;  // [out/32][in/32][32][4] u32
  half* sp = nullptr;      // [out/32][in/32][8][4] fp16
};

// A linear as the GEMV kernels take it, writing y: [n, out] fp32 (null: a fused epilogue writes instead).
inline kernels::GemvMat gemv_mat(const DevLinear& w, float* y) {
  kernels::GemvMat m;
  m.w16 = w.w16;
  m.wq = w.wq;
  m.s = w.s16;
  m.out = w.out;
  m.y = y;
  m.ldy = w.out;
  return m;
}

struct DevLayer {
  DevLinear q, k, v, o, gate, up, down, ple_gate, ple_proj;  // as LayerW: absent ones have out == 0
  // Matrices stored in one allocation, each one's rows right after the previous one's (same `in`, same layout): views
  // gate_up = [gate; up] and qkv = [q; k; v] ([q; k] with k_eq_v). A pass of more than 32 rows multiplies each as one
  // matrix (cuda/layers.hpp); the GEMVs and the fused int4 gate/up GEMM take the parts. out == 0: stored apart.
  DevLinear gate_up, qkv;
  float *in_norm = nullptr, *post_attn = nullptr, *pre_ff = nullptr, *post_ff = nullptr;  // [H] fp32
  float *q_norm = nullptr, *k_norm = nullptr;                                             // [d] fp32
  float* post_ple = nullptr;                                                              // [H] fp32
  float* inv_freq = nullptr;                                                              // [d/2] fp32
  float scalar = 1.f;
};

class DeviceWeights {
 public:
  static constexpr size_t kStagingBytes = size_t(16) << 20;

  DeviceWeights() = default;
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;
  ~DeviceWeights() { cuda_free(Mem::Pinned, staging_); }

  Status upload(const ModelConfig& cfg, const Weights& w, const LoadOptions& opt, cudaStream_t stream) {
    cfg_ = &cfg;
    w_ = &w;
    opt_ = &opt;
    stream_ = stream;
    GEMMA4_T4_TRY(cuda_alloc(Mem::Pinned, kStagingBytes, "load: staging buffer", &staging_));
    const int H = cfg.hidden_size, L = cfg.num_layers, D = cfg.hidden_size_per_layer_input;
    total_upload_ = w.decode_bytes() + double(cfg.vocab_size) * H * 2;
    if (D > 0 && opt.ple == PleLocation::Device) total_upload_ += double(w.ple_table->numel()) * 2;
    GEMMA4_T4_TRY(mem_.alloc(size_t(cfg.vocab_size) * H, "weights: embed_tokens", &embed16));
    GEMMA4_T4_TRY(upload_f16(*w.embed, 0, size_t(cfg.vocab_size) * H, embed16));
    lm16 = embed16;
    if (w.lm_head != w.embed) {
      GEMMA4_T4_TRY(mem_.alloc(size_t(cfg.vocab_size) * H, "weights: lm_head", &lm16));
      GEMMA4_T4_TRY(upload_f16(*w.lm_head, 0, size_t(cfg.vocab_size) * H, lm16));
      release_pages(*w.lm_head);
    }
    release_pages(*w.embed);
    GEMMA4_T4_TRY(quantize_head(stream));
    GEMMA4_T4_TRY(vec_f32(w.final_norm, &final_norm));
    if (D > 0) {
      GEMMA4_T4_TRY(linear(w.ple_model_proj, &ple_model_proj));
      GEMMA4_T4_TRY(vec_f32(w.ple_proj_norm, &ple_norm));
      if (opt.ple == PleLocation::Device) {
        const size_t count = size_t(w.ple_table->numel());
        GEMMA4_T4_TRY(mem_.alloc(count, "weights: embed_tokens_per_layer", &ple_table16));
        GEMMA4_T4_TRY(upload_f16(*w.ple_table, 0, count, ple_table16));
        release_pages(*w.ple_table);
      }
    }
    layers.resize(size_t(L));
    for (int l = 0; l < L; ++l) {
      const LayerW& lw = w.layers[l];
      DevLayer& d = layers[l];
      const LinearW* gu[] = {&lw.gate, &lw.up};
      const LinearW* qkv[] = {&lw.q, &lw.k, &lw.v};
      DevLinear* dgu[] = {&d.gate, &d.up};
      DevLinear* dqkv[] = {&d.q, &d.k, &d.v};
      GEMMA4_T4_TRY(linear_group(gu, dgu, 2, &d.gate_up));
      GEMMA4_T4_TRY(linear_group(qkv, dqkv, 3, &d.qkv));
      for (auto pr : {std::make_pair(&lw.o, &d.o), std::make_pair(&lw.down, &d.down),
                      std::make_pair(&lw.ple_gate, &d.ple_gate), std::make_pair(&lw.ple_proj, &d.ple_proj)})
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
      const std::vector<float> f = rope_inv_freq(cfg.layers[l]);
      GEMMA4_T4_TRY(mem_.alloc(f.size(), "rope table", &d.inv_freq));
      GEMMA4_T4_CUDA_TRY(upload_now(d.inv_freq, f.data(), f.size() * 4, stream_), "rope table");
    }
    cuda_free(Mem::Pinned, staging_);  // load only
    staging_ = nullptr;
    return Status::ok();
  }

  size_t bytes() const { return mem_.total(); }

  // The tensors, read by the executors (shapes as the checkpoint's; V = vocab, H = hidden, L = layers, D = PLE).
  half* embed16 = nullptr;      // [V, H] fp16
  half* lm16 = nullptr;         // [V, H] fp16: embed16 when tied
  half* ple_table16 = nullptr;  // [V, L * D] fp16 with PleLocation::Device, else null (rows from the map)
  int8_t* lm8 = nullptr;        // LmHead::Int8: [V, H] + lm8_scale [V] fp32
  float* lm8_scale = nullptr;
  uint32_t* lm4 = nullptr;  // LmHead::Int4: [V, H / 8] packed + lm4_scale [V, H / 32] fp16
  half* lm4_scale = nullptr;
  float* final_norm = nullptr;  // [H] fp32
  float* ple_norm = nullptr;    // [D] fp32 per_layer_projection_norm
  DevLinear ple_model_proj;     // [L * D, H]
  std::vector<DevLayer> layers;
  int max_in = 0, max_out = 0;  // over every linear
  int max_joint = 0;            // the widest DevLayer::gate_up / qkv (its outputs: one pass's rows at once)
  size_t max_deq = 0;           // largest w4a16 matrix without a GEMM-layout copy, in weights (the dequantised copy
                                // of passes of more than 32 rows)
  bool gemm_layout = false;     // some linear has the GEMM-layout copy (W4Matmul::TensorCore or Auto)

 private:
  void progress(size_t done_bytes) const {
    if (opt_->on_progress && total_upload_ > 0)
      opt_->on_progress(0.02f + 0.96f * float(double(done_bytes) / total_upload_));
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
      GEMMA4_T4_CUDA_TRY(upload_now(dst + off, st, m * 2, stream_), "upload of '" + t.name + "'");
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
      GEMMA4_T4_CUDA_TRY(upload_now(static_cast<uint8_t*>(dst) + off, staging_, m, stream_),
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
    GEMMA4_T4_TRY(mem_.alloc(v.size(), "weights: '" + t->name + "'", out));
    GEMMA4_T4_CUDA_TRY(upload_now(*out, v.data(), v.size() * 4, stream_), "upload of '" + t->name + "'");
    return Status::ok();
  }

  Status linear(const LinearW& w, DevLinear* d) {
    d->out = w.out;
    d->in = w.in;
    if (!w.out) return Status::ok();
    GEMMA4_T4_TRY(alloc_linear(w, w.out, "weights: '" + w.name + "'", d));
    return fill_linear(w, d);
  }

  // The present linears of ws (out > 0), when there are at least two of one `in` and one layout (w4a16: one group
  // size, every out a multiple of 32, the GEMM layout's row block), in one allocation, each one's rows after the
  // previous one's: *joint the whole, ds[i] the parts. Else each in its own, and joint->out = 0.
  Status linear_group(const LinearW* const* ws, DevLinear* const* ds, int count, DevLinear* joint) {
    *joint = DevLinear();
    const LinearW* first = nullptr;
    int present = 0, out = 0;
    bool ok = true;
    for (int i = 0; i < count; ++i) {
      const LinearW& w = *ws[i];
      if (!w.out) continue;
      if (!first) first = &w;
      ok = ok && w.in == first->in && w.quantized() == first->quantized() &&
           (!w.quantized() || (w.group == first->group && w.out % 32 == 0));
      ++present;
      out += w.out;
    }
    if (!ok || present < 2) {
      for (int i = 0; i < count; ++i) GEMMA4_T4_TRY(linear(*ws[i], ds[i]));
      return Status::ok();
    }
    std::string what = "weights: '" + first->name + "'";
    for (int i = 0; i < count; ++i)
      if (ws[i]->out && ws[i] != first) what += " + '" + ws[i]->name + "'";
    GEMMA4_T4_TRY(alloc_linear(*first, out, what, joint));
    max_joint = std::max(max_joint, out);
    for (int i = 0, r0 = 0; i < count; ++i) {
      if (!ws[i]->out) {
        GEMMA4_T4_TRY(linear(*ws[i], ds[i]));  // absent: out 0
        continue;
      }
      *ds[i] = rows_of(*joint, r0, ws[i]->out);
      GEMMA4_T4_TRY(fill_linear(*ws[i], ds[i]));
      r0 += ws[i]->out;
    }
    if (joint->wq && (!joint->wp || opt_->w4_matmul == W4Matmul::Auto))  // a large pass dequantises the whole
      max_deq = std::max(max_deq, size_t(out) * joint->in);
    return Status::ok();
  }

  // The buffers of `out` rows of a linear with w's `in` and layout (w4a16: and the GEMM layout where W4Matmul asks
  // for it and out % 32 == 0).
  Status alloc_linear(const LinearW& w, int out, const std::string& what, DevLinear* d) {
    d->out = out;
    d->in = w.in;
    if (!w.quantized()) return mem_.alloc(size_t(out) * w.in, what, &d->w16);
    GEMMA4_T4_TRY(mem_.alloc(size_t(out) * (w.in / 8), what, &d->wq));
    GEMMA4_T4_TRY(mem_.alloc(size_t(out) * (w.in / 32), what, &d->s16));
    if (opt_->w4_matmul != W4Matmul::Dequant && out % 32 == 0) {
      GEMMA4_T4_TRY(mem_.alloc(size_t(out) * (w.in / 8), what + " (GEMM layout)", &d->wp));
      GEMMA4_T4_TRY(mem_.alloc(size_t(out) * (w.in / 32), what + " (GEMM layout scales)", &d->sp));
    }
    return Status::ok();
  }

  // Rows [r0, r0 + out) of d's buffers (r0 and out multiples of 32 where d has the GEMM layout: its row blocks).
  static DevLinear rows_of(const DevLinear& d, int r0, int out) {
    DevLinear v;
    v.out = out;
    v.in = d.in;
    const size_t r = size_t(r0);
    if (d.w16) v.w16 = d.w16 + r * d.in;
    if (d.wq) v.wq = d.wq + r * (d.in / 8);
    if (d.s16) v.s16 = d.s16 + r * (d.in / 32);
    if (d.wp) v.wp = d.wp + r * (d.in / 8);   // [out / 32][in / 32][32][4] u32: in / 8 words per row
    if (d.sp) v.sp = d.sp + r * (d.in / 32);  // [out / 32][in / 32][8][4] fp16: in / 32 per row
    return v;
  }

  // w's weights into d's buffers (alloc_linear's, or a part of a group's).
  Status fill_linear(const LinearW& w, DevLinear* d) {
    if (w.quantized()) {
      GEMMA4_T4_TRY(upload_raw(*w.packed, d->wq));
      GEMMA4_T4_TRY(upload_f16(*w.scale, 0, size_t(w.scale->numel()), d->s16));
      release_pages(*w.packed);
      if (d->wp) {
        GEMMA4_T4_CUDA_TRY(kernels::launch_repack_w4_gemm(d->wq, d->s16, w.out, w.in, d->wp, d->sp, stream_),
                           "repack of '" + w.name + "' into the GEMM layout");
        GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream_), "repack of '" + w.name + "' into the GEMM layout");
        gemm_layout = true;
      }
      // the GEMV word order every kernel reading wq takes (kernels/mma.cuh w4_gemv_word), after the repack, which
      // reads the checkpoint's order
      GEMMA4_T4_CUDA_TRY(kernels::launch_w4_gemv_order(d->wq, size_t(w.out) * (w.in / 8), stream_),
                         "reorder of '" + w.name + "' into the GEMV word order");
      if (!d->wp || opt_->w4_matmul == W4Matmul::Auto)  // the passes that dequantise: Auto's large ones
        max_deq = std::max(max_deq, size_t(w.out) * w.in);
    } else {
      GEMMA4_T4_TRY(upload_f16(*w.dense, 0, size_t(w.out) * w.in, d->w16));
      release_pages(*w.dense);
    }
    max_in = std::max(max_in, w.in);
    max_out = std::max(max_out, w.out);
    return Status::ok();
  }

  // LoadOptions::lm_head: a quantized copy of the fp16 head, built on the GPU (kernels/gemv.cuh).
  Status quantize_head(cudaStream_t stream) {
    const int V = cfg_->vocab_size, H = cfg_->hidden_size;
    if (opt_->lm_head == LmHead::Int8) {
      GEMMA4_T4_TRY(mem_.alloc(size_t(V) * H, "weights: int8 LM head", &lm8));
      GEMMA4_T4_TRY(mem_.alloc(size_t(V), "weights: int8 LM head scales", &lm8_scale));
      GEMMA4_T4_CUDA_TRY(kernels::launch_quantize_int8(lm16, V, H, lm8, lm8_scale, stream), "LM head int8");
    } else if (opt_->lm_head == LmHead::Int4) {
      if (H % 32 != 0)
        return err(Code::Unsupported, "LmHead::Int4 needs hidden_size % 32 == 0 (hidden_size = ", H, ")");
      GEMMA4_T4_TRY(mem_.alloc(size_t(V) * H / 8, "weights: int4 LM head", &lm4));
      GEMMA4_T4_TRY(mem_.alloc(size_t(V) * H / 32, "weights: int4 LM head scales", &lm4_scale));
      GEMMA4_T4_CUDA_TRY(kernels::launch_quantize_int4(lm16, V, H, lm4, lm4_scale, stream), "LM head int4");
    }
    GEMMA4_T4_CUDA_TRY(cudaStreamSynchronize(stream), "LM head quantization");
    return Status::ok();
  }

  const ModelConfig* cfg_ = nullptr;
  const Weights* w_ = nullptr;
  const LoadOptions* opt_ = nullptr;
  DeviceMemory mem_;
  void* staging_ = nullptr;        // [kStagingBytes] pinned, during upload() only
  cudaStream_t stream_ = nullptr;  // upload()'s stream (every upload, the GEMM-layout repacks)
  double total_upload_ = 0;
  size_t uploaded_ = 0;
};

}  // namespace detail
}  // namespace gemma4_t4
