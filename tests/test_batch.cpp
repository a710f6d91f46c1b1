// Batch (continuous batching) on the CPU backend: every session's tokens, finish reason, Status, timing
// counts and final position equal generate() run alone with the same prompt and options -- sessions with
// different prompts, lengths and options joining at different steps, queued behind max_sessions, prompts
// read in chunks, one stopped by its callback, one cancelled, one reaching its context limit, invalid
// prompts, seeded sampling, a second turn on the same session; prefill chunks bounded per step while
// decoding sessions keep getting a token every step; add() argument errors.
#include <catch2/catch.hpp>

#include <algorithm>
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

// Five sessions added to a batch together, each asking 4 greedy tokens of `prompt`; the step (as the test counts
// them) at which each got its first token, and how many it got.
struct Joiners {
  std::vector<Session> s = std::vector<Session>(5);
  std::vector<int> first_step = std::vector<int>(5, -1), tokens = std::vector<int>(5, 0);
  int step = 0;  // the test's step counter, read by the callbacks

  void add(const Engine& engine, Batch& batch, const std::vector<int32_t>& prompt) {
    for (size_t i = 0; i < s.size(); ++i) {
      REQUIRE(engine.create_session(&s[i]));
      REQUIRE(batch.add(&s[i], prompt, greedy(4), [this, i](int32_t) {
        if (tokens[i]++ == 0) first_step[i] = step;
        return true;
      }));
    }
  }
};

}  // namespace

TEST_CASE("batch: each session's results equal generate() alone (chunked prefill, queueing)", "[batch][cpu]") {
  // 4 sessions at once (the others wait their turn); prompts read 6 tokens a step, shared by the joiners.
  for (const char* name : {"mm_bf16", "w4a16"}) fixture_batch_equals_alone(name, 4, 6);
}

TEST_CASE("batch: each session's results equal generate() alone (whole prompts, all at once)", "[batch][cpu]") {
  fixture_batch_equals_alone("flat_keqv", 64, 1000);
}

TEST_CASE("batch: each session's results equal generate() alone (prompts one or two at a time, prefill priority)",
          "[batch][cpu]") {
  const struct {
    int prompts;
    bool priority;
  } runs[] = {{1, false}, {2, false}, {0, true}, {1, true}};
  for (const auto& r : runs) {
    INFO("prefill_sessions " << r.prompts << ", prefill_priority " << r.priority);
    const Reference ref = reference("mm_bf16");
    Engine engine = load_engine("mm_bf16", Backend::Cpu);
    BatchOptions opt;
    opt.max_sessions = 6;
    opt.prefill_rows = r.prompts == 1 ? 1000 : 9;
    opt.prefill_sessions = r.prompts;
    opt.prefill_priority = r.priority;
    batch_equals_alone(engine, scenario(ref.prompt, ref.decode_ids, true), opt);
  }
}

// A server's first tokens: prompts added together are read one at a time with prefill_sessions 1, so the k-th
// prompt's first token comes after k steps (as prompts prefilled one by one), not all after one packed step.
TEST_CASE("batch: prefill_sessions bounds the prompts a step reads; prompt rows come before decode rows",
          "[batch][cpu]") {
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  const std::vector<int32_t> prompt = {2, 17, 99, 5, 8, 300, 41};
  for (int prompts : {0, 1, 3}) {
    INFO("prefill_sessions " << prompts);
    BatchOptions opt;
    opt.prefill_rows = 64;
    opt.prefill_sessions = prompts;
    Batch batch(engine, opt);
    CHECK(batch.last_step().prompt_sessions == 0);
    Joiners j;
    j.add(engine, batch, prompt);
    std::vector<Session>& s = j.s;
    std::vector<int>&first_step = j.first_step, &tokens = j.tokens;
    int& step = j.step;
    std::vector<bool> last_fed(5, false);  // the 4th token fed (generate() feeds it before returning)
    for (step = 1; step <= 40 && !batch.idle(); ++step) {
      size_t generating = 0;  // sessions with a sampled token to feed back this step (one row each)
      for (size_t i = 0; i < s.size(); ++i) {
        if (tokens[i] == 0 || last_fed[i]) continue;
        ++generating;
        if (tokens[i] == 4) last_fed[i] = true;
      }
      REQUIRE(batch.step());
      const BatchStep b = batch.last_step();
      const size_t per_step = prompts == 0 ? s.size() : size_t(prompts);
      const size_t joined_before = std::min(s.size(), size_t(step - 1) * per_step);
      const size_t reading = std::min(per_step, s.size() - joined_before);
      CHECK(b.prompt_sessions == reading);
      CHECK(b.prompt_rows == reading * prompt.size());
      CHECK(b.decode_rows == generating);
    }
    CHECK(batch.idle());
    for (size_t i = 0; i < s.size(); ++i) {
      INFO("session " << i);
      CHECK(tokens[i] == 4);
      CHECK(first_step[i] == (prompts == 0 ? 1 : int(i) / prompts + 1));
    }
  }
}

// prefill_priority: while prompts are left to read, a step reads prompts only (bench::run's order: every
// prompt prefilled before any decoding); the generating sessions get their next tokens once every prompt is in.
TEST_CASE("batch: prefill_priority holds the decode rows back while prompts are left", "[batch][cpu]") {
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  const std::vector<int32_t> prompt = {2, 17, 99, 5, 8, 300, 41};
  for (int prompts : {1, 2}) {
    INFO("prefill_sessions " << prompts);
    BatchOptions opt;
    opt.prefill_rows = 64;
    opt.prefill_sessions = prompts;
    opt.prefill_priority = true;
    Batch batch(engine, opt);
    Joiners j;
    j.add(engine, batch, prompt);
    std::vector<Session>& s = j.s;
    std::vector<int>&first_step = j.first_step, &tokens = j.tokens;
    int& step = j.step;
    const int prompt_steps = (int(s.size()) + prompts - 1) / prompts;
    for (step = 1; step <= 40 && !batch.idle(); ++step) {
      REQUIRE(batch.step());
      const BatchStep b = batch.last_step();
      INFO("step " << step);
      if (step <= prompt_steps) {
        CHECK(b.prompt_sessions == std::min(size_t(prompts), s.size() - size_t(step - 1) * prompts));
        CHECK(b.decode_rows == 0);
      } else {
        CHECK(b.prompt_sessions == 0);
        CHECK(b.decode_rows > 0);
      }
    }
    CHECK(batch.idle());
    for (size_t i = 0; i < s.size(); ++i) {
      INFO("session " << i);
      CHECK(tokens[i] == 4);
      CHECK(first_step[i] == int(i) / prompts + 1);
    }
    // 3 more tokens each (one step apart once decoding) and the 4th token's feed: 4 decode steps
    CHECK(step - 1 == prompt_steps + 4);
  }
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

// Engine::warm_up: the CPU backend has nothing to warm (the CUDA backend's is tests/gpu/test_decode_buckets.cpp).
TEST_CASE("warm_up: nothing to do on the CPU backend; an engine not loaded is refused", "[batch][cpu]") {
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  CHECK(engine.warm_up().is_ok());
  CHECK(engine.warm_up(3).is_ok());
  Session s;
  REQUIRE(engine.create_session(&s));
  std::vector<int32_t> out;
  REQUIRE(generate(engine, s, {2, 17, 99}, greedy(3), nullptr, &out));  // still usable
  CHECK(out.size() == 3);
  Engine unloaded;
  const Status st = unloaded.warm_up();
  CHECK(st.code == Code::InvalidArgument);
  CHECK(st.message.find("warm_up") != std::string::npos);
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
