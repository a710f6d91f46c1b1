// soak: many random sessions through one long-lived Engine, checking that nothing drifts or leaks. A benchmark-
// style program (not a unit test): tests/SOAK.md says what it does and records dated runs.
//
//   soak [--model DIR] [--backend cpu|cuda|auto] [--sessions N] [--min-tokens N] [--seed N]
//        [--max-concurrency N] [--json FILE] ...   (--help: all)
//
// It drives a gemma4_t4::Batch with sessions that join at random times (random target concurrency, random
// BatchOptions per batch), random prompt lengths (short, crossing the model's sliding window, ending a few
// tokens short of the session's context, a few invalid on purpose), random max_new_tokens (0 included),
// greedy and seeded sampling, cancellations between steps and from callbacks, callbacks that stop early or
// add sessions, and some plain generate() calls; sessions are created with random contexts, reused after
// reset(), continued without reset, and destroyed. It runs until both --sessions and --min-tokens are reached.
// Checks:
//   memory    at every checkpoint (each --sample-every sessions: batch drained or dropped, pool emptied) host
//             RssAnon and VmRSS (/proc/self/status) and, on CUDA, GPU memory in use (bench::device_report);
//             the growth of RssAnon and GPU memory from the first sample after --warmup sessions to the last
//             must stay within --rss-limit-mib / --gpu-limit-mib. (VmRSS is reported, not checked: it
//             includes pages of the mapped checkpoint, which grow as new token rows are first read.)
//   logits    every --probe-every finished sessions, Engine::step (last-position logits) or forward_batch
//             (Logits::All) on up to 4 live sessions: every logit finite.
//   canaries  fixed greedy prompts (one with a repetition penalty, one seeded-sampling, one filling its
//             session's context exactly) run with generate() alone on a freshly loaded engine at the start;
//             every --canary-every sessions and at the end the long-lived engine must reproduce them token
//             for token, and at the end so must another freshly loaded engine. Canaries also ride in the
//             batch among the random sessions: exact on the CPU backend (the Batch contract), counted only on
//             CUDA (its batched kernels may round differently).
//   results   every session's result obeys generate()'s contract: finish reason vs Status, token counts,
//             no stop tokens returned, the session's position afterwards; errors only where the request was
//             made to fail (invalid prompt, context overflow).
// Exit status: 0 every check passed, 1 a check failed (or the model did not load), 2 bad command line.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../programs/args.hpp"
#include "gemma4_t4.hpp"

#ifndef GEMMA4_T4_DEFAULT_MODEL
#define GEMMA4_T4_DEFAULT_MODEL "tests/fixtures/mm_bf16"
#endif

namespace {

using namespace gemma4_t4;
using Clock = std::chrono::steady_clock;

const char kUsage[] =
    "usage: soak [options]\n"
    "\n"
    "Runs many random sessions (continuous batching, cancellations, resets, plain generate() calls) through\n"
    "one engine and checks memory growth, finite logits, greedy outputs against a fresh engine, and every\n"
    "session's result. tests/SOAK.md describes it.\n"
    "\n";

// ---- options ----------------------------------------------------------------------------------------------

struct Args {
  std::string model = GEMMA4_T4_DEFAULT_MODEL;
  std::string backend = "auto";
  std::string json;
  bool quiet = false;
  long sessions = 1000, min_tokens = 100000, seed = 1, max_concurrency = 16, max_context = 0;
  long max_new_tokens = 256, canary_tokens = 24, warmup = -1, sample_every = 0, canary_every = 0;
  long probe_every = 10, rss_limit_mib = 8, gpu_limit_mib = 64, max_seconds = 0;
};

// Returns -1 to go on, else the exit status (0 for --help, 2 for a bad command line).
int parse_args(int argc, char** argv, Args* a) {
  const long big = 1L << 40;
  const std::string model_help =
      std::string("checkpoint directory (default: the bundled tiny model ") + GEMMA4_T4_DEFAULT_MODEL + ")";
  args::Parser p("soak", kUsage);
  p.text("--model", "DIR", &a->model, model_help.c_str());
  p.choice("--backend", "B", &a->backend, {{"cpu", "cpu"}, {"cuda", "cuda"}, {"auto", "auto"}},
           "cpu, cuda or auto (default: auto: CUDA when compiled in and a GPU is present)");
  p.integer("--sessions", "N", &a->sessions, 1, big, "run at least N sessions (default 1000)");
  p.integer("--min-tokens", "N", &a->min_tokens, 0, big, "and at least N generated tokens (default 100000)");
  p.integer("--seed", "N", &a->seed, 0, big, "seed of the random workload (default 1)");
  p.integer("--max-concurrency", "N", &a->max_concurrency, 1, 4096, "most sessions generating at once (default 16)");
  p.integer("--max-context", "N", &a->max_context, 16, 1L << 24,
            "largest session context, tokens (default: min(1024, the model's limit))");
  p.integer("--max-new-tokens", "N", &a->max_new_tokens, 1, 1L << 24, "largest random max_new_tokens (default 256)");
  p.integer("--canary-tokens", "N", &a->canary_tokens, 1, 4096, "tokens each canary generates (default 24)");
  p.integer("--warmup", "N", &a->warmup, 0, big, "sessions before the memory baseline (default: sessions / 5)");
  p.integer("--sample-every", "N", &a->sample_every, 1, big,
            "sessions between checkpoints / memory samples (default: sessions / 20)");
  p.integer("--canary-every", "N", &a->canary_every, 1, big, "sessions between canary runs (default: sessions / 5)");
  p.integer("--probe-every", "N", &a->probe_every, 1, big, "finished sessions between logit probes (default 10)");
  p.integer("--rss-limit-mib", "N", &a->rss_limit_mib, 0, big, "allowed host RssAnon growth after warm-up (default 8)");
  p.integer("--gpu-limit-mib", "N", &a->gpu_limit_mib, 0, big, "allowed GPU memory growth after warm-up (default 64)");
  p.integer("--max-seconds", "N", &a->max_seconds, 0, big,
            "stop adding sessions after N s, finish the checks, fail (default 0: no limit)");
  p.text("--json", "FILE", &a->json, "write the summary as JSON");
  p.flag("--quiet", &a->quiet, "no progress lines on stderr");
  p.footer("\nExit status: 0 every check passed, 1 a check failed or the model did not load, 2 bad command line.\n");
  if (const int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (a->warmup < 0) a->warmup = a->sessions / 5;
  if (a->sample_every == 0) a->sample_every = std::max(1L, a->sessions / 20);
  if (a->canary_every == 0) a->canary_every = std::max(1L, a->sessions / 5);
  return -1;
}

// ---- memory -----------------------------------------------------------------------------------------------

struct MemSample {
  uint64_t sessions = 0, tokens = 0;
  double seconds = 0;
  long rss_kib = -1, anon_kib = -1, hwm_kib = -1;  // /proc/self/status VmRSS, RssAnon, VmHWM; -1 unknown
  long long gpu_used = -1;                         // bytes in use on the device (total - free); -1: no GPU
};

void read_proc_status(MemSample* m) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    long* dst = line.rfind("VmRSS:", 0) == 0     ? &m->rss_kib
                : line.rfind("RssAnon:", 0) == 0 ? &m->anon_kib
                : line.rfind("VmHWM:", 0) == 0   ? &m->hwm_kib
                                                 : nullptr;
    if (dst) *dst = std::strtol(line.c_str() + line.find(':') + 1, nullptr, 10);
  }
}

