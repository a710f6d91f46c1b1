// gemma4_t4 implementation part: the text model's tensors, found and checked against the config.
//
// Every tensor the text model needs is looked up under whichever prefix the file uses
// (`model.language_model.`, `language_model.model.`, `model.`) and checked for dtype and shape before
// anything runs. What a text engine does not use is skipped: vision/audio towers, and k_proj/v_proj/k_norm
// of KV-shared layers (the bf16 E2B file ships them, the QAT file does not). The tied LM head is
// embed_tokens; a stored lm_head.weight is read only when tie_word_embeddings is false.
//
// Linear weights are either dense ([out, in] BF16/F16/F32) or compressed-tensors pack-quantized:
//   weight_packed I32 [out, in/8]: column 8j+k is nibble k (bits 4k..4k+3) of word j, holding u = q + 8
//   weight_scale  BF16/F16/F32 [out, in/32]
//   weight_shape  I64 [2] = [out, in] (optional)
//   w[o][i] = (u - 8) * scale[o][i / 32]
// The views point into the mapped files; nothing is copied here.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace gemma4_t4 {
namespace detail {

struct LinearW {
  std::string name;                    // base name, e.g. "layers.3.mlp.up_proj" (for messages)
  int out = 0, in = 0;                 // y[out] = W[out, in] x[in]
  const TensorInfo* dense = nullptr;   // [out, in] float dtype
  const TensorInfo* packed = nullptr;  // [out, in/8] I32   (w4a16)
  const TensorInfo* scale = nullptr;   // [out, in/group]   (w4a16)
  int group = 0;

  bool quantized() const { return packed != nullptr; }
  // Bytes a kernel reads for one pass over the weight, with dense weights counted as fp16 (how the GPU
  // stores them) and quantized ones as packed nibbles + fp16 scales.
  double device_bytes() const {
    if (quantized()) return double(out) * in / 2.0 + double(out) * (in / group) * 2.0;
    return double(out) * in * 2.0;
  }
};

struct LayerW {
  const TensorInfo* input_layernorm = nullptr;             // [H]
  const TensorInfo* post_attention_layernorm = nullptr;    // [H]
  const TensorInfo* pre_feedforward_layernorm = nullptr;   // [H]
  const TensorInfo* post_feedforward_layernorm = nullptr;  // [H]
  const TensorInfo* q_norm = nullptr;                      // [d]
  const TensorInfo* k_norm = nullptr;                      // [d]   (not on KV-shared layers)
  const TensorInfo* layer_scalar = nullptr;                // [1]
  LinearW q, k, v, o;                                      // v absent with k_eq_v; k, v absent when shared
  LinearW gate, up, down;
  // Per-layer embeddings (when hidden_size_per_layer_input > 0)
  LinearW ple_gate;                                       // per_layer_input_gate [D, H]
  LinearW ple_proj;                                       // per_layer_projection [H, D]
  const TensorInfo* post_per_layer_input_norm = nullptr;  // [H]
};

// ---- the quantized LM head (LoadOptions::lm_head) ----
// One row of [vocab, hidden] at a time; the CPU backend and the CUDA backend's quantize kernels
// (kernels/gemv.cuh) compute the same values from the same fp16-representable weights.

// Device bytes a decode step reads for a [rows, cols] head stored as `head`.
inline double lm_head_bytes(size_t rows, size_t cols, LmHead head) {
  switch (head) {
    case LmHead::F16: return double(rows) * cols * 2.0;
    case LmHead::Int8: return double(rows) * (cols + 4.0);                    // int8 + one fp32 scale
    case LmHead::Int4: return double(rows) * (cols / 2.0 + cols / 32 * 2.0);  // nibbles + fp16 group scales
  }
  return 0.0;
}

inline const char* lm_head_name(LmHead head) {
  switch (head) {
    case LmHead::F16: return "f16";
    case LmHead::Int8: return "int8";
    case LmHead::Int4: return "int4";
  }
  return "?";
}

// Per-row symmetric int8: scale = max|w| / 127, q = clamp(rint(w / scale), -127, 127); an all-zero row has
// scale 0 and q = 0.
inline void quantize_row_int8(const float* w, size_t n, int8_t* q, float* scale) {
  float amax = 0.f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float s = amax / 127.f;
  *scale = s;
  for (size_t i = 0; i < n; ++i)
    q[i] = s > 0.f ? int8_t(std::min(127.f, std::max(-127.f, std::nearbyint(w[i] / s)))) : int8_t(0);
}

// Group-32 int4 in the compressed-tensors layout the w4a16 linears use (kernels/gemv.cuh): per group
// scale = fp16(max|w| / 7), q = clamp(rint(w / scale), -8, 7), column 8j + k in nibble k of word j as q + 8.
// n % 32 == 0; words: [n / 8], scales: [n / 32] fp16 bits.
inline void quantize_row_int4(const float* w, size_t n, uint32_t* words, uint16_t* scales) {
  for (size_t g = 0; g < n / 32; ++g) {
    const float* x = w + g * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const uint16_t sh = f32_to_f16(amax / 7.f);
    const float s = f16_to_f32(sh);
    scales[g] = sh;
    for (int j = 0; j < 4; ++j) {
      uint32_t word = 0;
      for (int k = 0; k < 8; ++k) {
        const float v = s > 0.f ? std::min(7.f, std::max(-8.f, std::nearbyint(x[8 * j + k] / s))) : 0.f;
        word |= uint32_t(int(v) + 8) << (4 * k);
      }
      words[g * 4 + j] = word;
    }
  }
}

struct Weights {
  std::string prefix;                         // the prefix the file uses
  const TensorInfo* embed = nullptr;          // embed_tokens [V, H]
  const TensorInfo* lm_head = nullptr;        // [V, H] (== embed when tied)
  const TensorInfo* final_norm = nullptr;     // norm [H]
  const TensorInfo* ple_table = nullptr;      // embed_tokens_per_layer [Vple, L*D]
  LinearW ple_model_proj;                     // per_layer_model_projection [L*D, H]
  const TensorInfo* ple_proj_norm = nullptr;  // per_layer_projection_norm [D]
  std::vector<LayerW> layers;

