// gemma4_t4 implementation part: generate() -- the prefill + sample + feed loop over Engine::step.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

namespace gemma4_t4 {

namespace detail {

inline bool cancel_requested(const GenerateOptions& o) { return o.cancel && o.cancel->load(std::memory_order_acquire); }

// Runs a user callback that returns bool into *result. true: it threw instead -- the exception stops here,
// *thrown gets its what() (generate() and Batch turn it into Code::CallbackError).
template <typename F>
bool callback_threw(F&& f, bool* result, std::string* thrown) {
  try {
    *result = f();
    return false;
  } catch (const std::exception& e) {
    *thrown = e.what();
  } catch (...) {
    *thrown = "an exception that is not a std::exception";
  }
  return true;
}

}  // namespace detail

Status generate(const Engine& engine, Session& session, const std::vector<int32_t>& prompt,
                const GenerateOptions& options, const std::function<bool(int32_t token)>& on_token,
                std::vector<int32_t>* out, Timing* timing) {
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  if (!engine.loaded()) return detail::err(Code::InvalidArgument, "generate: engine is not loaded");
  if (prompt.empty()) return detail::err(Code::InvalidArgument, "generate: empty prompt");
  if (options.max_new_tokens < 0) return detail::err(Code::InvalidArgument, "generate: max_new_tokens < 0");
  std::vector<int32_t> stops = options.stop_tokens;
  if (options.stop_at_eos) {
    const auto& eos = engine.config().eos_token_ids;
    stops.insert(stops.end(), eos.begin(), eos.end());
  }
  Timing t;
  t.prompt_tokens = prompt.size();
  if (timing) *timing = t;
  const auto cancelled = [&](size_t sampled) {
    return detail::err(Code::Cancelled, "generate: cancelled (GenerateOptions::cancel) after ", sampled,
                       " sampled tokens");
  };
  if (detail::cancel_requested(options)) return cancelled(0);
  if (options.max_new_tokens == 0) {  // only extend the cache
    BatchItem item{&session, prompt.data(), prompt.size()};
    return engine.forward_batch(&item, 1, Logits::None, nullptr);
  }
  const Clock::time_point start = Clock::now();
  Clock::time_point first = start;
  std::vector<int32_t> feed = prompt;
  for (int i = 0; i < options.max_new_tokens; ++i) {
    if (i > 0 && detail::cancel_requested(options)) return cancelled(t.generated_tokens);  // feed not fed
    BatchItem item{&session, feed.data(), feed.size()};
    int32_t next = -1;
    GEMMA4_T4_TRY(engine.step(&item, 1, &options.sampling, &next));
    ++t.generated_tokens;
    const Clock::time_point now = Clock::now();
    if (i == 0) {
      first = now;
      t.ttft_ms = ms(start, now);
    } else {
      t.decode_ms = ms(first, now);
    }
    if (timing) *timing = t;
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    if (out) out->push_back(next);
    bool go_on = true;
    std::string thrown;
    if (on_token && detail::callback_threw([&] { return on_token(next); }, &go_on, &thrown))
      return detail::err(Code::CallbackError, "generate: on_token threw on sampled token ", t.generated_tokens, " (id ",
                         next, "): ", thrown);  // `next` stays unfed, as after a cancel
    const bool more = go_on && i + 1 < options.max_new_tokens;
    if (!more) {  // the last token is fed too: the session holds prompt + out
      BatchItem last{&session, &next, 1};
      return engine.forward_batch(&last, 1, Logits::None, nullptr);
    }
    feed.assign(1, next);
  }
  return Status::ok();
}

}  // namespace gemma4_t4
