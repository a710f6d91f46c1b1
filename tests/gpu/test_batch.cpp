// Batch (continuous batching) on the CUDA backend: each session's greedy tokens, finish reason, Status and
// final position equal generate() run alone on the same engine -- the scenario of tests/test_batch.cpp
// (sessions joining at different steps, chunked prompts mixed with decode rows in one pass, a callback
// stop, a cancellation, a context limit, invalid prompts, a second turn), greedy sessions only: seeded
// sampling of batched fp16 logits may differ from the single-session logits right at a filter boundary.
// Run by the GPU suite (label gpu), which exits 77 (skipped) without a CUDA device.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../batch_scenario.hpp"
#include "../reference.hpp"

using namespace gemma4_t4;
using namespace testref;
using namespace testbatch;

TEST_CASE("CUDA batch: each session's greedy results equal generate() alone", "[gpu][batch]") {
  for (const char* name : {"mm_bf16", "flat_keqv", "w4a16"}) {
    INFO(name);
    Reference ref;
    load_reference(name, &ref);
    Engine engine = load_engine(name, Backend::Cuda);
    REQUIRE(engine.backend() == Backend::Cuda);
    for (int rows : {6, 512}) {
      INFO("prefill_rows " << rows);
      BatchOptions opt;
      opt.max_sessions = 4;
      opt.prefill_rows = rows;
      batch_equals_alone(engine, scenario(ref.prompt, ref.decode_ids, false), opt);
    }
  }
}