  // Every decoder linear + the LM head (stored as `head` says), as the GPU would read them per decode step.
  double decode_bytes(LmHead head = LmHead::F16) const {
    double b = lm_head ? lm_head_bytes(size_t(lm_head->shape[0]), size_t(lm_head->shape[1]), head) : 0.0;
    if (ple_model_proj.out) b += ple_model_proj.device_bytes();
    for (const auto& l : layers)
      for (const LinearW* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj})
        if (w->out) b += w->device_bytes();
    return b;
  }

  // Bytes of the checkpoint tensors the text model reads, as stored in the file(s): embeddings, LM head (when
  // not tied), PLE table, every linear (dense, or packed + scales), norms and scalars. Towers and the unused
  // k/v of KV-shared layers are not counted.
  size_t file_bytes() const {
    size_t b = 0;
    auto t = [&b](const TensorInfo* x) {
      if (x) b += x->nbytes;
    };
    auto lin = [&t](const LinearW& w) {
      t(w.dense);
      t(w.packed);
      t(w.scale);
    };
    t(embed);
    if (lm_head != embed) t(lm_head);
    t(final_norm);
    t(ple_table);
    lin(ple_model_proj);
    t(ple_proj_norm);
    for (const auto& l : layers) {
      for (const TensorInfo* x :
           {l.input_layernorm, l.post_attention_layernorm, l.pre_feedforward_layernorm, l.post_feedforward_layernorm,
            l.q_norm, l.k_norm, l.layer_scalar, l.post_per_layer_input_norm})
        t(x);
      for (const LinearW* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj}) lin(*w);
    }
    return b;
  }
};

inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

class WeightBinder {
 public:
  WeightBinder(const TensorStore& store, const ModelConfig& cfg, const std::string& where)
      : store_(store), cfg_(cfg), where_(where) {}

  Status bind(Weights* w) {
    static const char* prefixes[] = {"model.language_model.", "language_model.model.", "model.", ""};
    w->prefix.clear();
    bool found = false;
    for (const char* p : prefixes)
      if (store_.find(std::string(p) + "embed_tokens.weight")) {
        w->prefix = p;
        found = true;
        break;
      }
    if (!found)
      return err(Code::NotFound, where_,
                 ": no embed_tokens.weight under any known prefix "
                 "(model.language_model., language_model.model., model.); is this a Gemma 4 checkpoint?");
    prefix_ = w->prefix;
    const int H = cfg_.hidden_size, V = cfg_.vocab_size, L = cfg_.num_layers, D = cfg_.hidden_size_per_layer_input;
    GEMMA4_T4_TRY(float_tensor("embed_tokens.weight", {V, H}, &w->embed));
    GEMMA4_T4_TRY(float_tensor("norm.weight", {H}, &w->final_norm));
    if (cfg_.tie_word_embeddings) {
      w->lm_head = w->embed;
    } else {
      const TensorInfo* t = store_.find("lm_head.weight");
      if (!t) t = store_.find(prefix_ + "lm_head.weight");
      if (!t) return err(Code::NotFound, where_, ": tie_word_embeddings is false but lm_head.weight is missing");
      GEMMA4_T4_TRY(check_float(t, {V, H}));
      w->lm_head = t;
    }
    if (D > 0) {
      GEMMA4_T4_TRY(float_tensor("embed_tokens_per_layer.weight", {cfg_.vocab_size_per_layer_input, int64_t(L) * D},
                                 &w->ple_table));
      GEMMA4_T4_TRY(linear("per_layer_model_projection", L * D, H, &w->ple_model_proj));
      GEMMA4_T4_TRY(float_tensor("per_layer_projection_norm.weight", {D}, &w->ple_proj_norm));
    }
    w->layers.assign(L, LayerW());
    for (int i = 0; i < L; ++i) GEMMA4_T4_TRY(bind_layer(i, &w->layers[i]));
    return Status::ok();
  }

