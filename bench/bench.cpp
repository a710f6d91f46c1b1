// bench: the built-in benchmark from the command line (gemma4_t4::bench). Device report, measured memory
// bandwidth, decode bytes per token and the ceiling they imply, then the sweep of the published T4 study:
// prompts x concurrency, 128 output tokens ignoring EOS, 3 repeats, one seed per cell and repeat. Prints an
// aligned table; --json / --csv / --svg write the other formats. T4 numbers are projections, and say so.
//
//   bench [--model DIR] [--cpu] [--prompts 512,4096] [--concurrency 1,4,8,16] [--tokens 128] [--repeats 3]
//         [--seed N] [--json FILE] [--csv FILE] [--svg FILE] [--doctor] [--device-only] ...   (--help: all)
//   bench --model DIR --lm-head-fidelity 4096 [--lm-head int8|int4]    quantized LM head vs fp16 logits
//
// Default model: the bundled tiny fixture (GEMMA4_T4_DEFAULT_MODEL, set by CMake to tests/fixtures/mm_bf16),
// so `bench` runs anywhere -- on the CPU when there is no GPU. Prompt lengths the model's context cannot hold
// (the tiny model's is 4096 tokens) are shortened to fit, and the output says so. Ctrl-C stops the sweep
// after the current repeat; what was measured is still printed and written.
// Exit status: 0 ok, 1 an error (load failure, or a cell that failed), 2 bad command line, 130 interrupted.

#include <algorithm>
#include <csignal>
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

namespace bench = gemma4_t4::bench;

const char kUsage[] =
    "usage: bench [--model DIR] [--cpu] [--prompts LIST] [--concurrency LIST] [--tokens N] [--repeats N]\n"
    "             [--seed N] [--json FILE] [--csv FILE] [--svg FILE] [--doctor] [--device-only]\n"
    "             [--lm-head f16|int8|int4] [--lm-head-fidelity POSITIONS] [--no-pdl] [--sampling greedy|gemma]\n"
    "             [--w4-matmul dequant|tensorcore|auto]\n"
    "\n"
    "Measures the device (memory bandwidth, the decode ceiling of the model) and runs the sweep of the\n"
    "published T4 study: every prompt length x every concurrency, greedy decoding, EOS ignored.\n"
    "\n";

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) { g_interrupted = 1; }

struct Args {
  std::string model = GEMMA4_T4_DEFAULT_MODEL;
  bool cpu = false;
  int device = 0;
  bench::SweepOptions sweep;
  std::string json, csv, svg;
  double kv_budget_gib = 0;
  uint64_t bandwidth_mib = 0;
  bool ple_device = false;
  bool no_pdl = false;
  gemma4_t4::LmHead lm_head = gemma4_t4::LmHead::F16;
  gemma4_t4::W4Matmul w4_matmul = gemma4_t4::LoadOptions().w4_matmul;
  int fidelity_positions = 0;
  bool doctor = false;
  bool device_only = false;
  bool quiet = false;
};

