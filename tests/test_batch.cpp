// Batch (continuous batching) on the CPU backend: every session's tokens, finish reason, Status, timing
// counts and final position equal generate() run alone with the same prompt and options -- sessions with
// different prompts, lengths and options joining at different steps, queued behind max_sessions, prompts
// read in chunks, one stopped by its callback, one cancelled, one reaching its context limit, invalid
// prompts, seeded sampling, a second turn on the same session; prefill chunks bounded per step while
// decoding sessions keep getting a token every step; add() argument errors.
#include <catch2/catch.hpp>

#include <vector>

#include "batch_scenario.hpp"
#include "reference.hpp"

using namespace gemma4_t4;
using namespace testref;
using namespace testbatch;

namespace {

// The reference scenario (batch_scenario.hpp) on fixture `name`, CPU backend, batched with these limits vs alone.
void fixture_batch_equals_alone(const char* name, int max_sessions, int prefill_rows) {
  INFO(name);
  const Reference ref = reference(name);
  Engine engine = load_engine(name, Backend::Cpu);
  BatchOptions opt;
  opt.max_sessions = max_sessions;
  opt.prefill_rows = prefill_rows;
  batch_equals_alone(engine, scenario(ref.prompt, ref.decode_ids, true), opt);
}

}  // namespace

TEST_CASE("batch: each session's results equal generate() alone (chunked prefill, queueing)", "[batch][cpu]") {
  // 4 sessions at once (the others wait their turn); prompts read 6 tokens a step, shared by the joiners.
  for (const char* name : {"mm_bf16", "w4a16"}) fixture_batch_equals_alone(name, 4, 6);
}

TEST_CASE("batch: each session's results equal generate() alone (whole prompts, all at once)", "[batch][cpu]") {
  fixture_batch_equals_alone("flat_keqv", 64, 1000);
}

TEST_CASE("batch: prompt chunks are bounded per step and decoding sessions are not starved", "[batch][cpu]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  BatchOptions opt;
  opt.prefill_rows = 4;
  Batch batch(engine, opt);
  Session a, b;
  REQUIRE(engine.create_session(&a));
  REQUIRE(engine.create_session(&b));
  int a_tokens = 0;
  REQUIRE(batch.add(&a, {2, 17}, greedy(40), [&](int32_t) {
    ++a_tokens;
    return true;
  }));
  REQUIRE(batch.step());  // a's prompt, its first token
  REQUIRE(a_tokens == 1);
  std::vector<int32_t> long_prompt;
  for (int r = 0; r < 3; ++r) long_prompt.insert(long_prompt.end(), ref.prompt.begin(), ref.prompt.end());
  uint64_t id_b = 0;
  REQUIRE(batch.add(&b, long_prompt, greedy(3), nullptr, &id_b));
  for (size_t k = 1; k * 4 <= long_prompt.size(); ++k) {
    INFO("step " << k);
    const size_t before = a.position();
    REQUIRE(batch.step());
    CHECK(b.position() == k * 4);       // 4 prompt rows a step
    CHECK(a.position() == before + 1);  // and one decode row for a, every step
    CHECK(a_tokens == int(1 + k));
  }
  while (!batch.idle()) REQUIRE(batch.step());
  const std::vector<BatchResult> done = batch.take_finished();
  REQUIRE(done.size() == 2);
  CHECK(done[0].id == id_b);  // b finished first (3 tokens)
  CHECK(done[0].tokens.size() == 3);
  CHECK(done[1].tokens.size() == 40);
  CHECK(done[1].finish == FinishReason::Length);
}

TEST_CASE("batch: add() refuses misuse; callbacks may cancel and add", "[batch][cpu][errors]") {
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  Engine other = load_engine("mm_bf16", Backend::Cpu);
  Batch batch(engine);
  Session s, t, foreign, unopened;
  REQUIRE(engine.create_session(&s));
  REQUIRE(engine.create_session(&t));
  REQUIRE(other.create_session(&foreign));
  const std::vector<int32_t> prompt = {2, 17, 99};
  CHECK(batch.add(nullptr, prompt, greedy(4), nullptr).code == Code::InvalidArgument);
  CHECK(batch.add(&unopened, prompt, greedy(4), nullptr).code == Code::InvalidArgument);
  CHECK(batch.add(&foreign, prompt, greedy(4), nullptr).code == Code::InvalidArgument);
  CHECK(batch.add(&s, prompt, greedy(-1), nullptr).code == Code::InvalidArgument);
  CHECK(batch.idle());
  CHECK_FALSE(batch.cancel(12345));

  // s's callback cancels t on its 2nd token and queues a new turn for a third session
  Session u;
  REQUIRE(engine.create_session(&u));
  uint64_t id_t = 0, id_u = 0;
  int s_tokens = 0;
  REQUIRE(batch.add(&t, prompt, greedy(50), nullptr, &id_t));
  REQUIRE(batch.add(&s, prompt, greedy(5), [&](int32_t) {
    if (++s_tokens == 2) {
      CHECK(batch.cancel(id_t));
      CHECK(batch.add(&u, {2, 5}, greedy(2), nullptr, &id_u));
    }
    return true;
  }));
  CHECK(batch.add(&s, prompt, greedy(4), nullptr).code == Code::InvalidArgument);  // already in it
  CHECK(batch.size() == 2);
  CHECK(batch.step().is_ok());
  CHECK(batch.step().is_ok());
  std::vector<BatchResult> done = batch.take_finished();
  REQUIRE(done.size() == 1);
  CHECK(done[0].id == id_t);
  CHECK(done[0].finish == FinishReason::Cancelled);
  CHECK(done[0].tokens.size() == 2);
  while (!batch.idle()) REQUIRE(batch.step());
  done = batch.take_finished();
  REQUIRE(done.size() == 2);
  CHECK(done[0].id == id_u);  // joined at step 3, two tokens: done before s's fifth
  CHECK(done[0].tokens.size() == 2);
  CHECK(done[0].finish == FinishReason::Length);
  CHECK(done[0].status.is_ok());
  CHECK(done[1].session == &s);
  CHECK(done[1].tokens.size() == 5);

  Batch moved = std::move(batch);
  CHECK(moved.idle());
  CHECK(moved.step().is_ok());
}
