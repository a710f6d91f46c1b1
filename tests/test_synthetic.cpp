// tools/make_synthetic end to end: the checkpoints it writes load through gemma4_t4::Engine::load, carry the
// config they claim, run a forward pass to finite, varied logits, and the decode bytes per token the tool
// prints equal Engine::decode_bytes_per_token(). `--model tiny` is also compared with the fixture it copies
// (tests/fixtures/mm_bf16 and w4a16): same config.json text_config and quantization_config, and the same
// safetensors header (names, dtypes, shapes, offsets) as the Python safetensors writer produced.
//
// CMake passes the tool's path as GEMMA4_T4_MAKE_SYNTHETIC (a string literal); without it this file is
// empty. Each case writes into its own temp directory, removed at the end. The e2b cases (2 layers,
// 262144-token vocabulary: ~1.2 GB per file, written and removed one at a time) fall back to --vocab 16384
// with a warning when the temp filesystem has less than 4 GB free.
#include <catch2/catch.hpp>

#include "gemma4_t4.hpp"
#include "temp_dir.hpp"
#include "fixture_config.hpp"

#ifdef GEMMA4_T4_MAKE_SYNTHETIC

#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using gemma4_t4::Backend;
using gemma4_t4::Engine;
using gemma4_t4::LayerType;
using gemma4_t4::Logits;
using gemma4_t4::WeightFormat;
using json = nlohmann::json;

using testutil::TempDir;

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct ToolRun {
  int status = -1;     // exit status (-1: did not exit normally)
  std::string output;  // stdout + stderr
};

// Runs the tool with `args` (through /bin/sh; `prefix` is shell text put before it, e.g. a ulimit).
ToolRun run_tool(const std::vector<std::string>& args, const std::string& prefix = "") {
  std::string cmd = prefix + quote(GEMMA4_T4_MAKE_SYNTHETIC);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " 2>&1";
  ToolRun r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = ::pclose(p);
  if (st != -1 && WIFEXITED(st)) r.status = WEXITSTATUS(st);
  return r;
}

// The integer after "decode_bytes_per_token: " in the tool's output; 0 when absent.
uint64_t printed_decode_bytes(const std::string& out) {
  const std::string key = "decode_bytes_per_token: ";
  const size_t at = out.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoull(out.c_str() + at + key.size(), nullptr, 10);
}

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return json::parse(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The header of a safetensors file: its length (8-byte prefix) and the parsed JSON.
json safetensors_header(const fs::path& p, uint64_t* length) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  unsigned char len[8];
  REQUIRE(in.read(reinterpret_cast<char*>(len), 8));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  REQUIRE(n < (uint64_t(1) << 26));
  std::string text(n, '\0');
  REQUIRE(in.read(&text[0], std::streamsize(n)));
  *length = n;
  return json::parse(text);
}

// Generates into dir, checks the exit status and returns the printed decode bytes.
uint64_t make(const fs::path& dir, std::vector<std::string> args) {
  args.push_back("--out");
  args.push_back(dir.string());
  const ToolRun r = run_tool(args);
  INFO("make_synthetic output:\n" << r.output);
  REQUIRE(r.status == 0);
  REQUIRE(fs::is_regular_file(dir / "config.json"));
  REQUIRE(fs::is_regular_file(dir / "model.safetensors"));
  const uint64_t decode = printed_decode_bytes(r.output);
  REQUIRE(decode > 0);
  uint64_t header_len = 0;
  safetensors_header(dir / "model.safetensors", &header_len);
  CHECK(header_len % 8 == 0);  // padded as the safetensors writer does
  return decode;
}

