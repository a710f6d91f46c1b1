// gemma4_t4 implementation part: generate() -- the prefill + sample + feed loop over Engine::step.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace gemma4_t4 {

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
  if (options.max_new_tokens == 0) {  // only extend the cache
    BatchItem item{&session, prompt.data(), prompt.size()};
    return engine.forward_batch(&item, 1, Logits::None, nullptr);
  }
  const Clock::time_point start = Clock::now();
  Clock::time_point first = start;
  std::vector<int32_t> feed = prompt;
  for (int i = 0; i < options.max_new_tokens; ++i) {
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
    const bool more = (!on_token || on_token(next)) && i + 1 < options.max_new_tokens;
    if (!more) {  // the last token is fed too: the session holds prompt + out
      BatchItem last{&session, &next, 1};
      return engine.forward_batch(&last, 1, Logits::None, nullptr);
    }
    feed.assign(1, next);
  }
  return Status::ok();
}

}  // namespace gemma4_t4
