// make_synthetic: writes full-size synthetic Gemma 4 checkpoints in the real Hugging Face layouts, so
// benchmarks can run at real size without downloading weights.
//
//   make_synthetic --model e2b|e4b|tiny --format bf16|w4a16 --out DIR [--seed N] [--layers N] [--vocab N]
//   make_synthetic --model e2b --format bf16 --dry-run      (sizes only, nothing written)
//
// Standalone C++17 (standard library + nlohmann/json only; it does not include the gemma4_t4 headers):
//   g++ -std=c++17 -O2 -Wall -Wextra -pthread -o make_synthetic tools/make_synthetic.cpp
//
// What it writes into DIR
//   config.json        nested `gemma4` config with `text_config` spelled as transformers 5.17 writes it (the
//                      structure of tests/fixtures/mm_bf16/config.json: full layers' head dims under
//                      `per_layer_config`), plus `quantization_config` for w4a16 (identical to the fixture's).
//   model.safetensors  one file, text tensors under `model.language_model.`, a few dummy
//                      `model.vision_tower.*` / `model.audio_tower.*` / `model.embed_*` tensors (which a text
//                      engine must skip). Tensors are laid out as the safetensors writer does: ordered by
//                      dtype size (largest first), then by name; header JSON padded with spaces to a multiple
//                      of 8 bytes; `__metadata__` {"format": "pt"}.
//     bf16:  every tensor BF16; KV-shared layers ALSO carry k_proj/v_proj/k_norm (the real bf16 E2B file
//            ships them; the model never uses them).
//     w4a16: compressed-tensors pack-quantized: every q/k/v/o, gate/up/down, per_layer_input_gate,
//            per_layer_projection and per_layer_model_projection as weight_packed I32 [out, in/8] +
//            weight_scale BF16 [out, in/32] + weight_shape I64 [2]; no k/v/k_norm for KV-shared layers (as
//            the QAT file ships); embeddings, norms and layer_scalar stay BF16.
//
// Values (deterministic: each tensor has its own counter-based splitmix64 stream keyed by the seed and a
// hash of the tensor name, so any chunking or thread count gives the same bytes):
//   linears N(0, 1/in) (Irwin-Hall sum of four uniforms), embeddings and tower tensors N(0, 1) * 0.05,
//   norms U(0.6, 1.4), layer_scalar U(0.5, 1.0), all rounded to bf16 and never exactly zero;
//   int4 nibbles uniform 0..15, scales U(0.75, 1.25) / (8 sqrt(in)).
//
// The file is streamed: the header (names, dtypes, shapes, offsets) is computed first, then each tensor is
// generated and written in 4 MiB chunks; memory use stays at a few MiB whatever the model size.
//
// --layers N keeps the model's layer-type pattern (layer i gets pattern[i % len]; the last layer is always
// full attention, as in the reference config) and rescales num_kv_shared_layers with this rule:
//   k = round(num_kv_shared_layers * N / original_layers), then decreased until the config is valid:
//   k < N and every KV-shared layer (N-k .. N-1) has an earlier non-shared layer of its own type to read.
//   (e2b --layers 2 -> layer types [sliding, full], num_kv_shared_layers 0.)
// --vocab N overrides vocab_size and vocab_size_per_layer_input (small test files).
//
// At the end it prints the file size and the decode bytes per token: every decoder linear the model uses
// (not the unused k/v of KV-shared layers) + per_layer_model_projection + the tied LM head (embed_tokens),
// dense weights at 2 bytes/param, int4 at 0.5 byte/param + 2 bytes per group of 32 -- the same figure as
// gemma4_t4::Engine::decode_bytes_per_token(). The line `decode_bytes_per_token: <integer>` is meant for
// scripts.
//
// Errors (bad arguments, not enough disk space, write failures) print a message on stderr and exit 1;
// a partly written model.safetensors is removed.

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- model table -----------------------------------------------------------------------------------------
//
// Layer-type pattern: 'S' sliding_attention, 'F' full_attention; layer i gets pattern[i % len], the last
// layer is forced to full attention.
//
// e2b: every number from shared/GEMMA4.md (google/gemma-4-E2B-it config.json).
// e4b: hidden 2560, 42 layers, 18 KV-shared, intermediate 10240, 8 heads, 2 KV heads, head_dim 256 / 512
//      global, PLE 256, vocab 262144 are from the project's notes. ASSUMPTIONS (not checked against the real
//      config.json; correct them here): layer pattern 5 sliding : 1 full (SSSSSF; public Megatron-Bridge and
//      gemma.cpp ports say "skip_freq 6" / "TTTTTF"), use_double_wide_mlp false (gemma.cpp: uniform FFN
//      10240), full layers with the same 2 KV heads, sliding_window 512, max_position_embeddings 131072,
//      RoPE as E2B (1e4 sliding; proportional 0.25 at 1e6 full), softcap 30.
// tiny: the config of tests/fixtures/mm_bf16 (tools/make_fixtures.py), for quick tests.
struct ModelSpec {
  const char* name;
  int hidden;
  int layers;
  int heads;
  int kv_heads;
  int head_dim;         // sliding layers
  int global_head_dim;  // full layers (written as per_layer_config)
  int intermediate;     // doubled on KV-shared layers when double_wide
  int kv_shared;
  int ple_dim;  // hidden_size_per_layer_input
  int vocab;
  int sliding_window;
  int max_position;
  bool double_wide;
  const char* pattern;
};

