// gemma4_t4::bench on the tiny fixture with the CPU backend (CI has no GPU): the sweep fills every cell with
// positive numbers; JSON, CSV and SVG carry what the header documents; the T4 projection is labelled in every
// format; clamping, failing cells, cancellation and bad options; the Engine's memory accessors; doctor and the
// device report without a GPU; prefill_flops against the checkpoint's own tensor shapes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference.hpp"
#include "temp_dir.hpp"

using namespace gemma4_t4;
using Json = nlohmann::json;

namespace {

constexpr char kLabel[] = "projection, not measured";

bench::SweepOptions tiny_sweep() {
  bench::SweepOptions o;
  o.prompts = {8, 16};
  o.concurrency = {1, 2};
  o.tokens = 4;
  o.repeats = 1;
  o.label = "mm_bf16";
  o.bandwidth_options.bytes = uint64_t(8) << 20;  // small: the test also runs under ASan
  o.bandwidth_options.repeats = 3;
  return o;
}

bench::Report tiny_report(const Engine& engine) {
  bench::Report r;
  const Status st = bench::run(engine, tiny_sweep(), &r);
  INFO(st.message);
  REQUIRE(st);
  return r;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// One CSV line into fields (RFC 4180 quoting).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> f(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted && ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      f.back() += '"';
      ++i;
    } else if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      f.emplace_back();
    } else {
      f.back() += ch;
    }
  }
  return f;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

}  // namespace

TEST_CASE("bench: the sweep on the tiny model fills every cell with positive numbers", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  const bench::Report r = tiny_report(engine);
  CHECK(r.backend == Backend::Cpu);
  CHECK(r.version == GEMMA4_T4_VERSION_STRING);
  CHECK(r.label == "mm_bf16");
  CHECK(r.model.find("7 layers") != std::string::npos);
  CHECK(r.bandwidth.backend == Backend::Cpu);
  CHECK(r.bandwidth.read_gbs > 0);
  CHECK(r.decode_bytes_per_token == engine.decode_bytes_per_token());
  CHECK(r.ceiling_tok_s == Approx(r.bandwidth.read_gbs * 1e9 / r.decode_bytes_per_token));
  CHECK(r.weight_bytes == engine.weight_bytes());
  CHECK(r.kv_bytes_per_token == engine.kv_bytes_per_token());
  CHECK(r.kv_budget_bytes > 0);
  CHECK(r.kv_capacity_tokens == r.kv_budget_bytes / r.kv_bytes_per_token);
  CHECK(r.t4_ceiling_tok_s == Approx(277e9 / r.decode_bytes_per_token));
  CHECK_FALSE(r.cancelled);
  CHECK(r.notes.empty());  // nothing clamped, bandwidth measured

  REQUIRE(r.cells.size() == 4);
  const int want[4][2] = {{8, 1}, {8, 2}, {16, 1}, {16, 2}};  // prompts outer, concurrency inner
  for (size_t i = 0; i < r.cells.size(); ++i) {
    const bench::Cell& c = r.cells[i];
    INFO("cell " << i << ": " << c.error);
    CHECK(c.ok());
    CHECK(c.prompt == want[i][0]);
    CHECK(c.requested_prompt == want[i][0]);
    CHECK(c.concurrency == want[i][1]);
    CHECK(c.tokens == 4);
    CHECK(c.repeats == 1);
    CHECK(c.seeds.size() == 1);
    CHECK(c.ms_per_token > 0);
    CHECK(c.tok_s_per_stream == Approx(1000.0 / c.ms_per_token));
    CHECK(c.tok_s_total == Approx(c.tok_s_per_stream * c.concurrency));
    CHECK(c.ttft_ms_median > 0);
    CHECK(c.ttft_ms_p90 >= c.ttft_ms_median);
    CHECK(c.prefill_tok_s > 0);
    CHECK(c.pct_of_ceiling == Approx(c.tok_s_per_stream / r.ceiling_tok_s * 100));
    CHECK(c.sessions_fit > 0);
    // the T4 projection: the weights' bytes at the T4's bandwidth plus the step's fixed cost measured here
    const double bytes_ms = r.decode_bytes_per_token / (r.bandwidth.read_gbs * 1e6);
    CHECK(c.fixed_ms == Approx(std::max(0.0, c.ms_per_token - bytes_ms)));
    CHECK(c.t4_tok_s_per_stream == Approx(1e3 / (r.decode_bytes_per_token / (277e9 / 1e3) + c.fixed_ms)));
    CHECK(c.t4_tok_s_total == Approx(c.t4_tok_s_per_stream * c.concurrency));
    CHECK(c.prefill_flops == Approx(bench::prefill_flops(engine.config(), c.prompt)));
    CHECK(c.t4_ttft_ms == 0);  // the TTFT projection is for GPUs (a tensor-core peak to scale from)
  }
  CHECK(r.t4_tensor_tflops == 65);
  // one seed per (cell, repeat): distinct cells, distinct seeds
  CHECK(r.cells[0].seeds[0] != r.cells[1].seeds[0]);
  CHECK(r.cells[0].seeds[0] != r.cells[2].seeds[0]);
}

