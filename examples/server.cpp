// server: an OpenAI-compatible HTTP server on gemma4_t4 (continuous batching through one Batch).
//
//   server [options]                        default: the bundled tiny model on http://127.0.0.1:8080
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (both with "stream": server-sent events ending
// with "data: [DONE]"), GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text).
// Errors are OpenAI's JSON ({"error": {"message", "type", "param", "code"}}) with the HTTP status of their
// class: 400 bad request, 401 API key, 404 model or path, 408 body too slow, 413 body too large, 429 queue full,
// 500 generation failed, 503 shutting down.
//
// Threads: httplib's pool runs the handlers (each request holds one thread until its response is written); one
// driver thread runs the engine (examples/server/driver.hpp); one thread waits for SIGINT/SIGTERM. On a signal
// the server refuses new generations (503), lets those in flight finish for --shutdown-timeout seconds, cancels
// the rest (streams end with an error event and [DONE], other requests get 503), waits for their responses to
// be written and exits 0. A second signal cancels at once.
//
// Build: needs cpp-httplib (Debian: libcpp-httplib-dev); CMake builds this target only when it finds it.

#include <dirent.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "gemma4_t4.hpp"
#include "server/driver.hpp"
#include "server/openai.hpp"

namespace {

using server::api_error;
using server::ApiError;
using server::Json;

const char kUsage[] =
    "usage: server [options]\n"
    "\n"
    "An OpenAI-compatible server: POST /v1/chat/completions, POST /v1/completions (\"stream\": true for\n"
    "server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
    "\n";

const char kRequestFields[] =
    "\n"
    "Request fields: OpenAI's (model, messages, prompt, stream, stream_options.include_usage, max_tokens,\n"
    "max_completion_tokens, temperature, top_p, seed, stop, n = 1) plus vLLM's top_k, min_p,\n"
    "repetition_penalty, ignore_eos, skip_special_tokens, add_special_tokens, return_token_ids and\n"
    "chat_template_kwargs.enable_thinking (Gemma 4 thinking; the thought comes back as reasoning_content).\n"
    "Without a seed a request draws a random one (--seed N sets a fixed default). --max-tokens sets the\n"
    "default completion length.\n"
    "\n"
    "Exit status: 0 after a clean shutdown, 1 an error (message on stderr), 2 bad command line.\n";

struct Options {
  std::string host = "127.0.0.1";
  long port = 8080;
  std::string api_key, model_name;
  long parallel = 64, max_queue = 64, prefill_rows = 0, prefill_sessions = 1, prefix_cache = 8, prefix_min = 256;
  long max_body = 4 << 20, read_timeout = 10, body_timeout = 30, keep_alive = 5, shutdown_timeout = 30;
  long threads = 0;
  bool log_requests = false, log_steps = false, prefill_priority = false, warm_up = true;
  bool seed_given = false;
};

// ---- the connection of a request ----
// httplib 0.11 (Debian 12) gives a handler no handle on its connection, so a non-streamed request could not see
// its client leave. The handler's socket is the one whose local and peer addresses are the request's: found
// once per request in /proc/self/fd (Linux), then polled. -1 when not found (the request then runs to its end).
int connection_fd(const httplib::Request& req) {
  auto endpoint = [](const sockaddr_storage& a, std::string* ip, int* port) {
    char buf[INET6_ADDRSTRLEN] = "";
    if (a.ss_family == AF_INET) {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
      inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof buf);
      *port = ntohs(v4.sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
      inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof buf);
      *port = ntohs(v6.sin6_port);
    } else {
      return false;
    }
    *ip = buf;
    return true;
  };
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* d = readdir(dir)) {
    const int fd = std::atoi(d->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    std::string lip, pip;
    int lport = 0, pport = 0;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || !endpoint(local, &lip, &lport) ||
        lport != req.local_port || getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
        !endpoint(peer, &pip, &pport) || pport != req.remote_port || pip != req.remote_addr)
      continue;
    found = fd;
    break;
  }
  closedir(dir);
  return found;
}