double mib(long long bytes) { return double(bytes) / (1024.0 * 1024.0); }

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// ---- canaries ---------------------------------------------------------------------------------------------

// A fixed request whose tokens must never change: run with generate() alone on a session of `context` tokens.
struct Canary {
  std::string what;
  std::vector<int32_t> prompt;
  GenerateOptions options;
  size_t context = 0;  // the session's context: prompt + max_new_tokens, or more when `exact` is false
  bool exact = false;  // the session is exactly this big (the last token lands in its last position)
};

std::vector<Canary> make_canaries(const ModelConfig& cfg, size_t max_context, int tokens) {
  std::mt19937_64 rng(20261203);  // fixed: the canaries do not depend on --seed
  const int vocab =
      std::min(cfg.vocab_size, cfg.hidden_size_per_layer_input > 0 ? cfg.vocab_size_per_layer_input : cfg.vocab_size);
  const size_t w = size_t(std::max(1, cfg.sliding_window));
  const size_t room = max_context > size_t(tokens) + 1 ? max_context - size_t(tokens) : 1;  // longest prompt
  auto prompt = [&](size_t n) {
    std::vector<int32_t> p(std::max<size_t>(1, std::min(n, room)));
    for (auto& t : p) t = int32_t(std::uniform_int_distribution<int>(3, vocab - 1)(rng));
    p[0] = cfg.bos_token_id;
    return p;
  };
  GenerateOptions greedy;
  greedy.sampling = SamplingOptions::greedy();
  greedy.max_new_tokens = tokens;
  greedy.stop_at_eos = false;
  std::vector<Canary> c;
  c.push_back({"greedy, 1-token prompt", prompt(1), greedy, 0, false});
  c.push_back({"greedy, 7-token prompt", prompt(7), greedy, 0, false});
  c.push_back({"greedy, prompt past the sliding window", prompt(w + 3), greedy, 0, false});
  c.push_back({"greedy, prompt past twice the window", prompt(2 * w + 5), greedy, 0, false});
  GenerateOptions penalty = greedy;
  penalty.sampling.repetition_penalty = 1.5f;
  c.push_back({"greedy + repetition penalty 1.5", prompt(w / 2 + 2), penalty, 0, false});
  GenerateOptions seeded = greedy;
  seeded.sampling = SamplingOptions();  // temperature 1, top-k 64, top-p 0.95
  seeded.sampling.seed = 1234;
  c.push_back({"seeded sampling (seed 1234)", prompt(w + 1), seeded, 0, false});
  c.push_back({"greedy, session filled to its last position", prompt(3 * w + 17), greedy, 0, true});
  for (Canary& k : c) k.context = k.prompt.size() + size_t(tokens);
  return c;
}

// ---- the soak ---------------------------------------------------------------------------------------------

// A pooled session. Held through a unique_ptr: a Batch keeps the Session's address while it runs.
struct Slot {
  Session session;
  bool busy = false;
};

enum class Shape { Short, Window, NearLimit, Invalid };
enum class Cb { None, Count, StopAfter, CancelSelf, CancelOther, Spawn };

// One session's request and what is needed to check its result.
struct Request {
  uint64_t id = 0;
  Slot* slot = nullptr;
  size_t pos_before = 0, prompt_len = 0;
  int max_new = 0;
  Shape shape = Shape::Short;
  Code invalid_code = Code::Ok;  // Shape::Invalid: the Code it must fail with
  std::vector<int32_t> stops;    // stop tokens in force (extra ones + the model's eos when stop_at_eos)
  Cb cb = Cb::None;
  int cb_at = 0;  // the callback acts on its cb_at-th token
  int seen = 0;   // tokens the callback saw
  bool said_stop = false;
  int canary = -1;        // >= 0: replays this canary; its tokens must match
  bool protect = false;   // never cancelled (canaries)
  bool via_batch = true;  // false: a plain generate() call
};

struct Counters {
  uint64_t sessions = 0, tokens = 0, prompt_tokens = 0;
  uint64_t stop = 0, length = 0, callback = 0, cancelled = 0, errors_expected = 0, dropped = 0;
  uint64_t generate_calls = 0, batch_sessions = 0, batches = 0, steps = 0;
  uint64_t created = 0, destroyed = 0, resets = 0, continued = 0;
  uint64_t cancels_between_steps = 0, cancels_in_callback = 0, spawned_in_callback = 0;
  uint64_t probes = 0, probe_values = 0, nonfinite = 0;
  uint64_t canary_runs = 0, canary_mismatches = 0, batch_canaries = 0, batch_canary_mismatches = 0;
  uint64_t max_inflight = 0;
};

class Soak {
 public:
  Soak(const Engine& engine, const Args& args, const std::vector<Canary>& canaries,
       const std::vector<std::vector<int32_t>>& reference)
      : engine_(engine), a_(args), canaries_(canaries), reference_(reference), rng_(uint64_t(args.seed)) {
    const ModelConfig& c = engine.config();
    vocab_ = std::min(c.vocab_size, c.hidden_size_per_layer_input > 0 ? c.vocab_size_per_layer_input : c.vocab_size);
    window_ = size_t(std::max(1, c.sliding_window));
    max_ctx_ = engine.load_options().max_context;
    cuda_ = engine.backend() == Backend::Cuda;
  }

  void run();

  Counters n;
  std::vector<MemSample> samples;
  std::vector<std::string> failures;  // every failed check, in words
  uint64_t failure_count = 0;
  double soak_seconds = 0;
  bool stopped_by_time = false;
  std::vector<std::vector<int32_t>> final_canaries;  // the long-lived engine's last canary run

