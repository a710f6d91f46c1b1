// Faults on the CPU backend (FAULTS in gemma4_t4.hpp): a callback that throws (generate(), Batch, load's
// on_progress), cancellation from another thread (GenerateOptions::cancel), and a checkpoint file truncated
// or deleted after it was mapped. Each must give a clear Status or a clean stop, leave the session holding what
// was fed, and leave the engine serving other sessions with unchanged results. The GPU side (allocation
// failures) is tests/gpu/test_faults.cpp.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reference.hpp"
#include "temp_dir.hpp"

using namespace gemma4_t4;
using namespace testref;
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> prefix(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + long(n)}; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Another thread that sets a cancel flag when asked, and says when it has. The callback of the generation to
// cancel asks from its k-th token and waits for the answer, so the flag is set before the next step for sure:
// no sleeps, the same outcome every run.
class Canceller {
 public:
  Canceller()
      : thread_([this] {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [this] { return asked_; });
          flag.store(true);
          done_ = true;
          cv_.notify_all();
        }) {}
  ~Canceller() {
    request_and_wait();  // never leave the thread waiting
    thread_.join();
  }
  Canceller(const Canceller&) = delete;
  Canceller& operator=(const Canceller&) = delete;

  void request_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    asked_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return done_; });
  }

  std::atomic<bool> flag{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool asked_ = false, done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

Engine load_cpu(const fs::path& dir) {
  Engine e;
  LoadOptions opt;
  opt.backend = Backend::Cpu;
  opt.max_context = 256;
  const Status st = Engine::load(dir.string(), opt, &e);
  INFO(st.message);
  REQUIRE(st);
  return e;
}

}  // namespace

TEST_CASE("faults: code_name of the new code", "[faults][cpu]") {
  CHECK(std::string(code_name(Code::CallbackError)) == "callback error");
}

TEST_CASE("faults: an on_token that throws ends generate() with CallbackError; the session goes on", "[faults][cpu]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  const std::vector<int32_t> expected = fresh_tokens(engine, ref.prompt, greedy(10));

  SECTION("a std::exception: its what() is in the message") {
    Session s;
    REQUIRE(engine.create_session(&s));
    int seen = 0;
    std::vector<int32_t> out;
    Timing timing;
    const Status st = generate(
        engine, s, ref.prompt, greedy(10),
        [&](int32_t) -> bool {
          if (++seen == 3) throw std::runtime_error("callback failed on purpose");
          return true;
        },
        &out, &timing);
    INFO(st.message);
    CHECK(st.code == Code::CallbackError);
    CHECK(contains(st.message, "callback failed on purpose"));
    CHECK(contains(st.message, "on_token"));
    // the token the callback threw on is in *out but was not fed
    REQUIRE(out == prefix(expected, 3));
    CHECK(timing.generated_tokens == 3);
    CHECK(s.position() == ref.prompt.size() + 2);
    // the session is usable: feeding that token goes on exactly where an undisturbed run would
    std::vector<int32_t> more;
    REQUIRE(generate(engine, s, {out.back()}, greedy(7), nullptr, &more));
    CHECK(more == std::vector<int32_t>(expected.begin() + 3, expected.end()));
    CHECK(s.position() == ref.prompt.size() + 10);  // prompt + the 3 tokens + the 7 more
  }

  SECTION("something that is not a std::exception, on the first token") {
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<int32_t> out;
    const Status st = generate(
        engine, s, ref.prompt, greedy(10), [](int32_t) -> bool { throw 42; }, &out);
    INFO(st.message);
    CHECK(st.code == Code::CallbackError);
    CHECK(contains(st.message, "not a std::exception"));
    CHECK(out == prefix(expected, 1));
    CHECK(s.position() == ref.prompt.size());
  }

  // the engine serves other sessions as before
  CHECK(fresh_tokens(engine, ref.prompt, greedy(10)) == expected);
}