const ModelSpec kModels[] = {
    // name    hidden layers heads kv  hd  ghd  inter  shared ple  vocab   window maxpos  dbl    pattern
    {"e2b", 1536, 35, 8, 1, 256, 512, 6144, 20, 256, 262144, 512, 131072, true, "SSSSF"},
    {"e4b", 2560, 42, 8, 2, 256, 512, 10240, 18, 256, 262144, 512, 131072, false, "SSSSSF"},
    {"tiny", 64, 7, 4, 1, 32, 64, 128, 3, 32, 512, 8, 4096, true, "SSFSSFF"},
};
constexpr double kRopeThetaSliding = 10000.0;
constexpr double kRopeThetaFull = 1000000.0;
constexpr double kPartialRotary = 0.25;
constexpr double kSoftcap = 30.0;
constexpr int kGroup = 32;  // w4a16 group size

// ---- resolved configuration --------------------------------------------------------------------------------

struct Model {
  ModelSpec spec;
  int layers = 0;
  int kv_shared = 0;
  int vocab = 0;
  std::vector<bool> full;  // per layer
  bool w4 = false;

  int first_shared() const { return layers - kv_shared; }
  bool shared(int i) const { return i >= first_shared(); }
  int head_dim(int i) const { return full[size_t(i)] ? spec.global_head_dim : spec.head_dim; }
  int intermediate(int i) const { return spec.intermediate * ((spec.double_wide && shared(i)) ? 2 : 1); }
};

bool kv_sharing_valid(const std::vector<bool>& full, int k) {
  const int n = int(full.size()), first = n - k;
  if (k < 0 || k >= n) return k == 0;
  for (int i = first; i < n; ++i) {
    bool has_source = false;
    for (int s = 0; s < first && !has_source; ++s) has_source = full[size_t(s)] == full[size_t(i)];
    if (!has_source) return false;
  }
  return true;
}

Model resolve(const ModelSpec& spec, int layers_override, int vocab_override, bool w4) {
  Model m;
  m.spec = spec;
  m.w4 = w4;
  m.layers = layers_override > 0 ? layers_override : spec.layers;
  m.vocab = vocab_override > 0 ? vocab_override : spec.vocab;
  const std::string pat = spec.pattern;
  m.full.resize(size_t(m.layers));
  for (int i = 0; i < m.layers; ++i) m.full[size_t(i)] = pat[size_t(i) % pat.size()] == 'F';
  m.full.back() = true;
  int k = spec.kv_shared;
  if (m.layers != spec.layers) k = int(std::lround(double(spec.kv_shared) * m.layers / spec.layers));
  while (k > 0 && !kv_sharing_valid(m.full, k)) --k;
  m.kv_shared = k;
  return m;
}

