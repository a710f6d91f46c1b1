// quick_bench: load a checkpoint and time it the way a user would -- load time and peak host RSS, time to
// first token for one prompt, and decode throughput for several concurrent sessions (greedy, or with
// --sampled Gemma 4's sampling defaults: temperature 1, top-k 64, top-p 0.95, on the GPU; EOS ignored).
// bench/bench.cpp is the full benchmark (sweep, JSON/CSV, plots, the T4 projection); this is the short probe
// for same-lease A/B runs of two builds (bench/RESULTS.md).
//
//   quick_bench --model DIR [--cpu] [--prompt 512] [--tokens 128] [--batch 1,4,8] [--ple host|device]
//               [--decode persistent|kernels] [--w4-matmul dequant|tensorcore|auto] [--no-graphs] [--no-pdl]
//               [--sampled]
//               [--pass-rows N] [--ttft N] [--prefill-together]
// --ttft N: before the batches, N prefills of fresh prompts in one session (reset between), each timed to the
// first token; prints every time and the median (the first one pays one-time costs: page faults, cuBLAS).
// --prefill-together: the other sessions' prompts in one Engine::step (passes of --pass-rows rows) instead of one
// step each: fewer kernels before the decode steps (a profiler's launch count reaches them sooner).
// Exit status: 0 ok, 1 an error (message on stderr), 2 bad command line.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../programs/args.hpp"
#include "gemma4_t4.hpp"

// The timed decode steps of each batch are an NVTX range "decode" where the CUDA toolkit's header-only NVTX is on
// the include path (a no-op unless a tool is attached): `ncu --nvtx --nvtx-include "decode/"` profiles decode steps
// alone, whatever the prompts' kernels before them (tools/gpu_check.sh steps).
#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define QUICK_BENCH_NVTX 1
#endif
#endif

using namespace gemma4_t4;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

static double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux: KiB
}

const char kUsage[] =
    "usage: quick_bench --model DIR [options]\n"
    "\n"
    "Loads a checkpoint, then times the first token of one prompt and decoding with several sessions at once.\n"
    "\n";

