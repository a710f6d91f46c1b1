// bench_serve: the load generator of examples/server.cpp -- the seed's sweep replayed over HTTP, as
// `vllm bench serve` measures vLLM's server.
//
//   bench_serve [--url http://127.0.0.1:8080] [--prompts 512,4096] [--concurrency 1,8,16,64] [--tokens 128]
//               [--repeats 3] [--json PATH] [--csv PATH]
//
// Per cell (prompt P, concurrency C) and repeat: C clients, each on its own keep-alive connection, send at
// once one streaming POST /v1/completions each -- P prompt token ids drawn as `bench` draws them (the same
// seeds: <bos> then ids uniform over [4, vocab)), max_tokens N, ignore_eos, greedy unless --temperature,
// return_token_ids -- and read the server-sent events as they come. Per stream: TTFT = the repeat's start to
// the first event carrying a token (so, as in `bench`, it includes waiting for the streams prefilled before
// it). Two per-token times per stream: the steady one, over the tokens that arrive once every stream of the
// repeat has its first token (all C decoding together, as `bench` times its decode steps): (last - first of
// those) / (their count - 1); and TPOT, `vllm bench serve`'s, over the whole answer: (last - first) / (N - 1),
// which also counts the steps the stream shared with other streams' prefill. Per cell: ms_per_token = the
// median over repeats of the median over streams of the steady time (TPOT where no stream has two tokens in
// the steady part); tpot_ms likewise; tok_s_per_stream = 1000 / ms_per_token; tok_s_total = C *
// tok_s_per_stream (bench's definition); tok_s_wall = C * N / the repeat's wall time (median over repeats;
// what `vllm bench serve` calls output throughput); TTFT p50 (median), p90, p99 (nearest rank) over streams x
// repeats. Each response must carry exactly N tokens, end with finish_reason "length" and
// "data: [DONE]", else the cell reports an error. An untimed warm-up request per stream precedes each cell.
// Output: an aligned table on stdout, --json and --csv with bench's column names (plus tpot_ms, tok_s_wall and
// ttft_ms_p99).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../programs/args.hpp"
#include "gemma4_t4.hpp"

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char kUsage[] =
    "usage: bench_serve [options]\n"
    "\n"
    "Drives an OpenAI-compatible server (examples/server.cpp) with concurrent streaming clients and reports\n"
    "tok/s per stream, total tok/s and TTFT p50/p90/p99 per (prompt, concurrency) cell.\n"
    "\n";

// ---- prompts: bench's (include/gemma4_t4/bench.hpp: cell_seed, prompt_ids), so both see the same ids ----

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t cell_seed(uint64_t seed, int prompt, int concurrency, int repeat) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ uint64_t(uint32_t(prompt)));
  h = splitmix64(h ^ (uint64_t(uint32_t(concurrency)) << 32));
  return splitmix64(h ^ uint64_t(uint32_t(repeat)) * 0xD1B54A32D192ED03ull);
}

std::vector<int32_t> prompt_ids(uint64_t seed, int stream, int n, int vocab, int bos) {
  const int lo = vocab > 8 ? 4 : 0;
  const uint64_t span = uint64_t(std::max(vocab - lo, 1));
  const uint64_t s = splitmix64(seed ^ (uint64_t(uint32_t(stream)) * 0x9E3779B97F4A7C15ull));
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = int32_t(lo + int(splitmix64(s + uint64_t(i)) % span));
  if (n > 0 && bos >= 0 && bos < vocab) out[0] = bos;
  return out;
}

// ---- statistics (bench's: median = mean of the middle two; percentiles by nearest rank) ----

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = size_t(std::ceil(q * double(v.size())));
  rank = std::min(std::max<size_t>(rank, 1), v.size());
  return v[rank - 1];
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// ---- one streaming request ----

