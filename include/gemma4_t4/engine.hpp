// gemma4_t4 implementation part: Engine and Session (the public API over the backends).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gemma4_t4 {

struct Engine::Impl {
  std::string dir;
  LoadOptions options;
  ModelConfig config;
  detail::TensorStore store;  // owns the mappings every view below points into
  detail::Weights weights;
  std::unique_ptr<detail::BackendModel> backend;
};

struct Session::Impl {
  const Engine::Impl* owner = nullptr;
  std::unique_ptr<detail::BackendSession> state;
  std::vector<int32_t> history;  // every token fed, for the repetition penalty
};

// ---- Session ----

Session::Session() = default;
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

bool Session::valid() const { return impl_ != nullptr; }
size_t Session::position() const { return impl_ ? impl_->state->pos : 0; }
size_t Session::max_context() const { return impl_ ? impl_->state->max_ctx : 0; }
void Session::reset() {
  if (!impl_) return;
  impl_->state->pos = 0;  // stale cache entries are never read: attention only looks below pos
  impl_->history.clear();
}

// ---- Engine ----

Engine::Engine() = default;
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

bool Engine::loaded() const { return impl_ != nullptr; }
const ModelConfig& Engine::config() const { return impl_->config; }
Backend Engine::backend() const { return impl_ ? impl_->backend->kind() : Backend::Cpu; }
std::string Engine::decode_path() const { return impl_ ? impl_->backend->decode_path() : std::string(); }
double Engine::decode_bytes_per_token() const {
  return impl_ ? impl_->weights.decode_bytes(impl_->options.lm_head) : 0.0;
}
size_t Engine::weight_bytes() const { return impl_ ? impl_->backend->weight_bytes() : 0; }
size_t Engine::kv_bytes_per_token() const { return impl_ ? impl_->backend->kv_bytes_per_token() : 0; }
size_t Engine::session_bytes(size_t max_context) const {
  if (!impl_) return 0;
  return impl_->backend->session_bytes(max_context ? max_context : impl_->options.max_context);
}
const LoadOptions& Engine::load_options() const { return impl_->options; }

namespace detail {

// What LoadOptions::on_progress threw, carried out of the load (Engine::load makes it Code::CallbackError).
struct CallbackFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline Status load_impl(const std::string& dir, const LoadOptions& options, std::unique_ptr<Engine::Impl>* out) {
  auto impl = std::make_unique<Engine::Impl>();
  impl->dir = dir;
  impl->options = options;
  if (options.max_context == 0) return err(Code::InvalidArgument, "LoadOptions::max_context must be > 0");
  if (options.max_pass_rows < 64 || options.max_pass_rows > 16384)  // checked whatever the backend
    return err(Code::InvalidArgument, "LoadOptions::max_pass_rows is ", options.max_pass_rows,
               "; it must be in [64, 16384]");
  if (options.on_progress) options.on_progress(0.f);
  std::string text;
  const std::string cfg_path = path_join(dir, "config.json");
  GEMMA4_T4_TRY(read_text_file(cfg_path, &text));
  GEMMA4_T4_TRY(parse_config(text, cfg_path, &impl->config));
  GEMMA4_T4_TRY(impl->store.open(dir));
  WeightBinder binder(impl->store, impl->config, dir);
  GEMMA4_T4_TRY(binder.bind(&impl->weights));
  GEMMA4_T4_TRY(impl->store.check_sizes());  // still whole before the backend reads the weights

  Backend want = options.backend;
#ifdef GEMMA4_T4_NO_CUDA
  if (want == Backend::Cuda)
    return err(Code::Unsupported, dir, ": this build has no CUDA backend (compile the implementation with nvcc)");
  want = Backend::Cpu;
#else
  if (want == Backend::Auto) want = cuda_usable(options.device) ? Backend::Cuda : Backend::Cpu;
  if (want == Backend::Cuda) {
    auto cuda = std::make_unique<CudaBackend>();
    GEMMA4_T4_TRY(cuda->init(impl->config, impl->weights, options, dir));
    impl->backend = std::move(cuda);
  }
#endif
  if (want == Backend::Cpu) {
    auto cpu = std::make_unique<CpuBackend>();
    GEMMA4_T4_TRY(cpu->init(impl->config, impl->weights, options.lm_head));
    impl->backend = std::move(cpu);
  }
  if (options.on_progress) options.on_progress(1.f);
  *out = std::move(impl);
  return Status::ok();
}

}  // namespace detail

