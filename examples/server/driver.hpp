// The engine side of examples/server.cpp: one driver thread owns a gemma4_t4::Batch (continuous batching) and
// every Session; HTTP threads submit Jobs and read their tokens back through each Job's channel (a mutex, a
// condition variable and the token list). Also the prefix cache and the Prometheus metrics.
//
// Flow of a job: submit() (bounded: at most parallel + max_queue jobs in flight, else Admit::Full -> 429) ->
// the inbox (its jobs join before the next step, while sessions are free) -> a free session (a pool of `parallel`,
// created on first use, reset and reused) -> the prefix cache (below) -> Batch::add -> tokens, appended to the job's
// channel from the Batch's on_token callback as they are sampled -> the Batch result completes the job and the session
// goes back to the pool. A job whose `cancel` flag is set -- its client went away, a stop string matched, shutdown --
// is finished by the Batch at its next step (GenerateOptions::cancel), or dropped from the inbox.
//
// Scheduling (DriverOptions::prefill_sessions -> BatchOptions): a step reads at most that many prompts. A prompt's
// first token comes at the end of the step that reads its last row, so with prompts packed into one step the
// first of them waits for all the others' rows: 8 prompts of 512 tokens sent together had their first tokens
// after ~2 packed passes of 1984 rows where bench (each prompt prefilled alone, one after another) gives the k-th
// its token after k single-prompt steps. One prompt per step (the server's default) is bench's order; the decode
// rows of the sessions already generating ride in the same step, after the prompt's rows. With
// DriverOptions::prefill_priority they wait instead while prompts are left (bench's order exactly: every prompt,
// then the decoding).
//
// Prefix cache (vLLM's automatic prefix caching / llama.cpp's cache reuse, at the granularity the engine has):
// an entry is a session holding exactly the tokens of a prefix (Engine::copy_prefix copies from a session whose
// position is the prefix's length, which every ring-buffer layout allows). A job names the part of its prompt
// worth keeping (chat: everything before the last message -- a shared system prompt, earlier turns); the first
// job with a new such prefix has it prefilled into a new entry (from the longest entry that starts it, if any)
// and waits for it, as do the jobs with the same prefix that arrive meanwhile (computed once); then each copies
// it into its own session and feeds only the rest of its prompt. Any job also starts from the longest ready
// entry its prompt begins with. Entries are evicted least recently used, at most `prefix_cache` of them.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gemma4_t4.hpp"

namespace server {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- metrics -----------------------------------------------------------------------------------------------

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    ++counts_[size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin())];
    sum_ += v;
  }
  // Prometheus text: cumulative buckets, +Inf, sum, count.
  std::string text(const std::string& name, const std::string& help) const {
    std::string s = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    char buf[64];
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      std::snprintf(buf, sizeof buf, "%g", bounds_[i]);
      s += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
    }
    cum += counts_.back();
    std::snprintf(buf, sizeof buf, "%.9g", sum_);
    s += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n" + name + "_sum " + buf + "\n" + name + "_count " +
         std::to_string(cum) + "\n";
    return s;
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1]: counts_[i] = values in (bounds[i-1], bounds[i]]
  double sum_ = 0;
};