TEST_CASE("faults: an on_token that throws in a Batch ends only its session", "[faults][cpu][batch]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  const std::vector<std::vector<int32_t>> prompts = {ref.prompt, prefix(ref.prompt, 9), prefix(ref.prompt, 14)};
  constexpr int kTokens = 8, kThrowAt = 2;  // session 1 throws on its 2nd token
  std::vector<std::vector<int32_t>> expected;
  for (const auto& p : prompts) expected.push_back(fresh_tokens(engine, p, greedy(kTokens)));

  for (int rows : {4, 256}) {  // prompts in chunks beside decode rows, or whole
    INFO("prefill_rows " << rows);
    BatchOptions bo;
    bo.prefill_rows = rows;
    Batch batch(engine, bo);
    std::vector<Session> sessions(prompts.size());
    std::vector<uint64_t> ids(prompts.size());
    int thrower_seen = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      REQUIRE(engine.create_session(&sessions[i]));
      std::function<bool(int32_t)> cb;
      if (i == 1)
        cb = [&](int32_t) -> bool {
          if (++thrower_seen == kThrowAt) throw std::logic_error("batch callback failed on purpose");
          return true;
        };
      REQUIRE(batch.add(&sessions[i], prompts[i], greedy(kTokens), cb, &ids[i]));
    }
    std::vector<BatchResult> results;
    for (int step = 0; !batch.idle(); ++step) {
      REQUIRE(step < 200);
      const Status st = batch.step();  // the exception does not leave step()
      INFO(st.message);
      REQUIRE(st);
      for (BatchResult& r : batch.take_finished()) results.push_back(std::move(r));
    }
    REQUIRE(results.size() == prompts.size());
    for (const BatchResult& r : results) {
      const size_t i = size_t(std::find(ids.begin(), ids.end(), r.id) - ids.begin());
      REQUIRE(i < prompts.size());
      INFO("session " << i << ": " << r.status.message);
      if (i == 1) {
        CHECK(r.finish == FinishReason::Error);
        CHECK(r.status.code == Code::CallbackError);
        CHECK(contains(r.status.message, "batch callback failed on purpose"));
        CHECK(r.tokens == prefix(expected[1], kThrowAt));
        CHECK(sessions[1].position() == prompts[1].size() + kThrowAt - 1);  // the last token was not fed
      } else {
        CHECK(r.finish == FinishReason::Length);
        CHECK(r.status);
        CHECK(r.tokens == expected[i]);
        CHECK(sessions[i].position() == prompts[i].size() + kTokens);
      }
    }
    // the batch goes on serving: a session added afterwards gets its undisturbed result
    Session again;
    REQUIRE(engine.create_session(&again));
    REQUIRE(batch.add(&again, prompts[1], greedy(kTokens), nullptr));
    while (!batch.idle()) REQUIRE(batch.step());
    const std::vector<BatchResult> last = batch.take_finished();
    REQUIRE(last.size() == 1);
    CHECK(last[0].tokens == expected[1]);
  }
}

TEST_CASE("faults: LoadOptions::on_progress that throws fails the load with CallbackError", "[faults][cpu]") {
  for (float at : {0.f, 1.f}) {  // before anything is read; after the backend is built
    INFO("throws at " << at);
    LoadOptions opt;
    opt.backend = Backend::Cpu;
    opt.on_progress = [at](float f) {
      if (f == at) throw std::runtime_error("progress callback failed on purpose");
    };
    Engine e;
    const Status st = Engine::load(fixtures() + "/mm_bf16", opt, &e);
    INFO(st.message);
    CHECK(st.code == Code::CallbackError);
    CHECK(contains(st.message, "progress callback failed on purpose"));
    CHECK_FALSE(e.loaded());
  }
  LoadOptions opt;  // a callback that does not throw is kept as given
  opt.backend = Backend::Cpu;
  int calls = 0;
  opt.on_progress = [&calls](float) { ++calls; };
  Engine e;
  REQUIRE(Engine::load(fixtures() + "/mm_bf16", opt, &e));
  CHECK(calls >= 2);
  e.load_options().on_progress(0.5f);
  CHECK(calls >= 3);
}