Status Engine::load(const std::string& dir, const LoadOptions& options, Engine* out) {
  if (!out) return detail::err(Code::InvalidArgument, "Engine::load: out is null");
  std::unique_ptr<Impl> impl;
  LoadOptions opt = options;  // on_progress wrapped: what it throws is told apart from the loader's errors
  if (options.on_progress)
    opt.on_progress = [user = options.on_progress](float f) {
      try {
        user(f);
      } catch (const std::exception& e) {
        throw detail::CallbackFailure(e.what());
      } catch (...) {
        throw detail::CallbackFailure("an exception that is not a std::exception");
      }
    };
  try {
    GEMMA4_T4_TRY(detail::load_impl(dir, opt, &impl));
  } catch (const detail::CallbackFailure& e) {
    return detail::err(Code::CallbackError, dir, ": load stopped: LoadOptions::on_progress threw: ", e.what());
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, dir, ": out of host memory while loading");
  } catch (const std::exception& e) {
    return detail::err(Code::BackendError, dir, ": unexpected error while loading: ", e.what());
  } catch (...) {
    return detail::err(Code::BackendError, dir, ": unexpected exception while loading");
  }
  impl->options = options;  // as passed (load_impl kept the wrapped on_progress)
  out->impl_ = std::move(impl);
  return Status::ok();
}

Status Engine::create_session(Session* out, size_t max_context) const {
  if (!impl_) return detail::err(Code::InvalidArgument, "create_session: engine is not loaded");
  if (!out) return detail::err(Code::InvalidArgument, "create_session: out is null");
  const size_t ctx = max_context ? max_context : impl_->options.max_context;
  if (ctx > size_t(impl_->config.max_position_embeddings))
    return detail::err(Code::InvalidArgument, "create_session: max_context ", ctx,
                       " exceeds the model's max_position_embeddings ", impl_->config.max_position_embeddings);
  try {
    auto s = std::make_unique<Session::Impl>();
    s->owner = impl_.get();
    GEMMA4_T4_TRY(impl_->backend->new_session(ctx, &s->state));
    out->impl_ = std::move(s);
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, "create_session: out of host memory for a ", ctx, "-token KV cache");
  }
  return Status::ok();
}

Status Engine::forward(Session& session, const int32_t* tokens, size_t n, Logits which,
                       std::vector<float>* logits) const {
  BatchItem item;
  item.session = &session;
  item.tokens = tokens;
  item.n = n;
  return forward_batch(&item, 1, which, logits);
}

namespace detail {

// Every id in range of the token embeddings (and of the per-layer table, which may be smaller).
inline Status check_token_ids(const ModelConfig& cfg, const int32_t* tokens, size_t n, const char* where) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || id >= cfg.vocab_size || (cfg.hidden_size_per_layer_input > 0 && id >= cfg.vocab_size_per_layer_input))
      return err(Code::InvalidArgument, where, "token ", i, " has id ", id, ", outside the vocabulary [0, ",
                 cfg.vocab_size, ")");
  }
  return Status::ok();
}

// Checks a batch (engine loaded, sessions ours and distinct, ids in range, context) and lowers it.
inline Status prepare_batch(const Engine::Impl* impl, const BatchItem* items, size_t count,
                            std::vector<ForwardItem>* out) {
  if (!impl) return err(Code::InvalidArgument, "forward: engine is not loaded");
  if (count == 0 || !items) return err(Code::InvalidArgument, "forward: empty batch");
  const ModelConfig& cfg = impl->config;
  out->resize(count);
  for (size_t b = 0; b < count; ++b) {
    const BatchItem& it = items[b];
    if (!it.session || !it.session->valid()) return err(Code::InvalidArgument, "forward: item ", b, " has no session");
    for (size_t c = 0; c < b; ++c)
      if (items[c].session == it.session)
        return err(Code::InvalidArgument, "forward: items ", c, " and ", b, " are the same session");
    if (it.n == 0 || !it.tokens) return err(Code::InvalidArgument, "forward: item ", b, " has no tokens");
    GEMMA4_T4_TRY(check_token_ids(cfg, it.tokens, it.n, "forward: "));
    (*out)[b] = ForwardItem{nullptr, it.tokens, it.n};
  }
  return Status::ok();
}

}  // namespace detail

