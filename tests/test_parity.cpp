// CPU backend vs the reference implementation's stored logits (tests/fixtures, made by
// tools/make_fixtures.py with transformers 5.17). Every row: max |err| / max |ref| <= 1e-4, and the greedy
// tokens identical.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gemma4_t4.hpp"
#include "gemma4_t4/common.hpp"
#include "gemma4_t4/safetensors.hpp"
#include "gemma4_t4/config.hpp"
#include "gemma4_t4/weights.hpp"
#include "reference.hpp"

using namespace gemma4_t4;

using namespace testref;

namespace {

constexpr double kTol = 1e-4;

void check_rows(const std::vector<float>& got, const float* ref, size_t rows, int V, const std::string& what) {
  testref::check_rows(got, ref, rows, V, kTol, what);
}

Engine load_engine(const std::string& name) { return testref::load_engine(name, Backend::Cpu, PleLocation::Host, 64); }

void parity(const std::string& name) {
  const Reference ref = reference(name);
  Engine engine = load_engine(name);
  const int V = engine.config().vocab_size;
  REQUIRE(V == ref.vocab);
  const size_t T = ref.prompt.size(), S = ref.decode_ids.size();
  REQUIRE(T > size_t(engine.config().sliding_window));  // the window is exercised

  SECTION("prefill, then step-by-step greedy decode") {
    Session s;
    REQUIRE(engine.create_session(&s));
    std::vector<float> logits;
    REQUIRE(engine.forward(s, ref.prompt.data(), T, Logits::All, &logits));
    check_rows(logits, ref.prefill.data(), T, V, "prefill");
    int next = argmax(&logits[(T - 1) * V], size_t(V));
    for (size_t step = 0; step < S; ++step) {
      INFO("decode step " << step);
      REQUIRE(next == ref.decode_ids[step]);  // our greedy choice is the reference's
      REQUIRE(engine.forward(s, &ref.decode_ids[step], 1, Logits::Last, &logits));
      check_rows(logits, &ref.decode[step * V], 1, V, "decode");
      next = argmax(logits.data(), size_t(V));
    }
    CHECK(s.position() == T + S);
  }

  SECTION("chunked prefill equals one-shot prefill") {
    for (size_t chunk : {size_t(1), size_t(3), size_t(7), size_t(9), size_t(16)}) {
      INFO("chunk " << chunk);
      Session s;
      REQUIRE(engine.create_session(&s));
      const std::vector<float> all = forward_in_chunks(engine, s, ref.prompt, chunk);
      std::vector<float> logits;
      check_rows(all, ref.prefill.data(), T, V, "chunked prefill");
      // and decoding continues correctly from a chunked cache
      REQUIRE(engine.forward(s, ref.decode_ids.data(), S, Logits::All, &logits));
      check_rows(logits, ref.decode.data(), S, V, "decode after chunked prefill");
    }
  }

  SECTION("sessions side by side do not disturb each other") {
    Session a, b;
    REQUIRE(engine.create_session(&a));
    REQUIRE(engine.create_session(&b));
    std::vector<float> la, lb;
    REQUIRE(engine.forward(a, ref.prompt.data(), T, Logits::Last, &la));
    REQUIRE(engine.forward(b, ref.prompt.data(), 5, Logits::None, nullptr));
    for (size_t step = 0; step < S; ++step) {
      REQUIRE(engine.forward(a, &ref.decode_ids[step], 1, Logits::Last, &la));
      check_rows(la, &ref.decode[step * V], 1, V, "session a");
      if (step == 3) REQUIRE(engine.forward(b, &ref.prompt[5], T - 5, Logits::Last, &lb));
    }
    check_rows(lb, &ref.prefill[(T - 1) * V], 1, V, "session b");
    // reset reuses the memory and starts over
    a.reset();
    REQUIRE(engine.forward(a, ref.prompt.data(), T, Logits::Last, &la));
    check_rows(la, &ref.prefill[(T - 1) * V], 1, V, "after reset");
  }
}

}  // namespace

TEST_CASE("CPU parity: multimodal-layout bf16 (PLE, KV sharing, double-wide MLP)", "[parity][cpu]") {
  parity("mm_bf16");
}
TEST_CASE("CPU parity: flat sharded f32 with attention_k_eq_v", "[parity][cpu]") { parity("flat_keqv"); }
TEST_CASE("CPU parity: compressed-tensors w4a16", "[parity][cpu]") { parity("w4a16"); }

