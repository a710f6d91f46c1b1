// bench_embed: the built-in benchmark called from an application. Loads a model, prints the device report,
// runs a small sweep through gemma4_t4::bench::run (with a progress callback), prints the table and writes
// the JSON report -- the few calls an application needs to measure itself on the machine it runs on.
//
//   bench_embed [MODEL_DIR [OUT.json]]     (defaults: the bundled tiny model, bench_embed.json)
//
// Exit status: 0 ok, 1 an error (message on stderr). bench/bench.cpp is the full command line.

#include <cstdint>
#include <cstdio>
#include <string>

#include "gemma4_t4.hpp"

#ifndef GEMMA4_T4_DEFAULT_MODEL
#define GEMMA4_T4_DEFAULT_MODEL "tests/fixtures/mm_bf16"
#endif

int main(int argc, char** argv) {
  namespace bench = gemma4_t4::bench;
  const std::string model = argc > 1 ? argv[1] : GEMMA4_T4_DEFAULT_MODEL;
  const std::string out = argc > 2 ? argv[2] : "bench_embed.json";

  // 1. What are we running on?
  std::fputs(bench::to_text(bench::device_report()).c_str(), stdout);

  // 2. The engine the application would use anyway.
  gemma4_t4::Engine engine;
  gemma4_t4::LoadOptions load;
  load.max_context = 512;
  if (auto st = gemma4_t4::Engine::load(model, load, &engine); !st) {
    std::fprintf(stderr, "bench_embed: %s\n", st.message.c_str());
    return 1;
  }

  // 3. A small sweep: two prompt lengths, one and two streams, 16 output tokens, one repeat.
  bench::SweepOptions sweep;
  sweep.prompts = {32, 128};
  sweep.concurrency = {1, 2};
  sweep.tokens = 16;
  sweep.repeats = 1;
  sweep.label = model;
  sweep.bandwidth_options.bytes = uint64_t(64) << 20;  // a quick bandwidth pass (the CLI uses 1 GiB on a GPU)
  sweep.on_progress = [](const bench::Progress& p) {
    std::fprintf(stderr, "bench_embed: %.0f%% (prompt %d, concurrency %d)\n", p.fraction * 100, p.prompt,
                 p.concurrency);
    return true;  // false would cancel; the report then holds what was measured
  };
  bench::Report report;
  if (auto st = bench::run(engine, sweep, &report); !st) {
    std::fprintf(stderr, "bench_embed: %s\n", st.message.c_str());
    return 1;
  }

  // 4. Results: a table for people, JSON for tools.
  std::fputs(bench::to_table(report).c_str(), stdout);
  if (auto st = bench::write_file(out, bench::to_json(report)); !st) {
    std::fprintf(stderr, "bench_embed: %s\n", st.message.c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  for (const bench::Cell& c : report.cells)
    if (!c.ok()) return 1;
  return 0;
}