Status Engine::forward_batch(const BatchItem* items, size_t count, Logits which, std::vector<float>* logits) const {
  if (which != Logits::None && !logits) return detail::err(Code::InvalidArgument, "forward: logits output is null");
  std::vector<detail::ForwardItem> fwd;
  GEMMA4_T4_TRY(detail::prepare_batch(impl_.get(), items, count, &fwd));
  GEMMA4_T4_TRY(bind_sessions(items, count, &fwd));
  GEMMA4_T4_TRY(impl_->backend->check_files(impl_->store));
  if (logits) logits->clear();
  try {
    GEMMA4_T4_TRY(impl_->backend->forward(fwd.data(), count, which, logits));
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, "forward: out of host memory");
  }
  record_history(items, count);
  return Status::ok();
}

Status Engine::step(const BatchItem* items, size_t count, const SamplingOptions* options, int32_t* next,
                    std::vector<float>* logits) const {
  if (!next) return detail::err(Code::InvalidArgument, "step: next is null");
  std::vector<detail::ForwardItem> fwd;
  GEMMA4_T4_TRY(detail::prepare_batch(impl_.get(), items, count, &fwd));
  GEMMA4_T4_TRY(bind_sessions(items, count, &fwd));
  std::vector<detail::SampleItem> samples(count);
  for (size_t b = 0; b < count; ++b) {
    detail::SampleItem& si = samples[b];
    si.options = options ? options[b] : SamplingOptions::greedy();
    si.counter = fwd[b].session->pos + fwd[b].n;
    if (si.options.repetition_penalty != 1.f) {
      const auto& h = items[b].session->impl_->history;
      si.seen.assign(h.begin(), h.end());
      si.seen.insert(si.seen.end(), items[b].tokens, items[b].tokens + items[b].n);
      std::sort(si.seen.begin(), si.seen.end());
      si.seen.erase(std::unique(si.seen.begin(), si.seen.end()), si.seen.end());
    }
  }
  GEMMA4_T4_TRY(impl_->backend->check_files(impl_->store));
  if (logits) logits->clear();
  try {
    GEMMA4_T4_TRY(impl_->backend->step(fwd.data(), count, samples.data(), next, logits));
  } catch (const std::bad_alloc&) {
    return detail::err(Code::OutOfMemory, "step: out of host memory");
  }
  record_history(items, count);
  return Status::ok();
}

Status Engine::copy_prefix(const Session& src, Session& dst, size_t n) const {
  if (!impl_) return detail::err(Code::InvalidArgument, "copy_prefix: engine is not loaded");
  if (!src.valid() || !dst.valid()) return detail::err(Code::InvalidArgument, "copy_prefix: invalid session");
  if (src.impl_->owner != impl_.get() || dst.impl_->owner != impl_.get())
    return detail::err(Code::InvalidArgument, "copy_prefix: a session was not created by this engine");
  if (&src == &dst) return detail::err(Code::InvalidArgument, "copy_prefix: source and destination are one session");
  const detail::BackendSession& s = *src.impl_->state;
  detail::BackendSession& d = *dst.impl_->state;
  if (n > s.pos)
    return detail::err(Code::InvalidArgument, "copy_prefix: ", n, " tokens asked, the source session holds ", s.pos);
  if (n > d.max_ctx)
    return detail::err(Code::InvalidArgument, "copy_prefix: ", n, " tokens pass the destination's context of ",
                       d.max_ctx);
  const std::vector<int32_t>& h = src.impl_->history;
  std::vector<int32_t> history(h.begin(), h.begin() + std::ptrdiff_t(std::min(n, h.size())));
  if (Status st = impl_->backend->copy_prefix(s, d, n); !st) {
    if (d.pos == 0) dst.impl_->history.clear();  // a failed device copy leaves dst empty
    return st;
  }
  dst.impl_->history = std::move(history);
  return Status::ok();
}