  // What failed, by the check it counts against (the summary's "check" lines).
  enum Check { kResults, kLogits, kCanaries, kMemory, kChecks };
  uint64_t failed[kChecks] = {};
  void fail(Check check, const std::string& what) {
    ++failed[check];
    ++failure_count;
    if (failures.size() < 50) failures.push_back(what);
    if (!a_.quiet && failure_count <= 20) std::fprintf(stderr, "soak: FAIL %s\n", what.c_str());
  }
  void note(const char* fmt, ...) __attribute__((format(printf, 2, 3)));

  // Runs every canary on this engine (sessions alternately fresh and reused after reset()) and compares.
  void run_canaries(std::vector<std::vector<int32_t>>* out);

 private:
  int uni(long lo, long hi) { return int(std::uniform_int_distribution<long>(lo, hi)(rng_)); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  bool targets_met() const { return n.sessions >= uint64_t(a_.sessions) && n.tokens >= uint64_t(a_.min_tokens); }

  Slot* new_slot(size_t context);
  Slot* take_slot(size_t need, bool allow_continue);
  void release(Slot* s);
  void new_batch();
  void arrivals();
  void add_request(bool from_callback);
  void plain_generate();
  void compose(Slot* slot, Request* r, GenerateOptions* options, std::vector<int32_t>* prompt);
  std::vector<int32_t> make_prompt(const Request& r, size_t room);
  GenerateOptions make_options(Request* r);
  std::function<bool(int32_t)> make_callback(Request* r);
  void cancel_random(bool in_callback, uint64_t except);
  void collect();
  void check(Request& r, const BatchResult& res);
  void probe();
  void checkpoint(bool final);
  void sample_memory();

  const Engine& engine_;
  const Args& a_;
  const std::vector<Canary>& canaries_;
  const std::vector<std::vector<int32_t>>& reference_;
  std::mt19937_64 rng_;
  int vocab_ = 0;
  size_t window_ = 1, max_ctx_ = 0;
  bool cuda_ = false;
  Clock::time_point start_;
  std::vector<std::unique_ptr<Slot>> pool_;
  std::unique_ptr<Batch> batch_;
  std::map<uint64_t, std::unique_ptr<Request>> inflight_;  // by Batch id
  int target_ = 1;                                         // sessions in flight the arrivals aim at
  uint64_t next_checkpoint_ = 0, next_canary_ = 0, finished_since_probe_ = 0;
};

void Soak::note(const char* fmt, ...) {
  if (a_.quiet) return;
  va_list ap;
  va_start(ap, fmt);
  std::fputs("soak: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

// ---- sessions ----

Slot* Soak::new_slot(size_t context) {
  auto s = std::make_unique<Slot>();
  if (Status st = engine_.create_session(&s->session, context); !st) {
    fail(kResults, "create_session(" + std::to_string(context) + "): " + st.message);
    return nullptr;
  }
  ++n.created;
  pool_.push_back(std::move(s));
  return pool_.back().get();
}

// An idle session with room for `need` tokens: a new one (random context, log-uniform), an idle one after
// reset(), or (allow_continue) an idle one as it is, continuing its conversation.
Slot* Soak::take_slot(size_t need, bool allow_continue) {
  std::vector<Slot*> idle;
  for (auto& s : pool_)
    if (!s->busy && s->session.max_context() >= need) idle.push_back(s.get());
  const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
  Slot* s = nullptr;
  if (idle.empty() || r < 0.3) {
    const double lo = std::log(double(std::max<size_t>(need, 32))), hi = std::log(double(max_ctx_));
    const size_t ctx =
        lo >= hi ? std::max(need, max_ctx_) : size_t(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng_)));
    s = new_slot(std::min(max_ctx_, std::max(ctx, need)));
  } else {
    s = idle[size_t(uni(0, long(idle.size()) - 1))];
    const size_t room = s->session.max_context() - s->session.position();
    if (allow_continue && r >= 0.65 && room >= std::max<size_t>(need, 2)) {
      ++n.continued;
    } else {
      s->session.reset();
      ++n.resets;
    }
  }
  if (s) s->busy = true;
  return s;
}

// Back to the pool; sometimes destroyed, and the idle pool is kept to about max-concurrency sessions.
void Soak::release(Slot* s) {
  s->busy = false;
  size_t idle = 0;
  for (auto& p : pool_) idle += !p->busy;
  if (chance(0.2) || idle > size_t(a_.max_concurrency)) {
    pool_.erase(std::find_if(pool_.begin(), pool_.end(), [&](const auto& p) { return p.get() == s; }));
    ++n.destroyed;
  }
}

void Soak::new_batch() {
  BatchOptions o;
  o.max_sessions = chance(0.25) ? uni(1, a_.max_concurrency) : int(a_.max_concurrency);  // mostly the most
  o.prefill_rows = uni(16, 512);
  batch_ = std::make_unique<Batch>(engine_, o);
  ++n.batches;
}

// ---- requests ----

std::vector<int32_t> Soak::make_prompt(const Request& r, size_t room) {
  size_t len = 0;
  switch (r.shape) {
    case Shape::Short: len = size_t(uni(1, 16)); break;
    case Shape::Window: len = size_t(uni(long(window_) + 1, 3 * long(window_) + 8)); break;
    case Shape::NearLimit: len = room > 16 ? room - size_t(uni(0, 16)) : room; break;
    case Shape::Invalid:
      if (r.invalid_code == Code::ContextOverflow)
        len = room + size_t(uni(1, 8));
      else
        len = chance(0.5) ? 0 : size_t(uni(1, 8));  // empty, or an id outside the vocabulary
      break;
  }
  if (r.shape != Shape::Invalid) len = std::max<size_t>(1, std::min(len, room));
  std::vector<int32_t> p(len);
  for (auto& t : p) t = int32_t(uni(0, vocab_ - 1));
  if (!p.empty() && r.pos_before == 0) p[0] = engine_.config().bos_token_id;
  if (r.shape == Shape::Invalid && r.invalid_code == Code::InvalidArgument && !p.empty())
    p[size_t(uni(0, long(p.size()) - 1))] = chance(0.5) ? -1 - uni(0, 5) : engine_.config().vocab_size + uni(0, 5);
  return p;
}

GenerateOptions Soak::make_options(Request* r) {
  GenerateOptions o;
  o.max_new_tokens = chance(0.05) ? 0 : uni(1, a_.max_new_tokens);
  if (chance(0.5)) {
    o.sampling = SamplingOptions::greedy();
  } else {
    o.sampling.temperature = float(std::uniform_real_distribution<double>(0.3, 1.5)(rng_));
    const int ks[] = {0, 1, 8, 64};
    o.sampling.top_k = ks[uni(0, 3)];
    o.sampling.top_p = chance(0.3) ? 1.f : float(std::uniform_real_distribution<double>(0.5, 0.99)(rng_));
    o.sampling.min_p = chance(0.7) ? 0.f : 0.05f;
    o.sampling.seed = uint64_t(uni(0, 1L << 30));
  }
  if (chance(0.3)) o.sampling.repetition_penalty = 1.3f;
  o.stop_at_eos = chance(0.5);
  if (chance(0.1)) o.stop_tokens.push_back(int32_t(uni(0, vocab_ - 1)));
  r->max_new = o.max_new_tokens;
  r->stops = o.stop_tokens;
  if (o.stop_at_eos)
    for (int e : engine_.config().eos_token_ids) r->stops.push_back(e);
  return o;
}

// Callbacks: none, counting, stopping at its cb_at-th token, cancelling its own session or another, or adding
// a new session (what a Batch allows on_token to do).
std::function<bool(int32_t)> Soak::make_callback(Request* r) {
  const double x = std::uniform_real_distribution<double>(0, 1)(rng_);
  r->cb = x < 0.3    ? Cb::None
          : x < 0.65 ? Cb::Count
          : x < 0.8  ? Cb::StopAfter
          : x < 0.88 ? Cb::CancelSelf
          : x < 0.94 ? Cb::CancelOther
                     : Cb::Spawn;
  if (!r->via_batch && r->cb != Cb::None) r->cb = chance(0.5) ? Cb::Count : Cb::StopAfter;
  r->cb_at = uni(1, std::max(1, r->max_new));
  if (r->cb == Cb::None) return {};
  return [this, r](int32_t) {
    ++r->seen;
    if (r->seen != r->cb_at) return true;
    switch (r->cb) {
      case Cb::StopAfter: r->said_stop = true; return false;
      case Cb::CancelSelf:
        if (!batch_->cancel(r->id))
          fail(kResults, "cancel of its own session " + std::to_string(r->id) + " from on_token: false");
        ++n.cancels_in_callback;
        return true;
      case Cb::CancelOther: cancel_random(true, r->id); return true;
      case Cb::Spawn:
        if (!targets_met()) {
          add_request(true);
          ++n.spawned_in_callback;
        }
        return true;
      default: return true;
    }
  };
}

// A random request on `slot`: its shape, options and prompt. Near-limit prompts end 0..16 tokens short of the
// session's context; half of them get a max_new_tokens that fits exactly, the others run into the limit.
void Soak::compose(Slot* slot, Request* r, GenerateOptions* options, std::vector<int32_t>* prompt) {
  r->slot = slot;
  r->pos_before = slot->session.position();
  const size_t room = slot->session.max_context() - r->pos_before;
  const double x = std::uniform_real_distribution<double>(0, 1)(rng_);
  r->shape = x < 0.55 ? Shape::Short : x < 0.8 ? Shape::Window : x < 0.97 ? Shape::NearLimit : Shape::Invalid;
  if (r->shape == Shape::Invalid) r->invalid_code = chance(0.5) ? Code::ContextOverflow : Code::InvalidArgument;
  *options = make_options(r);
  *prompt = make_prompt(*r, room);
  r->prompt_len = prompt->size();
  // Most requests fit their session; near-limit ones half the time, so ContextOverflow is a regular outcome.
  const double fit = r->shape == Shape::NearLimit ? 0.5 : r->shape == Shape::Invalid ? 0 : 0.9;
  if (chance(fit)) r->max_new = options->max_new_tokens = std::min(r->max_new, int(room - prompt->size()));
}

void Soak::add_request(bool from_callback) {
  auto req = std::make_unique<Request>();
  Request* r = req.get();
  std::vector<int32_t> prompt;
  GenerateOptions opt;
  std::function<bool(int32_t)> cb;
  if (!from_callback && chance(0.02)) {  // a canary among the random sessions
    r->canary = uni(0, long(canaries_.size()) - 1);
    const Canary& k = canaries_[size_t(r->canary)];
    Slot* s = k.exact ? new_slot(k.context) : take_slot(k.context, false);
    if (!s) return;
    s->busy = true;
    if (s->session.position() != 0) s->session.reset();
    r->slot = s;
    r->protect = true;
    prompt = k.prompt;
    opt = k.options;
    r->max_new = opt.max_new_tokens;
  } else {
    Slot* s = take_slot(1, true);
    if (!s) return;
    compose(s, r, &opt, &prompt);
    cb = make_callback(r);
  }
  r->prompt_len = prompt.size();
  uint64_t id = 0;
  if (Status st = batch_->add(&r->slot->session, std::move(prompt), opt, std::move(cb), &id); !st) {
    fail(kResults, "Batch::add: " + st.message);
    release(r->slot);
    return;
  }
  r->id = id;
  inflight_[id] = std::move(req);
  n.max_inflight = std::max<uint64_t>(n.max_inflight, inflight_.size());
}

// A plain generate() on a pooled session, between batch steps.
void Soak::plain_generate() {
  Slot* s = take_slot(1, true);
  if (!s) return;
  Request r;
  r.via_batch = false;
  GenerateOptions opt;
  std::vector<int32_t> prompt;
  compose(s, &r, &opt, &prompt);
  const std::function<bool(int32_t)> cb = make_callback(&r);
  BatchResult res;
  res.status = generate(engine_, s->session, prompt, opt, cb, &res.tokens, &res.timing);
  // generate() has no finish reason: derive it as a Batch would report it.
  res.finish = !res.status                                       ? FinishReason::Error
               : res.timing.generated_tokens > res.tokens.size() ? FinishReason::Stop
               : r.said_stop                                     ? FinishReason::Callback
                                                                 : FinishReason::Length;
  ++n.generate_calls;
  check(r, res);
  release(s);
}

void Soak::cancel_random(bool in_callback, uint64_t except) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : inflight_)
    if (id != except && !r->protect) ids.push_back(id);
  if (ids.empty()) return;
  const uint64_t id = ids[size_t(uni(0, long(ids.size()) - 1))];
  // Inside a callback the target may have finished earlier in this step (its result not yet taken).
  if (!batch_->cancel(id) && !in_callback)
    fail(kResults, "Batch::cancel(" + std::to_string(id) + ") of an unfinished session: false");
  ++(in_callback ? n.cancels_in_callback : n.cancels_between_steps);
}

