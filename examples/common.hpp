// Shared by examples/chat.cpp and examples/generate.cpp: the model and sampling flags, and loading the
// engine (with a progress bar), the tokenizer and the generation defaults.
//
// Defaults: GEMMA4_T4_DEFAULT_MODEL and GEMMA4_T4_DEFAULT_TOKENIZER, set by CMake to the bundled tiny
// model (tests/fixtures/mm_bf16: random weights, vocab 512) and its tokenizer (examples/tiny/tokenizer.json,
// with the tiny model's generation_config.json beside it).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "gemma4_t4.hpp"

#ifndef GEMMA4_T4_DEFAULT_MODEL
#define GEMMA4_T4_DEFAULT_MODEL "tests/fixtures/mm_bf16"
#endif
#ifndef GEMMA4_T4_DEFAULT_TOKENIZER
#define GEMMA4_T4_DEFAULT_TOKENIZER "examples/tiny/tokenizer.json"
#endif

namespace example {

// The help text of the flags below (printf format: the default model and tokenizer).
constexpr const char kModelFlagsHelp[] =
    "model:\n"
    "  --model DIR          checkpoint directory: config.json + *.safetensors (default: the bundled tiny\n"
    "                       model %s -- random weights, its output is gibberish)\n"
    "  --tokenizer PATH     tokenizer.json / tokenizer.model, or a directory holding one (default: the model\n"
    "                       directory; for the tiny model %s)\n"
    "  --cpu                use the CPU backend (default: CUDA when compiled in and a GPU is present)\n"
    "  --max-context N      tokens a conversation may hold (default: 8192, at most the model's limit)\n"
    "sampling (defaults: the model's generation_config.json -- for the tiny model examples/tiny's -- else\n"
    "Gemma's: temperature 1, top-k 64, top-p 0.95):\n"
    "  --temperature F      0 = greedy\n"
    "  --top-k N            0 = off\n"
    "  --top-p F            1 = off\n"
    "  --min-p F            0 = off\n"
    "  --repeat-penalty F   1 = off\n"
    "  --seed N             random seed (default 0)\n"
    "  --max-tokens N       most tokens per answer (default %d)\n"
    "  --ignore-eos         do not stop at the model's end-of-turn tokens\n";

struct ModelArgs {
  std::string model = GEMMA4_T4_DEFAULT_MODEL;
  std::string tokenizer;  // "" = the model directory, or the tiny tokenizer with the default model
  bool model_given = false;
  bool cpu = false;
  long max_context = 0;  // 0 = min(8192, max_position_embeddings)
  long max_tokens = 512;
  bool ignore_eos = false;
  // sampling flags given on the command line (they override generation_config.json)
  bool has_temperature = false, has_top_k = false, has_top_p = false, has_min_p = false, has_penalty = false;
  float temperature = 0, top_p = 0, min_p = 0, repeat_penalty = 0;
  long top_k = 0;
  unsigned long long seed = 0;
};

inline bool parse_long(const char* s, long lo, long hi, long* out) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

inline bool parse_float(const char* s, float lo, float hi, float* out) {
  errno = 0;
  char* end = nullptr;
  const float v = std::strtof(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

// If argv[*i] is one of the flags above, consumes it (and its value): returns 1, or 2 after printing why
// the value is wrong. 0: not one of ours.
inline int parse_model_flag(const char* prog, int argc, char** argv, int* i, ModelArgs* a) {
  const std::string f = argv[*i];
  if (f == "--cpu") {
    a->cpu = true;
    return 1;
  }
  if (f == "--ignore-eos") {
    a->ignore_eos = true;
    return 1;
  }
  static const char* const kValued[] = {"--model", "--tokenizer", "--max-context",    "--temperature", "--top-k",
                                        "--top-p", "--min-p",     "--repeat-penalty", "--seed",        "--max-tokens"};
  if (std::find(std::begin(kValued), std::end(kValued), f) == std::end(kValued)) return 0;
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "%s: missing value for %s (--help for usage)\n", prog, f.c_str());
    return 2;
  }
  const char* v = argv[++*i];
  bool ok = true;
  long n = 0;
  if (f == "--model") {
    a->model = v;
    a->model_given = true;
  } else if (f == "--tokenizer") {
    a->tokenizer = v;
  } else if (f == "--max-context") {
    ok = parse_long(v, 1, 1L << 24, &a->max_context);
  } else if (f == "--max-tokens") {
    ok = parse_long(v, 0, 1L << 24, &a->max_tokens);
  } else if (f == "--temperature") {
    ok = a->has_temperature = parse_float(v, 0.f, 100.f, &a->temperature);
  } else if (f == "--top-k") {
    ok = a->has_top_k = parse_long(v, 0, 1L << 30, &a->top_k);
  } else if (f == "--top-p") {
    ok = a->has_top_p = parse_float(v, 0.f, 1.f, &a->top_p);
  } else if (f == "--min-p") {
    ok = a->has_min_p = parse_float(v, 0.f, 1.f, &a->min_p);
  } else if (f == "--repeat-penalty") {
    ok = a->has_penalty = parse_float(v, 1e-3f, 100.f, &a->repeat_penalty);
  } else if (f == "--seed") {
    ok = parse_long(v, 0, LONG_MAX, &n);
    a->seed = static_cast<unsigned long long>(n);
  }
  if (!ok) {
    std::fprintf(stderr, "%s: bad value '%s' for %s (--help for usage)\n", prog, v, f.c_str());
    return 2;
  }
  return 1;
}

// What load() produces.
struct Loaded {
  gemma4_t4::Engine engine;
  gemma4_t4::Tokenizer tokenizer;
  std::string tokenizer_path;
  gemma4_t4::GenerateOptions generate;  // sampling defaults, stop tokens, max_new_tokens
  size_t context = 0;                   // tokens a session holds
};

// A progress bar on stderr while the weights load (only when stderr is a terminal).
inline void progress_bar(float f) {
  const int width = 30, done = static_cast<int>(f * width + 0.5f);
  std::fprintf(stderr, "\rloading [%.*s%*s] %3d%%", done, "##############################", width - done, "",
               static_cast<int>(f * 100.f + 0.5f));
  if (f >= 1.f) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// Loads the engine, the tokenizer and the generation defaults (generation_config.json, then the flags).
inline gemma4_t4::Status load(const ModelArgs& a, Loaded* out) {
  using namespace gemma4_t4;
  LoadOptions opt;
  opt.backend = a.cpu ? Backend::Cpu : Backend::Auto;
  if (isatty(STDERR_FILENO)) opt.on_progress = progress_bar;
  if (Status st = Engine::load(a.model, opt, &out->engine); !st) return st;
  const ModelConfig& cfg = out->engine.config();
  out->context = a.max_context > 0 ? size_t(a.max_context)
                                   : std::min<size_t>(8192, size_t(std::max(1, cfg.max_position_embeddings)));

  out->tokenizer_path = !a.tokenizer.empty() ? a.tokenizer : a.model_given ? a.model : GEMMA4_T4_DEFAULT_TOKENIZER;
  if (Status st = gemma4_t4::Tokenizer::load(out->tokenizer_path, &out->tokenizer); !st) return st;
  if (out->tokenizer.vocab_size() > size_t(cfg.vocab_size))
    return Status(Code::InvalidArgument, out->tokenizer_path + " has " + std::to_string(out->tokenizer.vocab_size()) +
                                             " tokens, more than the model's vocabulary of " +
                                             std::to_string(cfg.vocab_size) + ": not this model's tokenizer");

  // The bundled tiny model's generation_config.json lies beside its tokenizer (examples/tiny/): a repetition
  // penalty keeps its random weights from repeating one token.
  GenerateOptions& g = out->generate;
  std::vector<int> eos;
  const std::string tiny = GEMMA4_T4_DEFAULT_TOKENIZER;
  const std::string config_dir = a.model_given ? a.model : tiny.substr(0, tiny.find_last_of('/') + 1) + ".";
  if (Status st = load_generation_config(config_dir, &g.sampling, &eos); !st) return st;
  if (a.has_temperature) g.sampling.temperature = a.temperature;
  if (a.has_top_k) g.sampling.top_k = static_cast<int>(a.top_k);
  if (a.has_top_p) g.sampling.top_p = a.top_p;
  if (a.has_min_p) g.sampling.min_p = a.min_p;
  if (a.has_penalty) g.sampling.repetition_penalty = a.repeat_penalty;
  g.sampling.seed = a.seed;
  g.max_new_tokens = static_cast<int>(a.max_tokens);
  g.stop_at_eos = !a.ignore_eos;
  if (!a.ignore_eos) g.stop_tokens.assign(eos.begin(), eos.end());  // generation_config's, besides config.json's
  return Status::ok();
}

inline const char* backend_name(const gemma4_t4::Engine& e) {
  return e.backend() == gemma4_t4::Backend::Cuda ? "cuda" : "cpu";
}

}  // namespace example