// The peer closed the connection (EOF or error), as far as can be told without reading.
bool peer_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// ---- the server ----

class Server {
 public:
  Server(example::Loaded& model, const Options& o, const server::DriverOptions& d)
      : model_(model), opt_(o), driver_(model.engine, d, &metrics_) {
    const gemma4_t4::ModelConfig& cfg = model.engine.config();
    info_.model_name = o.model_name;
    info_.context = d.context;
    info_.default_max_tokens = model.generate.max_new_tokens > 0 ? model.generate.max_new_tokens : 512;
    // ids a prompt may hold: what the model embeds (a smaller tokenizer only leaves later ids without text)
    info_.vocab_size = cfg.vocab_size;
    if (cfg.hidden_size_per_layer_input > 0)
      info_.vocab_size = std::min(info_.vocab_size, cfg.vocab_size_per_layer_input);
    info_.bos_id = cfg.bos_token_id;
    info_.defaults = model.generate;
    turn_id_ = model.tokenizer.token_id("<|turn>");
    created_ = int64_t(std::time(nullptr));
  }

  void install(httplib::Server& svr) {
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opt_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      const std::string want = "Bearer " + opt_.api_key;
      if (req.get_header_value("Authorization") == want) return httplib::Server::HandlerResponse::Unhandled;
      const bool given = req.has_header("Authorization");
      reply_and_close(
          res, api_error(401, "invalid_api_key",
                         given ? "Incorrect API key provided" : "Missing API key: send \"Authorization: Bearer KEY\""));
      return httplib::Server::HandlerResponse::Handled;
    });
    svr.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.get_header_value_count("Content-Length") && body_too_large(req)) {
        set_error(res, too_large());
        return 413;
      }
      return 100;
    });
    svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
      ApiError e = res.status == 404 ? api_error(404, "not_found", "Unknown path: " + req.method + " " + req.path)
                   : res.status == 413
                       ? api_error(413, "request_too_large", "The request body is too large")
                       : api_error(res.status, "bad_request", "Bad request (HTTP " + std::to_string(res.status) + ")");
      set_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }));
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      std::fprintf(stderr, "server: handler threw: %s\n", what.c_str());
      set_error(res, api_error(500, "server_error", "Internal error: " + what));
    });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      static const char* const kKnown[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                           "/metrics"};
      std::string endpoint = "other";
      for (const char* k : kKnown)
        if (req.path == k) endpoint = k;
      if (req.path.rfind("/v1/models/", 0) == 0) endpoint = "/v1/models";
      {
        std::lock_guard<std::mutex> lock(metrics_.mu);
        ++metrics_.requests[{endpoint, res.status}];
      }
      if (opt_.log_requests)
        std::fprintf(stderr, "server: %s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
    });

    svr.Post("/v1/chat/completions",
             [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
               generate(req, res, reader, server::Endpoint::Chat);
             });
    svr.Post("/v1/completions",
             [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
               generate(req, res, reader, server::Endpoint::Completion);
             });
    // Any other POST: 404 without reading the body.
    svr.Post(".*", [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
      reply_and_close(res, api_error(404, "not_found", "Unknown path: POST " + req.path));
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      set_json(res, Json{{"object", "list"}, {"data", Json::array({model_json()})}});
    });
    svr.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] == opt_.model_name) return set_json(res, model_json());
      set_error(res,
                api_error(404, "model_not_found", "The model '" + req.matches[1].str() + "' does not exist", "model"));
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (shutting_down_.load()) return set_error(res, api_error(503, "shutting_down", "The server is shutting down"));
      set_json(res, Json{{"status", "ok"}});
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.render(), "text/plain; version=0.0.4");
    });
  }

  server::Driver& driver() { return driver_; }
  std::atomic<bool>& shutting_down() { return shutting_down_; }
  int open_responses() const { return open_responses_.load(); }

 private:
  // ---- responses ----

  static void set_json(httplib::Response& res, const Json& j) { res.set_content(server::dump(j), "application/json"); }
  static void set_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    set_json(res, server::error_json(e));
  }
  // An error sent before the request body was read: the connection is closed after it (what is left of the body
  // must not be read as the next request). A provider that writes the body and reports failure makes httplib
  // close the connection once the response is out.
  static void reply_and_close(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    res.set_header("Connection", "close");
    auto body = std::make_shared<std::string>(server::dump(server::error_json(e)));
    res.set_content_provider(body->size(), "application/json",
                             [body](size_t offset, size_t length, httplib::DataSink& sink) {
                               sink.write(body->data() + offset, length);
                               return false;  // done; and close the connection
                             });
  }

  bool body_too_large(const httplib::Request& req) const {
    const std::string v = req.get_header_value("Content-Length");
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    return !v.empty() && end && *end == '\0' && n > (unsigned long long)opt_.max_body;
  }
  ApiError too_large() const {
    return api_error(
        413, "request_too_large",
        "The request body is larger than this server's limit of " + std::to_string(opt_.max_body) + " bytes");
  }

  Json model_json() const {
    return Json{{"id", opt_.model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "gemma4_t4"},
                {"max_model_len", info_.context},
                {"vocab_size", info_.vocab_size}};
  }

  // Reads the body within the limits: false after answering (413, 408, 400) with the connection closed.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string* body) {
    if (body_too_large(req)) {
      reply_and_close(res, too_large());
      return false;
    }
    const auto deadline = server::Clock::now() + std::chrono::seconds(opt_.body_timeout);
    bool over = false, late = false;
    const bool ok = reader([&](const char* data, size_t n) {
      if (body->size() + n > size_t(opt_.max_body)) return !(over = true);
      if (server::Clock::now() > deadline) return !(late = true);
      body->append(data, n);
      return true;
    });
    if (ok && server::Clock::now() <= deadline) return true;
    if (over) {
      reply_and_close(res, too_large());
    } else if (late || server::Clock::now() > deadline) {
      reply_and_close(
          res, api_error(408, "timeout",
                         "The request body took longer than " + std::to_string(opt_.body_timeout) + " s to arrive"));
    } else {
      reply_and_close(res, api_error(400, "incomplete_body",
                                     "The request body ended early or stalled for longer than " +
                                         std::to_string(opt_.read_timeout) + " s"));
    }
    return false;
  }

  // ---- generation ----

  void generate(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                server::Endpoint endpoint) {
    const server::Clock::time_point arrival = server::Clock::now();
    std::string body;
    if (!read_body(req, res, reader, &body)) return;
    if (!server::json_depth_ok(body, 64))
      return set_error(res, api_error(400, "invalid_json", "The request body nests deeper than 64 levels"));
    const Json j = Json::parse(body, nullptr, false);
    if (j.is_discarded()) return set_error(res, api_error(400, "invalid_json", "The request body is not valid JSON"));
    server::Request r;
    ApiError err;
    if (!server::parse_request(j, endpoint, info_, &r, &err)) return set_error(res, err);

    // the prompt's tokens
    auto job = std::make_shared<server::Job>();
    job->arrival = arrival;
    if (!tokenize(r, &job->prompt, &job->cache_prefix, &err)) return set_error(res, err);
    const size_t P = job->prompt.size(), C = info_.context;
    if (P == 0) return set_error(res, api_error(400, "invalid_value", "The prompt is empty", "prompt"));
    if (P + 1 > C || (r.max_tokens > 0 && P + size_t(r.max_tokens) > C)) {
      return set_error(
          res,
          api_error(400, "context_length_exceeded",
                    "This model's maximum context length is " + std::to_string(C) + " tokens. However, you requested " +
                        std::to_string(P + size_t(std::max(r.max_tokens, 1))) + " tokens (" + std::to_string(P) +
                        " in the prompt, " + std::to_string(std::max(r.max_tokens, 1)) +
                        " for the completion). Please reduce the length of the prompt or "
                        "the completion.",
                    endpoint == server::Endpoint::Chat ? "messages" : "prompt"));
    }
    gemma4_t4::GenerateOptions& g = job->options;
    g = info_.defaults;
    g.sampling = r.sampling;
    if (!r.seed_given && !opt_.seed_given) g.sampling.seed = random_seed();
    g.max_new_tokens = r.max_tokens > 0 ? r.max_tokens : int(std::min<size_t>(size_t(info_.default_max_tokens), C - P));
    if (r.ignore_eos) {
      g.stop_at_eos = false;
      g.stop_tokens.clear();
    }
    switch (driver_.submit(job)) {
      case server::Driver::Admit::Ok: break;
      case server::Driver::Admit::Full:
        return set_error(res, api_error(429, "queue_full",
                                        "The server is busy: " + std::to_string(opt_.parallel + opt_.max_queue) +
                                            " requests in flight; retry later"));
      case server::Driver::Admit::Closed:
        return set_error(res, api_error(503, "shutting_down", "The server is shutting down"));
    }
    auto stream = std::make_shared<Stream>(*this, job, r, endpoint);
    if (!r.stream) return stream->whole(req, res);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto guard = std::make_shared<OpenResponse>(open_responses_);
    res.set_chunked_content_provider("text/event-stream",
                                     [stream, guard](size_t, httplib::DataSink& sink) { return stream->pump(sink); });
  }

  // Chat: the template's text, then ids; the prefix worth caching is everything before the last message (a
  // system prompt, earlier turns). Completions: the text's ids after <bos>, or the ids given.
  bool tokenize(const server::Request& r, std::vector<int32_t>* ids, size_t* cache_prefix, ApiError* err) const {
    const gemma4_t4::Tokenizer& tok = model_.tokenizer;
    if (r.endpoint == server::Endpoint::Completion) {
      if (r.prompt_is_ids) {
        *ids = r.prompt_ids;
        return true;
      }
      if (!tok.encode(r.prompt_text, ids)) {
        *err = api_error(400, "invalid_value", "The prompt is not valid UTF-8", "prompt");
        return false;
      }
      if (r.add_special_tokens && (ids->empty() || (*ids)[0] != info_.bos_id)) ids->insert(ids->begin(), info_.bos_id);
      return true;
    }
    gemma4_t4::ChatOptions chat;
    chat.thinking = r.thinking;
    std::string text;
    if (gemma4_t4::Status st = gemma4_t4::format_chat(r.messages, chat, &text); !st) {
      *err = api_error(400, "invalid_value", st.message, "messages");
      return false;
    }
    if (!tok.encode(text, ids)) {
      *err = api_error(400, "invalid_value", "The messages are not valid UTF-8", "messages");
      return false;
    }
    // The template opens every turn with <|turn>: the last message's turn starts at the second-to-last one (the
    // last opens the generation prompt). Any token boundary is a valid cache key; this one is where requests
    // sharing a system prompt (or earlier turns) part ways.
    *cache_prefix = 0;
    if (r.messages.size() >= 2 && turn_id_ >= 0) {
      size_t seen = 0;
      for (size_t i = ids->size(); i-- > 0;)
        if ((*ids)[i] == turn_id_ && ++seen == 2) {
          *cache_prefix = i;
          break;
        }
    }
    return true;
  }

  static uint64_t random_seed() {
    static std::atomic<uint64_t> counter{0};
    static const uint64_t base = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ uint64_t(std::time(nullptr));
    return base + counter.fetch_add(1) * 0xD1B54A32D192ED03ull;
  }

  // Counts the streamed responses still being written (shutdown waits for them).
  struct OpenResponse {
    std::atomic<int>& n;
    explicit OpenResponse(std::atomic<int>& count) : n(count) { ++n; }
    ~OpenResponse() { --n; }
  };

  // One request's output: reads the job's tokens, turns them into text and writes the response.
  class Stream {
   public:
    Stream(Server& s, std::shared_ptr<server::Job> job, const server::Request& r, server::Endpoint endpoint)
        : s_(s),
          job_(std::move(job)),
          req_(r),
          out_(s.model_.tokenizer, r.stop, !r.skip_special_tokens, r.endpoint == server::Endpoint::Chat && r.thinking) {
      head_.endpoint = endpoint;
      head_.id = (endpoint == server::Endpoint::Chat ? "chatcmpl-" : "cmpl-") + id_suffix();
      head_.created = int64_t(std::time(nullptr));
      head_.model = s.opt_.model_name;
    }
    ~Stream() { s_.driver_.cancel(*job_); }  // a response that ends early (client gone) ends its generation

    // Non-streamed: waits for the whole generation (watching the client), then answers.
    void whole(const httplib::Request& req, httplib::Response& res) {
      const int fd = connection_fd(req);
      std::string content, reasoning;
      std::vector<int32_t> ids;
      while (!advance(&content, &reasoning, &ids)) {
        if (peer_gone(fd)) {
          res.status = 499;  // client closed the connection (nginx's code; never sent)
          return;
        }
      }
      if (error_) return set_error(res, *error_);
      set_json(res, server::response_json(head_, content, reasoning, finish_, req_.return_token_ids ? &ids : nullptr,
                                          usage()));
    }

    // Streamed: called by httplib until it returns false or calls sink.done().
    bool pump(httplib::DataSink& sink) {
      if (!sink.is_writable()) return false;  // client gone: ~Stream cancels
      std::string events;
      if (!started_ && head_.endpoint == server::Endpoint::Chat) {
        events += event(server::chunk_json(head_, "", "", nullptr, nullptr, true, req_.include_usage));
      }
      started_ = true;
      std::string content, reasoning;
      std::vector<int32_t> ids;
      const bool end = advance(&content, &reasoning, &ids);
      if (!content.empty() || !reasoning.empty() || (req_.return_token_ids && !ids.empty()))
        events += event(server::chunk_json(head_, content, reasoning, nullptr, req_.return_token_ids ? &ids : nullptr,
                                           false, req_.include_usage));
      if (end) {
        if (error_) {
          events += event(server::error_json(*error_));
        } else {
          events += event(server::chunk_json(head_, "", "", finish_, nullptr, false, req_.include_usage));
          if (req_.include_usage) {
            Json u = server::head_json(head_, true);
            u["choices"] = Json::array();
            u["usage"] = usage();
            events += event(u);
          }
        }
        events += "data: [DONE]\n\n";
      }
      if (!events.empty() && !sink.write(events.data(), events.size())) return false;
      if (end) sink.done();
      return true;
    }

   private:
    static std::string event(const Json& j) { return "data: " + server::dump(j) + "\n\n"; }
    static std::string id_suffix() {
      static std::atomic<uint64_t> n{0};
      char buf[32];
      std::snprintf(buf, sizeof buf, "%llx%06llx", (unsigned long long)std::time(nullptr),
                    (unsigned long long)(n.fetch_add(1) & 0xffffff));
      return buf;
    }

    // Waits up to 50 ms for tokens; appends their text. true once the response is complete (finish_ or error_).
    bool advance(std::string* content, std::string* reasoning, std::vector<int32_t>* ids) {
      std::vector<int32_t> fresh;
      const bool done = job_->wait(seen_, std::chrono::milliseconds(50), &fresh);
      seen_ += fresh.size();
      for (int32_t t : fresh) {
        if (stopped_) break;
        ++consumed_;
        ids->push_back(t);
        if (out_.put(t, content, reasoning)) {  // a stop string: the answer ends here
          stopped_ = true;
          s_.driver_.cancel(*job_);
        }
      }
      if (stopped_) {
        finish_ = "stop";
        return true;
      }
      if (!done) return false;
      // the channel holds every token once done: the generation's outcome
      gemma4_t4::FinishReason why;
      gemma4_t4::Status status;
      {
        std::lock_guard<std::mutex> lock(job_->mu);
        why = job_->finish;
        status = job_->status;
        generated_ = job_->generated;
        cached_ = job_->cached;
      }
      out_.finish(content, reasoning);
      switch (why) {
        case gemma4_t4::FinishReason::Stop: finish_ = "stop"; break;
        case gemma4_t4::FinishReason::Length:
        case gemma4_t4::FinishReason::Callback: finish_ = "length"; break;
        case gemma4_t4::FinishReason::Cancelled:
          error_ = std::make_unique<ApiError>(
              api_error(503, "cancelled", "The request was cancelled (the server is shutting down)"));
          break;
        case gemma4_t4::FinishReason::Error:
          std::fprintf(stderr, "server: generation failed: %s\n", status.message.c_str());
          error_ = std::make_unique<ApiError>(api_error(500, "server_error", "Generation failed: " + status.message));
          break;
      }
      return true;
    }

    Json usage() const {
      const size_t completion = stopped_ ? consumed_ : std::max(generated_, consumed_);
      return server::usage_json(job_->prompt.size(), completion, cached_);
    }

    Server& s_;
    std::shared_ptr<server::Job> job_;
    server::Request req_;
    server::TextOutput out_;
    server::ResponseHead head_;
    size_t seen_ = 0, consumed_ = 0, generated_ = 0, cached_ = 0;
    bool started_ = false, stopped_ = false;
    const char* finish_ = nullptr;
    std::unique_ptr<ApiError> error_;
  };

  example::Loaded& model_;
  const Options opt_;
  server::ServerInfo info_;
  server::Metrics metrics_;
  server::Driver driver_;
  int64_t created_ = 0;
  int32_t turn_id_ = -1;  // "<|turn>"
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> open_responses_{0};
};