struct Options {
  std::string url = "http://127.0.0.1:8080", api_key, model, label, json_path, csv_path;
  std::vector<int> prompts = {512, 4096}, concurrency = {1, 8, 16, 64};
  long tokens = 128, repeats = 3, timeout = 600;
  unsigned long long seed = 20250101;
  float temperature = 0;
  bool warmup = true;
};

struct StreamResult {
  std::string error;
  std::vector<Clock::time_point> arrivals;  // one per token
  std::string finish;
  bool done_marker = false;
};

// Posts one streaming completion and records when each token arrives.
StreamResult run_stream(const Options& o, const std::vector<int32_t>& prompt, int tokens, uint64_t seed) {
  StreamResult r;
  httplib::Client cli(o.url);
  cli.set_read_timeout(time_t(o.timeout), 0);
  cli.set_write_timeout(time_t(o.timeout), 0);
  cli.set_connection_timeout(10, 0);
  Json body = {{"model", o.model}, {"prompt", prompt},        {"max_tokens", tokens},
               {"stream", true},   {"ignore_eos", true},      {"temperature", o.temperature},
               {"seed", seed},     {"return_token_ids", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  std::string buf;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();
    buf.append(data, n);
    for (size_t at; (at = buf.find("\n\n")) != std::string::npos; buf.erase(0, at + 2)) {
      const std::string ev = buf.substr(0, at);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        r.done_marker = true;
        continue;
      }
      const Json j = Json::parse(payload, nullptr, false);
      if (j.is_discarded() || j.contains("error")) {
        r.error = "bad event: " + payload.substr(0, 200);
        return false;
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const Json& c = j["choices"][0];
      if (c.contains("token_ids") && c["token_ids"].is_array())
        for (size_t k = 0; k < c["token_ids"].size(); ++k) r.arrivals.push_back(now);
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) r.finish = c["finish_reason"];
    }
    return true;
  };
  const httplib::Result res = cli.send(req);
  if (!res) {
    if (r.error.empty()) r.error = "HTTP request failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    r.error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 300);
  } else if (r.error.empty() && (!r.done_marker || r.finish != "length" || int(r.arrivals.size()) != tokens)) {
    r.error = "incomplete stream: " + std::to_string(r.arrivals.size()) + " of " + std::to_string(tokens) +
              " tokens, finish_reason '" + r.finish + "'" + (r.done_marker ? "" : ", no [DONE]");
  }
  return r;
}

// ---- the sweep ----

struct Cell {
  int prompt = 0, requested_prompt = 0, concurrency = 0, tokens = 0, repeats = 0;
  double ms_per_token = 0, tpot_ms = 0, tok_s_per_stream = 0, tok_s_total = 0, tok_s_wall = 0;
  double ttft_ms_median = 0, ttft_ms_p90 = 0, ttft_ms_p99 = 0;
  std::string error;
};

// C streams at once (a barrier releases them together); *wall = start to the last stream's end.
std::vector<StreamResult> run_concurrent(const Options& o, const std::vector<std::vector<int32_t>>& prompts, int tokens,
                                         uint64_t seed, Clock::time_point* start, double* wall) {
  const size_t C = prompts.size();
  std::vector<StreamResult> out(C);
  std::mutex mu;
  std::condition_variable cv;
  size_t ready = 0;
  bool go = false;
  std::vector<std::thread> threads;
  for (size_t b = 0; b < C; ++b)
    threads.emplace_back([&, b] {
      {
        std::unique_lock<std::mutex> lock(mu);
        ++ready;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      out[b] = run_stream(o, prompts[b], tokens, seed + b);
    });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return ready == C; });
    *start = Clock::now();
    go = true;
    cv.notify_all();
  }
  for (auto& t : threads) t.join();
  Clock::time_point end = *start;
  for (const StreamResult& r : out)
    if (!r.arrivals.empty()) end = std::max(end, r.arrivals.back());
  *wall = ms(*start, end);
  return out;
}