// ---- tensors ---------------------------------------------------------------------------------------------

enum class DType { BF16, I32, I64 };
const char* dtype_name(DType t) { return t == DType::BF16 ? "BF16" : t == DType::I32 ? "I32" : "I64"; }
size_t dtype_size(DType t) { return t == DType::BF16 ? 2 : t == DType::I32 ? 4 : 8; }

enum class Fill { Linear, Embed, Norm, Scalar, Packed, Scale, Shape };

struct Tensor {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<uint64_t> shape;
  Fill fill = Fill::Linear;
  uint64_t fan_in = 1;              // Linear / Scale
  int64_t shape_value[2] = {0, 0};  // Shape
  uint64_t offset = 0, nbytes = 0;

  uint64_t numel() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
};

struct Plan {
  std::vector<Tensor> tensors;
  uint64_t data_bytes = 0;
  uint64_t decode_body = 0;     // decoder linears + per_layer_model_projection (as a decode step reads them)
  uint64_t decode_lm_head = 0;  // tied LM head, dense 2 bytes/param
};

class Planner {
 public:
  explicit Planner(const Model& m) : m_(m) {}

  Plan build() {
    const ModelSpec& s = m_.spec;
    const uint64_t H = uint64_t(s.hidden), V = uint64_t(m_.vocab), L = uint64_t(m_.layers), D = uint64_t(s.ple_dim);
    const std::string p = "model.language_model.";
    bf16(p + "embed_tokens.weight", {V, H}, Fill::Embed);
    plan_.decode_lm_head = V * H * 2;  // tied: the LM head is embed_tokens
    bf16(p + "norm.weight", {H}, Fill::Norm);
    if (D > 0) {
      bf16(p + "embed_tokens_per_layer.weight", {V, L * D}, Fill::Embed);
      linear(p + "per_layer_model_projection", L * D, H, true);
      bf16(p + "per_layer_projection_norm.weight", {D}, Fill::Norm);
    }
    for (int i = 0; i < m_.layers; ++i) layer(p + "layers." + std::to_string(i) + ".", i);
    // Dummy multimodal towers (the fixture's names and shapes).
    bf16("model.vision_tower.encoder.layers.0.mlp.fc.weight", {16, 16}, Fill::Embed);
    bf16("model.embed_vision.embedding_projection.weight", {H, 16}, Fill::Embed);
    bf16("model.audio_tower.layers.0.norm.weight", {16}, Fill::Embed);
    bf16("model.embed_audio.embedding_projection.weight", {H, 16}, Fill::Embed);

    // The safetensors writer's order: larger dtype first, then by name.
    std::stable_sort(plan_.tensors.begin(), plan_.tensors.end(), [](const Tensor& a, const Tensor& b) {
      if (dtype_size(a.dtype) != dtype_size(b.dtype)) return dtype_size(a.dtype) > dtype_size(b.dtype);
      return a.name < b.name;
    });
    uint64_t off = 0;
    for (Tensor& t : plan_.tensors) {
      t.offset = off;
      t.nbytes = t.numel() * dtype_size(t.dtype);
      off += t.nbytes;
    }
    plan_.data_bytes = off;
    return std::move(plan_);
  }

