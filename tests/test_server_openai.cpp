// examples/server/openai.hpp without HTTP: the text a generation streams (stop strings matched across token
// boundaries and held back while they could still match, special tokens, the thinking channel, UTF-8 split over
// byte tokens) against Tokenizer::decode of the same ids, and request parsing (defaults, types, refusals).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../examples/server/openai.hpp"

using namespace gemma4_t4;
using server::Json;

namespace {

const Tokenizer& tiny() {
  static Tokenizer tok;
  static const bool loaded = [] {
    const Status st = Tokenizer::load(GEMMA4_T4_TINY_TOKENIZER, &tok);
    INFO(st.message);
    REQUIRE(st);
    return true;
  }();
  (void)loaded;
  return tok;
}

std::vector<int32_t> ids_of(const std::string& text) {
  std::vector<int32_t> ids;
  REQUIRE(tiny().encode(text, &ids));
  return ids;
}

std::string decoded(const std::vector<int32_t>& ids, size_t n) {
  std::string s;
  REQUIRE(tiny().decode(ids.data(), n, &s));
  return s;
}

struct Streamed {
  std::string content, reasoning;
  size_t stopped_at = 0;     // tokens put when a stop string matched (0: none)
  std::vector<size_t> grew;  // content size after each put
};

Streamed stream(const std::vector<int32_t>& ids, std::vector<std::string> stop, bool keep_special = false,
                bool reasoning = false) {
  server::TextOutput out(tiny(), std::move(stop), keep_special, reasoning);
  Streamed s;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool hit = out.put(ids[i], &s.content, &s.reasoning);
    s.grew.push_back(s.content.size());
    if (hit) {
      s.stopped_at = i + 1;
      return s;
    }
  }
  out.finish(&s.content, &s.reasoning);
  return s;
}

}  // namespace

TEST_CASE("server text: stop strings match across token boundaries, as decode() of the prefixes finds them",
          "[server]") {
  const std::string text = "the sea is wide and the wind is cold on the shore";
  const std::vector<int32_t> ids = ids_of(text);
  REQUIRE(decoded(ids, ids.size()) == text);
  bool spanned = false;
  for (const std::string stop : {"sea is", "e w", "cold", "d", "shore", "wind is c"}) {
    INFO("stop " << stop);
    const Streamed s = stream(ids, {stop, "never there"});
    // the reference: the first prefix of the ids whose text holds the stop string
    size_t first = 0;
    for (size_t n = 1; n <= ids.size() && !first; ++n)
      if (decoded(ids, n).find(stop) != std::string::npos) first = n;
    REQUIRE(first > 0);
    CHECK(s.stopped_at == first);
    CHECK(s.content == text.substr(0, text.find(stop)));
    if (decoded(ids, first - 1).size() > text.find(stop)) spanned = true;  // began before the last token
    // nothing past the match was ever shown
    for (size_t g : s.grew) CHECK(g <= text.find(stop));
  }
  CHECK(spanned);  // at least one match began in an earlier token than the one that completed it
}

TEST_CASE("server text: a partial match is held back until it fails or the stream ends", "[server]") {
  const std::vector<int32_t> ids = ids_of("the wind is wi");
  const Streamed s = stream(ids, {"wild"});
  CHECK(s.stopped_at == 0);
  CHECK(s.content == "the wind is wi");  // the held "wi" comes out at finish
  // before finish the tail that could start "wild" was held: the last put showed at most "the wind is "
  CHECK(s.grew.back() <= std::string("the wind is ").size());
  CHECK(stream(ids, {}).content == decoded(ids, ids.size()));
}

TEST_CASE("server text: UTF-8 split over byte tokens, stop strings inside it", "[server]") {
  const std::string text = "caf\xC3\xA9 \xE2\x98\x95 hot";  // "café ☕ hot": byte-fallback tokens
  const std::vector<int32_t> ids = ids_of(text);
  CHECK(stream(ids, {}).content == text);
  const Streamed s = stream(ids, {"\xE2\x98\x95"});
  CHECK(s.content == "caf\xC3\xA9 ");
  CHECK(s.stopped_at > 0);
}