Cell run_cell(const Options& o, int P, int requested, int C, int vocab, int bos) {
  Cell cell;
  cell.prompt = P;
  cell.requested_prompt = requested;
  cell.concurrency = C;
  cell.tokens = int(o.tokens);
  const int N = int(o.tokens);
  if (o.warmup) {
    std::vector<std::vector<int32_t>> wp;
    for (int b = 0; b < C; ++b) wp.push_back(prompt_ids(cell_seed(o.seed, P, C, -1), b, std::min(P, 64), vocab, bos));
    Clock::time_point t;
    double wall = 0;
    for (const StreamResult& r : run_concurrent(o, wp, 2, o.seed, &t, &wall))
      if (!r.error.empty()) {
        cell.error = "warm-up: " + r.error;
        return cell;
      }
  }
  std::vector<double> ttft, rep_ms, rep_tpot, rep_wall;
  for (int rep = 0; rep < o.repeats; ++rep) {
    const uint64_t seed = cell_seed(o.seed, P, C, rep);
    std::vector<std::vector<int32_t>> prompts;
    for (int b = 0; b < C; ++b) prompts.push_back(prompt_ids(seed, b, P, vocab, bos));
    Clock::time_point start;
    double wall = 0;
    const std::vector<StreamResult> res = run_concurrent(o, prompts, N, seed, &start, &wall);
    std::vector<double> steady, tpot;
    Clock::time_point all_started = start;  // every stream has its first token
    for (size_t b = 0; b < res.size(); ++b) {
      if (!res[b].error.empty()) {
        cell.error = "repeat " + std::to_string(rep + 1) + ", stream " + std::to_string(b + 1) + ": " + res[b].error;
        break;
      }
      all_started = std::max(all_started, res[b].arrivals.front());
    }
    if (!cell.error.empty()) break;
    for (const StreamResult& r : res) {
      ttft.push_back(ms(start, r.arrivals.front()));
      if (N > 1) tpot.push_back(ms(r.arrivals.front(), r.arrivals.back()) / (N - 1));
      const auto first = std::lower_bound(r.arrivals.begin(), r.arrivals.end(), all_started);
      const auto n = r.arrivals.end() - first;
      if (n >= 2) steady.push_back(ms(*first, r.arrivals.back()) / double(n - 1));
    }
    rep_ms.push_back(median(steady.empty() ? tpot : steady));
    rep_tpot.push_back(median(tpot));
    rep_wall.push_back(double(C) * N / std::max(wall, 1e-6) * 1e3);
    ++cell.repeats;
  }
  if (cell.repeats > 0) {
    cell.ms_per_token = median(rep_ms);
    cell.tpot_ms = median(rep_tpot);
    cell.tok_s_per_stream = cell.ms_per_token > 0 ? 1e3 / cell.ms_per_token : 0;
    cell.tok_s_total = C * cell.tok_s_per_stream;
    cell.tok_s_wall = median(rep_wall);
    cell.ttft_ms_median = median(ttft);
    cell.ttft_ms_p90 = percentile(ttft, 0.9);
    cell.ttft_ms_p99 = percentile(ttft, 0.99);
  }
  return cell;
}