TEST_CASE("bench: seeds depend on the cell and repeat only, so checkpoints share them", "[bench]") {
  bench::SweepOptions o = tiny_sweep();
  o.prompts = {8};
  o.concurrency = {1};
  o.repeats = 2;
  o.measure_bandwidth = false;  // a given bandwidth is used as is, and noted
  o.bandwidth.read_gbs = 10;
  bench::Report a, b;
  REQUIRE(bench::run(testref::load_engine("mm_bf16", Backend::Cpu), o, &a));
  REQUIRE(bench::run(testref::load_engine("w4a16", Backend::Cpu), o, &b));
  REQUIRE(a.cells.size() == 1);
  REQUIRE(b.cells.size() == 1);
  CHECK(a.cells[0].seeds.size() == 2);
  CHECK(a.cells[0].seeds == b.cells[0].seeds);
  CHECK(a.cells[0].seeds[0] != a.cells[0].seeds[1]);
  CHECK(a.bandwidth.read_gbs == 10);
  CHECK(a.ceiling_tok_s == Approx(10e9 / a.decode_bytes_per_token));
  CHECK(a.notes.size() == 1);
}

TEST_CASE("bench: JSON round-trips through nlohmann and has the documented fields", "[bench]") {
  const bench::Report r = tiny_report(testref::load_engine("mm_bf16", Backend::Cpu));
  const std::string text = bench::to_json(r);
  const Json j = Json::parse(text);  // throws (fails the test) on malformed JSON
  CHECK(Json::parse(j.dump()) == j);
  for (const char* k : {"schema", "version", "timestamp", "label", "model", "backend", "device", "bandwidth",
                        "decode_bytes_per_token", "ceiling_tok_s", "weight_bytes", "kv", "context_limit", "options",
                        "notes", "cells", "t4_projection", "cancelled"}) {
    INFO(k);
    CHECK(j.contains(k));
  }
  CHECK(j["schema"] == "gemma4_t4.bench/1");
  CHECK(j["backend"] == "cpu");
  CHECK(j["label"] == "mm_bf16");
  CHECK(j["device"]["cuda"] == false);
  CHECK(j["device"].contains("compute_capability"));
  CHECK(j["device"].contains("jit"));
  CHECK(j["bandwidth"]["read_gbs"].get<double>() == Approx(r.bandwidth.read_gbs));
  CHECK(j["decode_bytes_per_token"].get<double>() == Approx(r.decode_bytes_per_token));
  CHECK(j["ceiling_tok_s"].get<double>() == Approx(r.ceiling_tok_s));
  CHECK(j["weight_bytes"].get<uint64_t>() == r.weight_bytes);
  CHECK(j["kv"]["budget_bytes"].get<uint64_t>() == r.kv_budget_bytes);
  CHECK(j["kv"]["bytes_per_token"].get<uint64_t>() == r.kv_bytes_per_token);
  CHECK(j["kv"]["capacity_tokens"].get<uint64_t>() == r.kv_capacity_tokens);
  CHECK(j["options"]["prompts"] == Json({8, 16}));
  CHECK(j["options"]["concurrency"] == Json({1, 2}));
  CHECK(j["options"]["tokens"] == 4);
  CHECK(j["options"]["repeats"] == 1);
  CHECK(j["options"]["seed"].get<uint64_t>() == r.seed);
  REQUIRE(j["cells"].size() == r.cells.size());
  for (size_t i = 0; i < r.cells.size(); ++i) {
    const Json& c = j["cells"][i];
    for (const char* k :
         {"prompt", "requested_prompt", "concurrency", "tokens", "repeats", "seeds", "ms_per_token", "tok_s_per_stream",
          "tok_s_total", "ttft_ms_median", "ttft_ms_p90", "prefill_tok_s", "pct_of_ceiling", "sessions_fit", "error"}) {
      INFO("cell " << i << " field " << k);
      CHECK(c.contains(k));
    }
    CHECK(c["prompt"] == r.cells[i].prompt);
    CHECK(c["concurrency"] == r.cells[i].concurrency);
    CHECK(c["seeds"].get<std::vector<uint64_t>>() == r.cells[i].seeds);
    CHECK(c["tok_s_per_stream"].get<double>() == Approx(r.cells[i].tok_s_per_stream));
    CHECK(c["ttft_ms_p90"].get<double>() == Approx(r.cells[i].ttft_ms_p90));
    CHECK(c["error"] == "");
  }
  const Json& t4 = j["t4_projection"];
  CHECK(t4["label"] == kLabel);
  CHECK(t4["bandwidth_gbs"].get<double>() == 277);
  CHECK(t4["ceiling_tok_s"].get<double>() == Approx(r.t4_ceiling_tok_s));
  REQUIRE(t4["cells"].size() == r.cells.size());
  CHECK(t4["cells"][0]["tok_s_per_stream"].get<double>() == Approx(r.cells[0].t4_tok_s_per_stream));
}

