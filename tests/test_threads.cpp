// The thread-safety contract of the header (THREAD SAFETY in gemma4_t4.hpp): one Engine shared by several
// threads, each owning its Sessions; one Batch per thread beside them; a Tokenizer used from several threads.
// Every thread's results must equal what the same work gives on one thread. Runs in every build; built with
// -fsanitize=thread (CMAKE_CXX_FLAGS / CMAKE_EXE_LINKER_FLAGS, CPU-only build) it also checks for races.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "reference.hpp"

using namespace gemma4_t4;
using namespace testref;

namespace {

// Prompt k: the reference prompt rotated by k and truncated, so the sessions differ in content and length.
std::vector<int32_t> prompt_for(const std::vector<int32_t>& base, size_t k) {
  std::vector<int32_t> p;
  for (size_t i = 0; i < base.size() - k % 5; ++i) p.push_back(base[(i + k) % base.size()]);
  p[0] = base[0];  // keep BOS first
  return p;
}

}  // namespace

TEST_CASE("threads: one Engine, several threads with their own Sessions, results equal one thread", "[threads][cpu]") {
  for (const char* fixture : {"mm_bf16", "w4a16"}) {
    const Reference ref = reference(fixture);
    Engine engine = load_engine(fixture, Backend::Cpu);
    constexpr size_t kThreads = 4, kPerThread = 3;
    constexpr int kTokens = 8;
    std::vector<std::vector<int32_t>> expected(kThreads * kPerThread);
    for (size_t k = 0; k < expected.size(); ++k)
      expected[k] = fresh_tokens(engine, prompt_for(ref.prompt, k), greedy(kTokens));

    std::vector<std::vector<int32_t>> got(expected.size());
    std::vector<Status> status(expected.size());
    std::vector<std::thread> pool;
    for (size_t t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        // each thread owns its sessions; two turns on one of them, so a session's cache is reused
        for (size_t j = 0; j < kPerThread; ++j) {
          const size_t k = t * kPerThread + j;
          Session s;
          status[k] = engine.create_session(&s);
          if (!status[k]) return;
          status[k] = generate(engine, s, prompt_for(ref.prompt, k), greedy(kTokens), nullptr, &got[k]);
        }
      });
    for (auto& th : pool) th.join();
    for (size_t k = 0; k < expected.size(); ++k) {
      INFO(fixture << " session " << k << ": " << status[k].message);
      REQUIRE(status[k]);
      CHECK(got[k] == expected[k]);
    }
  }
}

TEST_CASE("threads: a Batch on one thread beside generate() on others shares the Engine", "[threads][cpu]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  constexpr int kTokens = 6;
  constexpr size_t kSessions = 4;
  std::vector<std::vector<int32_t>> expected(kSessions);
  for (size_t k = 0; k < kSessions; ++k) expected[k] = fresh_tokens(engine, prompt_for(ref.prompt, k), greedy(kTokens));

  std::vector<std::vector<int32_t>> batch_out(kSessions);
  std::atomic<bool> batch_ok{true};
  std::thread batch_thread([&] {
    Batch batch(engine);
    std::vector<Session> sessions(kSessions);
    for (size_t k = 0; k < kSessions; ++k) {
      uint64_t id = 0;
      if (!engine.create_session(&sessions[k]) ||
          !batch.add(&sessions[k], prompt_for(ref.prompt, k), greedy(kTokens), nullptr, &id)) {
        batch_ok = false;
        return;
      }
    }
    while (!batch.idle())
      if (!batch.step()) {
        batch_ok = false;
        return;
      }
    for (BatchResult& r : batch.take_finished()) {
      for (size_t k = 0; k < kSessions; ++k)
        if (r.session == &sessions[k]) batch_out[k] = r.tokens;
    }
  });
  std::vector<std::vector<int32_t>> solo_out(kSessions);
  std::thread solo_thread([&] {
    for (size_t k = 0; k < kSessions; ++k) {
      Session s;
      if (!engine.create_session(&s)) return;
      generate(engine, s, prompt_for(ref.prompt, k), greedy(kTokens), nullptr, &solo_out[k]);
    }
  });
  batch_thread.join();
  solo_thread.join();
  REQUIRE(batch_ok);
  for (size_t k = 0; k < kSessions; ++k) {
    INFO("session " << k);
    CHECK(batch_out[k] == expected[k]);
    CHECK(solo_out[k] == expected[k]);
  }
}

TEST_CASE("threads: one Tokenizer encoding and decoding on several threads", "[threads][tokenizer]") {
  Tokenizer tok;
  REQUIRE(Tokenizer::load(GEMMA4_T4_TINY_TOKENIZER, &tok));
  const std::vector<std::string> texts = {"<bos><|turn>user\nHello there, how are you?<turn|>\n",
                                          "Numbers 12345 and words, words, words.", "tabs\tand\nnewlines  ",
                                          "ünïcödé → 日本語 ✓"};
  std::vector<std::vector<int32_t>> expected(texts.size());
  std::vector<std::string> expected_text(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    REQUIRE(tok.encode(texts[i], &expected[i]));
    REQUIRE(tok.decode(expected[i].data(), expected[i].size(), &expected_text[i]));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) {
          std::vector<int32_t> ids;
          std::string text;
          if (!tok.encode(texts[i], &ids) || ids != expected[i] || !tok.decode(ids.data(), ids.size(), &text) ||
              text != expected_text[i])
            ++mismatches;
        }
    });
  for (auto& th : pool) th.join();
  CHECK(mismatches == 0);
}
