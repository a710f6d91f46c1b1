// gemma4_t4 implementation part: Batch -- continuous batching of generate() over Engine::step.
//
// A session moves waiting -> running -> finished. Each step():
//   0. sessions whose GenerateOptions::cancel is set finish (Cancelled), waiting or running;
//   1. waiting sessions join (first come, first served) while fewer than max_sessions run;
//   2. one pass is built, in join order: a generating session feeds its last sampled token (1 row, sampled);
//      a session whose last token only needs feeding (max_new_tokens reached, callback said stop) feeds it
//      (1 row, not sampled) and finishes after the pass; a joining session feeds the next chunk of its
//      prompt from what is left of the prefill_rows budget (sampled when the chunk ends the prompt), while
//      fewer than prefill_sessions (when set) have; with prefill_sessions set the prompt chunks go first, so
//      the engine's passes of prompt rows are full and the decode rows end the step; with prefill_priority a
//      step that has prompt rows to read has no decode rows (the generating sessions wait);
//   3. Engine::step runs it (items that need no token get greedy options and their token is ignored);
//   4. each sampled token goes through generate()'s rules: a stop token finishes the session, others are
//      kept and shown to on_token, and max_new_tokens or a false from on_token ends it after one more feed;
//      an on_token that throws ends its session at once (Error, CallbackError), its token unfed.
// Chunking does not change a session's numbers on the CPU backend (a row's math does not depend on the rows
// beside it), and the RNG counter and repetition-penalty history are the session's own, so each session
// gets exactly what generate() gives it alone. The context check is made per session before the pass, so
// a session that would pass its limit finishes alone (ContextOverflow) and the pass runs without it.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gemma4_t4 {

struct Batch::Impl {
  using Clock = std::chrono::steady_clock;
  enum class Phase { Prefill, Decode, LastFeed };

  struct Entry {
    BatchResult result;           // filled as it goes; handed out when done
    std::vector<int32_t> prompt;  // [prompt tokens]
    size_t fed = 0;               // prompt tokens already fed
    GenerateOptions options;      //
    std::vector<int32_t> stops;   // options.stop_tokens + the model's eos ids when stop_at_eos
    std::function<bool(int32_t)> on_token;
    Phase phase = Phase::Prefill;
    int32_t pending = -1;                             // Decode / LastFeed: the sampled token to feed next
    FinishReason last_reason = FinishReason::Length;  // LastFeed: why it ends after the feed
    Clock::time_point start, first;                   // add(); first token sampled
    bool done = false;
  };

  const Engine* engine = nullptr;
  BatchOptions options;
  uint64_t next_id = 1;
  std::deque<std::unique_ptr<Entry>> waiting;
  std::vector<std::unique_ptr<Entry>> running;  // in join order
  std::vector<BatchResult> finished;
  BatchStep last;         // what the last step() fed
  bool stepping = false;  // inside step(): callbacks run, entries must stay where they are

  void finish(Entry& e, FinishReason reason, Status status = Status::ok()) {
    e.done = true;
    e.result.finish = reason;
    e.result.status = std::move(status);
    finished.push_back(std::move(e.result));
  }

  static double ms(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }

  // generate()'s handling of one sampled token.
  void sampled(Entry& e, int32_t token, Clock::time_point now) {
    Timing& t = e.result.timing;
    ++t.generated_tokens;
    if (t.generated_tokens == 1) {
      e.first = now;
      t.ttft_ms = ms(e.start, now);
    } else {
      t.decode_ms = ms(e.first, now);
    }
    if (std::find(e.stops.begin(), e.stops.end(), token) != e.stops.end()) return finish(e, FinishReason::Stop);
    e.result.tokens.push_back(token);
    bool go_on = true;
    std::string thrown;
    if (e.on_token && detail::callback_threw([&] { return e.on_token(token); }, &go_on, &thrown)) {
      if (!e.done)  // (unless it cancelled its own session before throwing)
        finish(e, FinishReason::Error,
               detail::err(Code::CallbackError, "batch: session ", e.result.id, ": on_token threw on sampled token ",
                           t.generated_tokens, " (id ", token, "): ", thrown));
      return;
    }
    if (e.done) return;  // the callback cancelled its own session
    e.pending = token;
    if (go_on && t.generated_tokens < size_t(e.options.max_new_tokens)) {
      e.phase = Phase::Decode;
    } else {
      e.phase = Phase::LastFeed;
      e.last_reason = go_on ? FinishReason::Length : FinishReason::Callback;
    }
  }