// ---- results ----

void Soak::check(Request& r, const BatchResult& res) {
  const std::string who = (r.via_batch ? "batch session " + std::to_string(r.id) : std::string("generate()")) + " (" +
                          finish_reason_name(res.finish) + "): ";
  const size_t pos = r.slot->session.position(), ctx = r.slot->session.max_context();
  const size_t nt = res.tokens.size(), gen = res.timing.generated_tokens;
  const size_t full = r.pos_before + r.prompt_len + nt;  // what the session holds when everything was fed
  n.tokens += gen;
  n.prompt_tokens += r.prompt_len;
  ++n.sessions;
  ++finished_since_probe_;
  auto bad = [&](const std::string& what) { fail(kResults, who + what); };
  for (int32_t t : res.tokens) {
    if (t < 0 || t >= engine_.config().vocab_size) bad("token " + std::to_string(t) + " outside the vocabulary");
    if (std::find(r.stops.begin(), r.stops.end(), t) != r.stops.end()) bad("returned stop token " + std::to_string(t));
  }
  if (nt > size_t(r.max_new)) bad(std::to_string(nt) + " tokens > max_new_tokens " + std::to_string(r.max_new));
  if (gen != nt && gen != nt + 1) bad("timing counts " + std::to_string(gen) + " tokens for " + std::to_string(nt));
  const bool ok_status = res.status.is_ok();
  switch (res.finish) {
    case FinishReason::Stop:
    case FinishReason::Length:
    case FinishReason::Callback:
      if (!ok_status) bad("status " + res.status.message);
      if (pos != full) bad("session at " + std::to_string(pos) + ", expected " + std::to_string(full));
      if (r.shape == Shape::Invalid) bad("an invalid request did not fail");
      if (res.finish == FinishReason::Stop) {
        ++n.stop;
        if (gen != nt + 1) bad("stop without a stop token");
      } else if (res.finish == FinishReason::Length) {
        ++n.length;
        if (nt != size_t(r.max_new))
          bad(std::to_string(nt) + " tokens for max_new_tokens " + std::to_string(r.max_new));
      } else {
        ++n.callback;
        if (r.cb != Cb::StopAfter || nt != size_t(r.cb_at)) bad("callback stop at token " + std::to_string(nt));
      }
      break;
    case FinishReason::Cancelled:
      ++n.cancelled;
      if (res.status.code != Code::Cancelled) bad("status " + std::string(code_name(res.status.code)));
      if (pos < r.pos_before || pos > full) bad("cancelled session at position " + std::to_string(pos));
      if (r.protect) bad("a canary was cancelled");
      break;
    case FinishReason::Error: {
      const bool overflow_possible = r.pos_before + r.prompt_len + size_t(r.max_new) > ctx;
      const bool expected = r.shape == Shape::Invalid ? res.status.code == r.invalid_code
                                                      : res.status.code == Code::ContextOverflow && overflow_possible;
      if (!expected) {
        bad("unexpected error: " + res.status.message);
        break;
      }
      ++n.errors_expected;
      const size_t want = nt == 0 ? r.pos_before : full - 1;  // the token that did not fit is not fed
      if (pos != want) bad("failed session at " + std::to_string(pos) + ", expected " + std::to_string(want));
      break;
    }
  }
  if (r.canary >= 0) {
    ++n.batch_canaries;
    if (res.tokens != reference_[size_t(r.canary)]) {
      ++n.batch_canary_mismatches;
      if (!cuda_)
        fail(kCanaries, who + "canary '" + canaries_[size_t(r.canary)].what + "' differs from generate() alone");
    }
  }
}