int main(int argc, char** argv) {
  std::string model;
  bool cpu = false;
  int prompt_len = 512, tokens = 128;
  std::vector<int> batches = {1, 4, 8};
  bool sampled = false;
  int ttft_runs = 0;
  bool together = false;
  SamplingOptions sampling;  // the defaults are Gemma 4's generation_config
  sampling.seed = 7;
  LoadOptions opt;
  args::Parser parser("quick_bench", kUsage);
  parser.text("--model", "DIR", &model, "checkpoint directory (required)");
  parser.flag("--cpu", &cpu, "use the CPU reference backend (default: CUDA when there is a GPU)");
  parser.integer("--prompt", "N", &prompt_len, 1, 1 << 24, "prompt tokens (default 512)");
  parser.integer("--tokens", "N", &tokens, 4, 1 << 24, "decode steps per batch, the first 3 untimed (default 128)");
  parser.list("--batch", "LIST", &batches, 1, 4096, "sessions decoded together, one line each (default 1,4,8)");
  parser.choice("--ple", "WHERE", &opt.ple, {{"host", PleLocation::Host}, {"device", PleLocation::Device}},
                "where the per-layer-embedding table lives (default host)");
  parser.choice("--decode", "PATH", &opt.decode_path,
                {{"persistent", DecodePath::Persistent}, {"kernels", DecodePath::Kernels}},
                "persistent or kernels (LoadOptions::decode_path; default kernels)");
  parser.choice("--w4-matmul", "HOW", &opt.w4_matmul,
                {{"dequant", W4Matmul::Dequant}, {"tensorcore", W4Matmul::TensorCore}, {"auto", W4Matmul::Auto}},
                "w4a16 passes of > 32 rows: dequant (+ cuBLAS), tensorcore (kernels/gemm_w4.cuh) or auto\n"
                "(tensorcore up to kW4AutoGemmRows rows, dequant above) (LoadOptions::w4_matmul; default auto)");
  parser.integer("--persistent-blocks", "N", &opt.persistent.blocks_per_sm, 1, 2,
                 "persistent decode: blocks per SM, 1 or 2 (LoadOptions::persistent; default 1)");
  parser.integer("--persistent-prefetch", "BYTES", &opt.persistent.prefetch_bytes, -1, 1 << 26,
                 "persistent decode: L2 prefetch bytes ahead per block (default -1: a share of half the L2)");
  parser.text("--persistent-trace", "FILE", &opt.persistent.trace,
              "persistent decode: write where each step's time goes to FILE at exit");
  parser.flag("--no-graphs", &opt.cuda_graphs, "no CUDA graphs (LoadOptions::cuda_graphs = false)", false);
  parser.flag("--no-pdl", &opt.programmatic_launch, "plain launches (LoadOptions::programmatic_launch = false)", false);
  parser.flag("--sampled", &sampled, "sample with Gemma 4's defaults instead of greedy decoding");
  parser.integer("--pass-rows", "N", &opt.max_pass_rows, 64, 16384, "LoadOptions::max_pass_rows (default 2048)");
  parser.integer("--ttft", "N", &ttft_runs, 0, 1 << 20, "time N prefills of fresh prompts first (default 0)");
  parser.flag("--prefill-together", &together, "the other sessions' prompts in one step, not one step each");
  if (const int rc = parser.parse(argc, argv); rc >= 0) return rc;
  if (model.empty()) {
    std::fprintf(stderr, "quick_bench: --model DIR is required (--help for usage)\n");
    return 2;
  }
  opt.backend = cpu ? Backend::Cpu : Backend::Auto;
  opt.max_context = size_t(prompt_len + tokens + 8);
  Engine engine;
  const auto t0 = Clock::now();
  Status st = Engine::load(model, opt, &engine);
  if (!st) {
    std::fprintf(stderr, "load failed: %s\n", st.message.c_str());
    return 1;
  }
  const double load_s = seconds_since(t0);
  const ModelConfig& c = engine.config();
  std::printf("model %s: %d layers, hidden %d, vocab %d, %s, backend %s\n", model.c_str(), c.num_layers, c.hidden_size,
              c.vocab_size, c.weight_format == WeightFormat::W4A16 ? "w4a16" : "fp16",
              engine.backend() == Backend::Cuda ? "CUDA" : "CPU");
  std::printf("load %.2f s, peak host RSS after load %.0f MiB, decode bytes/token %.3f GB\n", load_s, peak_rss_mib(),
              engine.decode_bytes_per_token() / 1e9);
  std::printf("decode path: %s\n", engine.decode_path().c_str());
  if (opt.w4_matmul == W4Matmul::Auto)
    std::printf("w4a16 passes of > 32 rows (--w4-matmul): auto (tensorcore up to %d rows, dequant + cuBLAS above)\n",
                kW4AutoGemmRows);
  else
    std::printf("w4a16 passes of > 32 rows (--w4-matmul): %s\n",
                opt.w4_matmul == W4Matmul::TensorCore ? "tensorcore (kernels/gemm_w4.cuh)" : "dequant + cuBLAS");

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> id(5, c.vocab_size - 1);
  auto random_prompt = [&] {  // BOS, then random ids
    std::vector<int32_t> p(static_cast<size_t>(prompt_len));
    for (auto& t : p) t = id(rng);
    p[0] = c.bos_token_id;
    return p;
  };
  if (ttft_runs > 0) {
    Session s;
    if (!(st = engine.create_session(&s))) {
      std::fprintf(stderr, "%s\n", st.message.c_str());
      return 1;
    }
    std::vector<double> ms;
    std::printf("TTFT, prompt %d, pass rows %d, PLE on the %s:", prompt_len, opt.max_pass_rows,
                opt.ple == PleLocation::Device ? "GPU" : "host");
    for (int r = 0; r < ttft_runs; ++r) {
      const std::vector<int32_t> prompt = random_prompt();
      s.reset();
      int32_t next = 0;
      BatchItem item{&s, prompt.data(), prompt.size()};
      const auto tp = Clock::now();
      if (!(st = engine.step(&item, 1, nullptr, &next))) {
        std::fprintf(stderr, "\n%s\n", st.message.c_str());
        return 1;
      }
      ms.push_back(seconds_since(tp) * 1e3);
      std::printf(" %.1f", ms.back());
    }
    std::sort(ms.begin(), ms.end());
    std::printf(" ms; median %.1f ms\n", ms[ms.size() / 2]);
  }
  std::printf("%6s %8s %12s %14s %14s\n", "batch", "prompt", "TTFT ms", "tok/s/stream", "tok/s total");
  for (int B : batches) {
    std::vector<Session> s(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
      if (!(st = engine.create_session(&s[b]))) {
        std::fprintf(stderr, "%s\n", st.message.c_str());
        return 1;
      }
      prompts[b] = random_prompt();
    }
    std::vector<int32_t> next(static_cast<size_t>(B));
    std::vector<SamplingOptions> opts(static_cast<size_t>(B), sampling);  // step takes one per item
    for (int b = 0; b < B; ++b) opts[size_t(b)].seed = sampling.seed + uint64_t(b);
    std::vector<BatchItem> items(static_cast<size_t>(B));
    // TTFT: the first session alone (prefill + first token), then the others' prefills
    auto tp = Clock::now();
    items[0] = BatchItem{&s[0], prompts[0].data(), prompts[0].size()};
    if (!(st = engine.step(items.data(), 1, nullptr, next.data()))) {
      std::fprintf(stderr, "%s\n", st.message.c_str());
      return 1;
    }
    const double ttft = seconds_since(tp) * 1e3;
    if (together && B > 1) {
      for (int b = 1; b < B; ++b) items[size_t(b) - 1] = BatchItem{&s[b], prompts[b].data(), prompts[b].size()};
      if (!(st = engine.step(items.data(), size_t(B) - 1, nullptr, &next[1]))) {
        std::fprintf(stderr, "%s\n", st.message.c_str());
        return 1;
      }
    } else {
      for (int b = 1; b < B; ++b) {
        items[0] = BatchItem{&s[b], prompts[b].data(), prompts[b].size()};
        engine.step(items.data(), 1, nullptr, &next[b]);
      }
    }
    // decode: all B sessions one token per step; warm-up steps first (graph capture)
    std::vector<int32_t> feed(next);
    for (int b = 0; b < B; ++b) items[b] = BatchItem{&s[b], &feed[b], 1};
    const int warm = 3;
    Clock::time_point td;
    for (int i = 0; i < tokens; ++i) {
      if (i == warm) {
#ifdef QUICK_BENCH_NVTX
        nvtxRangePushA("decode");
#endif
        td = Clock::now();
      }
      if (!(st = engine.step(items.data(), size_t(B), sampled ? opts.data() : nullptr, next.data()))) {
        std::fprintf(stderr, "%s\n", st.message.c_str());
        return 1;
      }
      feed = next;
    }
    const double per_step = seconds_since(td) / (tokens - warm);
#ifdef QUICK_BENCH_NVTX
    nvtxRangePop();
#endif
    std::printf("%6d %8d %12.1f %14.1f %14.1f\n", B, prompt_len, ttft, 1.0 / per_step, B / per_step);
  }
  std::printf("peak host RSS %.0f MiB\n", peak_rss_mib());
  return 0;
}