// Loads dir on the CPU, runs a 3-token forward, checks logits and decode bytes; returns the engine.
Engine load_and_run(const fs::path& dir, uint64_t decode_bytes) {
  Engine engine;
  gemma4_t4::LoadOptions opt;
  opt.backend = Backend::Cpu;
  opt.max_context = 64;
  const gemma4_t4::Status st = Engine::load(dir.string(), opt, &engine);
  INFO(st.message);
  REQUIRE(st);
  const int V = engine.config().vocab_size;
  gemma4_t4::Session s;
  REQUIRE(engine.create_session(&s));
  const int32_t tokens[3] = {2, 105, 257};
  std::vector<float> logits;
  REQUIRE(engine.forward(s, tokens, 3, Logits::All, &logits));
  REQUIRE(logits.size() == size_t(3) * size_t(V));
  for (int r = 0; r < 3; ++r) {
    INFO("row " << r);
    const float* row = &logits[size_t(r) * size_t(V)];
    bool finite = true, varied = false;
    for (int i = 0; i < V; ++i) {
      finite = finite && std::isfinite(row[i]);
      varied = varied || row[i] != row[0];
    }
    CHECK(finite);
    CHECK(varied);
  }
  CHECK(s.position() == 3);
  CHECK(engine.decode_bytes_per_token() == double(decode_bytes));
  return engine;
}

uint64_t free_bytes(const fs::path& dir) {
  struct statvfs sv;
  if (::statvfs(dir.c_str(), &sv) != 0) return 0;
  return uint64_t(sv.f_bavail) * uint64_t(sv.f_frsize);
}

}  // namespace

TEST_CASE("make_synthetic --model tiny: the mm_bf16 fixture's layout, loads and runs", "[synthetic]") {
  for (const std::string format : {"bf16", "w4a16"}) {
    INFO("format " << format);
    TempDir tmp;
    const uint64_t decode = make(tmp.path(), {"--model", "tiny", "--format", format, "--seed", "5"});
    Engine engine = load_and_run(tmp.path(), decode);
    const gemma4_t4::ModelConfig& c = engine.config();
    testutil::check_tiny_config(c);
    CHECK(c.weight_format == (format == "w4a16" ? WeightFormat::W4A16 : WeightFormat::Bf16));

#ifdef GEMMA4_T4_FIXTURES
    // Same config and the same tensor layout as the fixture (which the Python safetensors writer made).
    const fs::path fx = fs::path(GEMMA4_T4_FIXTURES) / (format == "w4a16" ? "w4a16" : "mm_bf16");
    json mine = read_json(tmp.path() / "config.json"), theirs = read_json(fx / "config.json");
    mine["text_config"].erase("dtype");  // the tool says "bfloat16", as released checkpoints do
    theirs["text_config"].erase("dtype");
    CHECK(mine == theirs);
    uint64_t len_mine = 0, len_theirs = 0;
    const json h_mine = safetensors_header(tmp.path() / "model.safetensors", &len_mine);
    const json h_theirs = safetensors_header(fx / "model.safetensors", &len_theirs);
    CHECK(len_mine == len_theirs);
    CHECK(h_mine == h_theirs);
    CHECK(fs::file_size(tmp.path() / "model.safetensors") == fs::file_size(fx / "model.safetensors"));
#endif
  }
}