// ---- outputs ----

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string to_table(const Options& o, const std::vector<Cell>& cells, const std::vector<std::string>& notes) {
  std::string s = "bench_serve " + o.url + " model " + o.model + (o.label.empty() ? "" : " (" + o.label + ")") + ": " +
                  std::to_string(o.tokens) + " output tokens per stream (EOS ignored), " + std::to_string(o.repeats) +
                  " repeats, " +
                  (o.temperature > 0 ? "temperature " + fmt("%g", o.temperature) : std::string("greedy")) + "\n";
  for (const std::string& n : notes) s += "note: " + n + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%7s %5s %9s %8s %12s %11s %10s %9s %9s %9s  %s\n", "prompt", "conc", "ms/token",
                "TPOT ms", "tok/s/stream", "tok/s total", "tok/s wall", "TTFT p50", "TTFT p90", "TTFT p99", "error");
  s += line;
  for (const Cell& c : cells) {
    std::snprintf(line, sizeof line, "%7d %5d %9.2f %8.2f %12.1f %11.1f %10.1f %9.1f %9.1f %9.1f  %s\n", c.prompt,
                  c.concurrency, c.ms_per_token, c.tpot_ms, c.tok_s_per_stream, c.tok_s_total, c.tok_s_wall,
                  c.ttft_ms_median, c.ttft_ms_p90, c.ttft_ms_p99, c.error.c_str());
    s += line;
  }
  s += "(ms/token: per stream, once every stream decodes (as bench); TPOT: per stream over its whole answer (as vllm "
       "bench serve); tok/s total = concurrency x tok/s/stream, as bench; tok/s wall = tokens of all streams / wall "
       "time; TTFT in ms from the repeat's start)\n";
  return s;
}

