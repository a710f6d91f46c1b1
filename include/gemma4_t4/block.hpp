// gemma4_t4 implementation part: the Gemma 4 decoder layer, written once.
//
// Every executor runs a layer through gemma4_layer(): it names the steps of the block in the model's order,
// and each executor's Ops implements them -- the CPU backend in fp32 (cpu_backend.hpp), the CUDA backend as
// kernel launches with the norms folded into the residual kernels (cuda/layers.hpp), and the persistent decode
// executor as instructions of one kernel (cuda/persistent.hpp). A variant of the block (another norm, another
// residual branch) is a change here and to each Ops, not a fourth copy of the layer.
//
//   x = input_layernorm(h)                                   norm(l, Norm::Input)
//   q, k, v = q_proj x, k_proj x, v_proj x                   qkv(l)      KV-shared layers: q only; k_eq_v: v = k
//   q = rope(q_norm q); k = rope(k_norm k); v = rms(v)       heads(l)    k, v into the layer's own cache
//   a = softmax(q K^T) V                                     attend(l)   over kv_source's cache; sliding window
//   h += post_attention_layernorm(o_proj a)                  residual(l, Branch::Attention)
//   x = pre_feedforward_layernorm(h)                         norm(l, Norm::PreMlp)
//   g = gelu_tanh(gate_proj x) * up_proj x                   gate(l, Branch::Mlp)
//   h += post_feedforward_layernorm(down_proj g)             residual(l, Branch::Mlp)
// per-layer input (hidden_size_per_layer_input > 0; ple[l] from the token's row and the embedding):
//   x = h                                                    norm(l, Norm::Copy)
//   g = gelu_tanh(per_layer_input_gate x) * ple[l]           gate(l, Branch::Ple)
//   h += post_per_layer_input_norm(per_layer_projection g)   residual(l, Branch::Ple)
//   h *= layer_scalar                                        scale(l)
// All norms are RMSNorms in fp32 that multiply by the weight directly (x * rsqrt(mean(x^2) + eps) * w).
//
// Rows whose logits a pass does not return (a prompt's rows but its last): only the caches they leave matter,
// and the last layer that writes one (kv_keep_layer: E2B's layer 14, before the KV-shared layers 15..34 that read
// an earlier layer's cache and write none) needs nothing of theirs past its K/V. So right after that layer's
// heads(l) (its K/V in the cache), ops.keep_selected() keeps only the selected rows (the last row of each prompt
// chunk, every decode row) for the rest of the model; a pass that returns no logits (Logits::None, a chunk that is
// not its prompt's last) stops there. The caches a pass leaves, and the logits it returns, are the same either way.
#pragma once

namespace gemma4_t4 {
namespace detail {

enum class Norm {
  Input,   // input_layernorm
  PreMlp,  // pre_feedforward_layernorm
  Copy,    // no norm: the per-layer-input gate reads h itself
};

enum class Branch {
  Attention,  // o_proj, post_attention_layernorm
  Mlp,        // gate_proj / up_proj, down_proj, post_feedforward_layernorm
  Ple,        // per_layer_input_gate, per_layer_projection, post_per_layer_input_norm
};

// The last layer that writes a cache (every layer after it is KV-shared: it reads an earlier layer's cache and
// writes none): after its heads(), only the selected rows go on (see the header).
inline int kv_keep_layer(const ModelConfig& cfg) {
  int l = cfg.num_layers - 1;
  while (l > 0 && cfg.layers[size_t(l)].kv_shared) --l;
  return l;
}

// One decoder layer of Gemma 4 through `ops` (see the header for what each step means). In layer kv_keep_layer,
// keep_selected(l, &go) after heads(l): from here on only the rows whose logits are wanted; *go = false (there
// are none): the pass ends there (*go is left true otherwise, and after every other layer).
template <class Ops>
Status gemma4_layer(Ops& ops, const ModelConfig& cfg, int l, bool* go) {
  GEMMA4_T4_TRY(ops.norm(l, Norm::Input));
  GEMMA4_T4_TRY(ops.qkv(l));
  GEMMA4_T4_TRY(ops.heads(l));
  if (l == kv_keep_layer(cfg)) {
    GEMMA4_T4_TRY(ops.keep_selected(l, go));
    if (!*go) return Status::ok();
  }
  GEMMA4_T4_TRY(ops.attend(l));
  GEMMA4_T4_TRY(ops.residual(l, Branch::Attention));
  GEMMA4_T4_TRY(ops.norm(l, Norm::PreMlp));
  GEMMA4_T4_TRY(ops.gate(l, Branch::Mlp));
  GEMMA4_T4_TRY(ops.residual(l, Branch::Mlp));
  if (cfg.hidden_size_per_layer_input > 0) {
    GEMMA4_T4_TRY(ops.norm(l, Norm::Copy));
    GEMMA4_T4_TRY(ops.gate(l, Branch::Ple));
    GEMMA4_T4_TRY(ops.residual(l, Branch::Ple));
  }
  return ops.scale(l);
}

// Every layer, in order (the selected rows only past kv_keep_layer's heads).
template <class Ops>
Status gemma4_layers(Ops& ops, const ModelConfig& cfg) {
  bool go = true;
  for (int l = 0; l < cfg.num_layers && go; ++l) GEMMA4_T4_TRY(gemma4_layer(ops, cfg, l, &go));
  return Status::ok();
}

}  // namespace detail
}  // namespace gemma4_t4