void Soak::collect() {
  for (BatchResult& res : batch_->take_finished()) {
    auto it = inflight_.find(res.id);
    if (it == inflight_.end()) {
      fail(kResults, "a result for unknown id " + std::to_string(res.id));
      continue;
    }
    Request& r = *it->second;
    if (res.session != &r.slot->session) fail(kResults, "result " + std::to_string(res.id) + " names another session");
    ++n.batch_sessions;
    check(r, res);
    release(r.slot);
    inflight_.erase(it);
  }
  if (batch_->size() != inflight_.size())
    fail(kResults, "Batch::size() " + std::to_string(batch_->size()) + " but " + std::to_string(inflight_.size()) +
                       " sessions unfinished");
  if (finished_since_probe_ >= uint64_t(a_.probe_every)) probe();
}

// ---- logits ----

// Engine::step (last-position logits) or forward_batch (Logits::All) on up to 4 idle sessions that hold a
// conversation, with a few random tokens each: every logit must be finite.
void Soak::probe() {
  finished_since_probe_ = 0;
  std::vector<Slot*> live;
  for (auto& s : pool_)
    if (!s->busy && s->session.max_context() - s->session.position() >= 8) live.push_back(s.get());
  std::shuffle(live.begin(), live.end(), rng_);
  if (live.size() > 4) live.resize(4);
  if (live.empty()) {
    Slot* s = take_slot(8, true);
    if (!s) return;
    s->busy = false;
    live.push_back(s);
  }
  // At most ~8 MiB of logits (8 rows of a 262144-token vocabulary): bigger host buffers would move the heap
  // about and blur the memory samples.
  const size_t V = size_t(engine_.config().vocab_size);
  const long most = long(std::max<size_t>(1, std::min<size_t>(8, (size_t(2) << 20) / V / live.size())));
  std::vector<std::vector<int32_t>> toks(live.size());
  std::vector<BatchItem> items;  // [count]
  size_t rows_all = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    toks[i].resize(size_t(uni(1, most)));
    for (auto& t : toks[i]) t = int32_t(uni(0, vocab_ - 1));
    items.push_back(BatchItem{&live[i]->session, toks[i].data(), toks[i].size()});
    rows_all += toks[i].size();
  }
  std::vector<float> logits;  // [rows, vocab] fp32
  const bool use_step = chance(0.5);
  std::vector<int32_t> next(items.size(), -1);  // [count]
  Status st;
  if (use_step) {
    std::vector<SamplingOptions> opts(items.size(), SamplingOptions::greedy());
    opts[0].temperature = 1.f;
    st = engine_.step(items.data(), items.size(), opts.data(), next.data(), &logits);
  } else {
    st = engine_.forward_batch(items.data(), items.size(), Logits::All, &logits);
  }
  ++n.probes;
  if (!st) return fail(kLogits, std::string(use_step ? "step" : "forward_batch") + " probe: " + st.message);
  const size_t rows = use_step ? items.size() : rows_all;
  if (logits.size() != rows * V)
    return fail(kLogits, "probe: " + std::to_string(logits.size()) + " logits for " + std::to_string(rows) + " rows");
  size_t bad = 0;
  for (float x : logits) bad += !std::isfinite(x);
  n.probe_values += logits.size();
  n.nonfinite += bad;
  if (bad) fail(kLogits, "probe: " + std::to_string(bad) + " non-finite logits of " + std::to_string(logits.size()));
  for (size_t i = 0; use_step && i < next.size(); ++i)
    if (next[i] < 0 || next[i] >= int32_t(V)) fail(kLogits, "probe: step sampled id " + std::to_string(next[i]));
}