TEST_CASE("bench: CSV has a header and one line per cell", "[bench]") {
  const bench::Report r = tiny_report(testref::load_engine("mm_bf16", Backend::Cpu));
  const std::vector<std::string> l = lines(bench::to_csv(r));
  REQUIRE(l.size() == 1 + r.cells.size());
  const std::vector<std::string> header = csv_fields(l[0]);
  CHECK(header.size() == 21);
  CHECK(header.front() == "prompt");
  CHECK(header.back() == "error");
  const size_t note = size_t(std::find(header.begin(), header.end(), "t4_note") - header.begin());
  REQUIRE(note < header.size());
  for (size_t i = 1; i < l.size(); ++i) {
    INFO(l[i]);
    const std::vector<std::string> f = csv_fields(l[i]);
    REQUIRE(f.size() == header.size());
    const bench::Cell& c = r.cells[i - 1];
    CHECK(f[0] == std::to_string(c.prompt));
    CHECK(f[1] == std::to_string(c.requested_prompt));
    CHECK(f[2] == std::to_string(c.concurrency));
    CHECK(std::stod(f[6]) == Approx(c.tok_s_per_stream).epsilon(1e-5));  // tok_s_per_stream, %.6g
    CHECK(f[note] == kLabel);
    CHECK(f.back().empty());
  }
}