 private:
  Status bind_layer(int i, LayerW* lw) {
    const LayerConfig& lc = cfg_.layers[i];
    const int H = cfg_.hidden_size, d = lc.head_dim, nh = cfg_.num_heads, kvh = lc.num_kv_heads;
    const std::string p = "layers." + std::to_string(i) + ".";
    GEMMA4_T4_TRY(float_tensor(p + "input_layernorm.weight", {H}, &lw->input_layernorm));
    GEMMA4_T4_TRY(float_tensor(p + "post_attention_layernorm.weight", {H}, &lw->post_attention_layernorm));
    GEMMA4_T4_TRY(float_tensor(p + "pre_feedforward_layernorm.weight", {H}, &lw->pre_feedforward_layernorm));
    GEMMA4_T4_TRY(float_tensor(p + "post_feedforward_layernorm.weight", {H}, &lw->post_feedforward_layernorm));
    GEMMA4_T4_TRY(float_tensor(p + "self_attn.q_norm.weight", {d}, &lw->q_norm));
    GEMMA4_T4_TRY(linear(p + "self_attn.q_proj", nh * d, H, &lw->q));
    GEMMA4_T4_TRY(linear(p + "self_attn.o_proj", H, nh * d, &lw->o));
    if (!lc.kv_shared) {
      GEMMA4_T4_TRY(float_tensor(p + "self_attn.k_norm.weight", {d}, &lw->k_norm));
      GEMMA4_T4_TRY(linear(p + "self_attn.k_proj", kvh * d, H, &lw->k));
      if (!lc.k_eq_v) GEMMA4_T4_TRY(linear(p + "self_attn.v_proj", kvh * d, H, &lw->v));
    }
    const int I = lc.intermediate_size;
    GEMMA4_T4_TRY(linear(p + "mlp.gate_proj", I, H, &lw->gate));
    GEMMA4_T4_TRY(linear(p + "mlp.up_proj", I, H, &lw->up));
    GEMMA4_T4_TRY(linear(p + "mlp.down_proj", H, I, &lw->down));
    {
      const std::string n = prefix_ + p + "layer_scalar";
      const TensorInfo* t = store_.find(n);
      if (!t) return err(Code::NotFound, where_, ": missing tensor '", n, "'");
      if (!is_float_dtype(t->dtype) || t->numel() != 1)
        return err(Code::FormatError, where_, ": tensor '", n, "' must be one float, got ", dtype_name(t->dtype), " ",
                   t->shape_string());
      lw->layer_scalar = t;
    }
    const int D = cfg_.hidden_size_per_layer_input;
    if (D > 0) {
      GEMMA4_T4_TRY(linear(p + "per_layer_input_gate", D, H, &lw->ple_gate));
      GEMMA4_T4_TRY(linear(p + "per_layer_projection", H, D, &lw->ple_proj));
      GEMMA4_T4_TRY(float_tensor(p + "post_per_layer_input_norm.weight", {H}, &lw->post_per_layer_input_norm));
    }
    return Status::ok();
  }

  Status check_float(const TensorInfo* t, std::vector<int64_t> shape) {
    if (!is_float_dtype(t->dtype))
      return err(Code::FormatError, where_, ": tensor '", t->name, "' has dtype ", dtype_name(t->dtype),
                 "; expected BF16, F16 or F32");
    if (t->shape != shape)
      return err(Code::FormatError, where_, ": tensor '", t->name, "' has shape ", t->shape_string(),
                 "; config.json implies ", shape_str(shape.data(), shape.size()));
    return Status::ok();
  }

  Status float_tensor(const std::string& name, std::vector<int64_t> shape, const TensorInfo** out) {
    const TensorInfo* t = store_.find(prefix_ + name);
    if (!t) return err(Code::NotFound, where_, ": missing tensor '", prefix_ + name, "'");
    GEMMA4_T4_TRY(check_float(t, std::move(shape)));
    *out = t;
    return Status::ok();
  }