// Everything /metrics shows. Guarded by mu: HTTP threads count requests, the driver the rest.
struct Metrics {
  std::mutex mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, HTTP status) -> responses
  uint64_t prompt_tokens = 0, generation_tokens = 0;
  uint64_t cancelled = 0;  // generations cut short: client gone, stop string, shutdown
  uint64_t prefix_hits = 0, prefix_reused_tokens = 0, prefix_entries_made = 0;
  uint64_t steps = 0, step_prompt_rows = 0, step_decode_rows = 0;  // Batch steps and what they fed
  Histogram prompts_per_step{{1, 2, 4, 8, 16, 32, 64}};            // steps that fed prompt rows: how many prompts
  // Where a request's time goes on the driver thread: Batch::step() of steps with prompt rows and of decode-only
  // steps, and the driver's own time between two steps while the batch is busy (admitting requests, handing
  // tokens over, the metrics).
  Histogram prompt_step{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  Histogram decode_step{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25}};
  Histogram between_steps{{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025}};
  Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram tpot{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  // gauges (the driver sets them after each step)
  size_t queue_depth = 0, active_sessions = 0, prefix_entries = 0;
  size_t kv_bytes_in_use = 0, kv_bytes_allocated = 0;

  std::string render() {
    std::lock_guard<std::mutex> lock(mu);
    std::string s;
    auto metric = [&](const char* name, const char* type, const char* help, uint64_t v) {
      s += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
           std::to_string(v) + "\n";
    };
    s += "# HELP gemma4_t4_requests_total HTTP responses, by endpoint and status code\n"
         "# TYPE gemma4_t4_requests_total counter\n";
    for (const auto& [key, n] : requests)
      s += "gemma4_t4_requests_total{endpoint=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
    metric("gemma4_t4_prompt_tokens_total", "counter", "Prompt tokens of the requests admitted", prompt_tokens);
    metric("gemma4_t4_generation_tokens_total", "counter", "Tokens sampled", generation_tokens);
    metric("gemma4_t4_requests_cancelled_total", "counter",
           "Generations cut short (client disconnected, stop string matched, shutdown)", cancelled);
    s += ttft.text("gemma4_t4_time_to_first_token_seconds", "Request received to its first token sampled");
    s += tpot.text("gemma4_t4_time_per_output_token_seconds", "Time between two tokens of one request");
    metric("gemma4_t4_queue_depth", "gauge", "Requests waiting for a session", queue_depth);
    metric("gemma4_t4_active_sessions", "gauge", "Sessions serving a request", active_sessions);
    metric("gemma4_t4_kv_bytes_in_use", "gauge",
           "KV-cache bytes of the sessions serving requests and of the prefix cache", kv_bytes_in_use);
    metric("gemma4_t4_kv_bytes_allocated", "gauge", "KV-cache bytes allocated, idle pooled sessions included",
           kv_bytes_allocated);
    metric("gemma4_t4_prefix_cache_entries", "gauge", "Prefixes held by the prefix cache", prefix_entries);
    metric("gemma4_t4_prefix_cache_hits_total", "counter", "Requests that started from a cached prefix", prefix_hits);
    metric("gemma4_t4_prefix_cache_reused_tokens_total", "counter", "Prompt tokens copied from the prefix cache",
           prefix_reused_tokens);
    metric("gemma4_t4_prefix_cache_prefills_total", "counter", "Prefixes prefilled into the prefix cache",
           prefix_entries_made);
    metric("gemma4_t4_engine_steps_total", "counter", "Engine steps (one batch of prompt chunks and decode rows)",
           steps);
    metric("gemma4_t4_engine_prompt_rows_total", "counter", "Prompt tokens fed to the engine (prefix cache included)",
           step_prompt_rows);
    metric("gemma4_t4_engine_decode_rows_total", "counter", "Sampled tokens fed back to the engine", step_decode_rows);
    s += prompts_per_step.text("gemma4_t4_engine_prompts_per_step",
                               "Prompts (prefix-cache prefills included) fed by a step that fed prompt rows");
    s += prompt_step.text("gemma4_t4_engine_prompt_step_seconds", "Engine steps that fed prompt rows: wall time");
    s += decode_step.text("gemma4_t4_engine_decode_step_seconds", "Engine steps of decode rows only: wall time");
    s += between_steps.text("gemma4_t4_driver_between_steps_seconds",
                            "The driver's own time from one engine step to the next while requests run");
    return s;
  }
};

// ---- jobs --------------------------------------------------------------------------------------------------

