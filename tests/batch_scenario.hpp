// Shared by the CPU (tests/test_batch.cpp) and GPU (tests/gpu/test_batch.cpp) Batch tests: a scenario of
// sessions that join at different steps with their own prompts and options, and the check that each one's
// result equals generate() run alone on a fresh session with the same prompt and options.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gemma4_t4.hpp"
#include "reference.hpp"

namespace testbatch {

using testref::greedy;

// One session of the scenario.
struct Spec {
  std::string what;
  std::vector<int32_t> prompt;
  gemma4_t4::GenerateOptions options;
  size_t context = 0;                // session context (0: the engine's default)
  int join_step = 0;                 // added just before this step
  int stop_after = -1;               // the callback returns false on this token (1-based); -1: never
  int cancel_after = -1;             // cancelled between steps once it has this many tokens; -1: never
  std::vector<int32_t> second_turn;  // added again with this prompt once the first turn finished
};

// What generate() gives for one turn.
struct Turn {
  std::vector<int32_t> tokens;
  gemma4_t4::Status status;
  gemma4_t4::Timing timing;
  size_t position = 0;  // the session's position afterwards
  bool callback_stopped = false;
};

// generate() alone on a fresh session: the first turn, then the second when there is one.
inline std::vector<Turn> run_alone(const gemma4_t4::Engine& engine, const Spec& spec) {
  gemma4_t4::Session s;
  REQUIRE(engine.create_session(&s, spec.context));
  std::vector<Turn> turns;
  for (int t = 0; t < (spec.second_turn.empty() ? 1 : 2); ++t) {
    Turn turn;
    int seen = 0;
    auto cb = [&](int32_t) {
      ++seen;
      const bool go_on = t > 0 || seen != spec.stop_after;
      turn.callback_stopped |= !go_on;
      return go_on;
    };
    turn.status =
        generate(engine, s, t == 0 ? spec.prompt : spec.second_turn, spec.options, cb, &turn.tokens, &turn.timing);
    turn.position = s.position();
    turns.push_back(turn);
    if (!turn.status) break;
  }
  return turns;
}

inline gemma4_t4::FinishReason expected_finish(const Turn& t) {
  using gemma4_t4::FinishReason;
  if (!t.status) return FinishReason::Error;
  if (t.callback_stopped) return FinishReason::Callback;
  if (t.timing.generated_tokens > t.tokens.size()) return FinishReason::Stop;
  return FinishReason::Length;
}

// Runs the specs through one Batch and checks every session against run_alone().
inline void batch_equals_alone(const gemma4_t4::Engine& engine, const std::vector<Spec>& specs,
                               const gemma4_t4::BatchOptions& options) {
  using namespace gemma4_t4;
  const size_t n = specs.size();
  std::vector<Session> sessions(n);
  std::vector<int> seen(n, 0);            // tokens the callback saw (this turn)
  std::vector<int> turn(n, 0);            // 0: first turn, 1: second
  std::vector<uint64_t> id(n, 0);         // batch id of the current turn
  std::vector<bool> cancelled(n, false);  //
  std::vector<std::vector<BatchResult>> results(n);
  std::map<uint64_t, size_t> spec_of;  // batch id -> spec index

  Batch batch(engine, options);
  auto add = [&](size_t i) {
    seen[i] = 0;
    const int t = turn[i];
    auto cb = [&seen, &specs, i, t](int32_t) { return ++seen[i] != specs[i].stop_after || t > 0; };
    INFO(specs[i].what);
    REQUIRE(batch.add(&sessions[i], t == 0 ? specs[i].prompt : specs[i].second_turn, specs[i].options, cb, &id[i]));
    spec_of[id[i]] = i;
  };
  for (size_t i = 0; i < n; ++i) REQUIRE(engine.create_session(&sessions[i], specs[i].context));

  int last_join = 0;
  for (const Spec& s : specs) last_join = std::max(last_join, s.join_step);
  for (int step = 0; step <= last_join || !batch.idle(); ++step) {
    REQUIRE(step < 1000);
    for (size_t i = 0; i < n; ++i)
      if (specs[i].join_step == step) add(i);
    for (size_t i = 0; i < n; ++i)
      if (specs[i].cancel_after >= 0 && !cancelled[i] && seen[i] >= specs[i].cancel_after) {
        cancelled[i] = true;
        CHECK(batch.cancel(id[i]));
        CHECK_FALSE(batch.cancel(id[i]));  // no longer there
      }
    REQUIRE(batch.step());
    for (BatchResult& r : batch.take_finished()) {
      const size_t i = spec_of.at(r.id);
      CHECK(r.session == &sessions[i]);
      results[i].push_back(std::move(r));
      if (!specs[i].second_turn.empty() && turn[i] == 0 && results[i].back().status) {
        turn[i] = 1;  // the same session joins again with the next turn of its conversation
        add(i);
      }
    }
  }
  CHECK(batch.take_finished().empty());
  CHECK(batch.size() == 0);
  std::set<FinishReason> reasons;  // the scenario is made to end sessions every way there is
  for (const auto& rs : results)
    for (const BatchResult& r : rs) reasons.insert(r.finish);
  CHECK(reasons.size() == 5);

  for (size_t i = 0; i < n; ++i) {
    const Spec& spec = specs[i];
    INFO("session " << i << ": " << spec.what);
    const std::vector<Turn> alone = run_alone(engine, spec);
    if (spec.cancel_after >= 0) {
      REQUIRE(results[i].size() == 1);
      const BatchResult& r = results[i][0];
      CHECK(r.finish == FinishReason::Cancelled);
      CHECK(r.status.code == Code::Cancelled);
      REQUIRE(r.tokens.size() == size_t(spec.cancel_after));
      CHECK(std::equal(r.tokens.begin(), r.tokens.end(), alone[0].tokens.begin()));
      // the last sampled token was not fed
      CHECK(sessions[i].position() == spec.prompt.size() + r.tokens.size() - 1);
      continue;
    }
    REQUIRE(results[i].size() == alone.size());
    for (size_t t = 0; t < alone.size(); ++t) {
      INFO("turn " << t);
      const BatchResult& r = results[i][t];
      CHECK(r.tokens == alone[t].tokens);
      CHECK(r.finish == expected_finish(alone[t]));
      CHECK(r.status.code == alone[t].status.code);
      if (!alone[t].status) CHECK_FALSE(r.status.message.empty());
      CHECK(r.timing.prompt_tokens == alone[t].timing.prompt_tokens);
      CHECK(r.timing.generated_tokens == alone[t].timing.generated_tokens);
      if (r.timing.generated_tokens > 0) CHECK(r.timing.ttft_ms > 0);
    }
    CHECK(sessions[i].position() == alone.back().position);
  }
}

// The scenario both backends run: `fixture_prompt` is a fixture's reference prompt (20 ids) and
// `continuation` its greedy continuation (a stop token is taken from it, so that one session hits it).
inline std::vector<Spec> scenario(const std::vector<int32_t>& fixture_prompt, const std::vector<int32_t>& continuation,
                                  bool with_sampling) {
  auto prefix = [&](size_t k) {
    return std::vector<int32_t>(fixture_prompt.begin(), fixture_prompt.begin() + long(k));
  };
  std::vector<int32_t> other(fixture_prompt.rbegin(), fixture_prompt.rend());  // another prompt
  other.insert(other.begin(), 2);
  std::vector<Spec> specs;
  specs.push_back(
      {"the whole prompt, then a second turn", fixture_prompt, greedy(12), 0, 0, -1, -1, {105, 17, 300, 41, 107}});
  specs.push_back({"a short prompt", prefix(7), greedy(8), 0, 0, -1, -1, {}});
  specs.push_back({"another prompt, joining at step 3", other, greedy(10), 0, 3, -1, -1, {}});
  specs.push_back({"the callback stops on the 4th token", prefix(13), greedy(16), 0, 1, 4, -1, {}});
  specs.push_back({"cancelled after 3 tokens", prefix(11), greedy(16), 0, 0, -1, 3, {}});
  specs.push_back({"the context fills after 4 tokens", prefix(10), greedy(10), 14, 2, -1, -1, {}});
  specs.push_back({"an id outside the vocabulary", {2, 17, 1 << 20}, greedy(5), 0, 2, -1, -1, {}});
  specs.push_back({"a prompt longer than its context", fixture_prompt, greedy(5), 16, 4, -1, -1, {}});
  specs.push_back({"max_new_tokens 0", prefix(5), greedy(0), 0, 1, -1, -1, {}});
  specs.push_back({"a stop token", fixture_prompt, greedy(16), 0, 5, -1, -1, {}});
  specs.back().options.stop_tokens = {continuation.at(3)};
  if (with_sampling) {
    Spec s{"seeded sampling", prefix(15), greedy(12), 0, 4, -1, -1, {}};
    s.options.sampling.temperature = 0.9f;
    s.options.sampling.top_k = 50;
    s.options.sampling.top_p = 0.9f;
    s.options.sampling.repetition_penalty = 1.15f;
    s.options.sampling.seed = 7;
    specs.push_back(s);
    Spec t = s;
    t.what = "seeded sampling, another seed, min-p, a later join";
    t.options.sampling.seed = 8;
    t.options.sampling.min_p = 0.05f;
    t.join_step = 9;
    specs.push_back(t);
  }
  return specs;
}

}  // namespace testbatch