 private:
  void layer(const std::string& p, int i) {
    const ModelSpec& s = m_.spec;
    const uint64_t H = uint64_t(s.hidden), d = uint64_t(m_.head_dim(i)), nh = uint64_t(s.heads),
                   kvh = uint64_t(s.kv_heads), I = uint64_t(m_.intermediate(i)), D = uint64_t(s.ple_dim);
    const bool shared = m_.shared(i);
    bf16(p + "input_layernorm.weight", {H}, Fill::Norm);
    bf16(p + "post_attention_layernorm.weight", {H}, Fill::Norm);
    bf16(p + "pre_feedforward_layernorm.weight", {H}, Fill::Norm);
    bf16(p + "post_feedforward_layernorm.weight", {H}, Fill::Norm);
    bf16(p + "layer_scalar", {1}, Fill::Scalar);
    bf16(p + "self_attn.q_norm.weight", {d}, Fill::Norm);
    linear(p + "self_attn.q_proj", nh * d, H, true);
    linear(p + "self_attn.o_proj", H, nh * d, true);
    // KV-shared layers never use k/v: the bf16 file ships them anyway, the QAT file does not.
    if (!shared || !m_.w4) {
      bf16(p + "self_attn.k_norm.weight", {d}, Fill::Norm);
      linear(p + "self_attn.k_proj", kvh * d, H, !shared);
      linear(p + "self_attn.v_proj", kvh * d, H, !shared);
    }
    linear(p + "mlp.gate_proj", I, H, true);
    linear(p + "mlp.up_proj", I, H, true);
    linear(p + "mlp.down_proj", H, I, true);
    if (D > 0) {
      linear(p + "per_layer_input_gate", D, H, true);
      linear(p + "per_layer_projection", H, D, true);
      bf16(p + "post_per_layer_input_norm.weight", {H}, Fill::Norm);
    }
  }

  void bf16(const std::string& name, std::vector<uint64_t> shape, Fill fill, uint64_t fan_in = 1) {
    Tensor t;
    t.name = name;
    t.dtype = DType::BF16;
    t.shape = std::move(shape);
    t.fill = fill;
    t.fan_in = fan_in;
    plan_.tensors.push_back(std::move(t));
  }

  // y[out] = W[out, in] x; `counted`: read by a decode step (false for the unused k/v of shared layers).
  void linear(const std::string& base, uint64_t out, uint64_t in, bool counted) {
    if (!m_.w4) {
      bf16(base + ".weight", {out, in}, Fill::Linear, in);
      if (counted) plan_.decode_body += out * in * 2;
      return;
    }
    Tensor packed;
    packed.name = base + ".weight_packed";
    packed.dtype = DType::I32;
    packed.shape = {out, in / 8};
    packed.fill = Fill::Packed;
    plan_.tensors.push_back(std::move(packed));
    bf16(base + ".weight_scale", {out, in / kGroup}, Fill::Scale, in);
    Tensor shape;
    shape.name = base + ".weight_shape";
    shape.dtype = DType::I64;
    shape.shape = {2};
    shape.fill = Fill::Shape;
    shape.shape_value[0] = int64_t(out);
    shape.shape_value[1] = int64_t(in);
    plan_.tensors.push_back(std::move(shape));
    if (counted) plan_.decode_body += out * in / 2 + out * (in / kGroup) * 2;
  }

  const Model& m_;
  Plan plan_;
};

// ---- values ----------------------------------------------------------------------------------------------

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  uint16_t b = uint16_t(u >> 16);
  if ((b & 0x7fffu) == 0) b = uint16_t((b & 0x8000u) | 0x3580u);  // never exactly zero: +-2^-20
  return b;
}

