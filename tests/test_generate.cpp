// generate(): the loop over Engine::step -- greedy output equals the reference's continuation, stop tokens,
// max_new_tokens, a callback that stops, the session holding prompt + output, multi-turn continuation
// equal to re-prefilling the whole conversation, timing fields, and a context overflow mid-generation.
#include <catch2/catch.hpp>

#include <vector>

#include "reference.hpp"

using namespace gemma4_t4;
using namespace testref;

TEST_CASE("generate: greedy continuation equals the reference's", "[generate][cpu]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  Session s;
  REQUIRE(engine.create_session(&s));
  const GenerateOptions opt = greedy(int(ref.decode_ids.size()));
  std::vector<int32_t> out, seen;
  Timing t;
  REQUIRE(generate(
      engine, s, ref.prompt, opt,
      [&](int32_t tok) {
        seen.push_back(tok);
        return true;
      },
      &out, &t));
  CHECK(out == ref.decode_ids);
  CHECK(seen == out);
  CHECK(s.position() == ref.prompt.size() + out.size());  // every generated token was fed
  CHECK(t.prompt_tokens == ref.prompt.size());
  CHECK(t.generated_tokens == out.size());
  CHECK(t.ttft_ms > 0);
  CHECK(t.decode_ms > 0);
  CHECK(t.decode_tok_s() > 0);
}

TEST_CASE("generate: stop tokens, max_new_tokens and a stopping callback", "[generate][cpu]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  GenerateOptions opt = greedy(16);

  SECTION("a stop token ends generation and is neither returned nor fed") {
    opt.stop_tokens = {ref.decode_ids[3]};
    // the first occurrence of that id in the reference continuation is where generation must stop
    size_t first = 0;
    while (ref.decode_ids[first] != ref.decode_ids[3]) ++first;
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<int32_t> out;
    Timing t;
    REQUIRE(generate(engine, s, ref.prompt, opt, nullptr, &out, &t));
    CHECK(out == std::vector<int32_t>(ref.decode_ids.begin(), ref.decode_ids.begin() + long(first)));
    CHECK(t.generated_tokens == first + 1);
    CHECK(s.position() == ref.prompt.size() + first);
  }
  SECTION("max_new_tokens") {
    opt.max_new_tokens = 5;
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<int32_t> out;
    REQUIRE(generate(engine, s, ref.prompt, opt, nullptr, &out));
    CHECK(out == std::vector<int32_t>(ref.decode_ids.begin(), ref.decode_ids.begin() + 5));
    CHECK(s.position() == ref.prompt.size() + 5);
  }
  SECTION("the callback stops after the token it returns false for") {
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<int32_t> out;
    int calls = 0;
    REQUIRE(generate(
        engine, s, ref.prompt, opt, [&](int32_t) { return ++calls < 3; }, &out));
    CHECK(calls == 3);
    CHECK(out.size() == 3);
    CHECK(s.position() == ref.prompt.size() + 3);
  }
}

TEST_CASE("generate: a later turn continues the cache exactly like re-prefilling everything", "[generate][cpu]") {
  const Reference ref = reference("w4a16");
  Engine engine = load_engine("w4a16", Backend::Cpu);
  const GenerateOptions opt = greedy(6);
  const std::vector<int32_t> turn1(ref.prompt.begin(), ref.prompt.begin() + 9);
  const std::vector<int32_t> turn2 = {105, 17, 300, 41, 107};  // "the user's next message"
  Session s;
  REQUIRE(engine.create_session(&s));
  std::vector<int32_t> a1, a2;
  REQUIRE(generate(engine, s, turn1, opt, nullptr, &a1));
  REQUIRE(generate(engine, s, turn2, opt, nullptr, &a2));
  // the same conversation prefilled in one go
  std::vector<int32_t> all = turn1;
  all.insert(all.end(), a1.begin(), a1.end());
  all.insert(all.end(), turn2.begin(), turn2.end());
  Session fresh;
  REQUIRE(engine.create_session(&fresh));
  std::vector<int32_t> b2;
  REQUIRE(generate(engine, fresh, all, opt, nullptr, &b2));
  CHECK(a2 == b2);
  CHECK(s.position() == fresh.position());
}

TEST_CASE("generate: passing the context is an error that keeps what was generated", "[generate][cpu][errors]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  Session s;
  REQUIRE(engine.create_session(&s, ref.prompt.size() + 4));
  const GenerateOptions opt = greedy(10);
  std::vector<int32_t> out;
  const Status st = generate(engine, s, ref.prompt, opt, nullptr, &out);
  CHECK(st.code == Code::ContextOverflow);
  CHECK(out.size() == 5);  // 4 fit in the cache; the 5th was sampled from the last position
  CHECK(s.position() == ref.prompt.size() + 4);
  std::vector<int32_t> empty;
  CHECK(generate(engine, s, empty, opt, nullptr, &out).code == Code::InvalidArgument);
}
