// Shared by the CPU and GPU parity tests: the fixtures' reference outputs (tests/fixtures/README.md) and
// the row comparison every parity test uses.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"

namespace testref {

inline const std::string& fixtures() {
  static const std::string dir = GEMMA4_T4_FIXTURES;
  return dir;
}

struct Reference {
  gemma4_t4::detail::TensorStore store;
  std::vector<int32_t> prompt, decode_ids;
  std::vector<float> prefill, decode;  // [T, V], [S, V]
  int vocab = 0;
};

inline std::vector<int32_t> ints(const gemma4_t4::detail::TensorInfo& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

inline std::vector<float> floats(const gemma4_t4::detail::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = gemma4_t4::detail::load_float(t, i);
  return v;
}

inline void load_reference(const std::string& name, Reference* r) {
  const std::string path = fixtures() + "/" + name + "/reference.safetensors";
  gemma4_t4::Status st = r->store.open(path);
  INFO(st.message);
  REQUIRE(st);
  auto get = [&](const char* n) {
    const gemma4_t4::detail::TensorInfo* t = r->store.find(n);
    INFO("reference tensor " << n);
    REQUIRE(t != nullptr);
    return t;
  };
  REQUIRE(get("prompt_ids")->dtype == gemma4_t4::detail::DType::I32);
  r->prompt = ints(*get("prompt_ids"));
  r->decode_ids = ints(*get("decode_ids"));
  r->prefill = floats(*get("prefill_logits"));
  r->decode = floats(*get("decode_logits"));
  r->vocab = int(get("prefill_logits")->shape[1]);
}

// load_reference as a value: `const Reference ref = reference("mm_bf16");`.
inline Reference reference(const std::string& name) {
  Reference r;
  load_reference(name, &r);
  return r;
}

// max |a - b| / max |b| over one row of V logits
// An E2B-shaped checkpoint written by tools/make_synthetic (GPU tests; the build defines its path): hidden 1536,
// head dims 256 / 512, 8 query heads per KV head, PLE, KV-shared layers of both types, double-wide MLPs.
#ifdef GEMMA4_T4_MAKE_SYNTHETIC
inline void make_e2b_model(const std::string& dir, const std::string& format, int layers = 7) {
  const std::string cmd = std::string("'") + GEMMA4_T4_MAKE_SYNTHETIC + "' --model e2b --layers " +
                          std::to_string(layers) + " --vocab 4096 --format " + format + " --seed 11 --out '" + dir +
                          "' > /dev/null 2>&1";
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
}
#endif

// Engine::load that must succeed (the message shown when it does not).
inline gemma4_t4::Engine load_engine(const std::string& dir, const gemma4_t4::LoadOptions& opt) {
  gemma4_t4::Engine e;
  const gemma4_t4::Status st = gemma4_t4::Engine::load(dir, opt, &e);
  INFO(st.message);
  REQUIRE(st);
  return e;
}

// prefix[0..n) then `rest`, fed to a fresh session in two forwards; the logits of every row of `rest`.
inline std::vector<float> fed_itself(const gemma4_t4::Engine& e, const std::vector<int32_t>& prefix, size_t n,
                                     const std::vector<int32_t>& rest, size_t ctx) {
  gemma4_t4::Session s;
  REQUIRE(e.create_session(&s, ctx));
  if (n) REQUIRE(e.forward(s, prefix.data(), n, gemma4_t4::Logits::None, nullptr));
  std::vector<float> logits;
  REQUIRE(e.forward(s, rest.data(), rest.size(), gemma4_t4::Logits::All, &logits));
  return logits;
}

// The largest value's lead over the second: argmax comparisons are meaningful only where it is well above
// the compared paths' difference.
inline double top_gap(const float* x, int V) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < V; ++i) {
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  return double(a) - double(b);
}

inline double max_abs(const float* x, int V) {
  double m = 0;
  for (int i = 0; i < V; ++i) m = std::max(m, double(std::fabs(x[i])));
  return m;
}

inline double row_error(const float* a, const float* b, int V) {
  double e = 0, m = 0;
  for (int i = 0; i < V; ++i) {
    e = std::max(e, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return e / m;
}

// Every row within `tol` and with the same argmax. Returns the largest error seen.
inline double check_rows(const std::vector<float>& got, const float* ref, size_t rows, int V, double tol,
                         const std::string& what) {
  REQUIRE(got.size() == rows * size_t(V));
  double worst = 0;
  for (size_t r = 0; r < rows; ++r) {
    const double e = row_error(&got[r * V], ref + r * V, V);
    worst = std::max(worst, e);
    INFO(what << " row " << r << " rel err " << e);
    CHECK(e <= tol);
    CHECK(gemma4_t4::argmax(&got[r * V], size_t(V)) == gemma4_t4::argmax(ref + r * V, size_t(V)));
  }
  return worst;
}

// Feeds `tokens` to the session `chunk` at a time and returns every position's logits, concatenated.
inline std::vector<float> forward_in_chunks(const gemma4_t4::Engine& engine, gemma4_t4::Session& session,
                                            const std::vector<int32_t>& tokens, size_t chunk) {
  std::vector<float> all, logits;
  for (size_t b = 0; b < tokens.size(); b += chunk) {
    const size_t n = std::min(chunk, tokens.size() - b);
    REQUIRE(engine.forward(session, &tokens[b], n, gemma4_t4::Logits::All, &logits));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

inline gemma4_t4::Engine load_engine(const std::string& name, gemma4_t4::Backend backend,
                                     gemma4_t4::PleLocation ple = gemma4_t4::PleLocation::Host,
                                     size_t max_context = 1024, gemma4_t4::LmHead lm_head = gemma4_t4::LmHead::F16,
                                     int max_pass_rows = 0) {  // 0: LoadOptions' default
  gemma4_t4::Engine e;
  gemma4_t4::LoadOptions opt;
  opt.backend = backend;
  if (max_pass_rows > 0) opt.max_pass_rows = max_pass_rows;
  opt.max_context = max_context;
  opt.ple = ple;
  opt.lm_head = lm_head;
  gemma4_t4::Status st = gemma4_t4::Engine::load(fixtures() + "/" + name, opt, &e);
  INFO(st.message);
  REQUIRE(st);
  return e;
}

// Past the last layer that writes a cache, a pass goes on with the rows whose logits it returns only (block.hpp
// keep_selected). What that must not change,
// each within `tol` of the same engine's every-row results (Logits::All), with the same argmax where the top two
// logits are well apart: a prompt's last row (Logits::Last); the caches a pass leaves (decoding after a
// Logits::None prompt); and rows batched beside a prompt (one session's last prompt token as a one-row item next
// to another session's whole prompt).
inline void check_kv_tail(const gemma4_t4::Engine& engine, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& decode, double tol, const std::string& what) {
  using gemma4_t4::Logits;
  const int V = engine.config().vocab_size;
  const size_t T = prompt.size(), S = decode.size();
  auto same = [&](const float* got, const float* want, size_t rows, const std::string& case_) {
    for (size_t r = 0; r < rows; ++r) {
      const float *g = got + r * V, *w = want + r * V;
      const double e = row_error(g, w, V);
      INFO(what << ": " << case_ << ", row " << r << ": rel err " << e);
      CHECK(e <= tol);
      if (top_gap(w, V) > 4 * tol * max_abs(w, V))
        CHECK(gemma4_t4::argmax(g, size_t(V)) == gemma4_t4::argmax(w, size_t(V)));
    }
  };
  gemma4_t4::Session all, last, none, split, whole;
  for (gemma4_t4::Session* s : {&all, &last, &none, &split, &whole}) REQUIRE(engine.create_session(s));
  std::vector<float> la, lg;
  REQUIRE(engine.forward(all, prompt.data(), T, Logits::All, &la));
  const float* la_last = &la[(T - 1) * V];
  REQUIRE(engine.forward(last, prompt.data(), T, Logits::Last, &lg));
  REQUIRE(lg.size() == size_t(V));
  same(lg.data(), la_last, 1, "Logits::Last against the last row of Logits::All");
  // the caches: the decode rows after each prompt
  std::vector<float> da;
  REQUIRE(engine.forward(all, decode.data(), S, Logits::All, &da));
  REQUIRE(engine.forward(none, prompt.data(), T, Logits::None, nullptr));
  REQUIRE(engine.forward(none, decode.data(), S, Logits::All, &lg));
  REQUIRE(lg.size() == S * V);
  same(lg.data(), da.data(), S, "decode after a Logits::None prompt");
  // one pass: split's last prompt token (one row) beside whole's prompt (T rows); both rows are position T - 1's
  REQUIRE(engine.forward(split, prompt.data(), T - 1, Logits::None, nullptr));
  const gemma4_t4::BatchItem items[2] = {{&split, &prompt[T - 1], 1}, {&whole, prompt.data(), T}};
  REQUIRE(engine.forward_batch(items, 2, Logits::Last, &lg));
  REQUIRE(lg.size() == 2 * size_t(V));
  same(lg.data(), la_last, 1, "a row beside a prompt");
  same(lg.data() + V, la_last, 1, "a prompt beside a row");
}

// Greedy generation of n new tokens, EOS ignored (with a repetition penalty when asked).
inline gemma4_t4::GenerateOptions greedy(int n, float penalty = 1.f) {
  gemma4_t4::GenerateOptions opt;
  opt.sampling = gemma4_t4::SamplingOptions::greedy();
  opt.sampling.repetition_penalty = penalty;
  opt.max_new_tokens = n;
  opt.stop_at_eos = false;
  return opt;
}

// generate() on session s (fed from its current position): the tokens, REQUIRE-ing success.
inline std::vector<int32_t> tokens_of(const gemma4_t4::Engine& engine, gemma4_t4::Session& s,
                                      const std::vector<int32_t>& prompt, const gemma4_t4::GenerateOptions& opt) {
  std::vector<int32_t> out;
  const gemma4_t4::Status st = gemma4_t4::generate(engine, s, prompt, opt, nullptr, &out);
  INFO(st.message);
  REQUIRE(st);
  return out;
}

// generate() on a fresh session, no callback: what an undisturbed run gives.
inline std::vector<int32_t> fresh_tokens(const gemma4_t4::Engine& engine, const std::vector<int32_t>& prompt,
                                         const gemma4_t4::GenerateOptions& opt) {
  gemma4_t4::Session s;
  REQUIRE(engine.create_session(&s));
  return tokens_of(engine, s, prompt, opt);
}

// n token ids uniform in [5, V) (past the special ids), drawn from std::mt19937(seed).
inline std::vector<int32_t> random_tokens(int V, size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> id(5, V - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = id(rng);
  return t;
}

// Engines a and b (two backends or decode paths of one checkpoint) fed the same tokens on fresh sessions: the
// prompt in one forward, then `steps` single tokens, each the argmax of b's logits. check(step, la, lb) gets the
// last-position logits of both ([vocab] fp32): step 0 after the prompt, then 1..steps.
template <class Check>
void lockstep(const gemma4_t4::Engine& a, const gemma4_t4::Engine& b, const std::vector<int32_t>& prompt, int steps,
              const Check& check) {
  gemma4_t4::Session sa, sb;
  REQUIRE(a.create_session(&sa));
  REQUIRE(b.create_session(&sb));
  std::vector<float> la, lb;
  REQUIRE(a.forward(sa, prompt.data(), prompt.size(), gemma4_t4::Logits::Last, &la));
  REQUIRE(b.forward(sb, prompt.data(), prompt.size(), gemma4_t4::Logits::Last, &lb));
  check(0, la, lb);
  for (int step = 1; step <= steps; ++step) {
    const int32_t t = gemma4_t4::argmax(lb.data(), lb.size());
    REQUIRE(a.forward(sa, &t, 1, gemma4_t4::Logits::Last, &la));
    REQUIRE(b.forward(sb, &t, 1, gemma4_t4::Logits::Last, &lb));
    check(step, la, lb);
  }
}

// The fixture's checkpoint files (not its reference outputs) copied into dir / name, a copy a test may
// damage. Returns that directory.
inline std::filesystem::path copy_fixture(const std::string& name, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path dst = dir / name;
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(fs::path(fixtures()) / name))
    if (e.path().filename() != "reference.safetensors") fs::copy_file(e.path(), dst / e.path().filename());
  return dst;
}

}  // namespace testref