inline double unit(uint64_t r) { return double(r >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)

// Irwin-Hall: four 16-bit uniforms, mean 0, variance 1 (range +-3.46).
inline float normal(uint64_t r) {
  const uint32_t s =
      uint32_t(r & 0xffff) + uint32_t((r >> 16) & 0xffff) + uint32_t((r >> 32) & 0xffff) + uint32_t(r >> 48);
  const double u = (double(s) + 2.0) * (1.0 / 65536.0);  // sum of four (x + 0.5) / 65536
  return float((u - 2.0) * 1.7320508075688772);
}

// Writes elements [first, first + count) of tensor t (key: its stream) into out.
void generate(const Tensor& t, uint64_t key, uint64_t first, uint64_t count, uint8_t* out) {
  auto rnd = [key](uint64_t i) { return mix64(key + (i + 1) * kGolden); };
  switch (t.fill) {
    case Fill::Packed:
      for (uint64_t i = 0; i < count; ++i) {
        const uint32_t w = uint32_t(rnd(first + i));  // eight uniform nibbles
        std::memcpy(out + 4 * i, &w, 4);
      }
      return;
    case Fill::Shape:
      for (uint64_t i = 0; i < count; ++i) std::memcpy(out + 8 * i, &t.shape_value[first + i], 8);
      return;
    default: break;
  }
  const float inv_sqrt_in = float(1.0 / std::sqrt(double(t.fan_in)));
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t r = rnd(first + i);
    float v = 0.f;
    switch (t.fill) {
      case Fill::Linear: v = normal(r) * inv_sqrt_in; break;
      case Fill::Embed: v = normal(r) * 0.05f; break;
      case Fill::Norm: v = float(0.6 + 0.8 * unit(r)); break;
      case Fill::Scalar: v = float(0.5 + 0.5 * unit(r)); break;
      case Fill::Scale: v = float((0.75 + 0.5 * unit(r)) / 8.0) * inv_sqrt_in; break;
      default: break;
    }
    const uint16_t b = to_bf16(v);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

// ---- output ----------------------------------------------------------------------------------------------

std::string header_json(const Plan& plan) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (const Tensor& t : plan.tensors) {
    h += ",\"" + t.name + "\":{\"dtype\":\"" + dtype_name(t.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(t.offset) + "," + std::to_string(t.offset + t.nbytes) + "]}";
  }
  h += "}";
  while (h.size() % 8) h += ' ';
  return h;
}

json config_json(const Model& m) {
  const ModelSpec& s = m.spec;
  json layer_types = json::array();
  json per_layer = json::object();
  for (int i = 0; i < m.layers; ++i) {
    layer_types.push_back(m.full[size_t(i)] ? "full_attention" : "sliding_attention");
    if (m.full[size_t(i)]) per_layer[std::to_string(i)] = {{"head_dim", s.global_head_dim}};
  }
  json t = {
      {"architectures", nullptr},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"attention_k_eq_v", false},
      {"bos_token_id", 2},
      {"chunk_size_feed_forward", 0},
      {"dtype", "bfloat16"},
      {"enable_moe_block", false},
      {"eos_token_id", {1, 106}},
      {"final_logit_softcapping", kSoftcap},
      {"head_dim", s.head_dim},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"hidden_size", s.hidden},
      {"hidden_size_per_layer_input", s.ple_dim},
      {"id2label", {{"0", "LABEL_0"}, {"1", "LABEL_1"}}},
      {"initializer_range", 0.02},
      {"intermediate_size", s.intermediate},
      {"is_encoder_decoder", false},
      {"label2id", {{"LABEL_0", 0}, {"LABEL_1", 1}}},
      {"layer_types", layer_types},
      {"max_position_embeddings", s.max_position},
      {"model_type", "gemma4_text"},
      {"moe_intermediate_size", nullptr},
      {"num_attention_heads", s.heads},
      {"num_experts", nullptr},
      {"num_hidden_layers", m.layers},
      {"num_key_value_heads", s.kv_heads},
      {"num_kv_shared_layers", m.kv_shared},
      {"output_attentions", false},
      {"output_hidden_states", false},
      {"pad_token_id", 0},
      {"per_layer_config", per_layer},
      {"problem_type", nullptr},
      {"return_dict", true},
      {"rms_norm_eps", 1e-06},
      {"rope_parameters",
       {{"full_attention",
         {{"partial_rotary_factor", kPartialRotary}, {"rope_theta", kRopeThetaFull}, {"rope_type", "proportional"}}},
        {"sliding_attention", {{"rope_theta", kRopeThetaSliding}, {"rope_type", "default"}}}}},
      {"sliding_window", s.sliding_window},
      {"tie_word_embeddings", true},
      {"top_k_experts", nullptr},
      {"use_bidirectional_attention", nullptr},
      {"use_cache", true},
      {"use_double_wide_mlp", s.double_wide},
      {"vocab_size", m.vocab},
      {"vocab_size_per_layer_input", m.vocab},
  };
  json root = {
      {"architectures", {"Gemma4ForConditionalGeneration"}},
      {"audio_config", {{"hidden_size", 16}, {"model_type", "gemma4_audio"}, {"num_hidden_layers", 1}}},
      {"model_type", "gemma4"},
      {"text_config", t},
      {"tie_word_embeddings", true},
      {"transformers_version", "5.17.0"},
      {"vision_config", {{"hidden_size", 16}, {"model_type", "gemma4_vision"}, {"num_hidden_layers", 1}}},
  };
  if (m.w4) {
    root["quantization_config"] = {
        {"config_groups",
         {{"group_0",
           {{"format", "pack-quantized"},
            {"input_activations", nullptr},
            {"output_activations", nullptr},
            {"targets", {"Linear"}},
            {"weights",
             {{"actorder", nullptr},
              {"dynamic", false},
              {"group_size", kGroup},
              {"num_bits", 4},
              {"observer", "minmax"},
              {"strategy", "group"},
              {"symmetric", true},
              {"type", "int"}}}}}}},
        {"format", "pack-quantized"},
        {"ignore", {"lm_head", "re:.*vision.*", "re:.*audio.*", "re:.*embed.*"}},
        {"quant_method", "compressed-tensors"},
        {"quantization_status", "compressed"},
    };
  }
  return root;
}