TEST_CASE("faults: GenerateOptions::cancel set by another thread stops generate() between steps", "[faults][cpu]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  constexpr int kTokens = 12, kCancelAt = 4;
  const std::vector<int32_t> expected = fresh_tokens(engine, ref.prompt, greedy(kTokens));

  SECTION("after some tokens came out") {
    Canceller canceller;
    GenerateOptions opt = greedy(kTokens);
    opt.cancel = &canceller.flag;
    Session s;
    REQUIRE(engine.create_session(&s));
    int seen = 0;
    std::vector<int32_t> out;
    const Status st = generate(
        engine, s, ref.prompt, opt,
        [&](int32_t) {
          if (++seen == kCancelAt) canceller.request_and_wait();  // the other thread sets the flag
          return true;
        },
        &out);
    INFO(st.message);
    CHECK(st.code == Code::Cancelled);
    CHECK(out == prefix(expected, kCancelAt));                 // tokens so far kept
    CHECK(s.position() == ref.prompt.size() + kCancelAt - 1);  // the last one not fed
    // the session goes on from there
    std::vector<int32_t> more;
    REQUIRE(generate(engine, s, {out.back()}, greedy(kTokens - kCancelAt), nullptr, &more));
    CHECK(more == std::vector<int32_t>(expected.begin() + kCancelAt, expected.end()));
  }

  // generate() of ref.prompt on session s with GenerateOptions::cancel pointing at a flag that holds `set`.
  auto with_flag = [&](bool set, int max_new_tokens, Session& s, std::vector<int32_t>* out) {
    std::atomic<bool> flag{set};
    GenerateOptions opt = greedy(max_new_tokens);
    opt.cancel = &flag;
    return generate(engine, s, ref.prompt, opt, nullptr, out);
  };

  SECTION("already set: nothing is fed") {
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<int32_t> out;
    CHECK(with_flag(true, kTokens, s, &out).code == Code::Cancelled);
    CHECK(out.empty());
    CHECK(s.position() == 0);
    CHECK(with_flag(true, 0, s, &out).code == Code::Cancelled);  // the prompt-only path too
    CHECK(s.position() == 0);
  }

  SECTION("a flag that stays false changes nothing") {
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<int32_t> out;
    REQUIRE(with_flag(false, kTokens, s, &out));
    CHECK(out == expected);
  }
}

TEST_CASE("faults: GenerateOptions::cancel set by another thread finishes a Batch session", "[faults][cpu][batch]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16", Backend::Cpu);
  constexpr int kTokens = 10, kCancelAt = 3;
  const std::vector<int32_t> other = prefix(ref.prompt, 11);
  const std::vector<int32_t> expected = fresh_tokens(engine, ref.prompt, greedy(kTokens));
  const std::vector<int32_t> expected_other = fresh_tokens(engine, other, greedy(kTokens));

  Canceller canceller;
  std::atomic<bool> never{false};
  BatchOptions bo;
  bo.max_sessions = 2;  // the third session waits: cancelled before it ever runs
  Batch batch(engine, bo);
  Session a, b, c;
  for (Session* s : {&a, &b, &c}) REQUIRE(engine.create_session(s));
  GenerateOptions oa = greedy(kTokens), ob = greedy(kTokens);
  oa.cancel = &canceller.flag;
  ob.cancel = &never;
  int seen = 0;
  uint64_t ida = 0, idb = 0, idc = 0;
  REQUIRE(batch.add(
      &a, ref.prompt, oa,
      [&](int32_t) {
        if (++seen == kCancelAt) canceller.request_and_wait();
        return true;
      },
      &ida));
  REQUIRE(batch.add(&b, other, ob, nullptr, &idb));
  REQUIRE(batch.add(&c, ref.prompt, oa, nullptr, &idc));  // shares a's flag, waits behind a and b

  std::vector<BatchResult> results;
  for (int step = 0; !batch.idle(); ++step) {
    REQUIRE(step < 200);
    REQUIRE(batch.step());
    for (BatchResult& r : batch.take_finished()) results.push_back(std::move(r));
  }
  REQUIRE(results.size() == 3);
  for (const BatchResult& r : results) {
    INFO("session " << r.id << ": " << r.status.message);
    if (r.id == ida) {
      CHECK(r.finish == FinishReason::Cancelled);
      CHECK(r.status.code == Code::Cancelled);
      CHECK(contains(r.status.message, "GenerateOptions::cancel"));
      CHECK(r.tokens == prefix(expected, kCancelAt));
      CHECK(a.position() == ref.prompt.size() + kCancelAt - 1);
    } else if (r.id == idb) {
      CHECK(r.finish == FinishReason::Length);
      CHECK(r.tokens == expected_other);
      CHECK(b.position() == other.size() + kTokens);
    } else {
      CHECK(r.id == idc);
      CHECK(r.finish == FinishReason::Cancelled);
      CHECK(r.tokens.empty());
      CHECK(c.position() == 0);
    }
  }
}

