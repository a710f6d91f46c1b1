// generate_ids: load a Gemma 4 checkpoint, prefill a prompt given as token ids, greedily decode N tokens and
// print the ids with timings: examples/generate one level down (no tokenizer, no chat template), for
// checkpoints without a tokenizer and as the shortest example of Engine::forward.
//
//   generate_ids [--model DIR] [--cpu] [--tokens N] [--prompt "2,17,99"] [--ignore-eos]
//
// Default model: the bundled tiny fixture (GEMMA4_T4_DEFAULT_MODEL, set by CMake to tests/fixtures/mm_bf16).
// Exit status: 0 ok, 1 the library reported an error (message on stderr), 2 bad command line.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../programs/args.hpp"
#include "gemma4_t4.hpp"

#ifndef GEMMA4_T4_DEFAULT_MODEL
#define GEMMA4_T4_DEFAULT_MODEL "tests/fixtures/mm_bf16"
#endif

namespace {

const char kUsage[] =
    "usage: generate_ids [--model DIR] [--cpu] [--tokens N] [--prompt IDS] [--ignore-eos]\n"
    "\n"
    "Loads a Gemma 4 checkpoint directory (config.json + *.safetensors), feeds the prompt token ids,\n"
    "then greedily decodes N tokens (argmax) and prints them with timings.\n"
    "\n";

struct Args {
  std::string model = GEMMA4_T4_DEFAULT_MODEL;
  bool cpu = false;
  long tokens = 16;
  std::vector<int32_t> prompt = {2, 17, 99, 300, 42};
  bool ignore_eos = false;
};

// Returns -1 to continue, else the exit status (0 for --help, 2 for a bad command line).
int parse_args(int argc, char** argv, Args* args) {
  const std::string model_help = std::string("checkpoint directory (default: ") + GEMMA4_T4_DEFAULT_MODEL + ")";
  args::Parser p("generate_ids", kUsage);
  p.help_column(17);
  p.text("--model", "DIR", &args->model, model_help.c_str());
  p.flag("--cpu", &args->cpu, "use the CPU reference backend (default: CUDA when compiled in and a GPU is present)");
  p.integer("--tokens", "N", &args->tokens, 0, 1L << 20, "tokens to generate, N >= 0 (default: 16)");
  p.list("--prompt", "IDS", &args->prompt, 0, INT32_MAX,
         "comma-separated prompt token ids, at least one (default: 2,17,99,300,42)");
  p.flag("--ignore-eos", &args->ignore_eos, "keep decoding after an end-of-sequence token");
  p.footer("\nExit status: 0 ok, 1 the library reported an error, 2 bad command line.\n");
  return p.parse(argc, argv);
}

const char* format_name(gemma4_t4::WeightFormat f) {
  switch (f) {
    case gemma4_t4::WeightFormat::Bf16: return "bf16";
    case gemma4_t4::WeightFormat::F16: return "f16";
    case gemma4_t4::WeightFormat::F32: return "f32";
    case gemma4_t4::WeightFormat::W4A16: return "w4a16";
  }
  return "?";
}

void print_ids(const char* label, const std::vector<int32_t>& ids) {
  std::printf("%s", label);
  if (ids.empty()) std::printf("(none)");
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
  std::printf("\n");
}

int fail(const gemma4_t4::Status& st) {
  std::fprintf(stderr, "generate_ids: %s: %s\n", gemma4_t4::code_name(st.code), st.message.c_str());
  return 1;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int rc = parse_args(argc, argv, &args); rc >= 0) return rc;

  gemma4_t4::LoadOptions opt;
  opt.backend = args.cpu ? gemma4_t4::Backend::Cpu : gemma4_t4::Backend::Auto;
  gemma4_t4::Engine engine;
  auto t0 = std::chrono::steady_clock::now();
  if (auto st = gemma4_t4::Engine::load(args.model, opt, &engine); !st) return fail(st);
  const double load_ms = ms_since(t0);

  const gemma4_t4::ModelConfig& cfg = engine.config();
  int full_layers = 0, shared_layers = 0;
  for (const auto& l : cfg.layers) {
    full_layers += l.type == gemma4_t4::LayerType::Full;
    shared_layers += l.kv_shared;
  }
  std::printf("gemma4_t4 %s, backend %s\n", GEMMA4_T4_VERSION_STRING,
              engine.backend() == gemma4_t4::Backend::Cuda ? "cuda" : "cpu");
  std::printf("model %s (%s): %d layers (%d full, %d kv-shared), hidden %d, %d heads, vocab %d, weights %s\n",
              args.model.c_str(), cfg.model_type.c_str(), cfg.num_layers, full_layers, shared_layers, cfg.hidden_size,
              cfg.num_heads, cfg.vocab_size, format_name(cfg.weight_format));
  std::printf("load %.1f ms, decode reads %.2f MB/token\n", load_ms, engine.decode_bytes_per_token() / 1e6);
  print_ids("prompt ", args.prompt);

  gemma4_t4::Session session;
  const size_t context = args.prompt.size() + static_cast<size_t>(args.tokens);
  if (auto st = engine.create_session(&session, context); !st) return fail(st);

  // Prefill: the whole prompt in one call, logits of its last position only.
  std::vector<float> logits;  // [vocab] fp32
  t0 = std::chrono::steady_clock::now();
  gemma4_t4::Status st =
      engine.forward(session, args.prompt.data(), args.prompt.size(), gemma4_t4::Logits::Last, &logits);
  if (!st) return fail(st);
  const double prefill_ms = ms_since(t0);

  // Decode: the argmax of each step is fed back as the next single-token step (the last one is not fed).
  std::vector<int32_t> out;
  bool stopped_at_eos = false;
  t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < args.tokens; ++i) {
    if (i > 0) {
      const int32_t prev = out.back();
      if (auto st = engine.forward(session, &prev, 1, gemma4_t4::Logits::Last, &logits); !st) return fail(st);
    }
    const int32_t next = gemma4_t4::argmax(logits.data(), static_cast<size_t>(cfg.vocab_size));
    out.push_back(next);
    if (!args.ignore_eos) {
      for (int eos : cfg.eos_token_ids) stopped_at_eos |= next == eos;
      if (stopped_at_eos) break;
    }
  }
  const double decode_ms = ms_since(t0);
  const size_t decode_steps = out.empty() ? 0 : out.size() - 1;  // forward calls made in the loop

  print_ids("output ", out);
  if (stopped_at_eos) std::printf("(stopped at end-of-sequence token %d; --ignore-eos to go on)\n", out.back());
  std::printf("prefill %zu tokens in %.2f ms (%.1f tok/s)\n", args.prompt.size(), prefill_ms,
              prefill_ms > 0 ? 1e3 * static_cast<double>(args.prompt.size()) / prefill_ms : 0.0);
  std::printf("decode %zu steps in %.2f ms (%.1f tok/s)\n", decode_steps, decode_ms,
              decode_ms > 0 && decode_steps > 0 ? 1e3 * static_cast<double>(decode_steps) / decode_ms : 0.0);
  return 0;
}