std::string human(double bytes) {
  char buf[64];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.3f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3f MB", bytes / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  return buf;
}

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "make_synthetic: %s\n", msg.c_str());
  std::exit(1);
}

// Writes all of [data, data + n) or fails with errno's message.
class Output {
 public:
  explicit Output(const fs::path& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) fail(path.string() + ": cannot create: " + std::strerror(errno));
  }
  ~Output() {
    if (f_) std::fclose(f_);
  }
  bool write(const void* data, size_t n) {
    if (std::fwrite(data, 1, n, f_) != n) {
      err_ = errno;
      return false;
    }
    return true;
  }
  bool close() {
    const bool ok = std::fflush(f_) == 0;
    if (!ok) err_ = errno;
    const bool closed = std::fclose(f_) == 0;
    if (!closed && ok) err_ = errno;
    f_ = nullptr;
    return ok && closed;
  }
  std::string error() const { return err_ ? std::strerror(err_) : "unknown error"; }

 private:
  fs::path path_;
  std::FILE* f_ = nullptr;
  int err_ = 0;
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: make_synthetic --model e2b|e4b|tiny --format bf16|w4a16 --out DIR\n"
               "                      [--seed N] [--layers N] [--vocab N]\n"
               "\n"
               "Writes DIR/config.json and DIR/model.safetensors: a synthetic Gemma 4 checkpoint with the real\n"
               "layout (multimodal `model.language_model.` prefix, dummy vision/audio tensors) and random weights\n"
               "of realistic magnitude, streamed in chunks (e2b bf16 is ~10 GB; e4b larger).\n"
               "\n"
               "  --model    e2b (google/gemma-4-E2B-it), e4b (google/gemma-4-E4B-it; some numbers assumed),\n"
               "             tiny (the tests/fixtures/mm_bf16 config)\n"
               "  --format   bf16 (KV-shared layers also carry unused k/v/k_norm, as the real file) or w4a16\n"
               "             (compressed-tensors pack-quantized int4, group 32, as the QAT checkpoint)\n"
               "  --out      output directory (created if missing; model.safetensors/config.json replaced)\n"
               "  --seed     PRNG seed (default 1); same arguments + seed give identical bytes\n"
               "  --layers   override the layer count, keeping the layer-type pattern (last layer full);\n"
               "             num_kv_shared_layers becomes round(k * N / layers), lowered until every shared\n"
               "             layer has an earlier non-shared layer of its type (e2b --layers 2: 0)\n"
               "  --vocab    override vocab_size and vocab_size_per_layer_input (>= 128)\n"
               "  --dry-run  print the layout, file size and decode bytes; write nothing (--out not needed)\n"
               "  --help     this text\n"
               "\n"
               "Prints progress, the file size and `decode_bytes_per_token: N` (decoder linears + PLE model\n"
               "projection + tied LM head; dense 2 B/param, int4 0.5 B/param + 2 B per 32), the figure\n"
               "gemma4_t4::Engine::decode_bytes_per_token() reports. Exit status 1 on any error.\n");
}