  // GenerateOptions::cancel set (by any thread): finish the session now, as Batch::cancel does.
  void cancel_flagged() {
    auto scan = [&](auto& list) {
      for (auto& e : list)
        if (!e->done && detail::cancel_requested(e->options))
          finish(*e, FinishReason::Cancelled,
                 detail::err(Code::Cancelled, "batch: session ", e->result.id,
                             " was cancelled (GenerateOptions::cancel)"));
    };
    scan(running);
    scan(waiting);
  }

  void drop_done() {
    running.erase(std::remove_if(running.begin(), running.end(), [](const auto& e) { return e->done; }), running.end());
    waiting.erase(std::remove_if(waiting.begin(), waiting.end(), [](const auto& e) { return e->done; }), waiting.end());
  }

  bool contains(const Session* s) const {
    for (const auto& e : waiting)
      if (!e->done && e->result.session == s) return true;
    for (const auto& e : running)
      if (!e->done && e->result.session == s) return true;
    return false;
  }
};

Batch::Batch(const Engine& engine, const BatchOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->engine = &engine;
  impl_->options = options;
  impl_->options.max_sessions = std::max(1, options.max_sessions);
  impl_->options.prefill_rows = std::max(1, options.prefill_rows);
}
Batch::~Batch() = default;
Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&&) noexcept = default;

Status Batch::add(Session* session, std::vector<int32_t> prompt, const GenerateOptions& options,
                  std::function<bool(int32_t token)> on_token, uint64_t* id) {
  if (!impl_) return detail::err(Code::InvalidArgument, "Batch::add: the batch was moved from");
  Impl& b = *impl_;
  const Engine& engine = *b.engine;
  if (!engine.loaded()) return detail::err(Code::InvalidArgument, "Batch::add: engine is not loaded");
  if (!session || !session->valid()) return detail::err(Code::InvalidArgument, "Batch::add: no session");
  if (session->impl_->owner != engine.impl_.get())
    return detail::err(Code::InvalidArgument, "Batch::add: the session was not created by the batch's engine");
  if (b.contains(session))
    return detail::err(Code::InvalidArgument, "Batch::add: the session is already in this batch");
  if (options.max_new_tokens < 0) return detail::err(Code::InvalidArgument, "Batch::add: max_new_tokens < 0");

  auto e = std::make_unique<Impl::Entry>();
  e->start = Impl::Clock::now();
  e->result.id = b.next_id++;
  e->result.session = session;
  e->result.timing.prompt_tokens = prompt.size();
  e->prompt = std::move(prompt);
  e->options = options;
  e->stops = options.stop_tokens;
  if (options.stop_at_eos) {
    const auto& eos = engine.config().eos_token_ids;
    e->stops.insert(e->stops.end(), eos.begin(), eos.end());
  }
  e->on_token = std::move(on_token);
  if (id) *id = e->result.id;

  // What generate() refuses before its first step ends the session here, before it takes a slot.
  const size_t room = session->max_context() - session->position();
  Status refused;
  if (e->prompt.empty()) {
    refused = detail::err(Code::InvalidArgument, "batch: session ", e->result.id, ": empty prompt");
  } else if (Status st = detail::check_token_ids(engine.config(), e->prompt.data(), e->prompt.size(), "prompt "); !st) {
    refused = detail::err(Code::InvalidArgument, "batch: session ", e->result.id, ": ", st.message);
  } else if (e->prompt.size() > room) {
    refused = detail::err(Code::ContextOverflow, "batch: session ", e->result.id, ": a ", e->prompt.size(),
                          "-token prompt at position ", session->position(), " passes the session's context of ",
                          session->max_context(), " tokens");
  }
  if (!refused.is_ok()) {
    b.finish(*e, FinishReason::Error, std::move(refused));
    return Status::ok();
  }
  b.waiting.push_back(std::move(e));
  return Status::ok();
}

bool Batch::cancel(uint64_t id) {
  if (!impl_) return false;
  Impl& b = *impl_;
  auto cancel_in = [&](auto& list) {
    for (auto& e : list)
      if (!e->done && e->result.id == id) {
        b.finish(*e, FinishReason::Cancelled, detail::err(Code::Cancelled, "batch: session ", id, " was cancelled"));
        return true;
      }
    return false;
  };
  const bool found = cancel_in(b.running) || cancel_in(b.waiting);
  if (!b.stepping) b.drop_done();  // inside step() (a callback) entries are only marked: step() holds them
  return found;
}

