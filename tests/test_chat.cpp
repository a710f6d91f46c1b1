// format_chat against the official Gemma 4 chat template, and load_generation_config.
//
// tests/data/chat/conversations.json holds the conversations; expected.json holds what jinja2 renders for
// each of them with the official E2B template (tools/render_chat_template.py; tests/data/chat/README.md says
// how). Every conversation must come out of format_chat byte for byte the same.

#include <catch2/catch.hpp>

#include "gemma4_t4.hpp"
#include "temp_dir.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#ifndef GEMMA4_T4_FIXTURES
#define GEMMA4_T4_FIXTURES "tests/fixtures"
#endif

namespace {

namespace fs = std::filesystem;
using gemma4_t4::ChatOptions;
using gemma4_t4::Code;
using gemma4_t4::Message;
using gemma4_t4::SamplingOptions;
using gemma4_t4::Status;
using json = nlohmann::json;

fs::path chat_data(const std::string& name) { return fs::path(GEMMA4_T4_FIXTURES) / ".." / "data" / "chat" / name; }

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  INFO("reading " << p.string());
  REQUIRE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

// Escapes control characters so a failing comparison shows where the strings differ.
std::string visible(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n')
      out += "\\n\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  return out;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

}  // namespace

// ---- format_chat vs the official template ----

TEST_CASE("format_chat renders every conversation exactly as the official template does", "[chat]") {
  const json conversations = read_json(chat_data("conversations.json"));
  const json expected = read_json(chat_data("expected.json"));
  REQUIRE(conversations.is_array());
  REQUIRE(expected.at("cases").size() == conversations.size());
  REQUIRE(conversations.size() >= 20);

  for (size_t i = 0; i < conversations.size(); ++i) {
    const json& c = conversations[i];
    const json& e = expected["cases"][i];
    REQUIRE(e.at("name") == c.at("name"));
    std::vector<Message> messages;
    for (const json& m : c.at("messages"))
      messages.push_back(
          {m.at("role").get<std::string>(), m.at("content").get<std::string>(), m.value("reasoning", std::string())});
    ChatOptions options;
    options.add_generation_prompt = c.value("add_generation_prompt", true);
    options.thinking = c.value("enable_thinking", false);
    options.add_bos = c.value("add_bos", true);

    const std::string want = e.at("text").get<std::string>();
    std::string got;
    const Status st = gemma4_t4::format_chat(messages, options, &got);
    INFO("conversation " << i << ": " << c.at("name").get<std::string>() << "\nwant:\n"
                         << visible(want) << "\ngot:\n"
                         << visible(got));
    REQUIRE(st.is_ok());
    CHECK(got == want);
    CHECK(gemma4_t4::format_chat(messages, options) == want);
  }
}

TEST_CASE("format_chat: the known encoding's prompt with default options", "[chat]") {
  // GEMMA4.md: this text tokenizes to [2, 105, 2364, 107, 9259, 106, 107, 105, 4368, 107].
  CHECK(gemma4_t4::format_chat({{"user", "Hello"}}) == "<bos><|turn>user\nHello<turn|>\n<|turn>model\n");
}

TEST_CASE("format_chat refuses unknown roles and tool messages", "[chat]") {
  std::string out = "untouched";
  Status st = gemma4_t4::format_chat({{"user", "hi"}, {"bot", "hello"}}, ChatOptions(), &out);
  CHECK(st.code == Code::InvalidArgument);
  CHECK_THAT(st.message, Catch::Contains("message 1") && Catch::Contains("'bot'") && Catch::Contains("user"));
  CHECK(out == "untouched");
  CHECK(gemma4_t4::format_chat({{"user", "hi"}, {"bot", "hello"}}).empty());

  st = gemma4_t4::format_chat({{"User", "hi"}}, ChatOptions(), &out);  // roles are case-sensitive
  CHECK(st.code == Code::InvalidArgument);
  st = gemma4_t4::format_chat({{"", "hi"}}, ChatOptions(), &out);
  CHECK(st.code == Code::InvalidArgument);

  st = gemma4_t4::format_chat({{"user", "weather?"}, {"tool", "{\"temp\": 20}"}}, ChatOptions(), &out);
  CHECK(st.code == Code::Unsupported);
  CHECK_THAT(st.message, Catch::Contains("message 1") && Catch::Contains("tool"));
  CHECK(out == "untouched");
}

TEST_CASE("format_chat trims like Python's str.strip on malformed UTF-8 too", "[chat]") {
  // Bytes that are not well-formed UTF-8 are never whitespace (and are passed through).
  const std::string bad = std::string("\xe3\x80", 2);  // a truncated U+3000
  CHECK(gemma4_t4::format_chat({{"user", " x" + bad}}, ChatOptions{false, false, false}) ==
        "<|turn>user\nx" + bad + "<turn|>\n");
  CHECK(gemma4_t4::format_chat({{"user", bad + "\xe3\x80\x80"}}, ChatOptions{false, false, false}) ==
        "<|turn>user\n" + bad + "<turn|>\n");
  CHECK(gemma4_t4::format_chat({{"user", "\xc2\xa0\xc2\xa0"}}, ChatOptions{false, false, false}) ==
        "<|turn>user\n<turn|>\n");
}

// ---- generation_config.json ----

namespace {

// The five sampling fields load_generation_config sets, checked together.
void check_sampling(const SamplingOptions& o, float temperature, int top_k, float top_p, float min_p, float penalty) {
  CHECK(o.temperature == temperature);
  CHECK(o.top_k == top_k);
  CHECK(o.top_p == top_p);
  CHECK(o.min_p == min_p);
  CHECK(o.repetition_penalty == penalty);
}

}  // namespace

TEST_CASE("load_generation_config reads the sampling defaults and eos ids", "[chat]") {
  testutil::TempDir dir;
  SamplingOptions o;
  std::vector<int> eos = {1};
  auto load = [&](const char* json) {
    write_file(dir.path() / "generation_config.json", json);
    REQUIRE(gemma4_t4::load_generation_config(dir.path().string(), &o, &eos).is_ok());
  };

  SECTION("absent file keeps the defaults") {
    REQUIRE(gemma4_t4::load_generation_config(dir.path().string(), &o, &eos).is_ok());
    check_sampling(o, 1.0f, 64, 0.95f, 0.0f, 1.0f);
    CHECK(eos == std::vector<int>{1});
  }
  SECTION("Gemma 4's file") {
    load(R"({"bos_token_id": 2, "do_sample": true, "eos_token_id": [1, 106], "pad_token_id": 0,
            "temperature": 0.7, "top_k": 40, "top_p": 0.9, "transformers_version": "5.17.0"})");
    check_sampling(o, 0.7f, 40, 0.9f, 0.0f, 1.0f);
    CHECK(eos == std::vector<int>{1, 106});
  }
  SECTION("every field, eos as one id") {
    load(R"({"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.05, "repetition_penalty": 1.1,
            "eos_token_id": 106})");
    check_sampling(o, 1.5f, 0, 1.0f, 0.05f, 1.1f);
    CHECK(eos == std::vector<int>{106});
  }
  SECTION("null and absent fields keep what was there; do_sample false means greedy") {
    o.top_k = 7;
    o.seed = 42;
    load(R"({"top_k": null, "min_p": null, "do_sample": false})");
    CHECK(o.top_k == 7);
    CHECK(o.seed == 42);
    CHECK(o.temperature == 0.0f);
    CHECK(eos == std::vector<int>{1});
  }
  SECTION("an unreadable file is an IoError naming it") {
    fs::create_directory(dir.path() / "generation_config.json");
    const Status st = gemma4_t4::load_generation_config(dir.path().string(), &o, &eos);
    CHECK(st.code == Code::IoError);
    CHECK_THAT(st.message, Catch::Contains("generation_config.json"));
    CHECK(o.top_k == 64);
  }
  SECTION("null outputs are allowed") {
    write_file(dir.path() / "generation_config.json", R"({"temperature": 0.5, "eos_token_id": [1]})");
    REQUIRE(gemma4_t4::load_generation_config(dir.path().string(), nullptr, &eos).is_ok());
    CHECK(eos == std::vector<int>{1});
    REQUIRE(gemma4_t4::load_generation_config(dir.path().string(), &o, nullptr).is_ok());
    CHECK(o.temperature == 0.5f);
  }
}