// httplib::Server with a deeper accept queue: the library listens with a backlog of 5 (a compile-time constant of
// the built library), so a burst of clients connecting at once -- 64 streams starting together -- overflows it and
// the kernel drops their handshakes (1 s retries, resets). Calling listen() again on the bound socket raises it.
class HttpServer : public httplib::Server {
 public:
  bool deepen_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

// The server's flags on p, stored into *o (which must outlive p.parse()).
void add_server_flags(args::Parser* p, Options* o) {
  p->section("server:");
  p->text("--host", "HOST", &o->host, "address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)");
  p->integer("--port", "N", &o->port, 0, 65535,
             "port (default 8080; 0: any free port). The first line on stdout says\n"
             "\"listening on http://HOST:PORT\"");
  p->text("--api-key", "KEY", &o->api_key, "require \"Authorization: Bearer KEY\" on /v1/ endpoints");
  p->text("--served-model-name", "NAME", &o->model_name,
          "the model's name in the API (default: the model directory's name)");
  p->integer("--parallel", "N", &o->parallel, 1, 4096, "requests generating at once, one session each (default 64)");
  p->integer("--max-queue", "N", &o->max_queue, 0, 1 << 20, "requests waiting beyond those; more get 429 (default 64)");
  p->integer("--prefill-sessions", "N", &o->prefill_sessions, 0, 4096,
             "requests whose prompts one engine step reads (default 1: one at a time, so each\n"
             "first token waits only for the prompts before it, as in bench; 0: as many as\n"
             "--prefill-rows holds, which fills more of each pass but makes every prompt of a step\n"
             "wait for the whole step)");
  p->integer("--prefill-rows", "N", &o->prefill_rows, 1, 1 << 20,
             "prompt tokens per engine step, all its prompts together (default: with\n"
             "--prefill-sessions N > 0, two CUDA passes, 4096: a 4096-token prompt in one step,\n"
             "read as bench reads it; with 0, the pass size, 2048, less --parallel: prompt chunks\n"
             "and every decode row in one pass)");
  p->flag("--prefill-priority", &o->prefill_priority,
          "while prompts are waiting to be read, steps read prompts only and the generating\n"
          "requests wait (prefill first: every first token as early as when the prompts are\n"
          "prefilled one after another before any decoding, as in bench; later tokens of the\n"
          "running requests come later). Default: their decode rows ride in every step");
  p->integer("--prefix-cache", "N", &o->prefix_cache, 0, 4096, "prefixes kept for reuse (default 8; 0: off)");
  p->integer("--prefix-cache-min", "N", &o->prefix_min, 1, 1 << 24,
             "shortest prefix worth keeping, tokens (default 256)");
  p->integer("--max-body-bytes", "N", &o->max_body, 1, 1L << 32, "larger request bodies get 413 (default 4194304)");
  p->integer("--read-timeout", "S", &o->read_timeout, 1, 3600,
             "a read that waits longer closes the connection (default 10)");
  p->integer("--body-timeout", "S", &o->body_timeout, 1, 3600,
             "a request body that takes longer gets 408 (default 30)");
  p->integer("--keep-alive-timeout", "S", &o->keep_alive, 1, 3600,
             "idle keep-alive connections are closed after S seconds (default 5)");
  p->integer("--shutdown-timeout", "S", &o->shutdown_timeout, 0, 86400,
             "on SIGINT/SIGTERM, time in-flight requests get to finish (default 30)");
  p->integer("--threads", "N", &o->threads, 1, 65536, "HTTP threads (default: parallel + max-queue + 8)");
  p->flag("--no-warm-up", &o->warm_up,
          "start serving without warming up (by default the CUDA backend first runs a prompt of\n"
          "each pass size and a decode step of each graph's size in scratch sessions, so that the\n"
          "first requests do not pay for kernels loaded on first use and graph captures)",
          false);
  p->flag("--log-requests", &o->log_requests, "one line per request on stderr");
  p->flag("--log-steps", &o->log_steps, "one line per engine step on stderr: prompts and rows fed, its time");
}

}  // namespace

