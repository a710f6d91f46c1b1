// gemma4_t4 implementation part: config.json -> ModelConfig.
//
// Accepts the flat `gemma4_text` layout and the nested `gemma4` layout (text model under `text_config`),
// with the reference implementation's defaults (transformers Gemma4TextConfig) for absent fields, both
// spellings of the full-attention head dims (`global_head_dim` / `num_global_key_value_heads`, or
// `per_layer_config` {layer: {head_dim, num_key_value_heads}}), and `quantization_config` for
// compressed-tensors pack-quantized int4 symmetric group-32 weights. Everything else the text model
// would need to run differently is refused with a message that names it.
#pragma once

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace gemma4_t4 {
namespace detail {

using json = nlohmann::json;

// Reads an integer field (absent or null -> def). Fails on a non-integer or out of [lo, hi].
inline Status json_int(const json& j, const char* key, int def, int lo, int hi, const std::string& where, int* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = def;
    return Status::ok();
  }
  if (!it->is_number_integer())
    return err(Code::FormatError, where, ": '", key, "' must be an integer, got ", it->dump());
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return err(Code::FormatError, where, ": '", key, "' = ", v, " is outside [", lo, ", ", hi, "]");
  *out = static_cast<int>(v);
  return Status::ok();
}

inline Status json_float(const json& j, const char* key, double def, const std::string& where, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = def;
    return Status::ok();
  }
  if (!it->is_number() || !std::isfinite(it->get<double>()))
    return err(Code::FormatError, where, ": '", key, "' must be a finite number, got ", it->dump());
  *out = it->get<double>();
  return Status::ok();
}

inline Status json_bool(const json& j, const char* key, bool def, const std::string& where, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = def;
    return Status::ok();
  }
  if (!it->is_boolean()) return err(Code::FormatError, where, ": '", key, "' must be true or false, got ", it->dump());
  *out = it->get<bool>();
  return Status::ok();
}

inline Status json_string(const json& j, const char* key, const std::string& def, const std::string& where,
                          std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    *out = def;
    return Status::ok();
  }
  if (!it->is_string()) return err(Code::FormatError, where, ": '", key, "' must be a string, got ", it->dump());
  *out = it->get<std::string>();
  return Status::ok();
}

// compressed-tensors: only pack-quantized int4, symmetric, group 32 along the input, weights only.
inline Status parse_quantization(const json& q, const std::string& where, ModelConfig* cfg) {
  const std::string w = where + ": quantization_config";
  if (!q.is_object()) return err(Code::FormatError, w, " is not an object");
  std::string method, top_format;
  GEMMA4_T4_TRY(json_string(q, "quant_method", "(none)", w, &method));
  if (method != "compressed-tensors")
    return err(Code::Unsupported, w, ": quant_method '", method,
               "' is not supported (only compressed-tensors pack-quantized int4 w4a16)");
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty())
    return err(Code::FormatError, w, ": config_groups missing or empty");
  GEMMA4_T4_TRY(json_string(q, "format", "", w, &top_format));
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const std::string g = w + ".config_groups." + it.key();
    if (!it->is_object()) return err(Code::FormatError, g, " is not an object");
    std::string fmt;
    GEMMA4_T4_TRY(json_string(*it, "format", top_format, g, &fmt));
    if (fmt != "pack-quantized")
      return err(Code::Unsupported, g, ": format '", fmt, "' is not supported (only pack-quantized)");
    auto ia = it->find("input_activations");
    if (ia != it->end() && !ia->is_null())
      return err(Code::Unsupported, g, ": quantized input activations are not supported (w4a16 only)");
    auto oa = it->find("output_activations");
    if (oa != it->end() && !oa->is_null())
      return err(Code::Unsupported, g, ": quantized output activations are not supported");
    auto wt = it->find("weights");
    if (wt == it->end() || !wt->is_object()) return err(Code::FormatError, g, ": 'weights' missing");
    const json& ws = *wt;
    const std::string gw = g + ".weights";
    int bits = 0, group_size = 0;
    bool symmetric = false, dynamic = false;
    std::string type, strategy;
    GEMMA4_T4_TRY(json_int(ws, "num_bits", 0, 0, 64, gw, &bits));
    GEMMA4_T4_TRY(json_int(ws, "group_size", 0, -1, 1 << 20, gw, &group_size));
    GEMMA4_T4_TRY(json_bool(ws, "symmetric", false, gw, &symmetric));
    GEMMA4_T4_TRY(json_bool(ws, "dynamic", false, gw, &dynamic));
    GEMMA4_T4_TRY(json_string(ws, "type", "", gw, &type));
    GEMMA4_T4_TRY(json_string(ws, "strategy", "", gw, &strategy));
    if (bits != 4) return err(Code::Unsupported, gw, ": num_bits ", bits, " is not supported (only 4)");
    if (type != "int") return err(Code::Unsupported, gw, ": type '", type, "' is not supported (only int)");
    if (!symmetric) return err(Code::Unsupported, gw, ": asymmetric quantization (zero points) is not supported");
    if (strategy != "group")
      return err(Code::Unsupported, gw, ": strategy '", strategy, "' is not supported (only group)");
    if (group_size != 32) return err(Code::Unsupported, gw, ": group_size ", group_size, " is not supported (only 32)");
    auto ao = ws.find("actorder");
    if (ao != ws.end() && !ao->is_null() && !(ao->is_boolean() && !ao->get<bool>()))
      return err(Code::Unsupported, gw, ": act-order (", ao->dump(), ") is not supported");
    if (dynamic) return err(Code::Unsupported, gw, ": dynamic quantization is not supported");
  }
  cfg->weight_format = WeightFormat::W4A16;
  cfg->quant_group_size = 32;
  return Status::ok();
}