// ---- canaries and checkpoints ----

void Soak::run_canaries(std::vector<std::vector<int32_t>>* out) {
  out->assign(canaries_.size(), {});
  ++n.canary_runs;
  for (size_t i = 0; i < canaries_.size(); ++i) {
    const Canary& k = canaries_[i];
    Slot* s = k.exact || i % 2 == 0 ? new_slot(k.context) : take_slot(k.context, false);
    if (!s) return;
    s->busy = true;
    if (s->session.position() != 0) s->session.reset();
    const Status st = generate(engine_, s->session, k.prompt, k.options, nullptr, &(*out)[i]);
    if (!st) {
      ++n.canary_mismatches;
      fail(kCanaries, "canary '" + k.what + "': " + st.message);
    } else if ((*out)[i] != reference_[i]) {
      ++n.canary_mismatches;
      fail(kCanaries,
           "canary '" + k.what + "' differs from the fresh engine after " + std::to_string(n.sessions) + " sessions");
    }
    release(s);
  }
}

void Soak::sample_memory() {
  MemSample m;
  m.sessions = n.sessions;
  m.tokens = n.tokens;
  m.seconds = seconds();
  read_proc_status(&m);
  if (cuda_) {
    const bench::DeviceReport d = bench::device_report(engine_.load_options().device);
    if (d.cuda) m.gpu_used = (long long)(d.memory_total - d.memory_free);
  }
  samples.push_back(m);
}

// Drains the batch (or, sometimes, drops it with sessions still in it), runs the canaries when due, empties the
// pool and samples memory: each sample sees the same state -- the engine and no session.
void Soak::checkpoint(bool final) {
  const bool drop = !final && chance(0.25);
  while (!batch_->idle() && (!drop || batch_->size() > 2)) {
    if (Status st = batch_->step(); !st) fail(kResults, "Batch::step: " + st.message);
    ++n.steps;
    collect();
  }
  batch_.reset();
  for (auto& [id, r] : inflight_) {  // left in the dropped batch: they keep what was fed
    const size_t pos = r->slot->session.position();
    if (pos < r->pos_before || pos > r->pos_before + r->prompt_len + size_t(r->max_new))
      fail(kResults, "session " + std::to_string(id) + " dropped with its batch at position " + std::to_string(pos));
    r->slot->busy = false;
    ++n.dropped;
    ++n.sessions;
  }
  inflight_.clear();
  if (final || n.sessions >= next_canary_) {
    std::vector<std::vector<int32_t>> got;
    run_canaries(&got);
    if (final) final_canaries = got;
    next_canary_ = n.sessions + uint64_t(a_.canary_every);
  }
  n.destroyed += pool_.size();
  pool_.clear();
  sample_memory();
  const MemSample& m = samples.back();
  note("%6llu sessions, %8llu tokens, %7.0f tok/s, RssAnon %6.1f MiB, VmRSS %6.1f MiB%s%s, %llu failures",
       (unsigned long long)n.sessions, (unsigned long long)n.tokens, m.seconds > 0 ? double(n.tokens) / m.seconds : 0.0,
       m.anon_kib / 1024.0, m.rss_kib / 1024.0, m.gpu_used >= 0 ? strf(", GPU %.1f MiB", mib(m.gpu_used)).c_str() : "",
       drop ? " (batch dropped)" : "", (unsigned long long)failure_count);
  next_checkpoint_ = n.sessions + uint64_t(a_.sample_every);
  if (!final) new_batch();
}

void Soak::arrivals() {
  // Every 64 steps a new target: now and then a lull, mostly around max-concurrency, above it a queue.
  const long mc = a_.max_concurrency;
  if (n.steps % 64 == 0) target_ = chance(0.2) ? uni(1, mc) : uni(std::max(1L, mc / 2), mc + mc / 2);
  bool first = inflight_.empty();
  while (first || (inflight_.size() < size_t(target_) && chance(0.5))) {
    first = false;
    if (chance(0.04)) {
      plain_generate();
    } else {
      add_request(false);
    }
  }
}

void Soak::run() {
  start_ = Clock::now();
  next_checkpoint_ = uint64_t(a_.sample_every);
  next_canary_ = uint64_t(a_.canary_every);
  new_batch();
  for (;;) {
    // Out of time, or so broken that going on only repeats the same failures.
    const bool time_up = (a_.max_seconds > 0 && seconds() > double(a_.max_seconds)) || failure_count >= 500;
    if (time_up && !targets_met()) stopped_by_time = true;
    const bool more = !targets_met() && !time_up;
    if (more) arrivals();
    collect();  // add() finishes refused prompts at once
    if (batch_->idle() && !more) break;
    if (!batch_->idle()) {
      if (chance(0.015)) cancel_random(false, 0);
      if (Status st = batch_->step(); !st) fail(kResults, "Batch::step: " + st.message);
      ++n.steps;
      collect();
    }
    if (n.sessions >= next_checkpoint_) checkpoint(false);
  }
  checkpoint(true);
  soak_seconds = seconds();
}

// ---- main ----

bool load(const Args& a, size_t max_context, Engine* e) {
  LoadOptions opt;
  opt.backend = a.backend == "cpu" ? Backend::Cpu : a.backend == "cuda" ? Backend::Cuda : Backend::Auto;
  opt.max_context = max_context;
  if (Status st = Engine::load(a.model, opt, e); !st) {
    std::fprintf(stderr, "soak: %s\n", st.message.c_str());
    return false;
  }
  return true;
}

// Canaries with generate() alone, each on a new session of its own size.
bool reference_run(const Engine& e, const std::vector<Canary>& canaries, std::vector<std::vector<int32_t>>* out) {
  out->assign(canaries.size(), {});
  for (size_t i = 0; i < canaries.size(); ++i) {
    Session s;
    Status st = e.create_session(&s, canaries[i].context);
    if (st) st = generate(e, s, canaries[i].prompt, canaries[i].options, nullptr, &(*out)[i]);
    if (!st) {
      std::fprintf(stderr, "soak: canary '%s' on a fresh engine: %s\n", canaries[i].what.c_str(), st.message.c_str());
      return false;
    }
  }
  return true;
}