int main(int argc, char** argv) {
  example::ModelArgs args;
  Options opt;
  args::Parser parser("server", kUsage);
  add_server_flags(&parser, &opt);
  example::add_model_flags(&parser, &args);
  parser.footer(kRequestFields);
  if (const int rc = parser.parse(argc, argv); rc >= 0) return rc;
  opt.seed_given = args.seed.has_value();

  // Signals are taken by one thread (sigwait): block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  example::Loaded model;
  if (gemma4_t4::Status st = example::load(args, &model); !st) {
    std::fprintf(stderr, "server: %s\n", st.message.c_str());
    return 1;
  }
  if (opt.warm_up) {
    const auto t0 = std::chrono::steady_clock::now();
    if (const gemma4_t4::Status st = model.engine.warm_up(size_t(opt.parallel)); !st)
      std::fprintf(stderr, "server: warm-up failed, serving without it: %s\n", st.message.c_str());
    else if (model.engine.backend() == gemma4_t4::Backend::Cuda)
      std::fprintf(stderr, "server: warmed up in %.0f ms\n",
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (opt.model_name.empty()) {
    std::string dir = args.model;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    opt.model_name = dir.substr(dir.find_last_of('/') + 1);
  }
  server::DriverOptions d;
  d.parallel = int(opt.parallel);
  d.max_queue = int(opt.max_queue);
  // A step's rows are its prompt chunks plus one decode row per generating session; the CUDA backend runs them in
  // passes of LoadOptions::max_pass_rows, each reading every weight, and stages a pass's per-layer-embedding rows
  // while the one before it runs. Prompts one at a time (the default): up to two whole passes of one prompt, its
  // first token at the step's end, the decode rows after it -- a prompt's first token waits for no other prompt's
  // rows, as in bench (each stream's prompt prefilled in one Engine::step, one after the other). Packed: every
  // joining prompt and every decode row in one pass.
  const int pass_rows = model.engine.load_options().max_pass_rows;
  d.prefill_sessions = int(opt.prefill_sessions);
  d.prefill_rows = opt.prefill_rows > 0     ? int(opt.prefill_rows)
                   : d.prefill_sessions > 0 ? 2 * pass_rows
                                            : std::max(256, pass_rows - int(opt.parallel));
  d.context = model.context;
  d.prefix_cache = int(opt.prefix_cache);
  d.prefix_min = size_t(opt.prefix_min);
  d.log_steps = opt.log_steps;
  d.prefill_priority = opt.prefill_priority;

  HttpServer svr;
  const size_t threads = opt.threads > 0 ? size_t(opt.threads) : size_t(opt.parallel + opt.max_queue + 8);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_read_timeout(time_t(opt.read_timeout), 0);
  svr.set_write_timeout(time_t(opt.read_timeout), 0);
  svr.set_keep_alive_timeout(time_t(opt.keep_alive));
  svr.set_keep_alive_max_count(1000);
  svr.set_payload_max_length(size_t(opt.max_body));
  svr.set_tcp_nodelay(true);
  int port = int(opt.port);
  if (port == 0 ? (port = svr.bind_to_any_port(opt.host)) <= 0 : !svr.bind_to_port(opt.host, port)) {
    std::fprintf(stderr, "server: cannot listen on %s:%ld (in use, or not an address of this machine)\n",
                 opt.host.c_str(), opt.port);
    return 1;
  }
  if (!svr.deepen_backlog(1024)) std::fprintf(stderr, "server: listen(backlog 1024) failed; the backlog stays 5\n");

  Server server(model, opt, d);
  server.install(svr);

  std::atomic<bool> exiting{false};
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (exiting.load()) return;
    server.shutting_down().store(true);
    server.driver().close();
    std::fprintf(stderr, "server: %s: refusing new requests; %zu in flight get %ld s to finish\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", server.driver().in_flight(), opt.shutdown_timeout);
    const auto deadline = server::Clock::now() + std::chrono::seconds(opt.shutdown_timeout);
    const timespec tick{0, 50 * 1000 * 1000};
    bool again = false;
    while (server.driver().in_flight() > 0 && server::Clock::now() < deadline && !again)
      again = sigtimedwait(&signals, nullptr, &tick) > 0;
    if (const size_t left = server.driver().in_flight(); left > 0) {
      std::fprintf(stderr, "server: cancelling %zu requests\n", left);
      server.driver().cancel_all();
    }
    // the answers of the last requests are written before the listener stops (bounded: 10 s)
    for (int k = 0; k < 200 && (server.driver().in_flight() > 0 || server.open_responses() > 0); ++k)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    svr.stop();
  });

  std::printf("listening on http://%s:%d\n", opt.host.c_str(), port);
  std::fflush(stdout);
  std::fprintf(stderr, "server: %s (%s backend, context %zu, %ld parallel, queue %ld) on http://%s:%d\n",
               opt.model_name.c_str(), example::backend_name(model.engine), model.context, opt.parallel, opt.max_queue,
               opt.host.c_str(), port);
  const bool ok = svr.listen_after_bind();
  if (!server.shutting_down().load()) {  // the listener failed on its own: wake the signal thread
    exiting.store(true);
    pthread_kill(signal_thread.native_handle(), SIGTERM);
  }
  signal_thread.join();
  server.driver().stop();
  std::fprintf(stderr, "server: stopped\n");
  return ok || server.shutting_down().load() ? 0 : 1;
}
