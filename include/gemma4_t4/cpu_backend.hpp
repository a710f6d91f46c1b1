// gemma4_t4 implementation part: the CPU reference backend (fp32 math).
//
// The complete Gemma 4 text forward, written to be read next to transformers' modeling_gemma4.py:
//   h = embed[id] * sqrt(H)
//   PLE (D > 0): ple[l] = (rmsnorm_D(per_layer_model_projection(h) * H^-0.5) + table[id][l] * sqrt(D)) * 2^-0.5
//   per layer: h += post_attn_norm(attn(input_norm(h)))
//              h += post_ff_norm(down(gelu_tanh(gate(x)) * up(x))),  x = pre_ff_norm(h)
//              h += post_ple_norm(ple_proj(gelu_tanh(ple_gate(h)) * ple[l]))
//              h *= layer_scalar
//   logits = softcap(final_norm(h) @ embed^T)
// Attention: q = rope(q_norm(q_proj x)); k = rope(k_norm(k_proj x)); v = rms(v_proj x) (no weight; v_proj
// is k_proj on k_eq_v layers); scores q.k with scaling 1.0; causal; sliding layers see keys in
// (pos - window, pos]; KV-shared layers attend over their source layer's keys/values.
// Weights are read straight from the mapped checkpoint (bf16/f16/f32 rows converted on the fly, int4 rows
// unpacked on the fly), so the CPU backend needs no copy of the model.
//
// KV cache per session: full layers keep every position; sliding layers keep a ring of `window` slots
// (slot = pos % window). A forward over n tokens at position p first computes the chunk's K/V into
// scratch, attends over cache (positions < p) + scratch (positions >= p), and commits the scratch into the
// cache only after the last layer -- so a chunk longer than the window never overwrites keys its own
// earlier queries still need, and a failed call leaves the session untouched.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "block.hpp"
#include "threads.hpp"