// One generation. The HTTP thread fills the first block, submits, then reads the channel; the driver writes it.
struct Job {
  std::vector<int32_t> prompt;
  gemma4_t4::GenerateOptions options;  // options.cancel is set to &cancel by Driver::submit
  size_t cache_prefix = 0;             // leading prompt tokens worth a prefix-cache entry (0: none)
  Clock::time_point arrival = Clock::now();
  std::atomic<bool> cancel{false};  // any thread: end this generation at the next step

  // ---- channel (driver -> HTTP thread), guarded by mu ----
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;  // sampled, stop tokens excluded
  bool done = false;
  gemma4_t4::FinishReason finish = gemma4_t4::FinishReason::Error;
  gemma4_t4::Status status;
  size_t generated = 0;  // tokens sampled, a stop token included (valid once done)
  size_t cached = 0;     // prompt tokens taken from the prefix cache (valid once done)

  // Waits at most `timeout` for tokens past the first `seen` or the end; appends the new ones to *fresh.
  // Returns done.
  bool wait(size_t seen, std::chrono::milliseconds timeout, std::vector<int32_t>* fresh) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, timeout, [&] { return done || tokens.size() > seen; });
    if (tokens.size() > seen) fresh->insert(fresh->end(), tokens.begin() + std::ptrdiff_t(seen), tokens.end());
    return done;
  }
};

struct DriverOptions {
  int parallel = 64;              // sessions generating at once
  int max_queue = 64;             // jobs waiting beyond those; more in flight: Admit::Full
  int prefill_rows = 2048;        // BatchOptions::prefill_rows
  int prefill_sessions = 1;       // BatchOptions::prefill_sessions
  bool prefill_priority = false;  // BatchOptions::prefill_priority
  size_t context = 4096;          // tokens per session
  int prefix_cache = 8;           // prefix-cache entries (0: off)
  size_t prefix_min = 256;        // shortest prefix worth an entry, tokens
  bool log_steps = false;         // one line per engine step on stderr (what it fed, how long it took)
};

class Driver {
 public:
  enum class Admit { Ok, Full, Closed };

  Driver(const gemma4_t4::Engine& engine, const DriverOptions& options, Metrics* metrics)
      : engine_(engine), opt_(options), metrics_(metrics), batch_(engine, batch_options(options)) {
    session_bytes_ = engine.session_bytes(opt_.context);
    thread_ = std::thread([this] { run(); });
  }
  ~Driver() { stop(); }
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // HTTP threads.
  Admit submit(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Admit::Closed;
    if (live_.size() >= size_t(opt_.parallel) + size_t(opt_.max_queue)) return Admit::Full;
    job->options.cancel = &job->cancel;
    live_.push_back(job);
    inbox_.push_back(job);
    cv_.notify_one();
    return Admit::Ok;
  }
  // Ends a job at the next step (its client went away, a stop string matched).
  void cancel(Job& job) {
    job.cancel.store(true, std::memory_order_release);
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_one();  // a job still in the inbox is dropped now
  }
  size_t in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  // Shutdown, in order: refuse new jobs; cancel those in flight; end the thread.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void cancel_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& j : live_) j->cancel.store(true, std::memory_order_release);
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = stop_ = true;
      for (const auto& j : live_) j->cancel.store(true, std::memory_order_release);
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  using Session = gemma4_t4::Session;
  using FinishReason = gemma4_t4::FinishReason;