TEST_CASE("faults: a checkpoint file truncated after load is an IoError, not a crash", "[faults][cpu][io]") {
  // mm_bf16: one file; flat_keqv: the second of two shards
  for (const auto& fx : {std::make_pair("mm_bf16", "model.safetensors"),
                         std::make_pair("flat_keqv", "model-00002-of-00002.safetensors")}) {
    INFO(fx.first);
    const Reference ref = reference(fx.first);
    testutil::TempDir tmp;
    const fs::path dir = copy_fixture(fx.first, tmp.path());
    const fs::path victim = dir / fx.second;
    const auto full = fs::file_size(victim);
    {
      Engine engine = load_cpu(dir);
      Session s;
      REQUIRE(engine.create_session(&s));
      std::vector<float> logits;
      REQUIRE(engine.forward(s, ref.prompt.data(), 5, Logits::Last, &logits));

      REQUIRE(::truncate(victim.c_str(), off_t(full / 2)) == 0);
      Status st = engine.forward(s, ref.prompt.data() + 5, 3, Logits::Last, &logits);
      INFO(st.message);
      CHECK(st.code == Code::IoError);
      CHECK(contains(st.message, victim.string()));
      CHECK(contains(st.message, "shrank from " + std::to_string(full) + " to " + std::to_string(full / 2)));
      CHECK(s.position() == 5);  // as it was
      int32_t next = -1;
      BatchItem item{&s, ref.prompt.data() + 5, 3};
      CHECK(engine.step(&item, 1, nullptr, &next).code == Code::IoError);
      std::vector<int32_t> out;
      CHECK(generate(engine, s, {ref.prompt[5]}, greedy(4), nullptr, &out).code == Code::IoError);
      CHECK(out.empty());
      CHECK(s.position() == 5);
      Session fresh;  // creating sessions reads no weights
      CHECK(engine.create_session(&fresh));

      REQUIRE(::truncate(victim.c_str(), 0) == 0);  // emptied: the same
      CHECK(engine.forward(s, ref.prompt.data() + 5, 1, Logits::None, nullptr).code == Code::IoError);
    }              // the engine and its mappings go away cleanly
    Engine again;  // and loading the damaged copy is refused with a message, not a crash
    LoadOptions opt;
    opt.backend = Backend::Cpu;
    CHECK_FALSE(Engine::load(dir.string(), opt, &again));
  }
}

TEST_CASE("faults: a checkpoint file deleted after load keeps working", "[faults][cpu][io]") {
  const Reference ref = reference("mm_bf16");
  const Engine original = load_engine("mm_bf16", Backend::Cpu);
  std::vector<float> expected;
  {
    Session s;
    REQUIRE(original.create_session(&s));
    REQUIRE(original.forward(s, ref.prompt.data(), ref.prompt.size(), Logits::All, &expected));
  }
  const std::vector<int32_t> tokens = fresh_tokens(original, ref.prompt, greedy(6));

  auto tmp = std::make_unique<testutil::TempDir>();
  Engine engine = load_cpu(copy_fixture("mm_bf16", tmp->path()));
  tmp.reset();  // the files and their directory are gone; the mapping keeps the data
  Session s;
  REQUIRE(engine.create_session(&s));
  std::vector<float> logits;
  const Status st = engine.forward(s, ref.prompt.data(), ref.prompt.size(), Logits::All, &logits);
  INFO(st.message);
  REQUIRE(st);
  CHECK(logits == expected);
  CHECK(fresh_tokens(engine, ref.prompt, greedy(6)) == tokens);
}