namespace gemma4_t4 {
namespace detail {

// ---- math helpers (the `_ref` building blocks the kernels are tested against) ----

inline float dot_ref(const float* a, const float* b, int n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = 0.f;
  for (; i < n; ++i) r += a[i] * b[i];
  return r + ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// y[t, o] = sum_i x[t, i] * W[o, i] for t < n.   x: [n, in] fp32, y: [n, out] fp32
inline void matmul_ref(const LinearW& w, const float* x, size_t n, float* y) {
  parallel_for(size_t(w.out), double(w.out) * w.in * n, [&](size_t b, size_t e) {
    std::vector<float> row(static_cast<size_t>(w.in));
    for (size_t o = b; o < e; ++o) {
      linear_row(w, int(o), row.data());
      for (size_t t = 0; t < n; ++t) y[t * w.out + o] = dot_ref(row.data(), x + t * w.in, w.in);
    }
  });
}

// out = x * (mean(x^2) + eps)^-0.5 * w   (w == nullptr: no weight). In place allowed.
inline void rmsnorm_ref(const float* x, const float* w, int n, float eps, float* out) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) out[i] = x[i] * r * (w ? w[i] : 1.f);
}

inline float gelu_tanh_ref(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

// Rotate-half RoPE over one head x[d]: channel i pairs with i + d/2; inv_freq[d/2] (zeros = identity).
inline void rope_ref(float* x, int d, const float* inv_freq, int64_t pos) {
  const int h = d / 2;
  for (int i = 0; i < h; ++i) {
    if (inv_freq[i] == 0.f) continue;
    const float a = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(a), s = std::sin(a);
    const float x1 = x[i], x2 = x[i + h];
    x[i] = x1 * c - x2 * s;
    x[i + h] = x2 * c + x1 * s;
  }
}

// ---- sessions ----

struct CpuLayerCache {
  int capacity = 0;  // slots: window (ring) or max context (full)
  bool ring = false;
  int row = 0;              // floats per position: kv_heads * head_dim
  std::vector<float> k, v;  // [capacity, kv_heads, head_dim] fp32
};

struct CpuSession : BackendSession {
  std::vector<CpuLayerCache> caches;  // per layer; empty (capacity 0) for KV-shared layers
};

// ---- the model ----

class CpuModel {
 public:
  Status init(const ModelConfig& cfg, const Weights& w, LmHead head = LmHead::F16) {
    cfg_ = &cfg;
    w_ = &w;
    const int H = cfg.hidden_size, L = cfg.num_layers;
    auto vec = [](const TensorInfo* t) {
      std::vector<float> v(static_cast<size_t>(t->numel()));
      load_floats(*t, 0, v.size(), v.data());
      return v;
    };
    layers_.resize(size_t(L));
    for (int i = 0; i < L; ++i) {
      const LayerW& lw = w.layers[i];
      Layer& l = layers_[i];
      l.in_norm = vec(lw.input_layernorm);
      l.post_attn_norm = vec(lw.post_attention_layernorm);
      l.pre_ff_norm = vec(lw.pre_feedforward_layernorm);
      l.post_ff_norm = vec(lw.post_feedforward_layernorm);
      l.q_norm = vec(lw.q_norm);
      if (lw.k_norm) l.k_norm = vec(lw.k_norm);
      if (lw.post_per_layer_input_norm) l.post_ple_norm = vec(lw.post_per_layer_input_norm);
      l.scalar = load_float(*lw.layer_scalar, 0);
      l.inv_freq = rope_inv_freq(cfg.layers[i]);
    }
    final_norm_ = vec(w.final_norm);
    if (w.ple_proj_norm) ple_norm_ = vec(w.ple_proj_norm);
    return quantize_head(head, H);
  }

  // LoadOptions::lm_head: a quantized copy of the head, built once (weights.hpp's quantizers).
  Status quantize_head(LmHead head, int H) {
    head_ = head;
    if (head == LmHead::F16) return Status::ok();
    const size_t V = size_t(cfg_->vocab_size);
    if (head == LmHead::Int4 && H % 32 != 0)
      return err(Code::Unsupported, "LmHead::Int4 needs hidden_size % 32 == 0 (hidden_size = ", H, ")");
    if (head == LmHead::Int8) {
      head_q8_.resize(V * H);
      head_scale_.resize(V);
    } else {
      head_q4_.resize(V * H / 8);
      head_s4_.resize(V * H / 32);
    }
    parallel_for(V, double(V) * H * 4, [&](size_t b, size_t e) {
      std::vector<float> row(static_cast<size_t>(H));
      for (size_t o = b; o < e; ++o) {
        load_floats(*w_->lm_head, o * H, size_t(H), row.data());
        if (head == LmHead::Int8)
          quantize_row_int8(row.data(), size_t(H), &head_q8_[o * H], &head_scale_[o]);
        else
          quantize_row_int4(row.data(), size_t(H), &head_q4_[o * H / 8], &head_s4_[o * H / 32]);
      }
    });
    return Status::ok();
  }

  // Host bytes of the quantized head copy (0 for F16: the head is read from the mapped file).
  size_t head_copy_bytes() const {
    return head_q8_.size() + head_scale_.size() * 4 + head_q4_.size() * 4 + head_s4_.size() * 2;
  }

  // Row o of the LM head as the matmul sees it; for Int8 without its scale (applied to the dot product).
  void head_row(size_t o, float* row) const {
    const size_t H = size_t(cfg_->hidden_size);
    if (head_ == LmHead::F16) {
      load_floats(*w_->lm_head, o * H, H, row);
    } else if (head_ == LmHead::Int8) {
      for (size_t i = 0; i < H; ++i) row[i] = float(head_q8_[o * H + i]);
    } else {
      // fp16(q * scale): the weight the GPU's tensor cores get. H % 32 == 0 (quantize_head), so a row is
      // whole groups of 4 words.
      const uint32_t* words = &head_q4_[o * H / 8];
      const uint16_t* scales = &head_s4_[o * H / 32];
      for (size_t g = 0; g < H / 32; ++g) {
        const float s = f16_to_f32(scales[g]);
        for (size_t j = 4 * g; j < 4 * g + 4; ++j)
          for (int k = 0; k < 8; ++k)
            row[8 * j + size_t(k)] = f16_to_f32(f32_to_f16(float(int((words[j] >> (4 * k)) & 0xFu) - 8) * s));
      }
    }
  }

  void init_session(CpuSession* s, size_t max_ctx) const {
    s->pos = 0;
    s->max_ctx = max_ctx;
    s->caches.assign(cfg_->layers.size(), CpuLayerCache());
    for (size_t i = 0; i < cfg_->layers.size(); ++i) {
      const LayerConfig& lc = cfg_->layers[i];
      if (lc.kv_shared) continue;
      CpuLayerCache& c = s->caches[i];
      c.ring = lc.type == LayerType::Sliding && size_t(cfg_->sliding_window) < max_ctx;
      c.capacity = c.ring ? cfg_->sliding_window : int(max_ctx);
      c.row = lc.num_kv_heads * lc.head_dim;
      c.k.assign(size_t(c.capacity) * c.row, 0.f);
      c.v.assign(size_t(c.capacity) * c.row, 0.f);
    }
  }

  // tokens[n] at positions s.pos.. ; appends logits per `which`. Validated by the caller (ids, context).
  Status forward(CpuSession& s, const int32_t* tokens, size_t n, Logits which, std::vector<float>* logits) const {
    const ModelConfig& cfg = *cfg_;
    const int H = cfg.hidden_size, L = cfg.num_layers, D = cfg.hidden_size_per_layer_input;
    const size_t p = s.pos;
    const float eps = cfg.rms_norm_eps;

    // [n, H] fp32 residual stream
    std::vector<float> h(n * H);
    const float escale = static_cast<float>(std::sqrt(double(H)));
    for (size_t t = 0; t < n; ++t) {
      load_floats(*w_->embed, size_t(tokens[t]) * H, size_t(H), &h[t * H]);
      for (int i = 0; i < H; ++i) h[t * H + i] *= escale;
    }

    // [n, L, D] per-layer inputs
    std::vector<float> ple;
    if (D > 0) {
      const size_t LD = size_t(L) * D;
      ple.resize(n * LD);
      matmul_ref(w_->ple_model_proj, h.data(), n, ple.data());
      const float pscale = static_cast<float>(1.0 / std::sqrt(double(H)));
      const float tscale = static_cast<float>(std::sqrt(double(D)));
      const float mix = static_cast<float>(1.0 / std::sqrt(2.0));
      std::vector<float> tok(LD);
      for (size_t t = 0; t < n; ++t) {
        load_floats(*w_->ple_table, size_t(tokens[t]) * LD, LD, tok.data());
        for (int l = 0; l < L; ++l) {
          float* c = &ple[t * LD + size_t(l) * D];
          for (int k = 0; k < D; ++k) c[k] *= pscale;
          rmsnorm_ref(c, ple_norm_.data(), D, eps, c);
          for (int k = 0; k < D; ++k) c[k] = (c[k] + tok[size_t(l) * D + k] * tscale) * mix;
        }
      }
    }

    Ops ops{*this, s, n, p, which, std::move(h), std::move(ple)};
    GEMMA4_T4_TRY(gemma4_layers(ops, cfg));
    h = std::move(ops.h);  // [ops.n, H]: the chunk's rows from ops.row0 on (keep_selected may keep fewer)
    std::vector<std::vector<float>>& chunk_k = ops.chunk_k;
    std::vector<std::vector<float>>& chunk_v = ops.chunk_v;

    // ---- commit the chunk's K/V ----
    for (int li = 0; li < L; ++li) {
      if (cfg.layers[li].kv_shared) continue;
      CpuLayerCache& c = s.caches[size_t(li)];
      for (size_t t = 0; t < n; ++t) {
        if (c.ring && n - t > size_t(c.capacity)) continue;  // overwritten within this chunk anyway
        const size_t slot = c.ring ? (p + t) % size_t(c.capacity) : p + t;
        std::copy_n(&chunk_k[li][t * c.row], c.row, &c.k[slot * c.row]);
        std::copy_n(&chunk_v[li][t * c.row], c.row, &c.v[slot * c.row]);
      }
    }
    s.pos = p + n;

    // ---- head ----
    if (which == Logits::None || !logits) return Status::ok();
    const size_t first = which == Logits::All ? 0 : ops.n - 1;
    const size_t rows = ops.n - first;
    const int V = cfg.vocab_size;
    std::vector<float> xn(rows * H);
    for (size_t r = 0; r < rows; ++r) rmsnorm_ref(&h[(first + r) * H], final_norm_.data(), H, eps, &xn[r * H]);
    const size_t at = logits->size();
    logits->resize(at + rows * size_t(V));
    const float cap = cfg.final_logit_softcapping;
    float* out = logits->data() + at;
    parallel_for(size_t(V), double(V) * H * rows, [&](size_t b, size_t e) {
      std::vector<float> row(static_cast<size_t>(H));
      for (size_t o = b; o < e; ++o) {
        head_row(o, row.data());
        const float scale = head_ == LmHead::Int8 ? head_scale_[o] : 1.f;
        for (size_t r = 0; r < rows; ++r) {
          float v = dot_ref(row.data(), &xn[r * H], H) * scale;
          if (cap > 0.f) v = std::tanh(v / cap) * cap;
          out[r * V + o] = v;
        }
      }
    });
    return Status::ok();
  }

 private:
  // One forward's activations, and the block's steps over them (block.hpp): n rows, row t the chunk's token at
  // position p + row0 + t (row0 > 0 only once keep_selected() kept the last row).
  struct Ops {
    const CpuModel& m;
    CpuSession& s;
    size_t n, p;
    Logits which;
    size_t row0 = 0;
    std::vector<float> h;                              // [n, H] residual stream
    std::vector<float> ple;                            // [n, L, D] per-layer inputs
    std::vector<float> x, y, q, att, g;                // [n, H], [n, H], [n, heads, d], [n, heads, d], [n, I | D]
    std::vector<std::vector<float>> chunk_k, chunk_v;  // per owning layer: the chunk's [n, kv_heads, d]

    Ops(const CpuModel& model, CpuSession& session, size_t tokens, size_t pos, Logits w, std::vector<float>&& h0,
        std::vector<float>&& ple0)
        : m(model), s(session), n(tokens), p(pos), which(w), h(std::move(h0)), ple(std::move(ple0)) {
      const size_t H = size_t(m.cfg_->hidden_size), L = size_t(m.cfg_->num_layers);
      x.resize(n * H);
      y.resize(n * H);
      chunk_k.resize(L);
      chunk_v.resize(L);
    }
    int H() const { return m.cfg_->hidden_size; }
    float eps() const { return m.cfg_->rms_norm_eps; }

    // After layer l's K/V (block.hpp): all rows go on for Logits::All, the last for Last (its h, per-layer
    // inputs and layer l's queries), none for None.
    Status keep_selected(int l, bool* go) {
      *go = which != Logits::None;
      if (which != Logits::Last || n == 1) return Status::ok();
      const size_t H = size_t(m.cfg_->hidden_size),
                   LD = size_t(m.cfg_->num_layers) * m.cfg_->hidden_size_per_layer_input;
      const size_t QW = size_t(m.cfg_->num_heads) * m.cfg_->layers[size_t(l)].head_dim;
      h.erase(h.begin(), h.end() - std::ptrdiff_t(H));
      if (LD) ple.erase(ple.begin(), ple.end() - std::ptrdiff_t(LD));
      q.erase(q.begin(), q.end() - std::ptrdiff_t(QW));
      row0 += n - 1;
      n = 1;
      x.resize(H);
      y.resize(H);
      return Status::ok();
    }

    Status norm(int l, Norm which) {
      const Layer& ly = m.layers_[size_t(l)];
      if (which == Norm::Copy) {
        x = h;
        return Status::ok();
      }
      const float* w = which == Norm::Input ? ly.in_norm.data() : ly.pre_ff_norm.data();
      for (size_t t = 0; t < n; ++t) rmsnorm_ref(&h[t * H()], w, H(), eps(), &x[t * H()]);
      return Status::ok();
    }

    Status qkv(int l) {
      const LayerConfig& lc = m.cfg_->layers[size_t(l)];
      const LayerW& lw = m.w_->layers[size_t(l)];
      q.resize(n * size_t(m.cfg_->num_heads) * lc.head_dim);
      matmul_ref(lw.q, x.data(), n, q.data());
      if (lc.kv_shared) return Status::ok();
      std::vector<float>& k = chunk_k[size_t(l)];
      std::vector<float>& v = chunk_v[size_t(l)];
      k.resize(n * size_t(lc.num_kv_heads) * lc.head_dim);
      v.resize(k.size());
      matmul_ref(lw.k, x.data(), n, k.data());
      if (lc.k_eq_v)
        v = k;  // V is the raw k_proj output
      else
        matmul_ref(lw.v, x.data(), n, v.data());
      return Status::ok();
    }

    Status heads(int l) {
      const LayerConfig& lc = m.cfg_->layers[size_t(l)];
      const Layer& ly = m.layers_[size_t(l)];
      const int d = lc.head_dim, nh = m.cfg_->num_heads, kvh = lc.num_kv_heads;
      for (size_t t = 0; t < n; ++t)
        for (int hh = 0; hh < nh; ++hh) {
          float* qh = &q[(t * nh + hh) * d];
          rmsnorm_ref(qh, ly.q_norm.data(), d, eps(), qh);
          rope_ref(qh, d, ly.inv_freq.data(), int64_t(p + row0 + t));
        }
      if (lc.kv_shared) return Status::ok();
      std::vector<float>& k = chunk_k[size_t(l)];
      std::vector<float>& v = chunk_v[size_t(l)];
      for (size_t t = 0; t < n; ++t)
        for (int g = 0; g < kvh; ++g) {
          float* kh = &k[(t * kvh + g) * d];
          rmsnorm_ref(kh, ly.k_norm.data(), d, eps(), kh);
          rope_ref(kh, d, ly.inv_freq.data(), int64_t(p + t));
          float* vh = &v[(t * kvh + g) * d];
          rmsnorm_ref(vh, nullptr, d, eps(), vh);
        }
      return Status::ok();
    }

    // Keys below p come from the session's cache, keys from p on from this chunk (committed after the last
    // layer).
    Status attend(int l) {
      const ModelConfig& cfg = *m.cfg_;
      const LayerConfig& lc = cfg.layers[size_t(l)];
      const int d = lc.head_dim, nh = cfg.num_heads, kvh = lc.num_kv_heads;
      const int src = lc.kv_source;
      const CpuLayerCache& cache = s.caches[size_t(src)];
      const std::vector<float>& ck = chunk_k[size_t(src)];
      const std::vector<float>& cv = chunk_v[size_t(src)];
      const int row = kvh * d;
      auto key_at = [&](size_t j, int g) -> const float* {
        if (j >= p) return &ck[(j - p) * row + size_t(g) * d];
        const size_t slot = cache.ring ? j % size_t(cache.capacity) : j;
        return &cache.k[slot * row + size_t(g) * d];
      };
      auto val_at = [&](size_t j, int g) -> const float* {
        if (j >= p) return &cv[(j - p) * row + size_t(g) * d];
        const size_t slot = cache.ring ? j % size_t(cache.capacity) : j;
        return &cache.v[slot * row + size_t(g) * d];
      };
      att.assign(n * nh * d, 0.f);
      const int group = nh / kvh;
      parallel_for(n * nh, double(n) * nh * (p + n) * d, [&](size_t b, size_t e) {
        std::vector<float> sc;
        for (size_t idx = b; idx < e; ++idx) {
          const size_t t = idx / nh;
          const int hh = int(idx % nh), g = hh / group;
          const size_t qp = p + row0 + t;
          const size_t lo = (lc.type == LayerType::Sliding && qp + 1 > size_t(cfg.sliding_window))
                                ? qp + 1 - size_t(cfg.sliding_window)
                                : 0;
          const float* qh = &q[(t * nh + hh) * d];
          sc.resize(qp - lo + 1);
          float mx = -INFINITY;
          for (size_t j = lo; j <= qp; ++j) {
            sc[j - lo] = dot_ref(qh, key_at(j, g), d);
            mx = std::max(mx, sc[j - lo]);
          }
          double sum = 0.0;
          for (float& v : sc) {
            v = std::exp(v - mx);
            sum += v;
          }
          float* out = &att[(t * nh + hh) * d];
          for (size_t j = lo; j <= qp; ++j) {
            const float pw = static_cast<float>(sc[j - lo] / sum);
            const float* vh = val_at(j, g);
            for (int c = 0; c < d; ++c) out[c] += pw * vh[c];
          }
        }
      });
      return Status::ok();
    }

    Status gate(int l, Branch b) {
      const LayerW& lw = m.w_->layers[size_t(l)];
      if (b == Branch::Mlp) {
        const size_t I = size_t(m.cfg_->layers[size_t(l)].intermediate_size);
        std::vector<float> up(n * I);
        g.resize(n * I);
        matmul_ref(lw.gate, x.data(), n, g.data());
        matmul_ref(lw.up, x.data(), n, up.data());
        for (size_t i = 0; i < g.size(); ++i) g[i] = gelu_tanh_ref(g[i]) * up[i];
        return Status::ok();
      }
      const size_t L = size_t(m.cfg_->num_layers), D = size_t(m.cfg_->hidden_size_per_layer_input);
      g.resize(n * D);
      matmul_ref(lw.ple_gate, x.data(), n, g.data());
      for (size_t t = 0; t < n; ++t)
        for (size_t k = 0; k < D; ++k) g[t * D + k] = gelu_tanh_ref(g[t * D + k]) * ple[t * L * D + size_t(l) * D + k];
      return Status::ok();
    }

    Status residual(int l, Branch b) {
      const LayerW& lw = m.w_->layers[size_t(l)];
      const Layer& ly = m.layers_[size_t(l)];
      const LinearW& proj = b == Branch::Attention ? lw.o : b == Branch::Mlp ? lw.down : lw.ple_proj;
      const std::vector<float>& w = b == Branch::Attention ? ly.post_attn_norm
                                    : b == Branch::Mlp     ? ly.post_ff_norm
                                                           : ly.post_ple_norm;
      matmul_ref(proj, b == Branch::Attention ? att.data() : g.data(), n, y.data());
      for (size_t t = 0; t < n; ++t) {
        rmsnorm_ref(&y[t * H()], w.data(), H(), eps(), &y[t * H()]);
        for (int i = 0; i < H(); ++i) h[t * H() + i] += y[t * H() + i];
      }
      return Status::ok();
    }

    Status scale(int l) {
      for (float& v : h) v *= m.layers_[size_t(l)].scalar;
      return Status::ok();
    }
  };

  struct Layer {
    std::vector<float> in_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm, post_ple_norm;
    std::vector<float> inv_freq;  // [d/2]
    float scalar = 1.f;
  };
  const ModelConfig* cfg_ = nullptr;
  const Weights* w_ = nullptr;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_, ple_norm_;
  LmHead head_ = LmHead::F16;
  std::vector<int8_t> head_q8_;    // Int8: [V, H]
  std::vector<float> head_scale_;  // Int8: [V]
  std::vector<uint32_t> head_q4_;  // Int4: [V, H / 8]
  std::vector<uint16_t> head_s4_;  // Int4: [V, H / 32] fp16
};

class CpuBackend : public BackendModel {
 public:
  Status init(const ModelConfig& cfg, const Weights& w, LmHead head = LmHead::F16) {
    cfg_ = &cfg;
    w_ = &w;
    return model_.init(cfg, w, head);
  }
  Backend kind() const override { return Backend::Cpu; }
  // Weights are read in place from the mapped checkpoint (plus a quantized LM head copy when asked); the KV cache is
  // fp32, sized as init_session does (a sliding layer keeps a ring of `window` slots once max_ctx exceeds the window).
  size_t weight_bytes() const override { return w_->file_bytes() + model_.head_copy_bytes(); }
  size_t kv_bytes_per_token() const override { return kv_bytes_per_position(*cfg_, sizeof(float)); }
  size_t session_bytes(size_t max_ctx) const override {
    size_t b = 0;
    for (const LayerConfig& lc : cfg_->layers) {
      if (lc.kv_shared) continue;
      const bool ring = lc.type == LayerType::Sliding && size_t(cfg_->sliding_window) < max_ctx;
      b += 2 * (ring ? size_t(cfg_->sliding_window) : max_ctx) * lc.num_kv_heads * lc.head_dim * sizeof(float);
    }
    return b;
  }
  Status new_session(size_t max_ctx, std::unique_ptr<BackendSession>* out) const override {
    auto s = std::make_unique<CpuSession>();
    model_.init_session(s.get(), max_ctx);
    *out = std::move(s);
    return Status::ok();
  }
  Status copy_prefix(const BackendSession& src_base, BackendSession& dst_base, size_t n) const override {
    const auto& src = static_cast<const CpuSession&>(src_base);
    auto& dst = static_cast<CpuSession&>(dst_base);
    for (size_t l = 0; l < cfg_->layers.size(); ++l) {
      const CpuLayerCache& c = src.caches[l];
      const size_t lo = kv_prefix_start(*cfg_, cfg_->layers[l], n);
      if (!cfg_->layers[l].kv_shared && !kv_holds(size_t(c.capacity), src.pos, lo))
        return err(Code::InvalidArgument, "copy_prefix: layer ", l, " of the source session keeps its last ",
                   c.capacity, " positions and is at ", src.pos, ": positions [", lo, ", ", n,
                   ") of the prefix have been overwritten");
    }
    for (size_t l = 0; l < cfg_->layers.size(); ++l) {
      if (cfg_->layers[l].kv_shared) continue;
      const CpuLayerCache& from = src.caches[l];
      CpuLayerCache& to = dst.caches[l];
      const size_t row = size_t(from.row);
      for_each_slot_run(kv_prefix_start(*cfg_, cfg_->layers[l], n), n, size_t(from.capacity), size_t(to.capacity),
                        [&](size_t s, size_t d, size_t len) {
                          std::copy_n(&from.k[s * row], len * row, &to.k[d * row]);
                          std::copy_n(&from.v[s * row], len * row, &to.v[d * row]);
                        });
    }
    dst.pos = n;
    return Status::ok();
  }
  Status forward(const ForwardItem* items, size_t count, Logits which, std::vector<float>* logits) const override {
    for (size_t i = 0; i < count; ++i)
      GEMMA4_T4_TRY(
          model_.forward(static_cast<CpuSession&>(*items[i].session), items[i].tokens, items[i].n, which, logits));
    return Status::ok();
  }

 private:
  CpuModel model_;
  const ModelConfig* cfg_ = nullptr;
  const Weights* w_ = nullptr;
};

}  // namespace detail
}  // namespace gemma4_t4