TEST_CASE("server text: special tokens left out (or kept); the thinking channel becomes reasoning", "[server]") {
  const Tokenizer& tok = tiny();
  const int32_t open = tok.token_id("<|channel>"), close = tok.token_id("<channel|>"), turn = tok.token_id("<|turn>");
  REQUIRE(open >= 0);
  REQUIRE(close >= 0);
  std::vector<int32_t> ids = {open};
  for (int32_t t : ids_of("thought\nthe sea")) ids.push_back(t);
  ids.push_back(close);
  ids.push_back(turn);
  for (int32_t t : ids_of("is wide")) ids.push_back(t);

  const Streamed thinking = stream(ids, {}, false, true);
  CHECK(thinking.reasoning == "the sea");
  CHECK(thinking.content == "is wide");
  const Streamed plain = stream(ids, {}, false, false);
  CHECK(plain.reasoning.empty());
  CHECK(plain.content == "thought\nthe seais wide");
  const Streamed kept = stream(ids, {}, true, false);
  CHECK(kept.content == decoded(ids, ids.size()));
  // a stop string applies to the content, not to the reasoning
  const Streamed stopped = stream(ids, {"sea", "wide"}, false, true);
  CHECK(stopped.reasoning == "the sea");
  CHECK(stopped.content == "is ");
}

TEST_CASE("server requests: defaults, fields and refusals", "[server]") {
  server::ServerInfo info;
  info.model_name = "tiny";
  info.context = 64;
  info.vocab_size = 512;
  info.defaults.sampling.temperature = 0.5f;
  info.defaults.sampling.top_k = 7;
  auto parse = [&](const char* body, server::Endpoint e, server::Request* r, server::ApiError* err) {
    return server::parse_request(Json::parse(body), e, info, r, err);
  };
  server::Request r;
  server::ApiError err;
  REQUIRE(parse(R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text",
      "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 9, "stop": ["x", ""], "top_p": 0.5,
      "seed": 18446744073709551615, "stream": true, "stream_options": {"include_usage": true},
      "chat_template_kwargs": {"enable_thinking": true}, "unknown_field": 1, "n": 1, "logprobs": false})",
                server::Endpoint::Chat, &r, &err));
  CHECK(r.messages.size() == 2);
  CHECK(r.messages[1].content == "ab");
  CHECK(r.max_tokens == 9);
  CHECK(r.stop == std::vector<std::string>{"x"});
  CHECK(r.sampling.temperature == 0.5f);  // the server's default
  CHECK(r.sampling.top_k == 7);
  CHECK(r.sampling.top_p == 0.5f);
  CHECK(r.sampling.seed == 18446744073709551615ull);
  CHECK(r.seed_given);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.thinking);

  REQUIRE(parse(R"({"prompt": [2, 5, 511], "top_k": -1, "ignore_eos": true, "seed": -1})", server::Endpoint::Completion,
                &r, &err));
  CHECK(r.prompt_is_ids);
  CHECK(r.prompt_ids == std::vector<int32_t>{2, 5, 511});
  CHECK(r.sampling.top_k == 0);
  CHECK(r.ignore_eos);
  CHECK(r.sampling.seed == ~0ull);
  REQUIRE(parse(R"({"prompt": ["one"], "model": "tiny"})", server::Endpoint::Completion, &r, &err));
  CHECK(r.prompt_text == "one");

  struct Refused {
    const char* body;
    server::Endpoint endpoint;
    int status;
    const char* code;
  };
  const server::Endpoint chat = server::Endpoint::Chat, text = server::Endpoint::Completion;
  for (const Refused& x :
       {Refused{R"({"messages": [{"role": "user", "content": "a"}], "model": "x"})", chat, 404, "model_not_found"},
        Refused{R"({"messages": [{"role": "robot", "content": "a"}]})", chat, 400, "invalid_role"},
        Refused{R"({"messages": [{"role": "user", "content": "a"}], "n": 3})", chat, 400, "unsupported"},
        Refused{R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": -2})", chat, 400, "invalid_type"},
        Refused{R"({"messages": {}})", chat, 400, "invalid_type"},
        Refused{R"({"prompt": [1, 512]})", text, 400, "invalid_value"},
        Refused{R"({"prompt": "a", "echo": true})", text, 400, "unsupported"},
        Refused{R"({"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12",
                                   "13","14","15","16","17"]})",
                text, 400, "invalid_type"},
        Refused{R"({})", text, 400, "invalid_type"}}) {
    INFO(x.body);
    CHECK_FALSE(parse(x.body, x.endpoint, &r, &err));
    CHECK(err.status == x.status);
    CHECK(err.code == x.code);
    const Json j = server::error_json(err);
    CHECK(j["error"]["message"].get<std::string>() == err.message);
    CHECK(j["error"]["code"] == x.code);
  }
}
