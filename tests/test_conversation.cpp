// The conversation logic of examples/chat.cpp (examples/conversation.hpp) on the bundled tiny model and
// tokenizer: a turn feeds only the tokens the session lacks when the session's tokens are a prefix of the
// re-rendered conversation, re-prefills everything when they are not (an answer whose text encodes to other
// tokens, a changed system prompt, /reset), and either way every answer equals generating it on a fresh
// session from the whole rendered conversation.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../examples/conversation.hpp"
#include "reference.hpp"

using namespace gemma4_t4;

namespace {

Tokenizer tiny_tokenizer() {
  Tokenizer tok;
  const Status st = Tokenizer::load(GEMMA4_T4_TINY_TOKENIZER, &tok);
  INFO(st.message);
  REQUIRE(st);
  return tok;
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, const std::vector<Message>& messages, bool thinking) {
  ChatOptions co;
  co.thinking = thinking;
  std::string text;
  REQUIRE(format_chat(messages, co, &text));
  std::vector<int32_t> ids;
  REQUIRE(tok.encode(text, &ids));
  return ids;
}

}  // namespace

TEST_CASE("chat example: KV reuse across turns equals re-prefilling the conversation", "[chat][example]") {
  const Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  const Tokenizer tok = tiny_tokenizer();
  Session session;
  REQUIRE(engine.create_session(&session));
  example::Conversation conv(engine, tok, std::move(session));

  GenerateOptions sampled;
  sampled.max_new_tokens = 12;
  sampled.sampling.repetition_penalty = 1.5f;
  sampled.sampling.seed = 11;
  GenerateOptions greedy = sampled;
  greedy.sampling = SamplingOptions::greedy();
  GenerateOptions none = sampled;
  none.max_new_tokens = 0;

  struct Turn {
    const char* user;
    const GenerateOptions* options;
    const char* system;  // nullptr: unchanged
    bool reset;
  };
  const Turn turns[] = {
      {"Hello there!", &none, nullptr, false},  // no answer: the next turn must reuse the whole session
      {"How are you today?", &sampled, nullptr, false},
      {"Tell me more.", &greedy, nullptr, false},  // this model answers greedily with "\n"s, trimmed away
      {"And then?", &sampled, nullptr, false},
      {"Be brief.", &sampled, "You are terse.", false},  // a new system turn: nothing to reuse
      {"Once more.", &none, nullptr, true},              // after /reset: nothing to reuse
      {"Thanks!", &sampled, nullptr, false},
  };
  int reused_turns = 0, reprefilled_turns = 0;
  std::vector<int32_t> held;  // what the session should hold after each turn
  for (const Turn& t : turns) {
    INFO("turn '" << t.user << "'");
    if (t.system) conv.set_system(t.system);
    if (t.reset) {
      conv.reset();
      held.clear();
    }
    // the expected prompt and answer: the whole conversation on a fresh session
    std::vector<Message> messages;
    if (!conv.system().empty()) messages.push_back({"system", conv.system()});
    messages.insert(messages.end(), conv.history().begin(), conv.history().end());
    messages.push_back({"user", t.user});
    const std::vector<int32_t> ids = encode_chat(tok, messages, conv.thinking());
    Session fresh;
    REQUIRE(engine.create_session(&fresh));
    std::vector<int32_t> want;
    REQUIRE(generate(engine, fresh, ids, *t.options, nullptr, &want));

    const bool prefix = held.size() < ids.size() && std::equal(held.begin(), held.end(), ids.begin());
    example::TurnStats st;
    std::string answer, streamed;
    auto on_text = [&](const std::string& s) {
      streamed += s;
      return true;
    };
    REQUIRE(conv.ask(t.user, *t.options, on_text, &answer, &st));
    CHECK(st.tokens == want);
    CHECK(answer == streamed);
    std::string decoded;
    REQUIRE(tok.decode(want.data(), want.size(), &decoded));
    CHECK(answer == decoded);
    CHECK(st.prompt_tokens == ids.size());
    CHECK(st.reused == (prefix ? held.size() : 0));
    CHECK(st.reused + st.prefilled == ids.size());
    CHECK(st.timing.prompt_tokens == st.prefilled);
    CHECK(conv.session().position() == ids.size() + want.size());
    CHECK(conv.session().position() == fresh.position());
    (prefix && !held.empty() ? reused_turns : reprefilled_turns) += 1;
    held = ids;
    held.insert(held.end(), want.begin(), want.end());
  }
  CHECK(reused_turns >= 2);           // at least turn 2 (after an empty answer) and turn 7
  CHECK(reprefilled_turns >= 3);      // at least the first turn, the new system prompt and /reset
  CHECK(conv.history().size() == 4);  // two turns since /reset, user + model each
}

TEST_CASE("chat example: a stopped answer is kept; an error leaves the history alone", "[chat][example]") {
  const Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  const Tokenizer tok = tiny_tokenizer();
  Session session;
  REQUIRE(engine.create_session(&session, 64));
  example::Conversation conv(engine, tok, std::move(session));
  GenerateOptions opt;
  opt.max_new_tokens = 30;
  opt.stop_at_eos = false;
  opt.sampling.repetition_penalty = 1.5f;
  int calls = 0;
  example::TurnStats st;
  REQUIRE(conv.ask(
      "Hi", opt, [&](const std::string&) { return ++calls < 4; }, nullptr, &st));
  CHECK(st.stopped_by_caller);
  CHECK(st.tokens.size() == 4);
  REQUIRE(conv.history().size() == 2);
  // 64 tokens of context: the next long turn cannot fit
  const Status over = conv.ask("Tell me everything about everything, at length, please.", opt, nullptr, nullptr, &st);
  CHECK(over.code == Code::ContextOverflow);
  CHECK(conv.history().size() == 2);
  CHECK(conv.session().position() == 0);  // rewound: the next turn feeds everything again
  opt.max_new_tokens = 2;
  REQUIRE(conv.ask("Ok.", opt, nullptr, nullptr, &st));
  CHECK(st.reused == 0);
  CHECK(conv.history().size() == 4);
}