// prefill_flops from the config, against a count from the checkpoint's tensors: 2 x every decoder linear's
// elements per token (k/v only on layers that project their own cache), attention 4 x q width per (query, key)
// pair counted query by query (a sliding layer's window from config.json), the LM head once; past the K/V of the
// last layer that projects its own (the one before the last num_kv_shared_layers), the last token only.
TEST_CASE("bench: prefill_flops equals the count from the checkpoint's tensor shapes", "[bench]") {
  const std::string dir = testref::fixtures() + "/mm_bf16";
  std::ifstream f(dir + "/model.safetensors", std::ios::binary);
  REQUIRE(f);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string text(n, '\0');
  f.read(&text[0], std::streamsize(n));
  const Json header = Json::parse(text);
  const Json cfg = Json::parse(std::ifstream(dir + "/config.json"))["text_config"];
  const int L = cfg["num_hidden_layers"], shared = cfg["num_kv_shared_layers"], window = cfg["sliding_window"];
  const int keep = L - shared - 1;  // the last layer with a k_proj of its own
  const std::vector<std::string> types = cfg["layer_types"];
  const std::string pre = "model.language_model.";
  auto numel = [&](const std::string& name) -> double {
    if (!header.contains(name)) return 0;
    double e = 1;
    for (const auto& d : header[name]["shape"]) e *= d.get<double>();
    return e;
  };
  REQUIRE(shared > 0);
  // elements per token: those every token runs through, and those only the last does
  double every = numel(pre + "per_layer_model_projection.weight"), last = 0;
  std::vector<double> qwidth;
  for (int l = 0; l < L; ++l) {
    const std::string lp = pre + "layers." + std::to_string(l) + ".";
    double qkv = numel(lp + "self_attn.q_proj.weight"), rest = numel(lp + "self_attn.o_proj.weight");
    if (l < L - shared) qkv += numel(lp + "self_attn.k_proj.weight") + numel(lp + "self_attn.v_proj.weight");
    for (const char* m :
         {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection"})
      rest += numel(lp + m + ".weight");
    (l <= keep ? every : last) += qkv;
    (l < keep ? every : last) += rest;
    qwidth.push_back(header[lp + "self_attn.q_proj.weight"]["shape"][0].get<double>());
  }
  const Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  for (int P : {1, 7, 8, 9, 100, 1000}) {
    double attention = 0;
    for (int l = 0; l < L; ++l)
      for (int p = l < keep ? 0 : P - 1; p < P; ++p)
        attention +=
            4 * qwidth[size_t(l)] * (types[size_t(l)] == "sliding_attention" ? std::min(p + 1, window) : p + 1);
    const double want = 2 * every * P + 2 * last + attention + 2 * numel(pre + "embed_tokens.weight");
    INFO("prompt " << P);
    CHECK(bench::prefill_flops(engine.config(), P) == Approx(want).epsilon(1e-12));
  }
  CHECK(bench::prefill_flops(engine.config(), 0) == 0);
}

// The TTFT projection is the measured TTFT at this GPU's fp16 tensor peak over a T4's (a GPU report made by hand:
// CI has no GPU), for concurrency-1 cells only, and labelled in the table and the JSON.
TEST_CASE("bench: the T4 TTFT projection scales a concurrency-1 TTFT by the tensor-core peaks", "[bench]") {
  bench::Report r = tiny_report(testref::load_engine("mm_bf16", Backend::Cpu));
  r.backend = Backend::Cuda;
  r.device.cuda = true;
  r.device.cc_major = 9;
  r.device.sm_count = 132;
  r.device.clock_mhz = 1980;
  r.device.fp16_tensor_tflops = 132 * 1980e6 * 4096 / 1e12;
  for (bench::Cell& c : r.cells) {
    c.t4_ttft_ms = bench::t4_ttft_ms(r, c);
    INFO("prompt " << c.prompt << " concurrency " << c.concurrency);
    if (c.concurrency == 1)
      CHECK(c.t4_ttft_ms == Approx(c.ttft_ms_median * r.device.fp16_tensor_tflops / 65));
    else
      CHECK(c.t4_ttft_ms == 0);  // later streams' TTFTs include the earlier streams' prefills
  }
  const std::string table = bench::to_table(r);
  CHECK(table.find("T4 TTFT projection (projection, not measured)") != std::string::npos);
  CHECK(count(table, "ms on a T4") == 2);  // the two concurrency-1 cells
  const Json j = Json::parse(bench::to_json(r));
  CHECK(j["t4_projection"]["tensor_tflops"].get<double>() == 65);
  CHECK(j["t4_projection"]["cells"][0]["ttft_ms"].get<double>() == Approx(r.cells[0].t4_ttft_ms));
  CHECK(j["t4_projection"]["ttft_description"].get<std::string>().find(kLabel) != std::string::npos);
  CHECK(j["cells"][0]["prefill_flops"].get<double>() == Approx(r.cells[0].prefill_flops));
}

TEST_CASE("bench: SVG is well-formed enough, with one polyline per prompt in each panel", "[bench]") {
  const bench::Report r = tiny_report(testref::load_engine("mm_bf16", Backend::Cpu));
  const std::string svg = bench::to_svg(r);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.size() > 7);
  CHECK(svg.compare(svg.size() - 7, 7, "</svg>\n") == 0);
  CHECK(count(svg, "<svg") == 1);
  CHECK(count(svg, "<g ") == count(svg, "</g>"));
  CHECK(count(svg, "<g class=\"panel\"") == 2);
  CHECK(count(svg, "<polyline") == 2 * r.prompts.size());
  for (int p : r.prompts) {
    INFO("prompt " << p);
    CHECK(count(svg, "<polyline class=\"series\" data-prompt=\"" + std::to_string(p) + "\"") == 2);
  }
  CHECK(count(svg, "<circle") == 2 * r.cells.size());  // every cell measured: a point in each panel
  CHECK(count(svg, "class=\"ceiling\"") == 2);         // dashed, in both panels
  CHECK(svg.find("stroke-dasharray") != std::string::npos);
  CHECK(svg.find(kLabel) != std::string::npos);
  CHECK(svg.find('&') == std::string::npos);  // no unescaped entities from labels here
}

TEST_CASE("bench: the T4 projection is labelled as such in every format", "[bench]") {
  const bench::Report r = tiny_report(testref::load_engine("mm_bf16", Backend::Cpu));
  REQUIRE(r.t4_ceiling_tok_s > 0);
  const std::string table = bench::to_table(r);
  CHECK(table.find("T4 projection (projection, not measured)") != std::string::npos);
  CHECK(count(table, kLabel) >= 2);  // the sentence and the projected table's heading
  CHECK(bench::to_json(r).find(kLabel) != std::string::npos);
  CHECK(count(bench::to_csv(r), kLabel) == r.cells.size());
  CHECK(bench::to_svg(r).find(kLabel) != std::string::npos);
  // the measured table has one line per cell and aligned columns
  const std::vector<std::string> l = lines(table);
  auto head = std::find_if(l.begin(), l.end(), [](const std::string& s) { return s.rfind("prompt  streams", 0) == 0; });
  REQUIRE(head != l.end());
  REQUIRE(size_t(l.end() - head) > 2 + r.cells.size());
  for (size_t i = 1; i <= 1 + r.cells.size(); ++i) CHECK(head[i].size() == head->size());
}

TEST_CASE("bench: prompts too long for the context are clamped, or fail only their cells", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  bench::SweepOptions o = tiny_sweep();
  o.prompts = {100, 8};
  o.concurrency = {1};
  o.max_context = 64;
  o.measure_bandwidth = false;
  o.bandwidth.read_gbs = 10;

  SECTION("clamped, with a note") {
    bench::Report r;
    REQUIRE(bench::run(engine, o, &r));
    CHECK(r.context_limit == 64);
    REQUIRE(r.cells.size() == 2);
    CHECK(r.cells[0].ok());
    CHECK(r.cells[0].requested_prompt == 100);
    CHECK(r.cells[0].prompt == 60);  // 60 + 4 output tokens = 64
    CHECK(r.cells[1].prompt == 8);
    CHECK(std::any_of(r.notes.begin(), r.notes.end(),
                      [](const std::string& n) { return n.find("prompt 100 clamped to 60") != std::string::npos; }));
    CHECK(bench::to_table(r).find("60*") != std::string::npos);
    CHECK(bench::to_svg(r).find("clamped from 100") != std::string::npos);
  }
  SECTION("not clamped: that cell fails, the sweep goes on") {
    o.clamp_prompts = false;
    bench::Report r;
    REQUIRE(bench::run(engine, o, &r));
    REQUIRE(r.cells.size() == 2);
    CHECK_FALSE(r.cells[0].ok());
    CHECK(r.cells[0].error.find("exceed") != std::string::npos);
    CHECK(r.cells[0].repeats == 0);
    CHECK(r.cells[1].ok());
    CHECK(r.cells[1].tok_s_per_stream > 0);
    // the failed cell is reported in every format
    CHECK(bench::to_table(r).find("error: prompt 100") != std::string::npos);
    CHECK(Json::parse(bench::to_json(r))["cells"][0]["error"] != "");
    CHECK(bench::to_csv(r).find("exceed") != std::string::npos);
  }
}

TEST_CASE("bench: the sweep samples as SweepOptions::sampling says, and reports it", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  bench::SweepOptions o = tiny_sweep();
  o.measure_bandwidth = false;
  o.bandwidth.read_gbs = 10;
  bench::Report greedy;
  REQUIRE(bench::run(engine, o, &greedy));
  CHECK(greedy.sampling == "greedy");
  CHECK(bench::to_table(greedy).find("sampling    greedy\n") != std::string::npos);
  o.sampling = SamplingOptions();  // Gemma 4's generation_config
  o.sampling.repetition_penalty = 1.1f;
  bench::Report sampled;
  REQUIRE(bench::run(engine, o, &sampled));
  CHECK(sampled.sampling == "temperature 1, top-k 64, top-p 0.95, repetition penalty 1.1");
  CHECK(Json::parse(bench::to_json(sampled))["options"]["sampling"] == sampled.sampling);
  REQUIRE(sampled.cells.size() == greedy.cells.size());
  for (const bench::Cell& c : sampled.cells) {
    INFO("prompt " << c.prompt << " concurrency " << c.concurrency << ": " << c.error);
    CHECK(c.ok());
    CHECK(c.tok_s_per_stream > 0);
  }
  o.sampling.temperature = -1.f;  // <= 0 is greedy, whatever else is set
  bench::Report again;
  REQUIRE(bench::run(engine, o, &again));
  CHECK(again.sampling == "greedy");
}

TEST_CASE("bench: an on_progress that throws stops the sweep with CallbackError; the engine goes on", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  bench::SweepOptions o = tiny_sweep();
  o.measure_bandwidth = false;
  o.bandwidth.read_gbs = 10;
  for (bool std_exception : {true, false}) {
    INFO((std_exception ? "std::runtime_error" : "an int"));
    int calls = 0;
    o.on_progress = [&](const bench::Progress& p) -> bool {
      ++calls;
      if (p.cell == 1 && p.repeat == 0) {
        if (std_exception) throw std::runtime_error("progress bar gone");
        throw 7;
      }
      return true;
    };
    bench::Report r;
    const Status st = bench::run(engine, o, &r);
    INFO(st.message);
    CHECK(st.code == Code::CallbackError);
    CHECK(st.message.find(std_exception ? "progress bar gone" : "not a std::exception") != std::string::npos);
    CHECK(calls == 3);  // never called again after the throw
    REQUIRE(r.cells.size() == 4);
    CHECK(r.cells[0].ok());
    CHECK(r.cells[1].error.find("on_progress threw") != std::string::npos);
    CHECK(r.cells[2].error.find("not run") != std::string::npos);
  }
  o.on_progress = nullptr;  // the engine still runs a whole sweep
  bench::Report again;
  REQUIRE(bench::run(engine, o, &again));
  for (const bench::Cell& c : again.cells) CHECK(c.ok());
}

TEST_CASE("bench: on_progress can cancel; what was measured is kept", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  bench::SweepOptions o = tiny_sweep();
  o.measure_bandwidth = false;
  o.bandwidth.read_gbs = 10;
  std::vector<bench::Progress> seen;
  o.on_progress = [&](const bench::Progress& p) {
    seen.push_back(p);
    return !(p.cell == 1 && p.repeat == 0);  // stop before the second cell's first repeat
  };
  bench::Report r;
  const Status st = bench::run(engine, o, &r);
  CHECK(st.code == Code::Cancelled);
  CHECK(r.cancelled);
  REQUIRE(r.cells.size() == 4);
  CHECK(r.cells[0].ok());
  CHECK(r.cells[0].tok_s_per_stream > 0);
  CHECK(r.cells[1].error.find("cancelled") != std::string::npos);
  CHECK(r.cells[2].error.find("not run") != std::string::npos);
  CHECK(r.cells[3].error.find("not run") != std::string::npos);
  REQUIRE(seen.size() == 3);  // cell 0 repeat 0, cell 0 done, cell 1 repeat 0
  CHECK(seen[0].cells == 4);
  CHECK(seen[0].fraction == 0);
  CHECK(seen[1].repeat == seen[1].repeats);
  CHECK(seen[2].prompt == 8);
  CHECK(seen[2].concurrency == 2);
  CHECK(Json::parse(bench::to_json(r))["cancelled"] == true);
}

TEST_CASE("bench: bad options and an unloaded engine are refused before anything runs", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  bench::Report r;
  bench::SweepOptions o = tiny_sweep();
  o.tokens = 1;
  CHECK(bench::run(engine, o, &r).code == Code::InvalidArgument);
  o = tiny_sweep();
  o.prompts.clear();
  CHECK(bench::run(engine, o, &r).code == Code::InvalidArgument);
  o = tiny_sweep();
  o.concurrency = {0};
  CHECK(bench::run(engine, o, &r).code == Code::InvalidArgument);
  o = tiny_sweep();
  o.repeats = 0;
  CHECK(bench::run(engine, o, &r).code == Code::InvalidArgument);
  CHECK(bench::run(engine, tiny_sweep(), nullptr).code == Code::InvalidArgument);
  CHECK(bench::run(Engine(), tiny_sweep(), &r).code == Code::InvalidArgument);
  CHECK(r.cells.empty());
}

TEST_CASE("bench: the Engine's memory accessors (CPU backend)", "[bench]") {
  Engine engine = testref::load_engine("mm_bf16", Backend::Cpu);
  const ModelConfig& c = engine.config();
  size_t per_token = 0;
  for (const LayerConfig& l : c.layers)
    if (!l.kv_shared) per_token += 2 * size_t(l.num_kv_heads) * l.head_dim * sizeof(float);
  CHECK(engine.kv_bytes_per_token() == per_token);
  // within the sliding window every layer grows with the context; past it only the full layers do
  const size_t w = size_t(c.sliding_window);
  CHECK(engine.session_bytes(1) == per_token);
  CHECK(engine.session_bytes(w) == w * per_token);
  size_t full = 0;
  for (const LayerConfig& l : c.layers)
    if (!l.kv_shared && l.type == LayerType::Full) full += 2 * size_t(l.num_kv_heads) * l.head_dim * sizeof(float);
  CHECK(engine.session_bytes(w + 100) - engine.session_bytes(w + 99) == full);
  CHECK(engine.session_bytes() == engine.session_bytes(engine.load_options().max_context));
  CHECK(engine.load_options().backend == Backend::Cpu);
  // weights are read in place: the tensors the text model uses, no more than the file holds
  const auto file = std::filesystem::file_size(testref::fixtures() + "/mm_bf16/model.safetensors");
  CHECK(engine.weight_bytes() > size_t(engine.decode_bytes_per_token()) / 2);
  CHECK(engine.weight_bytes() < file);
  const Engine none;
  CHECK(none.weight_bytes() == 0);
  CHECK(none.kv_bytes_per_token() == 0);
  CHECK(none.session_bytes(16) == 0);
}

TEST_CASE("bench: host bandwidth is measured on the CPU", "[bench]") {
  bench::BandwidthOptions o;
  o.bytes = uint64_t(4) << 20;
  o.repeats = 3;
  o.threads = 2;
  bench::Bandwidth b;
  REQUIRE(bench::measure_bandwidth(Backend::Cpu, 0, o, &b));
  CHECK(b.backend == Backend::Cpu);
  CHECK(b.read_gbs > 0);
  CHECK(b.copy_gbs == 0);
  CHECK(b.threads == 2);
  CHECK(b.repeats == 3);
  CHECK(b.bytes == uint64_t(4) << 20);
  CHECK(bench::to_text(b).find("host read") != std::string::npos);
  CHECK(Json::parse(bench::to_json(b))["read_gbs"].get<double>() > 0);
  CHECK(bench::measure_bandwidth(Backend::Cpu, 0, o, nullptr).code == Code::InvalidArgument);
}

TEST_CASE("bench: device report and doctor without a GPU do not crash and say so", "[bench]") {
  const bench::DeviceReport d = bench::device_report(0);
  const std::string text = bench::to_text(d);
  CHECK_FALSE(text.empty());
  CHECK(Json::parse(bench::to_json(d))["cuda"] == d.cuda);
  if (!d.cuda) {  // the CPU build, or a CUDA build on a machine without a GPU
    CHECK(d.note.find("no CUDA device") != std::string::npos);
    CHECK(text.find("no CUDA device") != std::string::npos);
    // A CUDA build on a machine without a driver (CI): said in words, not as cudaErrorInsufficientDriver.
    const bool cuda_build = d.note.find("GEMMA4_T4_NO_CUDA") == std::string::npos;
    if (cuda_build && d.driver_version == 0) CHECK(d.note.find("no NVIDIA driver found") != std::string::npos);
    CHECK(d.note.find("cudaErrorInsufficientDriver") == std::string::npos);
  }
  CHECK(d.host_threads > 0);

  const bench::DoctorReport doc = bench::doctor(testref::fixtures() + "/mm_bf16");
  CHECK(doc.model_ok);
  CHECK(doc.model_summary.find("7 layers") != std::string::npos);
  CHECK(doc.model_file_bytes == std::filesystem::file_size(testref::fixtures() + "/mm_bf16/model.safetensors"));
  CHECK(doc.decode_bytes_per_token > 0);
  CHECK(doc.model_gpu_bytes > doc.decode_bytes_per_token);
  CHECK(doc.host_ram_total > 0);
  CHECK(doc.disk_free > 0);
  const std::string dt = bench::to_text(doc);
  if (!doc.device.cuda) {
    CHECK(dt.find("no CUDA device") != std::string::npos);
    CHECK(std::any_of(doc.warnings.begin(), doc.warnings.end(),
                      [](const std::string& w) { return w.find("no CUDA device") != std::string::npos; }));
  }
  const Json dj = Json::parse(bench::to_json(doc));
  CHECK(dj["model_ok"] == true);
  CHECK(dj["warnings"].size() == doc.warnings.size());

  testutil::TempDir tmp;
  const bench::DoctorReport bad = bench::doctor((tmp.path() / "no_such_model").string());
  CHECK_FALSE(bad.model_ok);
  CHECK(std::any_of(bad.warnings.begin(), bad.warnings.end(),
                    [](const std::string& w) { return w.rfind("model: ", 0) == 0; }));
  CHECK(bad.disk_free > 0);  // measured on the nearest existing parent
}

TEST_CASE("bench: write_file writes, and names the path when it cannot", "[bench]") {
  testutil::TempDir tmp;
  const std::string path = (tmp.path() / "r.json").string();
  REQUIRE(bench::write_file(path, "{}\n"));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "{}\n");
  const Status st = bench::write_file((tmp.path() / "no" / "dir" / "r.json").string(), "x");
  CHECK(st.code == Code::IoError);
  CHECK(st.message.find("no/dir/r.json") != std::string::npos);
}