const char* backend_name(const Engine& e) { return e.backend() == Backend::Cuda ? "cuda" : "cpu"; }

nlohmann::json sample_json(const MemSample& m) {
  return {{"sessions", m.sessions}, {"tokens", m.tokens},   {"seconds", m.seconds},  {"rss_kib", m.rss_kib},
          {"anon_kib", m.anon_kib}, {"hwm_kib", m.hwm_kib}, {"gpu_used", m.gpu_used}};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int rc = parse_args(argc, argv, &a); rc >= 0) return rc;
  const auto t0 = Clock::now();

  // The long-lived engine. Its max_context is the largest session context (it sizes the CUDA graphs' attention
  // splits): --max-context or 1024, reloaded at the model's limit when that is smaller.
  Engine engine;
  size_t max_ctx = a.max_context > 0 ? size_t(a.max_context) : 1024;
  if (!load(a, max_ctx, &engine)) return 1;
  if (const size_t max_pos = size_t(std::max(16, engine.config().max_position_embeddings)); max_ctx > max_pos) {
    max_ctx = max_pos;
    if (!load(a, max_ctx, &engine)) return 1;
  }
  const ModelConfig& cfg = engine.config();
  const std::vector<Canary> canaries = make_canaries(cfg, max_ctx, int(a.canary_tokens));

  // The reference: the canaries on a second, freshly loaded engine, unloaded again before the soak.
  std::vector<std::vector<int32_t>> reference;
  {
    Engine fresh;
    if (!load(a, max_ctx, &fresh) || !reference_run(fresh, canaries, &reference)) return 1;
  }
  std::printf("soak: %s (%d layers, hidden %d, vocab %d, sliding window %d), %s backend, sessions up to %zu tokens\n",
              a.model.c_str(), cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.sliding_window,
              backend_name(engine), max_ctx);
  std::printf("soak: >= %ld sessions and >= %ld generated tokens, concurrency <= %ld, seed %ld, %zu canaries\n",
              a.sessions, a.min_tokens, a.max_concurrency, a.seed, canaries.size());
  std::fflush(stdout);

  Soak soak(engine, a, canaries, reference);
  {  // the long-lived engine before any traffic
    std::vector<std::vector<int32_t>> got;
    soak.run_canaries(&got);
  }
  soak.run();

  // A newly loaded engine at the end: the same canaries, the same tokens.
  std::vector<std::vector<int32_t>> end_fresh;
  bool end_ok = false;
  {
    Engine fresh;
    end_ok = load(a, max_ctx, &fresh) && reference_run(fresh, canaries, &end_fresh);
  }
  if (!end_ok) soak.fail(Soak::kCanaries, "the fresh engine at the end did not run the canaries");
  for (size_t i = 0; end_ok && i < canaries.size(); ++i) {
    const std::string what = "canary '" + canaries[i].what + "': ";
    if (end_fresh[i] != reference[i])
      soak.fail(Soak::kCanaries, what + "a fresh engine at the end differs from the one at the start");
    if (soak.final_canaries.size() != canaries.size() || end_fresh[i] != soak.final_canaries[i])
      soak.fail(Soak::kCanaries, what + "the long-lived engine differs from a fresh one at the end");
  }

  // ---- verdicts ----
  const Counters& n = soak.n;
  const std::vector<MemSample>& s = soak.samples;
  size_t base = 0;  // the first sample after warm-up (the last one when the run is shorter than the warm-up)
  while (base + 1 < s.size() && s[base].sessions < uint64_t(a.warmup)) ++base;
  const MemSample& b = s.at(base);
  const MemSample& last = s.back();
  long max_anon = b.anon_kib, max_rss = b.rss_kib;
  long long max_gpu = b.gpu_used;
  for (size_t i = base; i < s.size(); ++i) {
    max_anon = std::max(max_anon, s[i].anon_kib);
    max_rss = std::max(max_rss, s[i].rss_kib);
    max_gpu = std::max(max_gpu, s[i].gpu_used);
  }
  const double anon_growth = (last.anon_kib - b.anon_kib) / 1024.0;
  const double gpu_growth = last.gpu_used >= 0 ? mib(last.gpu_used - b.gpu_used) : 0.0;
  if (s.size() - base < 2)
    soak.fail(Soak::kMemory, "memory: fewer than 2 samples after warm-up (lower --warmup or --sample-every)");
  if (anon_growth > double(a.rss_limit_mib))
    soak.fail(Soak::kMemory,
              strf("memory: RssAnon grew %.1f MiB after warm-up (limit %ld)", anon_growth, a.rss_limit_mib));
  if (gpu_growth > double(a.gpu_limit_mib))
    soak.fail(Soak::kMemory,
              strf("memory: GPU memory grew %.1f MiB after warm-up (limit %ld)", gpu_growth, a.gpu_limit_mib));
  if (n.probes == 0) soak.fail(Soak::kLogits, "logits: no probe ran (lower --probe-every)");
  const bool mem_ok = soak.failed[Soak::kMemory] == 0, logits_ok = soak.failed[Soak::kLogits] == 0;
  const bool canaries_ok = soak.failed[Soak::kCanaries] == 0, results_ok = soak.failed[Soak::kResults] == 0;
  const bool targets_ok = n.sessions >= uint64_t(a.sessions) && n.tokens >= uint64_t(a.min_tokens);
  const bool all_ok = mem_ok && logits_ok && canaries_ok && results_ok && targets_ok;
  const bool cuda = engine.backend() == Backend::Cuda;
  const double tok_s = soak.soak_seconds > 0 ? double(n.tokens) / soak.soak_seconds : 0;

  std::printf("\n---- soak summary ----\n");
  std::printf(
      "sessions        %llu (batch %llu, generate() %llu, dropped with their batch %llu) in %llu batches, %llu steps\n",
      (unsigned long long)n.sessions, (unsigned long long)n.batch_sessions, (unsigned long long)n.generate_calls,
      (unsigned long long)n.dropped, (unsigned long long)n.batches, (unsigned long long)n.steps);
  std::printf(
      "tokens          %llu generated, %llu prompt; %.1f s, %.0f generated tok/s; max %llu sessions in flight\n",
      (unsigned long long)n.tokens, (unsigned long long)n.prompt_tokens, soak.soak_seconds, tok_s,
      (unsigned long long)n.max_inflight);
  std::printf(
      "finished        stop %llu, length %llu, callback %llu, cancelled %llu (cancel() calls: %llu between steps, "
      "%llu from callbacks), expected errors %llu\n",
      (unsigned long long)n.stop, (unsigned long long)n.length, (unsigned long long)n.callback,
      (unsigned long long)n.cancelled, (unsigned long long)n.cancels_between_steps,
      (unsigned long long)n.cancels_in_callback, (unsigned long long)n.errors_expected);
  std::printf("Session objects created %llu, destroyed %llu, reset %llu, continued %llu; %llu added from callbacks\n",
              (unsigned long long)n.created, (unsigned long long)n.destroyed, (unsigned long long)n.resets,
              (unsigned long long)n.continued, (unsigned long long)n.spawned_in_callback);
  std::printf(
      "memory          %zu samples, baseline at %llu sessions; RssAnon %.1f -> %.1f MiB (max %.1f), VmRSS %.1f -> %.1f "
      "MiB (max %.1f), VmHWM %.1f MiB\n",
      s.size(), (unsigned long long)b.sessions, b.anon_kib / 1024.0, last.anon_kib / 1024.0, max_anon / 1024.0,
      b.rss_kib / 1024.0, last.rss_kib / 1024.0, max_rss / 1024.0, last.hwm_kib / 1024.0);
  if (last.gpu_used >= 0)
    std::printf("GPU memory      %.1f -> %.1f MiB in use (max %.1f)\n", mib(b.gpu_used), mib(last.gpu_used),
                mib(max_gpu));
  std::printf("check memory    %s  RssAnon growth %+.1f MiB (limit %ld)%s\n", mem_ok ? "PASS" : "FAIL", anon_growth,
              a.rss_limit_mib,
              last.gpu_used >= 0 ? strf(", GPU growth %+.1f MiB (limit %ld)", gpu_growth, a.gpu_limit_mib).c_str()
                                 : ", no GPU");
  std::printf("check logits    %s  %llu probes, %llu values, %llu non-finite\n", logits_ok ? "PASS" : "FAIL",
              (unsigned long long)n.probes, (unsigned long long)n.probe_values, (unsigned long long)n.nonfinite);
  std::printf(
      "check canaries  %s  %zu canaries x %llu runs on the long-lived engine + a fresh engine at the end; %llu in the "
      "batch, %llu differ%s\n",
      canaries_ok ? "PASS" : "FAIL", canaries.size(), (unsigned long long)n.canary_runs,
      (unsigned long long)n.batch_canaries, (unsigned long long)n.batch_canary_mismatches,
      cuda ? " (CUDA: batched rounding allowed, not checked)" : "");
  std::printf("check results   %s  %llu sessions checked, %llu failures\n", results_ok ? "PASS" : "FAIL",
              (unsigned long long)n.sessions, (unsigned long long)soak.failed[Soak::kResults]);
  std::printf("check targets   %s  %llu/%ld sessions, %llu/%ld tokens%s\n", targets_ok ? "PASS" : "FAIL",
              (unsigned long long)n.sessions, a.sessions, (unsigned long long)n.tokens, a.min_tokens,
              soak.stopped_by_time ? " (stopped early: --max-seconds, or too many failures)" : "");
  for (const std::string& f : soak.failures) std::printf("  failure: %s\n", f.c_str());
  std::printf("soak: %s (%.1f s in all)\n", all_ok ? "PASS" : "FAIL",
              std::chrono::duration<double>(Clock::now() - t0).count());

  if (!a.json.empty()) {
    nlohmann::json j;
    j["schema"] = "gemma4_t4.soak/1";
    j["version"] = GEMMA4_T4_VERSION_STRING;
    j["timestamp"] = bench::utc_timestamp();
    j["model"] = a.model;
    j["backend"] = backend_name(engine);
    j["options"] = {{"sessions", a.sessions},
                    {"min_tokens", a.min_tokens},
                    {"seed", a.seed},
                    {"max_concurrency", a.max_concurrency},
                    {"max_context", max_ctx},
                    {"max_new_tokens", a.max_new_tokens},
                    {"canary_tokens", a.canary_tokens},
                    {"warmup", a.warmup},
                    {"sample_every", a.sample_every},
                    {"canary_every", a.canary_every},
                    {"probe_every", a.probe_every},
                    {"rss_limit_mib", a.rss_limit_mib},
                    {"gpu_limit_mib", a.gpu_limit_mib},
                    {"max_seconds", a.max_seconds}};
    j["sessions"] = {{"total", n.sessions},  {"batch", n.batch_sessions}, {"generate", n.generate_calls},
                     {"dropped", n.dropped}, {"created", n.created},      {"destroyed", n.destroyed},
                     {"reset", n.resets},    {"continued", n.continued},  {"max_in_flight", n.max_inflight}};
    j["tokens"] = {
        {"generated", n.tokens}, {"prompt", n.prompt_tokens}, {"seconds", soak.soak_seconds}, {"tok_s", tok_s}};
    j["finish"] = {{"stop", n.stop},
                   {"length", n.length},
                   {"callback", n.callback},
                   {"cancelled", n.cancelled},
                   {"cancelled_between_steps", n.cancels_between_steps},
                   {"cancelled_from_callbacks", n.cancels_in_callback},
                   {"expected_errors", n.errors_expected}};
    nlohmann::json samples = nlohmann::json::array();
    for (const MemSample& m : s) samples.push_back(sample_json(m));
    j["memory"] = {{"samples", samples},           {"baseline", sample_json(b)},
                   {"last", sample_json(last)},    {"anon_growth_mib", anon_growth},
                   {"gpu_growth_mib", gpu_growth}, {"max_anon_kib", max_anon},
                   {"max_rss_kib", max_rss},       {"max_gpu_used", max_gpu}};
    j["probes"] = {{"count", n.probes}, {"values", n.probe_values}, {"nonfinite", n.nonfinite}};
    j["canaries"] = {{"count", canaries.size()},
                     {"runs", n.canary_runs},
                     {"mismatches", n.canary_mismatches},
                     {"in_batch", n.batch_canaries},
                     {"in_batch_differing", n.batch_canary_mismatches}};
    j["checks"] = {{"memory", mem_ok},
                   {"logits", logits_ok},
                   {"canaries", canaries_ok},
                   {"results", results_ok},
                   {"targets", targets_ok}};
    j["failures"] = soak.failures;
    j["pass"] = all_ok;
    if (Status st = bench::write_file(a.json, j.dump(2) + "\n"); !st) {
      std::fprintf(stderr, "soak: %s\n", st.message.c_str());
      return 1;
    }
  }
  return all_ok ? 0 : 1;
}