TEST_CASE("make_synthetic --model e2b --layers 2: real widths, loads and runs", "[synthetic]") {
  const bool full_vocab = free_bytes(fs::temp_directory_path()) >= (uint64_t(4) << 30);
  if (!full_vocab) WARN("less than 4 GB free under " << fs::temp_directory_path() << ": e2b cases use --vocab 16384");
  const int V = full_vocab ? 262144 : 16384;
  for (const std::string format : {"bf16", "w4a16"}) {
    INFO("format " << format);
    TempDir tmp;
    std::vector<std::string> args = {"--model", "e2b", "--layers", "2", "--format", format};
    if (!full_vocab) args.insert(args.end(), {"--vocab", std::to_string(V)});
    const uint64_t decode = make(tmp.path(), args);
    Engine engine = load_and_run(tmp.path(), decode);
    const gemma4_t4::ModelConfig& c = engine.config();
    CHECK(c.hidden_size == 1536);
    CHECK(c.num_layers == 2);
    CHECK(c.num_heads == 8);
    CHECK(c.vocab_size == V);
    CHECK(c.vocab_size_per_layer_input == V);
    CHECK(c.hidden_size_per_layer_input == 256);
    CHECK(c.sliding_window == 512);
    CHECK(c.max_position_embeddings == 131072);
    CHECK(c.final_logit_softcapping == 30.f);
    CHECK(c.num_kv_shared_layers == 0);  // 20 of 35 clamped: 2 layers leave no source for a shared layer
    CHECK(c.eos_token_ids == std::vector<int>{1, 106});
    CHECK(c.weight_format == (format == "w4a16" ? WeightFormat::W4A16 : WeightFormat::Bf16));
    REQUIRE(c.layers.size() == 2);
    const gemma4_t4::LayerConfig& s = c.layers[0];
    const gemma4_t4::LayerConfig& f = c.layers[1];  // the last layer is always full attention
    CHECK(s.type == LayerType::Sliding);
    CHECK(s.head_dim == 256);
    CHECK(s.rope_pairs == 128);
    CHECK(s.rope_theta == 10000.f);
    CHECK(f.type == LayerType::Full);
    CHECK(f.head_dim == 512);
    CHECK(f.rope_pairs == 64);  // proportional RoPE, partial 0.25
    CHECK(f.rope_theta == 1e6f);
    for (const auto& l : c.layers) {
      CHECK(l.num_kv_heads == 1);
      CHECK(l.intermediate_size == 6144);
      CHECK_FALSE(l.kv_shared);
    }
    // Dense bytes by hand: LM head + PLE projection + per layer (q, k, v, o, gate, up, down, PLE gate/proj).
    const double H = 1536, D = 256, I = 6144;
    double params = 2 * D * H;  // per_layer_model_projection [L*D, H]
    for (double d : {256.0, 512.0}) params += 8 * d * H * 2 + d * H * 2 + 3 * I * H + 2 * D * H;
    const double expect = double(V) * H * 2 + (format == "w4a16" ? params * (0.5 + 2.0 / 32) : params * 2);
    CHECK(engine.decode_bytes_per_token() == expect);
  }
}

TEST_CASE("make_synthetic: same seed same bytes; errors exit 1", "[synthetic]") {
  TempDir tmp;
  const fs::path a = tmp.path() / "a", b = tmp.path() / "b", c = tmp.path() / "c";
  make(a, {"--model", "tiny", "--format", "w4a16", "--seed", "9"});
  make(b, {"--model=tiny", "--format=w4a16", "--seed=9"});
  make(c, {"--model", "tiny", "--format", "w4a16", "--seed", "10"});
  CHECK(read_file(a / "model.safetensors") == read_file(b / "model.safetensors"));
  CHECK(read_file(a / "model.safetensors") != read_file(c / "model.safetensors"));

  const ToolRun help = run_tool({"--help"});
  CHECK(help.status == 0);
  CHECK(help.output.find("usage: make_synthetic") != std::string::npos);

  const std::vector<std::vector<std::string>> bad = {
      {},
      {"--model", "e9b", "--format", "bf16", "--out", (tmp.path() / "x").string()},
      {"--model", "tiny", "--format", "int8", "--out", (tmp.path() / "x").string()},
      {"--model", "tiny", "--format", "bf16"},
      {"--model", "tiny", "--format", "bf16", "--out", (tmp.path() / "x").string(), "--layers", "0"},
      {"--model", "tiny", "--format", "bf16", "--out", (tmp.path() / "x").string(), "--vocab", "12"},
      {"--model", "tiny", "--format", "bf16", "--out", (tmp.path() / "x").string(), "--bogus"},
      {"--model", "tiny", "--format", "bf16", "--out"},
  };
  for (const auto& args : bad) {
    const ToolRun r = run_tool(args);
    INFO("args: " <<
         [&] {
           std::string s;
           for (const auto& x : args) s += x + " ";
           return s;
         }() << "\noutput:\n"
                  << r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("make_synthetic: ") != std::string::npos);
  }

  // A write failure (here: a file-size limit of 128 shell blocks, far below the 1.3 MB file) is reported, exits 1 and
  // leaves no partial files.
  const fs::path d = tmp.path() / "limited";
  const ToolRun r = run_tool({"--model", "tiny", "--format", "bf16", "--out", d.string()}, "ulimit -f 128; ");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(r.output.find("write failed") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "model.safetensors"));
  CHECK_FALSE(fs::exists(d / "config.json"));
}

#endif  // GEMMA4_T4_MAKE_SYNTHETIC