struct RopeSpec {
  std::string type = "default";
  double theta = 10000.0;
  double partial = 1.0;
  double factor = 1.0;
};

inline Status parse_rope(const json& params, const std::string& where, RopeSpec* out) {
  if (!params.is_object()) return err(Code::FormatError, where, " is not an object");
  GEMMA4_T4_TRY(json_string(params, "rope_type", "default", where, &out->type));
  if (out->type != "default" && out->type != "proportional")
    return err(Code::Unsupported, where, ": rope_type '", out->type, "' is not supported (default, proportional)");
  GEMMA4_T4_TRY(json_float(params, "rope_theta", out->theta, where, &out->theta));
  GEMMA4_T4_TRY(json_float(params, "partial_rotary_factor", 1.0, where, &out->partial));
  GEMMA4_T4_TRY(json_float(params, "factor", 1.0, where, &out->factor));
  if (out->theta <= 1.0 || out->partial <= 0.0 || out->partial > 1.0 || out->factor <= 0.0)
    return err(Code::FormatError, where, ": rope_theta/partial_rotary_factor/factor out of range");
  return Status::ok();
}

// Parses config.json text. `where` names the file in messages.
inline Status parse_config(const std::string& text, const std::string& where, ModelConfig* out) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return err(Code::FormatError, where, ": not well-formed JSON");
  if (!root.is_object()) return err(Code::FormatError, where, ": top level is not a JSON object");
  ModelConfig cfg;
  GEMMA4_T4_TRY(json_string(root, "model_type", "", where, &cfg.model_type));
  const json* t = &root;
  std::string tw = where;
  if (cfg.model_type == "gemma4") {
    auto tc = root.find("text_config");
    if (tc == root.end() || !tc->is_object())
      return err(Code::FormatError, where, ": model_type gemma4 needs an object 'text_config'");
    t = &*tc;
    tw = where + ": text_config";
    std::string inner;
    GEMMA4_T4_TRY(json_string(*t, "model_type", "gemma4_text", tw, &inner));
    if (inner != "gemma4_text") return err(Code::Unsupported, tw, ": model_type '", inner, "' is not gemma4_text");
  } else if (cfg.model_type != "gemma4_text") {
    return err(Code::Unsupported, where, ": model_type '", cfg.model_type,
               "' is not a Gemma 4 text model (expected gemma4 or gemma4_text)");
  }
  const json& j = *t;

  bool moe = false;
  GEMMA4_T4_TRY(json_bool(j, "enable_moe_block", false, tw, &moe));
  if (moe)
    return err(Code::Unsupported, tw, ": enable_moe_block is true; MoE Gemma 4 models (26B-A4B) are not supported");
  {
    auto ne = j.find("num_experts");
    if (ne != j.end() && ne->is_number_integer() && ne->get<int64_t>() > 0)
      return err(Code::Unsupported, tw, ": num_experts = ", ne->get<int64_t>(), "; MoE models are not supported");
  }
  bool attention_bias = false;
  GEMMA4_T4_TRY(json_bool(j, "attention_bias", false, tw, &attention_bias));
  if (attention_bias) return err(Code::Unsupported, tw, ": attention_bias true is not supported");
  {
    auto bi = j.find("use_bidirectional_attention");
    if (bi != j.end() && bi->is_string() && bi->get<std::string>() == "all")
      return err(Code::Unsupported, tw, ": use_bidirectional_attention 'all' is not supported (causal text model)");
  }
  std::string act;
  GEMMA4_T4_TRY(json_string(j, "hidden_activation", "gelu_pytorch_tanh", tw, &act));
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh")
    return err(Code::Unsupported, tw, ": hidden_activation '", act, "' is not supported (gelu_pytorch_tanh)");

  constexpr int kMaxDim = 1 << 16;
  int num_kv_heads = 0, head_dim = 0, global_head_dim = 0, num_global_kv = 0, intermediate = 0;
  GEMMA4_T4_TRY(json_int(j, "hidden_size", 2304, 1, kMaxDim, tw, &cfg.hidden_size));
  GEMMA4_T4_TRY(json_int(j, "num_hidden_layers", 30, 1, 1024, tw, &cfg.num_layers));
  GEMMA4_T4_TRY(json_int(j, "num_attention_heads", 8, 1, 1024, tw, &cfg.num_heads));
  GEMMA4_T4_TRY(json_int(j, "num_key_value_heads", 4, 1, 1024, tw, &num_kv_heads));
  GEMMA4_T4_TRY(json_int(j, "head_dim", 256, 2, 4096, tw, &head_dim));
  GEMMA4_T4_TRY(json_int(j, "global_head_dim", 512, 0, 4096, tw, &global_head_dim));
  GEMMA4_T4_TRY(json_int(j, "num_global_key_value_heads", 0, 0, 1024, tw, &num_global_kv));
  GEMMA4_T4_TRY(json_int(j, "vocab_size", 262144, 1, 1 << 24, tw, &cfg.vocab_size));
  GEMMA4_T4_TRY(json_int(j, "vocab_size_per_layer_input", 262144, 1, 1 << 24, tw, &cfg.vocab_size_per_layer_input));
  GEMMA4_T4_TRY(json_int(j, "hidden_size_per_layer_input", 256, 0, kMaxDim, tw, &cfg.hidden_size_per_layer_input));
  GEMMA4_T4_TRY(json_int(j, "sliding_window", 512, 1, 1 << 24, tw, &cfg.sliding_window));
  GEMMA4_T4_TRY(json_int(j, "num_kv_shared_layers", 0, 0, 1024, tw, &cfg.num_kv_shared_layers));
  GEMMA4_T4_TRY(json_int(j, "max_position_embeddings", 131072, 1, 1 << 24, tw, &cfg.max_position_embeddings));
  GEMMA4_T4_TRY(json_int(j, "bos_token_id", 2, 0, 1 << 24, tw, &cfg.bos_token_id));
  GEMMA4_T4_TRY(json_int(j, "pad_token_id", 0, 0, 1 << 24, tw, &cfg.pad_token_id));
  double eps = 1e-6, softcap = 0.0;
  GEMMA4_T4_TRY(json_float(j, "rms_norm_eps", 1e-6, tw, &eps));
  GEMMA4_T4_TRY(json_float(j, "final_logit_softcapping", 0.0, tw, &softcap));
  if (eps <= 0 || eps > 1e-1 || softcap < 0)
    return err(Code::FormatError, tw, ": rms_norm_eps or final_logit_softcapping out of range");
  cfg.rms_norm_eps = static_cast<float>(eps);
  cfg.final_logit_softcapping = static_cast<float>(softcap);
  bool k_eq_v = false, double_wide = false, tie_text = true, tie_root = true;
  GEMMA4_T4_TRY(json_bool(j, "attention_k_eq_v", false, tw, &k_eq_v));
  GEMMA4_T4_TRY(json_bool(j, "use_double_wide_mlp", false, tw, &double_wide));
  GEMMA4_T4_TRY(json_bool(j, "tie_word_embeddings", true, tw, &tie_text));
  GEMMA4_T4_TRY(json_bool(root, "tie_word_embeddings", true, where, &tie_root));
  cfg.tie_word_embeddings = tie_text && tie_root;

  // eos: int or list, in the text config or at the top level.
  const json* eos = nullptr;
  if (j.contains("eos_token_id") && !j.at("eos_token_id").is_null())
    eos = &j.at("eos_token_id");
  else if (root.contains("eos_token_id") && !root.at("eos_token_id").is_null())
    eos = &root.at("eos_token_id");
  if (!eos)
    cfg.eos_token_ids = {1};
  else {
    const json one = json::array({*eos});
    const json& list = eos->is_array() ? *eos : one;
    for (const auto& e : list) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= (int64_t(1) << 24))
        return err(Code::FormatError, tw, ": eos_token_id must be a token id or a list of them, got ", eos->dump());
      cfg.eos_token_ids.push_back(e.get<int>());
    }
  }

  const int L = cfg.num_layers;
  if (cfg.num_kv_shared_layers >= L)
    return err(Code::FormatError, tw, ": num_kv_shared_layers ", cfg.num_kv_shared_layers,
               " must be below num_hidden_layers ", L);
  if (cfg.num_heads % num_kv_heads != 0)
    return err(Code::FormatError, tw, ": num_attention_heads ", cfg.num_heads,
               " is not a multiple of num_key_value_heads ", num_kv_heads);

  // intermediate_size: one number, or one per layer.
  std::vector<int> inter(L);
  {
    auto it = j.find("intermediate_size");
    if (it != j.end() && it->is_array()) {
      if (static_cast<int>(it->size()) != L)
        return err(Code::FormatError, tw, ": intermediate_size list length != num_hidden_layers");
      for (int i = 0; i < L; ++i) {
        if (!(*it)[i].is_number_integer() || (*it)[i].get<int64_t>() < 1 || (*it)[i].get<int64_t>() > (1 << 20))
          return err(Code::FormatError, tw, ": intermediate_size[", i, "] is not a positive integer");
        inter[i] = (*it)[i].get<int>();
      }
    } else {
      GEMMA4_T4_TRY(json_int(j, "intermediate_size", 9216, 1, 1 << 20, tw, &intermediate));
      std::fill(inter.begin(), inter.end(), intermediate);
    }
  }

  // layer_types: explicit list, else the reference's default 5:1 pattern; the last layer is always full.
  std::vector<LayerType> types(L);
  {
    auto it = j.find("layer_types");
    if (it != j.end() && !it->is_null()) {
      if (!it->is_array() || static_cast<int>(it->size()) != L)
        return err(Code::FormatError, tw, ": layer_types must be a list of num_hidden_layers (", L, ") entries");
      for (int i = 0; i < L; ++i) {
        const std::string s = (*it)[i].is_string() ? (*it)[i].get<std::string>() : (*it)[i].dump();
        if (s == "sliding_attention")
          types[i] = LayerType::Sliding;
        else if (s == "full_attention")
          types[i] = LayerType::Full;
        else
          return err(Code::Unsupported, tw, ": layer_types[", i, "] = '", s,
                     "' is not supported (sliding_attention, full_attention)");
      }
    } else {
      for (int i = 0; i < L; ++i) types[i] = ((i + 1) % 6) ? LayerType::Sliding : LayerType::Full;
    }
    types[L - 1] = LayerType::Full;
  }

  // RoPE per layer type.
  RopeSpec rope_sliding, rope_full;
  rope_full.type = "proportional";
  rope_full.theta = 1e6;
  rope_full.partial = 0.25;
  {
    auto it = j.find("rope_parameters");
    if (it != j.end() && !it->is_null()) {
      if (!it->is_object()) return err(Code::FormatError, tw, ": rope_parameters is not an object");
      if (it->contains("rope_type") || it->contains("rope_theta")) {  // one set for every layer type
        GEMMA4_T4_TRY(parse_rope(*it, tw + ": rope_parameters", &rope_sliding));
        rope_full = rope_sliding;
      } else {
        if (it->contains("sliding_attention"))
          GEMMA4_T4_TRY(
              parse_rope(it->at("sliding_attention"), tw + ": rope_parameters.sliding_attention", &rope_sliding));
        if (it->contains("full_attention"))
          GEMMA4_T4_TRY(parse_rope(it->at("full_attention"), tw + ": rope_parameters.full_attention", &rope_full));
      }
    }
  }

  // per_layer_config (newer spelling): {"<layer>": {"head_dim": d, "num_key_value_heads": h}}.
  std::vector<int> plc_head(L, 0), plc_kv(L, 0);
  bool have_plc = false;
  {
    auto it = j.find("per_layer_config");
    if (it != j.end() && !it->is_null()) {
      if (!it->is_object()) return err(Code::FormatError, tw, ": per_layer_config is not an object");
      have_plc = true;
      for (auto e = it->begin(); e != it->end(); ++e) {
        char* end = nullptr;
        const long idx = std::strtol(e.key().c_str(), &end, 10);
        if (e.key().empty() || *end != '\0' || idx < 0 || idx >= L)
          return err(Code::FormatError, tw, ": per_layer_config key '", e.key(), "' is not a layer index");
        if (!e->is_object()) return err(Code::FormatError, tw, ": per_layer_config[", idx, "] is not an object");
        const std::string pw = tw + ": per_layer_config[" + e.key() + "]";
        GEMMA4_T4_TRY(json_int(*e, "head_dim", 0, 0, 4096, pw, &plc_head[idx]));
        GEMMA4_T4_TRY(json_int(*e, "num_key_value_heads", 0, 0, 1024, pw, &plc_kv[idx]));
      }
    }
  }

  const int first_shared = L - cfg.num_kv_shared_layers;
  cfg.layers.resize(L);
  for (int i = 0; i < L; ++i) {
    LayerConfig& lc = cfg.layers[i];
    lc.type = types[i];
    const bool full = lc.type == LayerType::Full;
    lc.k_eq_v = k_eq_v && full;
    lc.head_dim = head_dim;
    lc.num_kv_heads = num_kv_heads;
    if (full && !have_plc && global_head_dim > 0) lc.head_dim = global_head_dim;
    if (lc.k_eq_v && !have_plc && num_global_kv > 0) lc.num_kv_heads = num_global_kv;
    if (plc_head[i] > 0) lc.head_dim = plc_head[i];
    if (plc_kv[i] > 0) lc.num_kv_heads = plc_kv[i];
    if (lc.head_dim % 2 != 0) return err(Code::FormatError, tw, ": layer ", i, " head_dim ", lc.head_dim, " is odd");
    if (cfg.num_heads % lc.num_kv_heads != 0)
      return err(Code::FormatError, tw, ": layer ", i, ": num_attention_heads ", cfg.num_heads,
                 " is not a multiple of its ", lc.num_kv_heads, " KV heads");
    lc.kv_shared = i >= first_shared;
    lc.kv_source = i;
    if (lc.kv_shared) {
      lc.kv_source = -1;
      for (int s = first_shared - 1; s >= 0; --s)
        if (types[s] == lc.type) {
          lc.kv_source = s;
          break;
        }
      if (lc.kv_source < 0)
        return err(Code::FormatError, tw, ": KV-shared layer ", i,
                   " has no earlier non-shared layer of its type to read");
      const LayerConfig& src = cfg.layers[lc.kv_source];
      if (src.head_dim != lc.head_dim || src.num_kv_heads != lc.num_kv_heads)
        return err(Code::FormatError, tw, ": KV-shared layer ", i, " and its source ", lc.kv_source,
                   " differ in head dims");
      lc.k_eq_v = src.k_eq_v;
    }
    lc.intermediate_size = inter[i] * ((double_wide && lc.kv_shared) ? 2 : 1);
    const RopeSpec& r = full ? rope_full : rope_sliding;
    lc.rope_theta = static_cast<float>(r.theta);
    lc.rope_factor = static_cast<float>(r.factor);
    lc.rope_denominator = lc.head_dim;
    if (r.type == "proportional") {
      lc.rope_pairs = static_cast<int>(std::floor(r.partial * lc.head_dim / 2.0));
    } else {  // default: every pair rotates (the reference ignores partial_rotary_factor here)
      lc.rope_pairs = lc.head_dim / 2;
    }
    if (lc.rope_pairs < 1 || lc.rope_pairs > lc.head_dim / 2)
      return err(Code::FormatError, tw, ": layer ", i, " RoPE rotates ", lc.rope_pairs, " pairs of a ", lc.head_dim,
                 "-wide head");
  }

  const json* quant = nullptr;
  if (root.contains("quantization_config") && !root.at("quantization_config").is_null())
    quant = &root.at("quantization_config");
  else if (j.contains("quantization_config") && !j.at("quantization_config").is_null())
    quant = &j.at("quantization_config");
  if (quant) GEMMA4_T4_TRY(parse_quantization(*quant, where, &cfg));
  *out = std::move(cfg);
  return Status::ok();
}

inline Status read_text_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return err(Code::NotFound, path, ": cannot open");
  out->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return err(Code::IoError, path, ": read failed");
  return Status::ok();
}

// The RoPE frequencies of a layer (LayerConfig's rope_*): inv_freq[k] = theta^(-2k / denominator) / factor for
// the rotated pairs, 0 (identity) for the rest. [head_dim / 2] fp32; both backends use this table.
inline std::vector<float> rope_inv_freq(const LayerConfig& lc) {
  std::vector<float> f(size_t(lc.head_dim / 2), 0.f);
  for (int k = 0; k < lc.rope_pairs; ++k) {
    const float e = float(2 * k) / float(lc.rope_denominator);
    f[k] = (1.0f / std::pow(lc.rope_theta, e)) / lc.rope_factor;
  }
  return f;
}

}  // namespace detail
}  // namespace gemma4_t4