// Returns -1 to continue, else the exit status (0 for --help, 2 for a bad command line).
int parse_args(int argc, char** argv, Args* a) {
  using gemma4_t4::LmHead;
  using gemma4_t4::SamplingOptions;
  using gemma4_t4::W4Matmul;
  const std::string model_help = std::string("checkpoint directory (default: ") + GEMMA4_T4_DEFAULT_MODEL + ")";
  args::Parser p("bench", kUsage);
  p.help_column(21);
  p.text("--model", "DIR", &a->model, model_help.c_str());
  p.flag("--cpu", &a->cpu, "use the CPU reference backend (default: CUDA when compiled in and a GPU is present)");
  p.integer("--device", "N", &a->device, 0, 1024, "CUDA device ordinal (default: 0)");
  p.list("--prompts", "LIST", &a->sweep.prompts, 1, 1 << 24,
         "prompt lengths in tokens, comma-separated (default: 512,4096; shortened to fit the\n"
         "model's context, with a note)");
  p.list("--concurrency", "LIST", &a->sweep.concurrency, 1, 4096,
         "streams decoded together, comma-separated (default: 1,4,8,16)");
  p.integer("--tokens", "N", &a->sweep.tokens, 2, 1 << 24, "output tokens per stream, N >= 2 (default: 128)");
  p.integer("--repeats", "N", &a->sweep.repeats, 1, 1000, "timed repeats per cell (default: 3)");
  p.integer("--seed", "N", &a->sweep.seed, 0, UINT64_MAX, "base seed of the prompt ids (default: 20250101)");
  p.text("--json", "FILE", &a->json, "write the report as JSON");
  p.text("--csv", "FILE", &a->csv, "write one CSV line per cell");
  p.text("--svg", "FILE", &a->svg, "write a plot (tok/s per stream and total vs concurrency, ceiling dashed)");
  p.custom(
      "--kv-budget", "GIB",
      [a](const char* v) {
        const bool ok = args::parse_number(v, 0, 1e12, &a->kv_budget_gib) && a->kv_budget_gib > 0;
        return ok ? std::string() : std::string("a size in GiB > 0");
      },
      "report KV capacity at this budget (default: free GPU memory / available RAM)");
  p.integer("--bandwidth-mib", "N", &a->bandwidth_mib, 1, 1 << 20,
            "buffer for the bandwidth measurement (default: 1024 on a GPU, 256 on the host)");
  p.flag("--ple-device", &a->ple_device, "keep the per-layer-embedding table on the GPU (LoadOptions::ple)");
  p.choice("--lm-head", "KIND", &a->lm_head, {{"f16", LmHead::F16}, {"int8", LmHead::Int8}, {"int4", LmHead::Int4}},
           "LM head storage: f16 (default), int8 (per row) or int4 (group 32) (LoadOptions::lm_head)");
  p.choice("--w4-matmul", "HOW", &a->w4_matmul,
           {{"dequant", W4Matmul::Dequant}, {"tensorcore", W4Matmul::TensorCore}, {"auto", W4Matmul::Auto}},
           "w4a16 passes of > 32 rows: dequant (+ cuBLAS), tensorcore (kernels/gemm_w4.cuh) or auto\n"
           "(tensorcore up to kW4AutoGemmRows rows, dequant above; default) (LoadOptions::w4_matmul)");
  p.choice("--sampling", "MODE", &a->sweep.sampling,
           {{"greedy", SamplingOptions::greedy()}, {"gemma", SamplingOptions()}},
           "greedy (default) or gemma: temperature 1, top-k 64, top-p 0.95 (generation_config)");
  p.integer("--lm-head-fidelity", "POSITIONS", &a->fidelity_positions, 1, 1 << 24,
            "instead of the sweep: logits of the quantized head (--lm-head, or both int8 and int4)\n"
            "vs the fp16 head over POSITIONS random-token positions (max/mean error, top-1/top-5)");
  p.flag("--no-pdl", &a->no_pdl, "plain kernel launches on sm_90+ (LoadOptions::programmatic_launch = false)");
  p.flag("--no-warmup", &a->sweep.warmup, "skip the untimed warm-up pass of each cell", false);
  p.flag("--doctor", &a->doctor,
         "check this machine for the model (GPU, memory, disk) and exit: status 0 when the\n"
         "model loads (warnings or not), 1 when it does not");
  p.flag("--device-only", &a->device_only, "report the device and its bandwidth, load no model, and exit");
  p.flag("--quiet", &a->quiet, "no progress lines on stderr");
  p.footer("\nExit status: 0 ok, 1 an error (load failure or a failed cell), 2 bad command line, 130 interrupted.\n");
  return p.parse(argc, argv);
}