Status Batch::step() {
  if (!impl_) return detail::err(Code::InvalidArgument, "Batch::step: the batch was moved from");
  Impl& b = *impl_;
  if (b.stepping) return detail::err(Code::InvalidArgument, "Batch::step: called from a callback inside step()");
  struct Stepping {
    bool& flag;
    explicit Stepping(bool& f) : flag(f) { flag = true; }
    ~Stepping() { flag = false; }
  } stepping(b.stepping);
  b.cancel_flagged();
  b.drop_done();
  while (!b.waiting.empty() && b.running.size() < size_t(b.options.max_sessions)) {
    b.running.push_back(std::move(b.waiting.front()));
    b.waiting.pop_front();
  }

  // ---- the pass ----
  std::vector<BatchItem> items;         // [count]
  std::vector<SamplingOptions> sample;  // [count]: the session's options, greedy when the token is unused
  std::vector<Impl::Entry*> owner;      // [count]
  size_t budget = size_t(b.options.prefill_rows);
  // prefill_sessions set: at most that many prompts, and the prompt rows first (round 0), then the decode rows
  const size_t prompts_max =
      b.options.prefill_sessions > 0 ? size_t(b.options.prefill_sessions) : std::numeric_limits<size_t>::max();
  const int rounds = b.options.prefill_sessions > 0 ? 2 : 1;
  // prefill_priority: no decode rows while a prompt has rows left
  const bool prompts_only =
      b.options.prefill_priority && budget > 0 &&
      std::any_of(b.running.begin(), b.running.end(), [](const auto& e) { return e->phase == Impl::Phase::Prefill; });
  b.last = BatchStep{};
  for (int round = 0; round < rounds; ++round)
    for (auto& ep : b.running) {
      Impl::Entry& e = *ep;
      const bool prompt = e.phase == Impl::Phase::Prefill;
      if (rounds == 2 && prompt != (round == 0)) continue;
      Session* s = e.result.session;
      BatchItem it{s, nullptr, 0};
      bool samples = false;
      if (prompt) {
        if (budget == 0 || b.last.prompt_sessions == prompts_max) continue;
        it.tokens = e.prompt.data() + e.fed;
        it.n = std::min(budget, e.prompt.size() - e.fed);
        budget -= it.n;
        samples = e.fed + it.n == e.prompt.size() && e.options.max_new_tokens > 0;
        ++b.last.prompt_sessions;
        b.last.prompt_rows += it.n;
      } else {
        if (prompts_only) continue;
        it.tokens = &e.pending;
        it.n = 1;
        samples = e.phase == Impl::Phase::Decode;
        if (s->position() + 1 > s->max_context()) {
          b.finish(e, FinishReason::Error,
                   detail::err(Code::ContextOverflow, "batch: session ", e.result.id, ": 1 token at position ",
                               s->position(), " passes the session's context of ", s->max_context(), " tokens"));
          continue;
        }
        ++b.last.decode_rows;
      }
      items.push_back(it);
      sample.push_back(samples ? e.options.sampling : SamplingOptions::greedy());
      owner.push_back(&e);
    }
  if (items.empty()) {
    b.drop_done();
    return Status::ok();
  }
  std::vector<int32_t> next(items.size(), -1);  // [count]
  const Status st = b.engine->step(items.data(), items.size(), sample.data(), next.data());
  if (!st) {
    for (Impl::Entry* e : owner) b.finish(*e, FinishReason::Error, st);
    b.drop_done();
    return st;
  }

  // ---- the tokens ----
  const Impl::Clock::time_point now = Impl::Clock::now();
  for (size_t i = 0; i < items.size(); ++i) {
    Impl::Entry& e = *owner[i];
    if (e.done) continue;  // cancelled by an earlier callback of this step
    switch (e.phase) {
      case Impl::Phase::Prefill:
        e.fed += items[i].n;
        if (e.fed < e.prompt.size()) break;
        if (e.options.max_new_tokens == 0) {
          b.finish(e, FinishReason::Length);
          break;
        }
        b.sampled(e, next[i], now);
        break;
      case Impl::Phase::Decode: b.sampled(e, next[i], now); break;
      case Impl::Phase::LastFeed: b.finish(e, e.last_reason); break;
    }
  }
  b.drop_done();
  return Status::ok();
}

bool Batch::idle() const { return !impl_ || (impl_->waiting.empty() && impl_->running.empty()); }

size_t Batch::size() const { return impl_ ? impl_->waiting.size() + impl_->running.size() : 0; }

BatchStep Batch::last_step() const { return impl_ ? impl_->last : BatchStep{}; }

std::vector<BatchResult> Batch::take_finished() {
  std::vector<BatchResult> out;
  if (impl_) out.swap(impl_->finished);
  return out;
}

}  // namespace gemma4_t4