// The backend's plan (warm_up_plan) through the public API, in scratch sessions: the engine's other state is
// untouched but for what first use would have done anyway (graphs captured, kernels loaded).
Status Engine::warm_up(size_t max_sessions) const {
  if (!impl_) return detail::err(Code::InvalidArgument, "warm_up: engine is not loaded");
  const detail::BackendModel::WarmUp plan = impl_->backend->warm_up_plan();
  const ModelConfig& c = impl_->config;
  const size_t ctx = std::min(impl_->options.max_context, size_t(c.max_position_embeddings));
  // token ids: any valid ones (a pass's cost does not depend on them), spread over the vocabulary
  int32_t ids_end = c.vocab_size;
  if (c.hidden_size_per_layer_input > 0) ids_end = std::min(ids_end, c.vocab_size_per_layer_input);
  auto id = [&](size_t i) { return int32_t(1 + (i * 7919) % size_t(std::max(ids_end - 1, 1))); };
  int32_t next = 0;
  // one scratch session for every prompt, as long as the longest that fits (not max_context: a long-context
  // engine would allocate that whole KV cache for a moment)
  size_t longest = 0;
  for (const int len : plan.prompts)
    if (len >= 1 && size_t(len) <= ctx) longest = std::max(longest, size_t(len));
  Session s;
  for (const int len : plan.prompts) {
    if (len < 1 || size_t(len) > ctx) continue;
    if (!s.valid()) GEMMA4_T4_TRY(create_session(&s, longest));
    s.reset();
    std::vector<int32_t> prompt(static_cast<size_t>(len));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = id(i);
    const BatchItem it{&s, prompt.data(), prompt.size()};
    if (Status st = step(&it, 1, nullptr, &next); !st) return detail::err(st.code, "warm_up: ", st.message);
  }
  std::vector<Session> d;
  std::vector<BatchItem> items;
  std::vector<int32_t> tok, out;
  for (const int n : plan.decode_rows) {
    if (n < 1 || (max_sessions > 0 && size_t(n) > max_sessions)) continue;
    while (d.size() < size_t(n)) {
      d.emplace_back();
      GEMMA4_T4_TRY(create_session(&d.back(), 1));
    }
    items.resize(size_t(n));
    tok.resize(size_t(n));
    out.resize(size_t(n));
    for (size_t b = 0; b < size_t(n); ++b) {
      d[b].reset();
      tok[b] = id(b);
      items[b] = BatchItem{&d[b], &tok[b], 1};
    }
    if (Status st = step(items.data(), items.size(), nullptr, out.data()); !st)
      return detail::err(st.code, "warm_up: a decode step of ", n, " sessions: ", st.message);
  }
  return Status::ok();
}

// Sessions must belong to this engine and have room for their tokens.
Status Engine::bind_sessions(const BatchItem* items, size_t count, std::vector<detail::ForwardItem>* lowered) const {
  std::vector<detail::ForwardItem>& fwd = *lowered;
  for (size_t b = 0; b < count; ++b) {
    Session::Impl* si = items[b].session->impl_.get();
    if (si->owner != impl_.get())
      return detail::err(Code::InvalidArgument, "forward: item ", b, ": session was not created by this engine");
    detail::BackendSession& s = *si->state;
    if (s.pos + items[b].n > s.max_ctx)
      return detail::err(Code::ContextOverflow, "forward: ", items[b].n, " tokens at position ", s.pos,
                         " pass the session's context of ", s.max_ctx, " tokens");
    fwd[b].session = &s;
  }
  return Status::ok();
}

void Engine::record_history(const BatchItem* items, size_t count) const {
  for (size_t b = 0; b < count; ++b) {
    auto& h = items[b].session->impl_->history;
    h.insert(h.end(), items[b].tokens, items[b].tokens + items[b].n);
  }
}

// ---- testing hooks (backend.hpp holds the state) ----

void detail::set_alloc_fault_hook(std::function<bool(size_t bytes, const char* what)> hook) {
  AllocFaultHook& h = alloc_fault_hook();
  std::lock_guard<std::mutex> lock(h.mu);
  h.fn = std::move(hook);
  h.armed.store(static_cast<bool>(h.fn), std::memory_order_release);
}

size_t detail::live_cuda_allocations() { return alloc_fault_hook().live.load(std::memory_order_acquire); }

}  // namespace gemma4_t4