bool write(const std::string& path, const std::string& text, const char* what) {
  if (path.empty()) return true;
  const gemma4_t4::Status st = bench::write_file(path, text);
  if (!st) {
    std::fprintf(stderr, "bench: %s\n", st.message.c_str());
    return false;
  }
  std::fprintf(stderr, "bench: wrote %s %s\n", what, path.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int rc = parse_args(argc, argv, &a); rc >= 0) return rc;
  const gemma4_t4::Backend backend = a.cpu ? gemma4_t4::Backend::Cpu : gemma4_t4::Backend::Auto;
  bench::BandwidthOptions bw;
  bw.bytes = uint64_t(a.bandwidth_mib) << 20;

  if (a.doctor) {
    const bench::DoctorReport d = bench::doctor(a.model, a.device);
    std::fputs(bench::to_text(d).c_str(), stdout);
    const bool written = write(a.json, bench::to_json(d), "doctor JSON");
    return written && d.model_ok ? 0 : 1;
  }

  if (a.device_only) {
    const bench::DeviceReport d = bench::device_report(a.device);
    std::fputs(bench::to_text(d).c_str(), stdout);
    bench::Bandwidth b;
    const gemma4_t4::Status st = bench::measure_bandwidth(backend, a.device, bw, &b);
    if (!st) {
      std::fprintf(stderr, "bench: %s\n", st.message.c_str());
      return 1;
    }
    std::fputs(bench::to_text(b).c_str(), stdout);
    const std::string json = "{\n\"device\": " + bench::to_json(d) + ",\n\"bandwidth\": " + bench::to_json(b) + "}\n";
    return write(a.json, json, "device JSON") ? 0 : 1;
  }

  gemma4_t4::LoadOptions opt;
  opt.backend = backend;
  opt.device = a.device;
  opt.ple = a.ple_device ? gemma4_t4::PleLocation::Device : gemma4_t4::PleLocation::Host;
  opt.lm_head = a.lm_head;
  opt.w4_matmul = a.w4_matmul;
  opt.programmatic_launch = !a.no_pdl;
  if (a.fidelity_positions > 0) {
    std::string json = "[\n";
    for (gemma4_t4::LmHead h : {gemma4_t4::LmHead::Int8, gemma4_t4::LmHead::Int4}) {
      if (a.lm_head != gemma4_t4::LmHead::F16 && h != a.lm_head) continue;
      bench::HeadFidelityOptions fo;
      fo.head = h;
      fo.positions = a.fidelity_positions;
      fo.seed = a.sweep.seed;
      bench::HeadFidelity f;
      if (!a.quiet) std::fprintf(stderr, "bench: LM head fidelity on %s\n", a.model.c_str());
      if (const gemma4_t4::Status st = bench::lm_head_fidelity(a.model, opt, fo, &f); !st) {
        std::fprintf(stderr, "bench: %s\n", st.message.c_str());
        return 1;
      }
      std::fputs(bench::to_text(f).c_str(), stdout);
      json += (json.size() > 2 ? "," : "") + bench::to_json(f);
    }
    return write(a.json, json + "]\n", "fidelity JSON") ? 0 : 1;
  }
  int longest = 0;
  for (int p : a.sweep.prompts) longest = std::max(longest, p);
  opt.max_context = size_t(longest) + size_t(a.sweep.tokens);  // sizes the CUDA graphs' attention splits
  if (!a.quiet) std::fprintf(stderr, "bench: loading %s\n", a.model.c_str());
  gemma4_t4::Engine engine;
  if (const gemma4_t4::Status st = gemma4_t4::Engine::load(a.model, opt, &engine); !st) {
    std::fprintf(stderr, "bench: %s\n", st.message.c_str());
    return 1;
  }
  const size_t max_pos = size_t(engine.config().max_position_embeddings);
  if (opt.max_context > max_pos) {  // reload is cheap next to the sweep, and keeps the graphs' splits exact
    opt.max_context = max_pos;
    if (const gemma4_t4::Status st = gemma4_t4::Engine::load(a.model, opt, &engine); !st) {
      std::fprintf(stderr, "bench: %s\n", st.message.c_str());
      return 1;
    }
  }

  a.sweep.label = a.model;
  a.sweep.bandwidth_options = bw;
  a.sweep.kv_budget_bytes = uint64_t(a.kv_budget_gib * double(uint64_t(1) << 30));
  const bool quiet = a.quiet;
  a.sweep.on_progress = [quiet](const bench::Progress& p) {
    if (!quiet && p.repeat < p.repeats)
      std::fprintf(stderr, "bench: [%3.0f%%] cell %zu/%zu: prompt %d, concurrency %d, repeat %d/%d\n", p.fraction * 100,
                   p.cell + 1, p.cells, p.prompt, p.concurrency, p.repeat + 1, p.repeats);
    return g_interrupted == 0;
  };
  std::signal(SIGINT, on_sigint);
  bench::Report report;
  const gemma4_t4::Status st = bench::run(engine, a.sweep, &report);
  std::signal(SIGINT, SIG_DFL);
  if (!st && st.code != gemma4_t4::Code::Cancelled) {
    std::fprintf(stderr, "bench: %s\n", st.message.c_str());
    return 1;
  }
  std::fputs(bench::to_table(report).c_str(), stdout);
  bool ok = write(a.json, bench::to_json(report), "JSON");
  ok = write(a.csv, bench::to_csv(report), "CSV") && ok;
  ok = write(a.svg, bench::to_svg(report), "SVG") && ok;
  if (report.cancelled) return 130;
  for (const bench::Cell& c : report.cells)
    if (!c.ok()) ok = false;
  return ok ? 0 : 1;
}