  struct StepRecord {
    gemma4_t4::BatchStep step;
    double seconds = 0;  // Batch::step() wall time
    double gap = -1;     // since the previous step ended (-1: the batch was idle in between)
    double admit = 0;    // of which admitting the jobs that joined before it (sessions, prefix cache)
  };
  struct Running {  // a job in the Batch
    std::shared_ptr<Job> job;
    std::unique_ptr<Session> session;
    size_t cached = 0;
    bool first = true;
    Clock::time_point last;
  };
  struct Waiter {  // a job waiting for its prefix entry
    std::shared_ptr<Job> job;
    std::unique_ptr<Session> session;
    bool creator = false;  // its prefix made the entry: only what came from a base entry counts as cached
  };
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<Session> session;  // position == tokens.size() once ready
    size_t from_base = 0;              // leading tokens copied from an older entry, not prefilled
    bool ready = false;
    uint64_t last_used = 0;
    std::vector<Waiter> waiters;
  };

  static gemma4_t4::BatchOptions batch_options(const DriverOptions& o) {
    gemma4_t4::BatchOptions b;
    b.max_sessions = o.parallel + std::max(o.prefix_cache, 0);  // entries being prefilled never wait for a slot
    b.prefill_rows = o.prefill_rows;
    b.prefill_sessions = o.prefill_sessions;
    b.prefill_priority = o.prefill_priority;
    return b;
  }

  // The driver thread. Nothing in the loop is expected to throw; if something does (out of host memory), every
  // job in flight fails and the server refuses new ones (503) instead of terminating.
  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      fail_all(e.what());
    } catch (...) {
      fail_all("an exception that is not a std::exception");
    }
  }

  void fail_all(const std::string& what) {
    std::fprintf(stderr, "server: the engine driver failed (%s); refusing new requests\n", what.c_str());
    std::vector<std::shared_ptr<Job>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      live = live_;
      inbox_.clear();
    }
    for (const auto& j : live)
      complete(*j, FinishReason::Error, gemma4_t4::Status(gemma4_t4::Code::BackendError, "engine driver: " + what), 0,
               0);
  }

  void loop() {
    for (;;) {
      std::vector<std::shared_ptr<Job>> joining, dropped;
      bool stopping = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return stop_ || !batch_.idle() || std::any_of(inbox_.begin(), inbox_.end(), [&](const auto& j) {
                   return sessions_out_ < size_t(opt_.parallel) || j->cancel.load(std::memory_order_acquire);
                 });
        });
        stopping = stop_;
        for (auto it = inbox_.begin(); it != inbox_.end();) {  // cancelled before they started
          if ((*it)->cancel.load(std::memory_order_acquire)) {
            dropped.push_back(*it);
            it = inbox_.erase(it);
          } else {
            ++it;
          }
        }
        while (!inbox_.empty() && sessions_out_ + joining.size() < size_t(opt_.parallel)) {
          joining.push_back(inbox_.front());
          inbox_.pop_front();
        }
        queue_depth_ = inbox_.size();
      }
      for (const auto& j : dropped) complete(*j, FinishReason::Cancelled, cancelled_status(), 0, 0);
      const Clock::time_point ta = Clock::now();
      for (const auto& j : joining) start(j);
      if (!batch_.idle()) {
        const Clock::time_point t0 = Clock::now();
        const gemma4_t4::Status st = batch_.step();  // a failed pass finishes its sessions with the error
        const Clock::time_point t1 = Clock::now();
        if (!st) std::fprintf(stderr, "server: batch step failed: %s\n", st.message.c_str());
        steps_.push_back(StepRecord{batch_.last_step(), seconds(t1 - t0),
                                    last_step_end_ ? seconds(t0 - *last_step_end_) : -1.0, seconds(t0 - ta)});
        if (opt_.log_steps) log_step(steps_.back());
        last_step_end_ = t1;
      } else {
        last_step_end_.reset();  // idle: the wait for requests is not the driver's time
      }
      for (gemma4_t4::BatchResult& r : batch_.take_finished()) finished(r);
      publish();
      if (stopping && batch_.idle()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (inbox_.empty()) break;
      }
    }
  }

  void log_step(const StepRecord& r) {
    const gemma4_t4::BatchStep& b = r.step;
    std::fprintf(stderr, "server: step %llu: %zu prompts (%zu rows), %zu decode rows: %.2f ms", ++logged_steps_,
                 b.prompt_sessions, b.prompt_rows, b.decode_rows, r.seconds * 1e3);
    if (r.gap >= 0) std::fprintf(stderr, ", %.3f ms after the previous one", r.gap * 1e3);
    if (b.prompt_sessions > 0) std::fprintf(stderr, " (%.3f ms admitting requests)", r.admit * 1e3);
    std::fprintf(stderr, "\n");
  }

  static gemma4_t4::Status cancelled_status() { return gemma4_t4::Status(gemma4_t4::Code::Cancelled, "cancelled"); }

  std::unique_ptr<Session> take_session(gemma4_t4::Status* st) {
    std::unique_ptr<Session> s;
    if (!free_.empty()) {
      s = std::move(free_.back());
      free_.pop_back();
    } else {
      s = std::make_unique<Session>();
      *st = engine_.create_session(s.get(), opt_.context);
      if (!*st) return nullptr;
      ++sessions_made_;
    }
    ++sessions_out_;
    return s;
  }
  void give_back(std::unique_ptr<Session> s) {
    s->reset();
    free_.push_back(std::move(s));
    --sessions_out_;
  }

  void start(const std::shared_ptr<Job>& job) {
    gemma4_t4::Status st(gemma4_t4::Code::InvalidArgument, "empty prompt");
    if (job->prompt.empty()) return complete(*job, FinishReason::Error, st, 0, 0);
    std::unique_ptr<Session> session = take_session(&st);
    if (!session) return complete(*job, FinishReason::Error, st, 0, 0);
    Entry* base = longest_entry(job->prompt, job->prompt.size() - 1);
    const size_t k = job->cache_prefix;
    if (opt_.prefix_cache > 0 && k >= opt_.prefix_min && k < job->prompt.size() && (!base || base->tokens.size() < k)) {
      const std::vector<int32_t> prefix(job->prompt.begin(), job->prompt.begin() + std::ptrdiff_t(k));
      Entry* e = find_entry(prefix);  // one being prefilled (a ready one would have been `base`)
      const bool creator = !e;
      if (!e) e = new_entry(prefix, base);
      if (e) {
        e->waiters.push_back(Waiter{job, std::move(session), creator});
        return;
      }
    }
    launch(job, std::move(session), base, base ? base->tokens.size() : 0);
  }

  // Copies `base` (may be null) into the session and adds the rest of the prompt to the Batch. `cached`: how
  // many of the base's tokens count as taken from the cache (reported in usage and /metrics).
  void launch(const std::shared_ptr<Job>& job, std::unique_ptr<Session> session, Entry* base, size_t cached) {
    if (job->cancel.load(std::memory_order_acquire)) {
      give_back(std::move(session));
      return complete(*job, FinishReason::Cancelled, cancelled_status(), 0, 0);
    }
    auto run = std::make_shared<Running>();
    size_t copied = 0;
    if (base) {
      const gemma4_t4::Status st = engine_.copy_prefix(*base->session, *session, base->tokens.size());
      if (st) {
        copied = base->tokens.size();
        run->cached = std::min(cached, copied);
        base->last_used = ++tick_;
        if (run->cached > 0) ++hits_;
        reused_ += run->cached;
      } else {
        std::fprintf(stderr, "server: prefix cache: %s (the prompt is prefilled instead)\n", st.message.c_str());
        session->reset();
      }
    }
    std::vector<int32_t> rest(job->prompt.begin() + std::ptrdiff_t(copied), job->prompt.end());
    prompt_tokens_ += job->prompt.size();
    run->job = job;
    Running* r = run.get();
    uint64_t id = 0;
    const gemma4_t4::Status st = batch_.add(
        session.get(), std::move(rest), job->options, [this, r](int32_t t) { return on_token(*r, t); }, &id);
    run->session = std::move(session);
    if (!st) {
      give_back(std::move(run->session));
      return complete(*job, FinishReason::Error, st, 0, 0);
    }
    running_[id] = std::move(run);
  }

  bool on_token(Running& r, int32_t token) {
    const Clock::time_point now = Clock::now();
    if (r.first) {
      ttft_.push_back(seconds(now - r.job->arrival));
      if (opt_.log_steps)
        std::fprintf(stderr, "server: a first token, %.2f ms after its request arrived\n", ttft_.back() * 1e3);
      r.first = false;
    } else {
      tpot_.push_back(seconds(now - r.last));
    }
    r.last = now;
    ++generated_;
    {
      std::lock_guard<std::mutex> lock(r.job->mu);
      r.job->tokens.push_back(token);
    }
    r.job->cv.notify_all();
    return true;
  }

  void finished(gemma4_t4::BatchResult& res) {
    if (auto it = computing_.find(res.id); it != computing_.end()) {
      Entry* e = it->second;
      computing_.erase(it);
      return entry_done(e, res);
    }
    auto it = running_.find(res.id);
    if (it == running_.end()) return;
    Running& r = *it->second;
    if (res.finish == FinishReason::Stop) ++generated_;  // the stop token was sampled too (not shown to on_token)
    give_back(std::move(r.session));
    complete(*r.job, res.finish, std::move(res.status), res.timing.generated_tokens, r.cached);
    running_.erase(it);
  }

  void complete(Job& job, FinishReason finish, gemma4_t4::Status status, size_t generated, size_t cached) {
    if (finish == FinishReason::Cancelled) ++cancelled_;
    {
      std::lock_guard<std::mutex> lock(job.mu);
      job.done = true;
      job.finish = finish;
      job.status = std::move(status);
      job.generated = generated;
      job.cached = cached;
    }
    job.cv.notify_all();
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(std::remove_if(live_.begin(), live_.end(), [&](const auto& j) { return j.get() == &job; }),
                live_.end());
  }

  // ---- prefix cache ----

  // The ready entry with the most tokens (at most `limit`) that `prompt` starts with.
  Entry* longest_entry(const std::vector<int32_t>& prompt, size_t limit) {
    Entry* best = nullptr;
    for (const auto& e : cache_)
      if (e->ready && e->tokens.size() <= limit && (!best || e->tokens.size() > best->tokens.size()) &&
          std::equal(e->tokens.begin(), e->tokens.end(), prompt.begin()))
        best = e.get();
    return best;
  }
  Entry* find_entry(const std::vector<int32_t>& tokens) {
    for (const auto& e : cache_)
      if (e->tokens == tokens) return e.get();
    return nullptr;
  }

  // A new entry being prefilled (from `base` when given); null when the cache is full of entries in use or the
  // session cannot be made.
  Entry* new_entry(const std::vector<int32_t>& tokens, Entry* base) {
    if (cache_.size() >= size_t(opt_.prefix_cache)) {
      auto victim = cache_.end();
      for (auto it = cache_.begin(); it != cache_.end(); ++it)
        if ((*it)->ready && it->get() != base && (victim == cache_.end() || (*it)->last_used < (*victim)->last_used))
          victim = it;
      if (victim == cache_.end()) return nullptr;
      cache_.erase(victim);
    }
    auto e = std::make_unique<Entry>();
    e->tokens = tokens;
    e->session = std::make_unique<Session>();
    if (!engine_.create_session(e->session.get(), tokens.size())) return nullptr;
    size_t from = 0;
    if (base && engine_.copy_prefix(*base->session, *e->session, base->tokens.size())) {
      from = e->from_base = base->tokens.size();
      base->last_used = ++tick_;
    }
    gemma4_t4::GenerateOptions feed_only;
    feed_only.max_new_tokens = 0;
    uint64_t id = 0;
    if (!batch_.add(e->session.get(), std::vector<int32_t>(tokens.begin() + std::ptrdiff_t(from), tokens.end()),
                    feed_only, nullptr, &id))
      return nullptr;
    e->last_used = ++tick_;
    ++entries_made_;
    computing_[id] = e.get();
    cache_.push_back(std::move(e));
    return cache_.back().get();
  }

  void entry_done(Entry* e, const gemma4_t4::BatchResult& res) {
    std::vector<Waiter> waiters = std::move(e->waiters);
    e->waiters.clear();
    const bool ok = res.finish == FinishReason::Length && e->session->position() == e->tokens.size();
    if (ok) {
      e->ready = true;
    } else {
      std::fprintf(stderr, "server: prefix cache: prefill of a %zu-token prefix failed: %s\n", e->tokens.size(),
                   res.status.message.c_str());
      cache_.erase(std::find_if(cache_.begin(), cache_.end(), [&](const auto& p) { return p.get() == e; }));
      e = nullptr;
    }
    for (Waiter& w : waiters) {
      Entry* base = e ? e : longest_entry(w.job->prompt, w.job->prompt.size() - 1);
      launch(w.job, std::move(w.session), base,
             !base                    ? 0
             : w.creator && base == e ? e->from_base
                                      : base->tokens.size());
    }
  }

  // Counters into the metrics, gauges refreshed.
  void publish() {
    size_t entry_bytes = 0;
    for (const auto& e : cache_) entry_bytes += engine_.session_bytes(e->tokens.size());
    std::lock_guard<std::mutex> lock(metrics_->mu);
    for (double v : ttft_) metrics_->ttft.observe(v);
    for (double v : tpot_) metrics_->tpot.observe(v);
    ttft_.clear();
    tpot_.clear();
    for (const StepRecord& r : steps_) {
      const gemma4_t4::BatchStep& b = r.step;
      ++metrics_->steps;
      metrics_->step_prompt_rows += b.prompt_rows;
      metrics_->step_decode_rows += b.decode_rows;
      if (b.prompt_sessions > 0) metrics_->prompts_per_step.observe(double(b.prompt_sessions));
      (b.prompt_rows > 0 ? metrics_->prompt_step : metrics_->decode_step).observe(r.seconds);
      if (r.gap >= 0) metrics_->between_steps.observe(r.gap);
    }
    steps_.clear();
    metrics_->generation_tokens += generated_;
    metrics_->prompt_tokens += prompt_tokens_;
    metrics_->cancelled += cancelled_;
    metrics_->prefix_hits += hits_;
    metrics_->prefix_reused_tokens += reused_;
    metrics_->prefix_entries_made += entries_made_;
    generated_ = prompt_tokens_ = cancelled_ = hits_ = reused_ = entries_made_ = 0;
    metrics_->queue_depth = queue_depth_;
    metrics_->active_sessions = sessions_out_;
    metrics_->prefix_entries = cache_.size();
    metrics_->kv_bytes_in_use = sessions_out_ * session_bytes_ + entry_bytes;
    metrics_->kv_bytes_allocated = sessions_made_ * session_bytes_ + entry_bytes;
  }

  const gemma4_t4::Engine& engine_;
  const DriverOptions opt_;
  Metrics* metrics_;

  // shared with the HTTP threads, guarded by mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> inbox_;
  std::vector<std::shared_ptr<Job>> live_;  // submitted, not completed
  bool closed_ = false, stop_ = false;

  // the driver thread's own
  gemma4_t4::Batch batch_;
  std::vector<std::unique_ptr<Session>> free_;
  size_t sessions_out_ = 0, sessions_made_ = 0, session_bytes_ = 0, queue_depth_ = 0;
  std::map<uint64_t, std::shared_ptr<Running>> running_;  // by Batch id
  std::vector<std::unique_ptr<Entry>> cache_;
  std::map<uint64_t, Entry*> computing_;  // entries being prefilled, by Batch id
  uint64_t tick_ = 0;
  std::vector<double> ttft_, tpot_;                 // observed since the last publish()
  std::vector<StepRecord> steps_;                   // likewise
  std::optional<Clock::time_point> last_step_end_;  // the previous step's end while the batch stays busy
  uint64_t generated_ = 0, prompt_tokens_ = 0, cancelled_ = 0, hits_ = 0, reused_ = 0, entries_made_ = 0;
  unsigned long long logged_steps_ = 0;  // log_steps
  std::thread thread_;                   // last: starts after everything above is built
};

}  // namespace server