Json to_json(const Options& o, const std::vector<Cell>& cells, const std::vector<std::string>& notes) {
  char ts[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  Json jc = Json::array();
  for (const Cell& c : cells)
    jc.push_back({{"prompt", c.prompt},
                  {"requested_prompt", c.requested_prompt},
                  {"concurrency", c.concurrency},
                  {"tokens", c.tokens},
                  {"repeats", c.repeats},
                  {"ms_per_token", c.ms_per_token},
                  {"tpot_ms", c.tpot_ms},
                  {"tok_s_per_stream", c.tok_s_per_stream},
                  {"tok_s_total", c.tok_s_total},
                  {"tok_s_wall", c.tok_s_wall},
                  {"ttft_ms_median", c.ttft_ms_median},
                  {"ttft_ms_p90", c.ttft_ms_p90},
                  {"ttft_ms_p99", c.ttft_ms_p99},
                  {"error", c.error}});
  return Json{{"schema", "gemma4_t4.bench_serve/1"},
              {"version", GEMMA4_T4_VERSION_STRING},
              {"timestamp", ts},
              {"label", o.label},
              {"url", o.url},
              {"model", o.model},
              {"options",
               {{"prompts", o.prompts},
                {"concurrency", o.concurrency},
                {"tokens", o.tokens},
                {"repeats", o.repeats},
                {"seed", o.seed},
                {"temperature", o.temperature}}},
              {"notes", notes},
              {"cells", jc}};
}

std::string to_csv(const std::vector<Cell>& cells) {
  std::string s =
      "prompt,requested_prompt,concurrency,tokens,repeats,ms_per_token,tpot_ms,tok_s_per_stream,tok_s_total,"
      "tok_s_wall,ttft_ms_median,ttft_ms_p90,ttft_ms_p99,error\n";
  for (const Cell& c : cells) {
    std::string err = c.error;
    for (char& ch : err)
      if (ch == '"' || ch == '\n') ch = '\'';
    char line[512];
    std::snprintf(line, sizeof line, "%d,%d,%d,%d,%d,%.4f,%.4f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,\"%s\"\n", c.prompt,
                  c.requested_prompt, c.concurrency, c.tokens, c.repeats, c.ms_per_token, c.tpot_ms, c.tok_s_per_stream,
                  c.tok_s_total, c.tok_s_wall, c.ttft_ms_median, c.ttft_ms_p90, c.ttft_ms_p99, err.c_str());
    s += line;
  }
  return s;
}

bool write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  return bool(f);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool no_warmup = false;
  args::Parser p("bench_serve", kUsage);
  p.text("--url", "URL", &o.url, "the server (default http://127.0.0.1:8080)");
  p.text("--api-key", "KEY", &o.api_key, "sent as \"Authorization: Bearer KEY\"");
  p.text("--model", "NAME", &o.model, "the model field (default: the first model GET /v1/models lists)");
  p.list("--prompts", "LIST", &o.prompts, 1, 1 << 24, "prompt tokens per stream (default 512,4096)");
  p.list("--concurrency", "LIST", &o.concurrency, 1, 1 << 24, "streams at once (default 1,8,16,64)");
  p.integer("--tokens", "N", &o.tokens, 2, 1 << 20, "output tokens per stream, EOS ignored (default 128)");
  p.integer("--repeats", "N", &o.repeats, 1, 1000, "timed repeats per cell (default 3)");
  p.integer("--seed", "N", &o.seed, 0, ULLONG_MAX, "base seed of the prompts, as bench's (default 20250101)");
  p.number("--temperature", "F", &o.temperature, 0, 100, "sampling temperature (default 0: greedy, as bench)");
  p.flag("--no-warmup", &no_warmup, "skip the untimed request per stream before each cell");
  p.integer("--timeout", "S", &o.timeout, 1, 86400, "per request (default 600)");
  p.text("--label", "TEXT", &o.label, "names the run in the outputs");
  p.text("--json", "PATH", &o.json_path, "write the results there too");
  p.text("--csv", "PATH", &o.csv_path, "write the results there too");
  p.footer("\nExit status: 0 every cell ran, 1 an error, 2 bad command line.\n");
  if (const int rc = p.parse(argc, argv); rc >= 0) return rc;
  o.warmup = !no_warmup;

  // the model: its name, context and vocabulary, from GET /v1/models
  httplib::Client cli(o.url);
  cli.set_connection_timeout(10, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  const httplib::Result res = cli.Get("/v1/models", headers);
  if (!res || res->status != 200) {
    std::fprintf(stderr, "bench_serve: GET %s/v1/models failed: %s\n", o.url.c_str(),
                 res ? ("HTTP " + std::to_string(res->status) + " " + res->body).c_str()
                     : httplib::to_string(res.error()).c_str());
    return 1;
  }
  const Json models = Json::parse(res->body, nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() || models["data"].empty()) {
    std::fprintf(stderr, "bench_serve: GET /v1/models: no model listed: %s\n", res->body.c_str());
    return 1;
  }
  Json entry = models["data"][0];
  for (const Json& m : models["data"])
    if (m.value("id", std::string()) == o.model) entry = m;
  if (o.model.empty()) o.model = entry.value("id", std::string());
  const int vocab = entry.value("vocab_size", 0), context = entry.value("max_model_len", 0), bos = 2;
  if (vocab <= 0 || context <= 0) {
    std::fprintf(stderr, "bench_serve: /v1/models gives no vocab_size / max_model_len (not examples/server?)\n");
    return 1;
  }

  std::vector<Cell> cells;
  std::vector<std::string> notes;
  for (int P : o.prompts) {
    int run_p = P;
    if (P + o.tokens > context) {
      run_p = std::max(1, context - int(o.tokens));
      notes.push_back("prompt " + std::to_string(P) + " shortened to " + std::to_string(run_p) + " (context " +
                      std::to_string(context) + ")");
    }
    for (int C : o.concurrency) {
      std::fprintf(stderr, "bench_serve: prompt %d, concurrency %d ...\n", run_p, C);
      cells.push_back(run_cell(o, run_p, P, C, vocab, bos));
    }
  }
  std::fputs(to_table(o, cells, notes).c_str(), stdout);
  bool ok = true;
  if (!o.json_path.empty() && !write(o.json_path, to_json(o, cells, notes).dump(2) + "\n")) {
    std::fprintf(stderr, "bench_serve: cannot write %s\n", o.json_path.c_str());
    ok = false;
  }
  if (!o.csv_path.empty() && !write(o.csv_path, to_csv(cells))) {
    std::fprintf(stderr, "bench_serve: cannot write %s\n", o.csv_path.c_str());
    ok = false;
  }
  for (const Cell& c : cells) ok = ok && c.error.empty();
  return ok ? 0 : 1;
}