TEST_CASE("CPU: past the last cache write only the rows whose logits are returned go on", "[parity][cpu]") {
  for (const char* name : {"mm_bf16", "flat_keqv", "w4a16"}) {  // KV-shared layers after it, or none
    INFO(name);
    const Reference ref = reference(name);
    Engine engine = load_engine(name);
    check_kv_tail(engine, ref.prompt, ref.decode_ids, 1e-5, name);
  }
}

TEST_CASE("w4a16 unpacking is bit-exact against the fixture script's packing", "[w4a16][cpu]") {
  const Reference ref = reference("w4a16");
  std::string text;
  const std::string dir = fixtures() + "/w4a16";
  REQUIRE(detail::read_text_file(dir + "/config.json", &text));
  ModelConfig cfg;
  REQUIRE(detail::parse_config(text, dir, &cfg));
  REQUIRE(cfg.weight_format == WeightFormat::W4A16);
  detail::TensorStore store;
  REQUIRE(store.open(dir));
  detail::Weights w;
  detail::WeightBinder binder(store, cfg, dir);
  REQUIRE(binder.bind(&w));
  int checked = 0;
  for (const auto& kv : ref.store.tensors()) {
    if (kv.first.rfind("dequant.", 0) != 0) continue;
    const std::string name = kv.first.substr(8, kv.first.size() - 8 - 7);  // strip "dequant." and ".weight"
    const detail::LinearW* lw = nullptr;
    for (const auto& l : w.layers)
      for (const detail::LinearW* c : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &l.ple_gate, &l.ple_proj})
        if (c->name == name) lw = c;
    INFO(name);
    REQUIRE(lw != nullptr);
    REQUIRE(lw->quantized());
    const std::vector<float> expect = floats(kv.second);
    std::vector<float> row(static_cast<size_t>(lw->in));
    size_t mismatches = 0;
    for (int o = 0; o < lw->out; ++o) {
      detail::unpack_w4_row(*lw, o, row.data());
      for (int i = 0; i < lw->in; ++i)
        if (std::memcmp(&row[i], &expect[size_t(o) * lw->in + i], 4) != 0) ++mismatches;
    }
    CHECK(mismatches == 0);
    ++checked;
  }
  CHECK(checked == 2);
}

TEST_CASE("decode bytes per token counts packed weights at 4 bits", "[w4a16][cpu]") {
  Engine bf = load_engine("mm_bf16");
  Engine q4 = load_engine("w4a16");
  const double lm = double(bf.config().vocab_size) * bf.config().hidden_size * 2.0;
  // same architecture: the body shrinks to a quarter plus scales (fp16 per 32 weights); the LM head stays
  const double body_bf = bf.decode_bytes_per_token() - lm, body_q4 = q4.decode_bytes_per_token() - lm;
  CHECK(body_q4 == Approx(body_bf * (0.25 + 2.0 / 32 / 2)).epsilon(1e-9));
}

TEST_CASE("invalid tokens and context overflow are errors that leave the session usable", "[cpu][errors]") {
  const Reference ref = reference("mm_bf16");
  Engine engine = load_engine("mm_bf16");
  Session s;
  REQUIRE(engine.create_session(&s, 24));
  std::vector<float> logits;
  const int32_t bad[2] = {5, engine.config().vocab_size};
  Status st = engine.forward(s, bad, 2, Logits::Last, &logits);
  CHECK(st.code == Code::InvalidArgument);
  CHECK_THAT(st.message, Catch::Contains("token 1"));
  const int32_t neg = -3;
  CHECK(engine.forward(s, &neg, 1, Logits::Last, &logits).code == Code::InvalidArgument);
  CHECK(s.position() == 0);
  REQUIRE(engine.forward(s, ref.prompt.data(), ref.prompt.size(), Logits::Last, &logits));
  std::vector<int32_t> more(5, 7);
  st = engine.forward(s, more.data(), more.size(), Logits::Last, &logits);
  CHECK(st.code == Code::ContextOverflow);
  CHECK(s.position() == ref.prompt.size());
  // still usable: the reference's first decode step is within the context
  REQUIRE(engine.forward(s, ref.decode_ids.data(), 1, Logits::Last, &logits));
  check_rows(logits, ref.decode.data(), 1, engine.config().vocab_size, "after errors");
  Session other;
  Engine engine2 = load_engine("mm_bf16");
  REQUIRE(engine2.create_session(&other));
  CHECK(engine.forward(other, ref.prompt.data(), 1, Logits::None, nullptr).code == Code::InvalidArgument);
}