  Status linear(const std::string& base, int out, int in, LinearW* w) {
    const std::string full = prefix_ + base;
    w->name = full;
    w->out = out;
    w->in = in;
    if (const TensorInfo* t = store_.find(full + ".weight")) {
      GEMMA4_T4_TRY(check_float(t, {out, in}));
      w->dense = t;
      return Status::ok();
    }
    const TensorInfo* packed = store_.find(full + ".weight_packed");
    if (!packed)
      return err(Code::NotFound, where_, ": missing tensor '", full, ".weight' (nor a pack-quantized '", full,
                 ".weight_packed')");
    if (cfg_.weight_format != WeightFormat::W4A16)
      return err(Code::Unsupported, where_, ": tensor '", full,
                 ".weight_packed' is pack-quantized but config.json has no "
                 "compressed-tensors quantization_config describing it");
    const int g = cfg_.quant_group_size;
    if (in % g != 0 || in % 8 != 0)
      return err(Code::FormatError, where_, ": '", full, "' input width ", in, " is not a multiple of the group size ",
                 g);
    if (packed->dtype != DType::I32)
      return err(Code::FormatError, where_, ": tensor '", packed->name, "' has dtype ", dtype_name(packed->dtype),
                 "; expected I32");
    const std::vector<int64_t> pshape = {out, in / 8};
    if (packed->shape != pshape)
      return err(Code::FormatError, where_, ": tensor '", packed->name, "' has shape ", packed->shape_string(),
                 "; expected ", shape_str(pshape.data(), 2), " for a ", out, " x ", in, " int4 weight");
    const TensorInfo* scale = store_.find(full + ".weight_scale");
    if (!scale) return err(Code::NotFound, where_, ": missing tensor '", full, ".weight_scale'");
    const std::vector<int64_t> sshape = {out, in / g};
    if (!is_float_dtype(scale->dtype) || scale->shape != sshape)
      return err(Code::FormatError, where_, ": tensor '", scale->name, "' is ", dtype_name(scale->dtype), " ",
                 scale->shape_string(), "; expected a float ", shape_str(sshape.data(), 2));
    if (const TensorInfo* ws = store_.find(full + ".weight_shape")) {
      int64_t v[2] = {0, 0};
      if (ws->numel() == 2 && (ws->dtype == DType::I64 || ws->dtype == DType::I32)) {
        for (int k = 0; k < 2; ++k) {
          if (ws->dtype == DType::I64)
            std::memcpy(&v[k], ws->data + 8 * k, 8);
          else {
            int32_t x;
            std::memcpy(&x, ws->data + 4 * k, 4);
            v[k] = x;
          }
        }
      }
      if (v[0] != out || v[1] != in)
        return err(Code::FormatError, where_, ": tensor '", ws->name, "' does not hold [", out, ", ", in, "]");
    }
    w->packed = packed;
    w->scale = scale;
    w->group = g;
    return Status::ok();
  }

  const TensorStore& store_;
  const ModelConfig& cfg_;
  std::string where_;
  std::string prefix_;
};

// Unpacks row `o` of a pack-quantized weight to floats: dst[in]. Bit-exact: nibbles are taken from the
// integer words, never through float.
inline void unpack_w4_row(const LinearW& w, int o, float* dst) {
  const uint8_t* words = w.packed->data + size_t(o) * (w.in / 8) * 4;
  const int groups = w.in / w.group;
  for (int gi = 0; gi < groups; ++gi) {
    const float s = load_float(*w.scale, size_t(o) * groups + gi);
    for (int j = gi * w.group / 8; j < (gi + 1) * w.group / 8; ++j) {
      uint32_t word;
      std::memcpy(&word, words + 4 * j, 4);
      for (int k = 0; k < 8; ++k) dst[8 * j + k] = float(int((word >> (4 * k)) & 0xFu) - 8) * s;
    }
  }
}

// Row `o` of any linear weight as floats: dst[in].
inline void linear_row(const LinearW& w, int o, float* dst) {
  if (w.quantized()) {
    unpack_w4_row(w, o, dst);
    return;
  }
  const size_t base = size_t(o) * w.in;
  const TensorInfo& t = *w.dense;
  auto widen = [&](auto to_f32) {  // the row's 16-bit floats -> fp32 (a lambda per format: inlined)
    for (int i = 0; i < w.in; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * (base + i), 2);
      dst[i] = to_f32(h);
    }
  };
  switch (t.dtype) {
    case DType::BF16: widen([](uint16_t h) { return bf16_to_f32(h); }); break;
    case DType::F16: widen([](uint16_t h) { return f16_to_f32(h); }); break;
    default: std::memcpy(dst, t.data + 4 * base, sizeof(float) * w.in); break;
  }
}

// A float vector tensor (norm weights, PLE/embedding rows) as floats.
inline void load_floats(const TensorInfo& t, size_t first, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = load_float(t, first + i);
}

}  // namespace detail
}  // namespace gemma4_t4
