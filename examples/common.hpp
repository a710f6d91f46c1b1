// Shared by examples/chat.cpp and examples/generate.cpp: the model and sampling flags (declared on the
// programs' args::Parser, programs/args.hpp), and loading the engine (with a progress bar), the tokenizer and
// the generation defaults.
//
// Defaults: GEMMA4_T4_DEFAULT_MODEL and GEMMA4_T4_DEFAULT_TOKENIZER, set by CMake to the bundled tiny
// model (tests/fixtures/mm_bf16: random weights, vocab 512) and its tokenizer (examples/tiny/tokenizer.json,
// with the tiny model's generation_config.json beside it).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "../programs/args.hpp"
#include "gemma4_t4.hpp"

#ifndef GEMMA4_T4_DEFAULT_MODEL
#define GEMMA4_T4_DEFAULT_MODEL "tests/fixtures/mm_bf16"
#endif
#ifndef GEMMA4_T4_DEFAULT_TOKENIZER
#define GEMMA4_T4_DEFAULT_TOKENIZER "examples/tiny/tokenizer.json"
#endif

namespace example {

struct ModelArgs {
  std::string model = GEMMA4_T4_DEFAULT_MODEL;
  std::string tokenizer;  // "" = the model directory, or the tiny tokenizer with the default model
  bool model_given = false;
  bool cpu = false;
  long max_context = 0;  // 0 = min(8192, max_position_embeddings)
  long max_tokens = 512;
  bool ignore_eos = false;
  // sampling flags given on the command line (they override generation_config.json)
  std::optional<float> temperature, top_p, min_p, repeat_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;  // given on the command line (default 0)
};

// Declares the model and sampling flags on p, stored into *a (which must outlive p.parse()).
inline void add_model_flags(args::Parser* p, ModelArgs* a) {
  const std::string model_help = std::string("checkpoint directory: config.json + *.safetensors (default: the ") +
                                 "bundled tiny\nmodel " + GEMMA4_T4_DEFAULT_MODEL +
                                 " -- random weights, its output is gibberish)";
  const std::string tokenizer_help = std::string("tokenizer.json / tokenizer.model, or a directory holding one ") +
                                     "(default: the model\ndirectory; for the tiny model " +
                                     GEMMA4_T4_DEFAULT_TOKENIZER + ")";
  p->section("model:");
  p->custom(
      "--model", "DIR",
      [a](const char* v) {
        a->model = v;
        a->model_given = true;
        return std::string();
      },
      model_help.c_str());
  p->text("--tokenizer", "PATH", &a->tokenizer, tokenizer_help.c_str());
  p->flag("--cpu", &a->cpu, "use the CPU backend (default: CUDA when compiled in and a GPU is present)");
  p->integer("--max-context", "N", &a->max_context, 1, 1L << 24,
             "tokens a conversation may hold (default: 8192, at most the model's limit)");
  p->section(
      "sampling (defaults: the model's generation_config.json -- for the tiny model examples/tiny's -- else\n"
      "Gemma's: temperature 1, top-k 64, top-p 0.95):");
  p->number("--temperature", "F", &a->temperature, 0, 100, "0 = greedy");
  p->integer("--top-k", "N", &a->top_k, 0, 1 << 30, "0 = off");
  p->number("--top-p", "F", &a->top_p, 0, 1, "1 = off");
  p->number("--min-p", "F", &a->min_p, 0, 1, "0 = off");
  p->number("--repeat-penalty", "F", &a->repeat_penalty, 1e-3, 100, "1 = off");
  p->integer("--seed", "N", &a->seed, 0, UINT64_MAX, "random seed (default 0)");
  p->integer("--max-tokens", "N", &a->max_tokens, 0, 1L << 24, "most tokens per answer (default 512)");
  p->flag("--ignore-eos", &a->ignore_eos, "do not stop at the model's end-of-turn tokens");
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
  g.sampling.temperature = a.temperature.value_or(g.sampling.temperature);
  g.sampling.top_k = a.top_k.value_or(g.sampling.top_k);
  g.sampling.top_p = a.top_p.value_or(g.sampling.top_p);
  g.sampling.min_p = a.min_p.value_or(g.sampling.min_p);
  g.sampling.repetition_penalty = a.repeat_penalty.value_or(g.sampling.repetition_penalty);
  g.sampling.seed = a.seed.value_or(0);
  g.max_new_tokens = static_cast<int>(a.max_tokens);
  g.stop_at_eos = !a.ignore_eos;
  if (!a.ignore_eos) g.stop_tokens.assign(eos.begin(), eos.end());  // generation_config's, besides config.json's
  return Status::ok();
}

inline const char* backend_name(const gemma4_t4::Engine& e) {
  return e.backend() == gemma4_t4::Backend::Cuda ? "cuda" : "cpu";
}

}  // namespace example