bool parse_int(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end != '\0' || v < lo || v > hi) return false;
  *out = long(v);
  return true;
}

int run(int argc, char** argv) {
  std::string model_name, format, out_dir;
  long seed = 1, layers = 0, vocab = 0;
  bool dry_run = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], val;
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--dry-run") {
      dry_run = true;
      continue;
    }
    const size_t eq = a.find('=');
    bool has_val = false;
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_val = true;
    }
    auto value = [&]() -> std::string {
      if (has_val) return val;
      if (i + 1 >= argc) fail("option " + a + " needs a value (see --help)");
      return argv[++i];
    };
    if (a == "--model")
      model_name = value();
    else if (a == "--format")
      format = value();
    else if (a == "--out")
      out_dir = value();
    else if (a == "--seed") {
      if (!parse_int(value(), 0, 0x7fffffffffffffffL, &seed)) fail("--seed needs a non-negative integer");
    } else if (a == "--layers") {
      if (!parse_int(value(), 1, 1024, &layers)) fail("--layers needs an integer in [1, 1024]");
    } else if (a == "--vocab") {
      if (!parse_int(value(), 128, 1 << 24, &vocab)) fail("--vocab needs an integer in [128, 16777216]");
    } else {
      fail("unknown argument '" + std::string(argv[i]) + "' (see --help)");
    }
  }
  if (model_name.empty() || format.empty() || (out_dir.empty() && !dry_run)) {
    usage(stderr);
    fail("--model, --format and --out are required");
  }
  const ModelSpec* spec = nullptr;
  for (const ModelSpec& s : kModels)
    if (model_name == s.name) spec = &s;
  if (!spec) fail("unknown --model '" + model_name + "' (e2b, e4b, tiny)");
  if (format != "bf16" && format != "w4a16") fail("unknown --format '" + format + "' (bf16, w4a16)");

  const Model m = resolve(*spec, int(layers), int(vocab), format == "w4a16");
  const Plan plan = Planner(m).build();
  const std::string header = header_json(plan);
  const uint64_t file_bytes = 8 + header.size() + plan.data_bytes;
  const uint64_t decode = plan.decode_body + plan.decode_lm_head;
  auto print_decode = [&]() {
    std::printf("decode_bytes_per_token: %llu\n", (unsigned long long)decode);
    std::printf("  = %s: decoder linears + PLE model projection %s (%s) + tied LM head %s (bf16)\n",
                human(double(decode)).c_str(), human(double(plan.decode_body)).c_str(), m.w4 ? "int4 + scales" : "bf16",
                human(double(plan.decode_lm_head)).c_str());
  };
  auto print_model = [&]() {
    std::printf(
        "  hidden %d, layers %d (%d KV-shared), heads %d, KV heads %d, head dim %d / %d full, "
        "intermediate %d%s, PLE %d, vocab %d\n",
        spec->hidden, m.layers, m.kv_shared, spec->heads, spec->kv_heads, spec->head_dim, spec->global_head_dim,
        spec->intermediate, spec->double_wide ? " (x2 on KV-shared layers)" : "", spec->ple_dim, m.vocab);
  };
  if (dry_run) {
    std::printf("make_synthetic: %s %s (dry run: nothing written)\n", spec->name, format.c_str());
    print_model();
    std::printf("model.safetensors would be %llu bytes (%s), %zu tensors\n", (unsigned long long)file_bytes,
                human(double(file_bytes)).c_str(), plan.tensors.size());
    print_decode();
    return 0;
  }

  // Output directory and space.
  const fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) fail(out_dir + ": cannot create directory" + (ec ? ": " + ec.message() : ""));
  const fs::path weights = dir / "model.safetensors", config = dir / "config.json";
  if (fs::exists(dir / "model.safetensors.index.json", ec))
    fail(out_dir +
         " holds model.safetensors.index.json (a sharded checkpoint, which loaders would read instead); "
         "use another directory");
  uint64_t reclaim = 0;
  if (fs::is_regular_file(weights, ec)) reclaim = fs::file_size(weights, ec);
  struct statvfs sv;
  if (statvfs(dir.c_str(), &sv) == 0) {
    const uint64_t avail = uint64_t(sv.f_bavail) * uint64_t(sv.f_frsize) + reclaim;
    const uint64_t need = file_bytes + (1u << 20);
    if (avail < need)
      fail("not enough disk space in " + out_dir + ": need " + human(double(need)) + " (" + std::to_string(need) +
           " bytes), " + human(double(avail)) + " available");
  }

  std::printf("make_synthetic: %s %s, seed %ld -> %s\n", spec->name, format.c_str(), seed, out_dir.c_str());
  print_model();
  std::printf("  %zu tensors, %s to write\n", plan.tensors.size(), human(double(file_bytes)).c_str());
  std::fflush(stdout);

  // Stream the file.
  auto abort_write = [&](const std::string& what) {
    std::error_code rm;
    fs::remove(weights, rm);
    fs::remove(config, rm);
    fail(weights.string() + ": " + what);
  };
  fs::remove(config, ec);  // a config.json must never describe a partial or older model.safetensors
  {
    Output out(weights);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
    if (!out.write(len, 8) || !out.write(header.data(), header.size())) abort_write("write failed: " + out.error());

    constexpr uint64_t kChunk = uint64_t(4) << 20;  // bytes, a multiple of every element size
    std::vector<uint8_t> buf(kChunk);
    const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    uint64_t done = 0;
    int next_report = 5;
    for (const Tensor& t : plan.tensors) {
      const uint64_t key = mix64(uint64_t(seed) * kGolden ^ fnv1a(t.name));
      const uint64_t esz = dtype_size(t.dtype), n = t.numel();
      for (uint64_t first = 0; first < n; first += kChunk / esz) {
        const uint64_t count = std::min(kChunk / esz, n - first);
        // Split the chunk across threads (each element depends only on its index).
        const uint64_t per = (count + threads - 1) / threads;
        std::vector<std::thread> pool;
        for (unsigned k = 1; k < threads && k * per < count && count >= 65536; ++k) {
          const uint64_t b = k * per, e = std::min(count, b + per);
          pool.emplace_back(generate, std::cref(t), key, first + b, e - b, buf.data() + b * esz);
        }
        const uint64_t own = pool.empty() ? count : std::min(count, per);
        generate(t, key, first, own, buf.data());
        for (auto& th : pool) th.join();
        if (!out.write(buf.data(), size_t(count * esz))) abort_write("write failed: " + out.error());
        done += count * esz;
        if (plan.data_bytes >= (uint64_t(64) << 20)) {
          const int pct = int(100.0 * double(done) / double(plan.data_bytes));
          if (pct >= next_report) {
            std::printf("  [%3d%%] %s of %s\n", pct, human(double(done)).c_str(),
                        human(double(plan.data_bytes)).c_str());
            std::fflush(stdout);
            while (next_report <= pct) next_report += 5;
          }
        }
      }
    }
    if (!out.close()) abort_write("write failed: " + out.error());
  }
  {
    const std::string text = config_json(m).dump(2) + "\n";
    std::FILE* f = std::fopen(config.c_str(), "wb");
    if (!f) abort_write(std::string("cannot create config.json: ") + std::strerror(errno));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const int e = errno;
    if (std::fclose(f) != 0 || !ok)
      abort_write(std::string("writing config.json failed: ") + std::strerror(ok ? errno : e));
  }
  const uint64_t written = fs::file_size(weights, ec);
  if (ec || written != file_bytes)
    abort_write("size is " + std::to_string(written) + ", expected " + std::to_string(file_bytes));

  std::printf("wrote %s: %llu bytes (%s), %zu tensors; %s\n", weights.c_str(), (unsigned long long)written,
              human(double(written)).c_str(), plan.tensors.size(), config.c_str());
  print_decode();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit becomes a write error (EFBIG), reported like disk full
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // thread creation, allocation, file-system errors
    fail(std::string("error: ") + e.what());
  }
}