TEST_CASE("load_generation_config: malformed files are FormatErrors naming the file", "[chat]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"temperature\": 0.7,", ""},                          // truncated JSON
      {"[1, 2]", ""},                                          // not an object
      {R"({"temperature": "hot"})", "temperature"},            // wrong type
      {R"({"top_k": 1.5})", "top_k"},                          // not an integer
      {R"({"top_k": -3})", "top_k"},                           // out of range
      {R"({"repetition_penalty": 0})", "repetition_penalty"},  // must be > 0
      {R"({"do_sample": "yes"})", "do_sample"},
      {R"({"eos_token_id": "</s>"})", "eos_token_id"},
      {R"({"eos_token_id": [1, -1]})", "eos_token_id"},
      {R"({"eos_token_id": [1, [106]]})", "eos_token_id"},
  };
  for (const auto& [text, field] : cases) {
    testutil::TempDir dir;
    write_file(dir.path() / "generation_config.json", text);
    SamplingOptions o;
    o.top_k = 5;
    std::vector<int> eos = {7};
    const Status st = gemma4_t4::load_generation_config(dir.path().string(), &o, &eos);
    INFO(text << " -> " << st.message);
    CHECK(st.code == Code::FormatError);
    CHECK_THAT(st.message, Catch::Contains("generation_config.json") && Catch::Contains(field));
    CHECK(o.top_k == 5);  // nothing changed
    CHECK(o.temperature == 1.0f);
    CHECK(eos == std::vector<int>{7});
  }
}
